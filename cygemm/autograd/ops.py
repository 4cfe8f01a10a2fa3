"""cygemm's torch entry points as torch custom operators (``torch.ops.cygemm.*``), so that
``torch.compile`` keeps them in its graph: each has a fake (meta) implementation that gives the
result's shape and dtype without running, and the differentiable ones their autograd formula.

==========================================  ===================================================
operator                                    as
==========================================  ===================================================
``cygemm::matmul(a, b, math, ...)``         :func:`cygemm.matmul` (differentiable)
``cygemm::linear(x, weight, bias, ...)``    :func:`cygemm.autograd.linear` (differentiable)
``cygemm::int_mm(a, b)``                    :func:`cygemm.int_mm` (int32 out)
``cygemm::scaled_matmul(a, b, sa, sb, ...)`` :func:`cygemm.fp8.scaled_matmul` (tensor scales)
``cygemm::moe_gemm(x, w, offsets, ...)``    :func:`cygemm.moe_gemm` (host offsets)
``cygemm::moe_gemm_dev(x, w, offs, ...)``   :func:`cygemm.moe_gemm`, offsets a CUDA tensor
                                            (differentiable in x and w)
``cygemm::moe_gemm_wgrad(x, dy, offs)``     :func:`cygemm.moe_gemm_wgrad`, offsets a CUDA tensor
``cygemm::moe_scaled_gemm(x, w, ...)``      :func:`cygemm.moe_scaled_gemm` (FP8), offsets a CUDA tensor
==========================================  ===================================================

Eager code keeps calling cygemm directly (a custom op costs several times an
``autograd.Function`` per call in eager mode): :func:`cygemm.autograd.linear`,
:func:`matmul`, :func:`int_mm`, :func:`scaled_matmul` and :func:`moe_gemm` (host offsets)
below take the operator only while torch.compile traces them. Every operator runs on torch's
current stream and allocates through torch, so a compiled graph (and ``torch.cuda.graph``)
captures it.
"""
from typing import List, Optional, Tuple

import torch

import cygemm
from cygemm import fp8, grouped
from cygemm.autograd import _dense_forward, _matrix_grads, _name, _saves, _stream_of, linear_backward

__all__ = ["matmul", "linear", "int_mm", "scaled_matmul", "moe_gemm", "moe_gemm_wgrad", "moe_scaled_gemm"]

_Tensor = torch.Tensor


def _compiling():
    return torch.compiler.is_compiling()


# ---------------------------------------------------------------- matmul

def _matmul_shape(a, b):
    """NumPy's matmul result shape (1-D operands promoted and their axis removed)."""
    sa, sb = list(a.shape), list(b.shape)
    m = [sa[-2]] if len(sa) > 1 else []
    n = [sb[-1]] if len(sb) > 1 else []
    batch = torch.broadcast_shapes(torch.Size(sa[:-2]), torch.Size(sb[:-2]))
    return (*batch, *m, *n)


@torch.library.custom_op("cygemm::matmul", mutates_args=())
def _matmul_op(a: _Tensor, b: _Tensor, math: str, autotune: Optional[str], determinism: Optional[str]) -> _Tensor:
    # (the result from torch's allocator: cygemm allocates nothing, so torch.cuda.graph captures it)
    out = a.new_empty(_matmul_shape(a, b), dtype=torch.promote_types(a.dtype, b.dtype))
    return cygemm.matmul(a, b, out, math=math, stream=_stream_of(a), autotune=autotune, determinism=determinism)


@_matmul_op.register_fake
def _(a, b, math, autotune, determinism):
    return a.new_empty(_matmul_shape(a, b), dtype=torch.promote_types(a.dtype, b.dtype))


def _matmul_setup(ctx, inputs, output):
    a, b, math, autotune, determinism = inputs
    ctx.save_for_backward(a, b)
    ctx.options = (math, autotune, determinism)


def _matmul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    options = ctx.options
    ga, gb = _matrix_grads(a, b, grad, ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                           lambda x, y: _matmul_op(x, y, *options))
    return ga, gb, None, None, None


_matmul_op.register_autograd(_matmul_backward, setup_context=_matmul_setup)


