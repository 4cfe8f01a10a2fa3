"""What torch.compile traces in place of cygemm's public functions, so that a model calling them
compiles with no graph break.

cygemm's entry points are compiled functions: Dynamo cannot look inside them and would break
its graph at each call. torch's ``torch.compiler.substitute_in_graph`` registers a Python
stand-in that Dynamo traces instead (eager calls still run the compiled function, at its own
cost). Each stand-in below takes the public function's signature and calls the custom operator
that writes into the given tensors (:mod:`cygemm.autograd.into_ops`), which Dynamo keeps in its
graph; a result the call would allocate is allocated through torch first (``matmul`` then takes
the differentiable ``cygemm::matmul``).

A call the operators do not cover is run eagerly, as a graph break that names the reason
(``fullgraph=True`` raises it): an explicit ``stream`` (a compiled graph runs on torch's
current stream), arrays that are not torch tensors, FP8 ``uint8`` bytes with a ``format_*``,
``moe_gemm_wgrad`` with offsets on the host, and, with grad mode on, an input that requires
grad where the call writes into given tensors (eagerly cygemm refuses it by name).

Registered once, when ``torch._dynamo`` is imported (``cygemm``'s __init__ sees to it, in
either order of imports): importing Dynamo costs about a second, which ``import cygemm``
does not pay.
"""
import torch
from torch.compiler import substitute_in_graph

import cygemm
from cygemm import dense, fp8, grouped
from cygemm.autograd import into_ops as into, ops
from cygemm.engine.dtypes import torch_dtype
from cygemm.fp8.args import DEFAULT_OUT as DEFAULT_SCALED_OUT, OUT_DTYPES as SCALED_OUT_DTYPES

__all__ = ["STANDS_IN_FOR"]

# scaled_matmul's new results by the names its out_dtype takes (None: its default), from the dtype table.
_SCALED_DTYPES = {name: torch_dtype(torch, cuda) for name, cuda in SCALED_OUT_DTYPES.items()}
_SCALED_DTYPES[None] = _SCALED_DTYPES[DEFAULT_SCALED_OUT]


def _tensors(*arrays):
    """Whether every array given (None: not given) is a torch tensor."""
    return all(x is None or isinstance(x, torch.Tensor) for x in arrays)


# Why a call runs eagerly, by key (the graph break's message names it).
_WHY = {
    "stream": "stream= is given: a compiled graph runs on torch's current stream (use torch.cuda.stream(s))",
    "arrays": "an array is not a torch tensor",
    "beta": "a nonzero beta needs out",
    "z_out": "z_out and save_z disagree",
    "bytes": "FP8 bytes with format_a/format_b/format_out (pass torch float8 tensors)",
    "out_dtype": "an out_dtype the call does not make, or one that out's dtype disagrees with",
    "host_offsets": "group_offsets on the host (the operator takes them as a CUDA tensor)",
    "grad": "an input requires grad, and this call records no gradient (eagerly it refuses such a tensor)",
}
_eager = {}         # (name, key) -> the public function, run outside the graph (made at import: not traceable)


def _eagerly(name, key):
    """The public function ``name`` run as it is, outside the graph: a graph break naming why
    (``_WHY[key]``)."""
    return _eager[name, key]


def _reason(stream, arrays, before=(), after=(), grad=True):
    """Why a call runs eagerly (a key of ``_WHY``), or None where it stays in the graph: the
    first of ``before``'s (key, holds) pairs that holds, an explicit stream, an array that is no
    torch tensor, the first of ``after``'s, and (``grad``) an input that requires grad with grad
    mode on: the calls that write into given tensors record no gradient, so such a call runs
    eagerly, where cygemm refuses it by name (the operators would drop the gradient silently)."""
    for key, holds in before:
        if holds:
            return key
    if stream is not None:
        return "stream"
    if not _tensors(*arrays):
        return "arrays"
    for key, holds in after:
        if holds:
            return key
    if grad and torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in arrays):
        return "grad"
    return None


def _trans(t):
    """gemm's trans_a/trans_b as the operator's string."""
    return t if isinstance(t, str) else ("T" if t else "N")