def matmul(a, b, *, math="tf32", autotune=None, determinism=None):
    """:func:`cygemm.matmul` of two torch tensors that ``torch.compile`` keeps in its graph (the
    ``cygemm::matmul`` operator while it traces, cygemm.matmul itself when eager).

    Parameters
    ----------
    a, b : torch.Tensor
        CUDA tensors, as :func:`cygemm.matmul` takes them (NumPy's matmul semantics).
    math, autotune, determinism
        As :func:`cygemm.matmul`.

    Returns
    -------
    torch.Tensor
        ``a @ b``, a new tensor from torch's allocator on torch's current stream;
        differentiable in a and b.
    """
    if _compiling():
        return _matmul_op(a, b, math, autotune, determinism)
    return cygemm.matmul(a, b, math=math, autotune=autotune, determinism=determinism)


# ---------------------------------------------------------------- the dense layer

@torch.library.custom_op("cygemm::linear", mutates_args=())
def _linear_op(x: _Tensor, weight: _Tensor, bias: Optional[_Tensor], act: str, leaky_slope: float, math: str,
               autotune: Optional[str]) -> Tuple[_Tensor, _Tensor]:
    """y, and what the backward reads besides x and weight (Z, y, or an empty tensor)."""
    saves = _saves(act, leaky_slope)
    y, z = _dense_forward(x, weight, bias, act, leaky_slope, math, autotune, saves == "z")
    kept = z if saves == "z" else (y.detach().clone() if saves == "y" else x.new_empty(0))
    return y, kept


@_linear_op.register_fake
def _(x, weight, bias, act, leaky_slope, math, autotune):
    n, k = weight.shape
    saves = _saves(act, leaky_slope)
    y = x.new_empty((*x.shape[:-1], n))
    rows = x.numel() // k if k else 0
    kept = x.new_empty((rows, n)) if saves == "z" else (x.new_empty(y.shape) if saves == "y" else x.new_empty(0))
    return y, kept


@torch.library.custom_op("cygemm::linear_backward", mutates_args=())
def _linear_backward_op(x: _Tensor, weight: _Tensor, gy: _Tensor, kept: _Tensor, has_bias: bool, act: str,
                        leaky_slope: float, math: str, autotune: Optional[str]) -> Tuple[_Tensor, _Tensor, _Tensor]:
    gx, gw, gb = linear_backward(x, weight, gy, kept if kept.numel() else None, _saves(act, leaky_slope), has_bias,
                                 act, leaky_slope, math, autotune, True, True, True)
    return gx, gw, gb if gb is not None else x.new_empty(0)


@_linear_backward_op.register_fake
def _(x, weight, gy, kept, has_bias, act, leaky_slope, math, autotune):
    n, k = weight.shape
    return x.new_empty(x.shape), weight.new_empty((n, k)), weight.new_empty((n,) if has_bias else (0,))


def _linear_setup(ctx, inputs, output):
    x, weight, bias, act, leaky_slope, math, autotune = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.options = (bias is not None, act, leaky_slope, math, autotune)


def _linear_backward(ctx, gy, _gkept):
    x, weight, kept = ctx.saved_tensors
    gx, gw, gb = _linear_backward_op(x, weight, gy.contiguous(), kept, *ctx.options)
    return gx, gw, (gb if ctx.options[0] else None), None, None, None, None


_linear_op.register_autograd(_linear_backward, setup_context=_linear_setup)


def linear(x, weight, bias=None, *, act="none", leaky_slope=0.01, math="tf32", autotune=None):
    """The ``cygemm::linear`` operator's output (:func:`cygemm.autograd.linear` calls it while
    torch.compile traces).

    Parameters
    ----------
    x, weight, bias, act, leaky_slope, math, autotune
        As :func:`cygemm.autograd.linear` (which checks them before it calls this; this
        function does not).

    Returns
    -------
    torch.Tensor
        ``act(x @ weight.T + bias)``, (..., out_features), x's dtype; differentiable in x,
        weight and bias.
    """
    return _linear_op(x, weight, bias, act, float(leaky_slope), math, autotune)[0]


# ---------------------------------------------------------------- int8, FP8, grouped

@torch.library.custom_op("cygemm::int_mm", mutates_args=())
def _int_mm_op(a: _Tensor, b: _Tensor) -> _Tensor:
    out = a.new_empty((a.shape[0], b.shape[1]), dtype=torch.int32)
    cygemm.int_mm(a, b, out, stream=_stream_of(a))
    return out


@_int_mm_op.register_fake
def _(a, b):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.int32)


def int_mm(a, b):
    """:func:`cygemm.int_mm` into a new int32 tensor, kept in torch.compile's graph.

    Parameters
    ----------
    a : torch.Tensor (M, K)
        int8, CUDA, rows contiguous.
    b : torch.Tensor (K, N)
        int8, CUDA, F-ordered (``w.T`` of a C-ordered (N, K) weight ``w``); as
        :func:`cygemm.int_mm` takes it.

    Returns
    -------
    torch.Tensor (M, N)
        int32, the exact sums. Not differentiable.
    """
    return _int_mm_op(a, b) if _compiling() else cygemm.int_mm(a, b)


_OUT_DTYPES = {_name(t): t for t in (torch.bfloat16, torch.float16, torch.float32)}     # (by torch's names)


@torch.library.custom_op("cygemm::scaled_matmul", mutates_args=())
def _scaled_op(a: _Tensor, b: _Tensor, scale_a: _Tensor, scale_b: _Tensor, bias: Optional[_Tensor], out_dtype: str,
               act: str, fast_accum: bool) -> _Tensor:
    out = a.new_empty((a.shape[0], b.shape[1]), dtype=_OUT_DTYPES[out_dtype])
    fp8.scaled_matmul(a, b, scale_a, scale_b, out=out, bias=bias, act=act, fast_accum=fast_accum, stream=_stream_of(a))
    return out


@_scaled_op.register_fake
def _(a, b, scale_a, scale_b, bias, out_dtype, act, fast_accum):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=_OUT_DTYPES[out_dtype])


def scaled_matmul(a, b, scale_a, scale_b, *, bias=None, out_dtype="bfloat16", act="none", fast_accum=False):
    """:func:`cygemm.fp8.scaled_matmul` of torch float8 tensors into a new bfloat16, float16 or
    float32 tensor, kept in torch.compile's graph.

    Parameters
    ----------
    a : torch.Tensor (M, K)
        ``float8_e4m3fn`` or ``float8_e5m2``, CUDA, row-major.
    b : torch.Tensor (K, N)
        float8, column-major (``w.T`` of a C-contiguous (N, K) weight); not both E5M2.
    scale_a, scale_b : torch.Tensor
        float32 dequantizing scales, as :func:`cygemm.fp8.scaled_matmul` takes them.
    bias : torch.Tensor (N,), optional
        bfloat16 (float16 for a float16 result), added before the activation.
    out_dtype : {"bfloat16", "float16", "float32"}
        The result's dtype (default bfloat16).
    act : {"none", "relu", "gelu"}
        Applied in cuBLASLt's epilogue (gelu: the tanh approximation).
    fast_accum : bool
        cuBLASLt's FP8 fast accumulation.

    Returns
    -------
    torch.Tensor (M, N)
        ``act(scale_a * scale_b * (a @ b) + bias)`` in ``out_dtype``. Not differentiable.

    Raises
    ------
    ValueError
        An unknown ``out_dtype``; otherwise as :func:`cygemm.fp8.scaled_matmul`.
    """
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype: expected one of {sorted(_OUT_DTYPES)}, got {out_dtype!r}")
    return _scaled_op(a, b, scale_a, scale_b, bias, out_dtype, act, bool(fast_accum))


@torch.library.custom_op("cygemm::moe_gemm", mutates_args=())
def _moe_op(x: _Tensor, w: _Tensor, group_offsets: List[int], w_layout: str, math: str) -> _Tensor:
    n = w.shape[2] if w_layout == "kn" else w.shape[1]
    out = x.new_empty((x.shape[0], n))
    grouped.moe_gemm(x, w, group_offsets, out, w_layout=w_layout, math=math, stream=_stream_of(x))
    return out