# ---------------------------------------------------------------- the stand-ins

@substitute_in_graph(cygemm.matmul)
def matmul(a, b, out=None, *, math="tf32", stream=None, autotune=None, determinism=None):
    # (with no out, the differentiable operator: the eager call records a gradient)
    why = _reason(stream, (a, b, out), grad=out is not None)
    if why is not None:
        return _eagerly("matmul", why)(a, b, out, math=math, stream=stream, autotune=autotune, determinism=determinism)
    if out is None:
        return ops._matmul_op(a, b, math, autotune, determinism)
    into.matmul_into(a, b, out, math, autotune, determinism)
    return out


def _gemm_shape(A, B, trans_a, trans_b, batched):
    """gemm's new result: (M, N), or (batch, M, N) batched (a 2-D operand broadcast)."""
    m = A.shape[-1] if trans_a not in ("N", "n") else A.shape[-2]
    n = B.shape[-2] if trans_b not in ("N", "n") else B.shape[-1]
    if not batched:
        return (m, n)
    return (max(A.shape[0] if A.dim() == 3 else 1, B.shape[0] if B.dim() == 3 else 1), m, n)


def _gemm(run, batched, A, B, out, trans_a, trans_b, alpha, beta, math, stream, autotune, determinism):
    why = _reason(stream, (A, B, out), after=(("beta", out is None and beta != 0),))
    if why is not None:
        return _eagerly(run, why)(A, B, out, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta, math=math,
                                  stream=stream, autotune=autotune, determinism=determinism)
    trans_a, trans_b = _trans(trans_a), _trans(trans_b)
    if out is None:         # (int8 operands sum into int32)
        out = A.new_empty(_gemm_shape(A, B, trans_a, trans_b, batched),
                          dtype=torch.int32 if A.dtype == torch.int8 else A.dtype)
    into.gemm_into(A, B, out, trans_a, trans_b, alpha, beta, math, autotune, determinism, batched)
    return out


@substitute_in_graph(cygemm.gemm)
def gemm(A, B, out=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, math="tf32", stream=None,
         autotune=None, determinism=None):
    return _gemm("gemm", False, A, B, out, trans_a, trans_b, alpha, beta, math, stream, autotune, determinism)


@substitute_in_graph(cygemm.gemm_strided_batched)
def gemm_strided_batched(A, B, out=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, math="tf32",
                         stream=None, autotune=None, determinism=None):
    return _gemm("gemm_strided_batched", True, A, B, out, trans_a, trans_b, alpha, beta, math, stream, autotune,
                 determinism)


@substitute_in_graph(cygemm.int_mm)
def int_mm(A, B, out=None, *, stream=None, autotune=None, determinism=None):
    why = _reason(stream, (A, B, out))
    if why is not None:
        return _eagerly("int_mm", why)(A, B, out, stream=stream, autotune=autotune, determinism=determinism)
    if out is None:
        out = A.new_empty((A.shape[0], B.shape[1]), dtype=torch.int32)
    into.int_mm_into(A, B, out, autotune, determinism)
    return out


@substitute_in_graph(fp8.scaled_matmul)
def scaled_matmul(a, b, scale_a, scale_b, *, out=None, out_dtype=None, bias=None, act="none", scale_out=None,
                  amax_out=None, format_a=None, format_b=None, format_out=None, fast_accum=False, scale_mode=None,
                  determinism=None, stream=None, autotune=None):
    as_bytes = format_a is not None or format_b is not None or format_out is not None
    arrays = (a, b, scale_a, scale_b, out, bias, scale_out, amax_out)
    # an out_dtype the call does not make, or one out's dtype disagrees with: the eager call says which
    unknown = out_dtype not in _SCALED_DTYPES or (out is not None and out_dtype is not None
                                                  and _tensors(out) and _SCALED_DTYPES[out_dtype] != out.dtype)
    why = _reason(stream, arrays, before=(("bytes", as_bytes), ("out_dtype", unknown)))
    if why is not None:
        return _eagerly("scaled_matmul", why)(
            a, b, scale_a, scale_b, out=out, out_dtype=out_dtype, bias=bias, act=act, scale_out=scale_out,
            amax_out=amax_out, format_a=format_a, format_b=format_b, format_out=format_out, fast_accum=fast_accum,
            scale_mode=scale_mode, determinism=determinism, stream=stream, autotune=autotune)
    if out is None:
        out = a.new_empty((a.shape[0], b.shape[1]), dtype=_SCALED_DTYPES[out_dtype])
    mode_a, mode_b = (scale_mode, None) if scale_mode is None or isinstance(scale_mode, str) else scale_mode
    into.scaled_matmul_into(a, b, scale_a, scale_b, out, bias, act, scale_out, amax_out, bool(fast_accum), mode_a,
                            mode_b, determinism, autotune)
    return out


@substitute_in_graph(dense.forward_into)
def forward_into(A, B, out, bias=None, *, with_bias=True, act="none", leaky_slope=0.01, save_z=False, z_out=None,
                 lt_workspace=None, math="tf32", stream=None, autotune=None, determinism=None):
    why = _reason(stream, (A, B, out, bias, z_out, lt_workspace),
                  after=(("z_out", (z_out is not None) != bool(save_z)),))
    if why is not None:
        return _eagerly("forward_into", why)(
            A, B, out, bias, with_bias=with_bias, act=act, leaky_slope=leaky_slope, save_z=save_z, z_out=z_out,
            lt_workspace=lt_workspace, math=math, stream=stream, autotune=autotune, determinism=determinism)
    into.dense_forward_into(A, B, out, bias if with_bias else None, act, float(leaky_slope), z_out, lt_workspace,
                            math, autotune, determinism)
    return out


def _on_device(offsets):
    return isinstance(offsets, torch.Tensor) and offsets.device.type != "cpu"


@substitute_in_graph(grouped.moe_gemm)
def moe_gemm(x, w, group_offsets, out, *, w_layout="kn", math="tf32", stream=None, route=None, autotune=None,
             determinism=None, check_offsets=False):
    why = _reason(stream, (x, w, out))
    if why is not None:
        return _eagerly("moe_gemm", why)(
            x, w, group_offsets, out, w_layout=w_layout, math=math, stream=stream, route=route, autotune=autotune,
            determinism=determinism, check_offsets=check_offsets)
    if _on_device(group_offsets):
        into.moe_gemm_dev_into(x, w, group_offsets, out, w_layout, math, route, autotune, determinism,
                               bool(check_offsets))
    else:       # host ints: the graph is specialised to them, as torch does for a list of ints
        into.moe_gemm_into(x, w, [int(o) for o in group_offsets], out, w_layout, math, route, autotune, determinism)
    return out


@substitute_in_graph(grouped.moe_gemm_wgrad)
def moe_gemm_wgrad(x, dy, group_offsets, dw, *, dw_layout="kn", math="tf32", stream=None, route=None, autotune=None,
                   determinism=None, check_offsets=False):
    why = _reason(stream, (x, dy, dw), after=(("host_offsets", not _on_device(group_offsets)),))
    if why is not None:
        return _eagerly("moe_gemm_wgrad", why)(
            x, dy, group_offsets, dw, dw_layout=dw_layout, math=math, stream=stream, route=route, autotune=autotune,
            determinism=determinism, check_offsets=check_offsets)
    into.moe_gemm_wgrad_into(x, dy, group_offsets, dw, dw_layout, math, route, autotune, determinism,
                             bool(check_offsets))
    return dw


# The public functions that have a stand-in here, by name (what the tests and the docs enumerate).
STANDS_IN_FOR = {"matmul": cygemm.matmul, "gemm": cygemm.gemm, "gemm_strided_batched": cygemm.gemm_strided_batched,
                 "int_mm": cygemm.int_mm, "scaled_matmul": fp8.scaled_matmul, "forward_into": dense.forward_into,
                 "moe_gemm": grouped.moe_gemm, "moe_gemm_wgrad": grouped.moe_gemm_wgrad}
_eager.update({(name, key): torch.compiler.disable(fn, reason=f"cygemm's {name}: {why}")
               for name, fn in STANDS_IN_FOR.items() for key, why in _WHY.items()})