@_moe_op.register_fake
def _(x, w, group_offsets, w_layout, math):
    return x.new_empty((x.shape[0], w.shape[2] if w_layout == "kn" else w.shape[1]))


def _moe_n(w, w_layout):
    return w.shape[2] if w_layout == "kn" else w.shape[1]


_FLIP = {"kn": "nk", "nk": "kn"}


@torch.library.custom_op("cygemm::moe_gemm_dev", mutates_args=())
def _moe_dev_op(x: _Tensor, w: _Tensor, offsets: _Tensor, w_layout: str, math: str) -> _Tensor:
    out = x.new_empty((x.shape[0], _moe_n(w, w_layout)))
    grouped.moe_gemm(x, w, offsets, out, w_layout=w_layout, math=math, stream=_stream_of(x))
    return out


@_moe_dev_op.register_fake
def _(x, w, offsets, w_layout, math):
    return x.new_empty((x.shape[0], _moe_n(w, w_layout)))


@torch.library.custom_op("cygemm::moe_gemm_wgrad", mutates_args=())
def _moe_wgrad_op(x: _Tensor, dy: _Tensor, offsets: _Tensor, dw_layout: str, math: str) -> _Tensor:
    g, k, n = offsets.shape[0] - 1, x.shape[1], dy.shape[1]
    dw = x.new_empty((g, k, n) if dw_layout == "kn" else (g, n, k))
    grouped.moe_gemm_wgrad(x, dy, offsets, dw, dw_layout=dw_layout, math=math, stream=_stream_of(x))
    return dw


@_moe_wgrad_op.register_fake
def _(x, dy, offsets, dw_layout, math):
    g, k, n = offsets.shape[0] - 1, x.shape[1], dy.shape[1]
    return x.new_empty((g, k, n) if dw_layout == "kn" else (g, n, k))


def _moe_dev_setup(ctx, inputs, output):
    x, w, offsets, w_layout, math = inputs
    ctx.save_for_backward(x, w, offsets)
    ctx.options = (w_layout, math)


def _moe_dev_backward(ctx, grad):
    # out = x @ w[g] ("kn") or x @ w[g].T ("nk") per expert: dx runs the same experts on the
    # other layout of w (read in place), dw is the ragged-K weight gradient in w's layout.
    x, w, offsets = ctx.saved_tensors
    w_layout, math = ctx.options
    grad = grad.contiguous()
    gx = _moe_dev_op(grad, w, offsets, _FLIP[w_layout], math) if ctx.needs_input_grad[0] else None
    gw = _moe_wgrad_op(x, grad, offsets, w_layout, math) if ctx.needs_input_grad[1] else None
    return gx, gw, None, None, None


_moe_dev_op.register_autograd(_moe_dev_backward, setup_context=_moe_dev_setup)


def moe_gemm(x, w, group_offsets, *, w_layout="kn", math="tf32"):
    """:func:`cygemm.moe_gemm` into a new tensor, kept in torch.compile's graph.

    ``group_offsets`` a CUDA tensor (int32 or int64, G + 1 offsets): the offsets stay on the GPU
    (no sync, and a compiled or captured graph follows their values), and the operator is
    differentiable in x and w. A list of ints: a compiled graph is specialised to them.

    Parameters
    ----------
    x : torch.Tensor (T, K)
        CUDA, every token sorted by expert, as :func:`cygemm.moe_gemm` takes it.
    w : torch.Tensor (G, K, N) or (G, N, K)
        The experts' weights, as ``w_layout`` says; x's dtype.
    group_offsets : torch CUDA tensor or sequence of int
        G + 1 non-decreasing offsets from 0 to T: a CUDA tensor (int32 or int64) or host
        ints (anything else, a CPU tensor too, is read as ints).
    w_layout : {"kn", "nk"}
        As :func:`cygemm.moe_gemm`: "kn", ``w[g]`` is (K, N); "nk", (N, K).
    math
        As :func:`cygemm.moe_gemm`.

    Returns
    -------
    torch.Tensor (T, N)
        x's dtype; differentiable in x and w where the offsets are a CUDA tensor.
    """
    if isinstance(group_offsets, torch.Tensor) and group_offsets.device.type != "cpu":
        return _moe_dev_op(x, w, group_offsets, w_layout, math)
    return _moe_op(x, w, [int(o) for o in group_offsets], w_layout, math)


def moe_gemm_wgrad(x, dy, group_offsets, *, dw_layout="kn", math="tf32"):
    """:func:`cygemm.moe_gemm_wgrad` into a new (G, K, N) or (G, N, K) tensor, kept in
    torch.compile's graph; ``group_offsets`` a CUDA tensor of G + 1 offsets.

    Parameters
    ----------
    x : torch.Tensor (T, K)
        CUDA, the layer's input, tokens sorted by expert.
    dy : torch.Tensor (T, N)
        The gradient of the layer's output, x's dtype.
    group_offsets : torch.Tensor (G + 1,)
        A CUDA int32 or int64 tensor of non-decreasing offsets from 0 to T.
    dw_layout : {"kn", "nk"}
        As :func:`cygemm.moe_gemm_wgrad`: "kn", ``dw[g] = x[a:b].T @ dy[a:b]`` (K, N); "nk",
        its transpose (N, K).
    math
        As :func:`cygemm.moe_gemm_wgrad`.

    Returns
    -------
    torch.Tensor (G, K, N) or (G, N, K)
        x's dtype; an expert with no rows gets zeros. Not differentiable.
    """
    return _moe_wgrad_op(x, dy, group_offsets, dw_layout, math)



@torch.library.custom_op("cygemm::moe_scaled_gemm", mutates_args=("workspace",))
def _moe_scaled_op(x: _Tensor, w: _Tensor, scale_x: _Tensor, scale_w: _Tensor, offsets: _Tensor, out_dtype: str,
                   fast_accum: bool, workspace: Optional[_Tensor]) -> _Tensor:
    out = x.new_empty((x.shape[0], w.shape[1]), dtype=_OUT_DTYPES[out_dtype])
    grouped.moe_scaled_gemm(x, w, scale_x, scale_w, offsets, out, fast_accum=fast_accum, workspace=workspace,
                            stream=_stream_of(x))
    return out


@_moe_scaled_op.register_fake
def _(x, w, scale_x, scale_w, offsets, out_dtype, fast_accum, workspace):
    return x.new_empty((x.shape[0], w.shape[1]), dtype=_OUT_DTYPES[out_dtype])


def moe_scaled_gemm(x, w, scale_x, scale_w, group_offsets, *, out_dtype="bfloat16", fast_accum=False,
                    workspace=None):
    """:func:`cygemm.moe_scaled_gemm` of torch float8 tensors into a new tensor, kept in
    torch.compile's graph; ``group_offsets`` a CUDA tensor of G + 1 offsets; ``workspace`` as
    :func:`cygemm.moe_scaled_gemm` takes it (block scales).

    Parameters
    ----------
    x : torch.Tensor (T, K)
        float8, CUDA, tokens sorted by expert.
    w : torch.Tensor (G, N, K)
        float8, each expert's weight as a linear layer holds it.
    scale_x, scale_w : torch.Tensor
        float32 dequantizing scales, as :func:`cygemm.moe_scaled_gemm` takes them.
    group_offsets : torch.Tensor (G + 1,)
        A CUDA int32 or int64 tensor of non-decreasing offsets from 0 to T.
    out_dtype : {"bfloat16", "float16", "float32"}
        The result's dtype (default bfloat16).
    fast_accum : bool
        cuBLASLt's FP8 fast accumulation.
    workspace : torch.Tensor, optional
        float32, as :func:`cygemm.moe_scaled_gemm` takes it (needed for block scales).

    Returns
    -------
    torch.Tensor (T, N)
        ``out_dtype``. Not differentiable.

    Raises
    ------
    ValueError
        An unknown ``out_dtype``; otherwise as :func:`cygemm.moe_scaled_gemm`.
    """
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype: expected one of {sorted(_OUT_DTYPES)}, got {out_dtype!r}")
    return _moe_scaled_op(x, w, scale_x, scale_w, group_offsets, out_dtype, bool(fast_accum), workspace)