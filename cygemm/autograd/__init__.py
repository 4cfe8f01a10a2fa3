"""torch's autograd through cygemm: ``matmul`` and the dense layer as ``torch.autograd.Function``,
so a torch user's ``loss.backward()`` runs cygemm's GEMMs and kernels.

    y = cygemm.matmul(x, w)                     # has a grad_fn when x or w requires grad
    h = cygemm.autograd.linear(x, weight, bias, act="gelu")     # act(x @ weight.T + bias)
    loss.backward()

``cygemm.matmul`` comes here by itself when a torch input requires grad and grad mode is on
(its only cost otherwise: reading ``requires_grad`` of torch inputs; CuPy inputs pay nothing).

Eager calls go through ``torch.autograd.Function``: in eager mode a ``torch.library`` custom
op with a registered autograd formula costs about 5x what ``Function.apply`` does per call
(measured with torch 2.13's CPU build, a trivial body, one CPU: about 120 us against 25 us),
and cygemm exists to remove such overhead. Under ``torch.compile`` the entry points of
:mod:`cygemm.autograd.ops` (and :func:`linear`) take cygemm's custom operators instead
(``torch.ops.cygemm.*``, each with its fake implementation and autograd formula), which
Dynamo keeps in its graph; ``cygemm.matmul`` itself, a compiled function, breaks the graph
there: call ``cygemm.autograd.ops.matmul`` in code you compile. Under
``torch.cuda.graph``, ``linear`` can be captured (it allocates through torch only); a recorded
``matmul`` allocates its result through cygemm, which refuses that in a capture.

Streams: every call runs on torch's current stream (``torch.cuda.current_stream()``) of the
inputs' device: the forward on the stream current when it is called (or ``matmul``'s
``stream=``), the backward on the stream torch's autograd engine makes current for it (the
forward's, as for torch's own operators). Results and gradients are torch tensors from torch's
allocator, allocated on that stream.
"""
try:
    import torch
except ImportError as exc:          # only a torch user gets here (cygemm.matmul on tensors, or this import)
    raise ImportError("cygemm.autograd needs PyTorch (pip install torch)") from exc
from torch.autograd.function import once_differentiable

from cygemm.engine.dtypes import LEVELS, expected
from cygemm.dense import backward_into, backward_reads, forward_into
from cygemm.rowmajor.matmul import _set_grad_path, matmul as _matmul

__all__ = ["MatmulFunction", "LinearFunction", "linear", "linear_backward", "ops"]

_DENSE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _cuda_tensor(x, name):
    """x as a CUDA torch tensor (a CuPy or other CUDA array is wrapped without a copy), or
    TypeError naming `name`."""
    if not isinstance(x, torch.Tensor):
        if not hasattr(x, "__dlpack__"):
            raise TypeError(f"{name}: expected a torch CUDA tensor, got {type(x).__module__}.{type(x).__name__}")
        x = torch.from_dlpack(x)
    if not x.is_cuda:
        raise TypeError(f"{name}: expected a CUDA tensor, got a torch tensor on {x.device} (a CPU tensor "
                        "is not a CUDA array: move it with .cuda())")
    return x


def _stream_of(x):
    """torch's current stream on x's device, as the raw cudaStream_t cygemm takes; None for a
    tensor not on a GPU (cygemm's reader then refuses it, naming it: torch would raise first,
    asking a CPU-only build for a CUDA stream)."""
    if x.device.type != "cuda":
        return None
    return torch.cuda.current_stream(x.device).cuda_stream


# ---------------------------------------------------------------- matmul

def _matrix_grads(a, b, g, need_a, need_b, mm):
    """Gradients of ``a @ b`` (NumPy's matmul: 1-D operands, broadcast batch axes) for the
    output gradient g, each summed over the batch axes its operand was broadcast along; `mm`
    multiplies (cygemm.matmul eagerly, the custom op under torch.compile: one formula)."""
    # The axes matmul removed for 1-D operands, back: a (K,) is a (1, K) row, b (K,) a column.
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    g2 = g.unsqueeze(-1) if b.dim() == 1 else g
    g2 = g2.unsqueeze(-2) if a.dim() == 1 else g2
    # Complex operands take conjugate transposes (torch's convention: dL/da = g @ b^H), made
    # here as tensors that hold their values: cygemm reads memory, not torch's lazy conjugate
    # bit (an output gradient may carry one, e.g. from a later .conj()).
    g2 = g2.resolve_conj().resolve_neg()
    ga = gb = None
    if need_a:      # dL/da = g @ b^H
        bh = b2.mH.resolve_conj() if b2.is_complex() else b2.mT
        ga = mm(g2, bh).sum_to_size(a2.shape).reshape(a.shape)
        ga = _as_grad_of(ga, a)
    if need_b:      # dL/db = a^H @ g
        ah = a2.mH.resolve_conj() if a2.is_complex() else a2.mT
        gb = mm(ah, g2).sum_to_size(b2.shape).reshape(b.shape)
        gb = _as_grad_of(gb, b)
    return ga, gb


def _as_grad_of(grad, x):
    """grad in x's dtype: a real x (multiplied with a complex operand) takes the real part."""
    if grad.is_complex() and not x.is_complex():
        grad = grad.real
    return grad.to(x.dtype)


class MatmulFunction(torch.autograd.Function):
    """``cygemm.matmul(a, b)`` recorded by torch's autograd.

    ``MatmulFunction.apply(a, b, math="tf32", stream=None, autotune=None, determinism=None)``:
    a and b are CUDA tensors (float16, bfloat16, float32, float64, complex64, complex128), shapes
    as :func:`cygemm.matmul` takes. The backward computes ``g @ b^H`` and ``a^H @ g`` (for real
    dtypes the transposes; a real operand's gradient is the real part) with
    ``cygemm.matmul`` (the same ``math``, ``autotune`` and ``determinism``), sums them over broadcast batch axes, and is itself
    differentiable (``create_graph=True`` records it again). ``cygemm.matmul`` calls this for
    you when an input requires grad.
    """

    @staticmethod
    def forward(ctx, a, b, math="tf32", stream=None, autotune=None, determinism=None):
        ctx.math, ctx.autotune, ctx.determinism = math, autotune, determinism
        ctx.save_for_backward(a, b)
        # (grad mode is off here)
        return _matmul(a, b, math=math, stream=stream, autotune=autotune, determinism=determinism)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        ga, gb = _matrix_grads(a, b, grad, ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                               lambda x, y: _matmul(x, y, math=ctx.math, autotune=ctx.autotune,
                                                    determinism=ctx.determinism))
        return ga, gb, None, None, None, None


def _recorded_matmul(a, b, out, math, stream, autotune, determinism=None):
    """cygemm.matmul's path when autograd must record the call."""
    if out is not None:
        raise RuntimeError("out: matmul(..., out=...) cannot record gradients, but an argument requires grad; "
                           "call matmul(a, b) without out= (the result then has a grad_fn), or run it under "
                           "torch.no_grad()")
    for name, x in (("a", a), ("b", b)):       # a CPU tensor is named before the other is wrapped
        if isinstance(x, torch.Tensor):
            _cuda_tensor(x, name)
    return MatmulFunction.apply(_cuda_tensor(a, "a"), _cuda_tensor(b, "b"), math, stream, autotune, determinism)


_set_grad_path(_recorded_matmul)        # from now on cygemm.matmul calls it directly


# ---------------------------------------------------------------- the dense layer

def _rows(x, k):
    """x (..., k) as a C-ordered (M, k) matrix (a view when it is one already)."""
    return x.reshape(-1, k).contiguous()


def _check_dense(x, weight, bias):
    x = _cuda_tensor(x, "x")
    weight = _cuda_tensor(weight, "weight")
    if weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D (out_features, in_features) tensor, got shape {tuple(weight.shape)}")
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x: expected a last axis of weight's in_features ({weight.shape[1]}), got shape "
                         f"{tuple(x.shape)}")
    if bias is not None:
        bias = _cuda_tensor(bias, "bias")
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"bias: expected shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if x.dtype not in _DENSE_DTYPES:
        raise TypeError(f"x: expected {expected(LEVELS['float'])} (the dense layer has no float64; "
                        f"cygemm.matmul has), got {_name(x.dtype)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != x.dtype:
            raise TypeError(f"{name}: expected x's dtype {_name(x.dtype)}, got {_name(t.dtype)}")
    return x, weight, bias


def _name(dtype):
    return str(dtype).replace("torch.", "")


# The float results the FP8 and MoE operators make, by torch's names.
_OUT_DTYPES = {_name(t): t for t in (torch.bfloat16, torch.float16, torch.float32)}


# What the backward reads besides x and weight: "z", "y" or None (the dense layer's rule).
_saves = backward_reads


def _dense_forward(x, weight, bias, act, leaky_slope, math, autotune, save_z):
    """y = act(x @ weight.T + bias) of shape (..., N), and Z (M, N) with save_z, on torch's
    current stream."""
    n, k = weight.shape
    x2 = _rows(x, k)
    y = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    z = torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device) if save_z else None
    forward_into(x2, weight.T, y.view(-1, n), bias, with_bias=bias is not None, act=act, leaky_slope=leaky_slope,
                 save_z=save_z, z_out=z, math=math, stream=_stream_of(x), autotune=autotune)
    return y, z


class LinearFunction(torch.autograd.Function):
    """The dense layer ``act(x @ weight.T + bias)`` recorded by torch's autograd.

    ``LinearFunction.apply(x, weight, bias, act, leaky_slope, math, autotune)``; prefer
    :func:`linear`, which checks the arguments and skips the recording when no gradient is
    needed. The forward is :func:`cygemm.gemm_ops.forward_into` (the activation fused where
    cuBLASLt can), the backward :func:`cygemm.gemm_ops.backward_into`; it keeps Z only for
    activations whose derivative the output does not fix (gelu, gelu_erf, silu, leaky_relu
    of slope 0). Not differentiable twice.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, act, leaky_slope, math, autotune):
        saves = _saves(act, leaky_slope)
        y, z = _dense_forward(x, weight, bias, act, leaky_slope, math, autotune, saves == "z")
        ctx.act, ctx.leaky_slope, ctx.math, ctx.autotune, ctx.saves = act, leaky_slope, math, autotune, saves
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight, z if saves == "z" else (y if saves == "y" else None))
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        x, weight, saved = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx, gw, gb = linear_backward(x, weight, gy, saved, ctx.saves, ctx.has_bias, ctx.act, ctx.leaky_slope,
                                     ctx.math, ctx.autotune, need_x, need_w, need_b)
        return gx, gw, gb, None, None, None, None


def linear_backward(x, weight, gy, saved, saves, has_bias, act, leaky_slope, math, autotune, need_x, need_w, need_b):
    """The dense layer's gradients (gx shaped as x, gw, gb; None where not needed) by
    :func:`cygemm.gemm_ops.backward_into`, from `saved` (Z or y, as `saves` says, or None).

    The backward that :class:`LinearFunction` and the ``cygemm::linear`` operator run. Nothing
    is checked here: the arguments are what the forward had and saved. It runs on torch's
    current stream of x's device and allocates the gradients there, through torch.

    Parameters
    ----------
    x : torch CUDA tensor (..., in_features)
        The forward's input: float32, float16 or bfloat16.
    weight : torch CUDA tensor (out_features, in_features)
        The forward's weight, x's dtype.
    gy : torch CUDA tensor (..., out_features)
        dL/dy, the shape of the forward's output and x's dtype (a non-contiguous one is
        copied first).
    saved : torch CUDA tensor or None
        What the forward kept for this activation: the pre-activation Z ((rows, out_features),
        the forward's ``z_out``) where ``saves`` is "z", the output y where it is "y", None
        where it is None.
    saves : {"z", "y", None}
        Which `saved` is: "z" for activations whose derivative needs Z (gelu, gelu_erf, silu,
        leaky_relu of slope 0), "y" for the others, None for act "none".
    has_bias : bool
        Whether the layer has a bias (gb is computed only then).
    act, leaky_slope, math, autotune
        The forward's, as :func:`linear` takes them.
    need_x, need_w, need_b : bool
        Which of gx, gw and gb to compute (as ``ctx.needs_input_grad`` says).

    Returns
    -------
    gx : torch.Tensor or None
        dL/dx, x's shape, where ``need_x``.
    gw : torch.Tensor or None
        dL/dweight (out_features, in_features), where ``need_w``.
    gb : torch.Tensor or None
        dL/dbias (out_features,), where ``need_b`` and ``has_bias``.
    """
    n, k = weight.shape
    x2 = _rows(x, k)
    gy2 = gy.reshape(-1, n).contiguous()
    m = x2.shape[0]
    new = dict(dtype=x.dtype, device=x.device)
    gx = torch.empty((m, k), **new) if need_x else None
    gw = torch.empty((n, k), **new) if need_w else None
    gb = torch.empty((n,), **new) if need_b and has_bias else None
    dz = torch.empty((m, n), **new) if saves is not None and (need_x or need_w) else None
    saved2 = saved.reshape(-1, n) if saved is not None else None
    backward_into(x2, weight.T, gy2, saved2 if saves == "z" else None,
                  y=saved2 if saves == "y" else None, with_bias=gb is not None, act=act,
                  leaky_slope=leaky_slope, gA_out=gx, gB_out=None if gw is None else gw.T, gBias_out=gb,
                  work_dZ=dz, math=math, stream=_stream_of(x), autotune=autotune)
    return (None if gx is None else gx.view(x.shape)), gw, gb


def linear(x, weight, bias=None, *, act="none", leaky_slope=0.01, math="tf32", autotune=None):
    """``act(x @ weight.T + bias)`` through cygemm's dense layer, differentiable by torch.

    As ``torch.nn.functional.linear`` followed by the activation, with the weight stored
    (out_features, in_features) as ``torch.nn.Linear`` keeps it (read as ``weight.T`` in
    place, no copy).

    Parameters
    ----------
    x : torch CUDA tensor (..., in_features)
        float32, float16 or bfloat16.
    weight : torch CUDA tensor (out_features, in_features)
        x's dtype.
    bias : torch CUDA tensor (out_features,), optional
    act : str
        As :func:`cygemm.gemm_ops.forward_into`: "none", "relu", "leaky_relu" (``leaky_slope``),
        "gelu" (tanh approximation), "gelu_erf", "sigmoid", "tanh", "silu".
    math : {"tf32", "fp32", "cupy"}
        float32 products (float16 and bfloat16 accumulate in fp32 either way).
    autotune : {None, "off", "auto", "exhaustive"}
        As :func:`cygemm.gemm`.

    Returns
    -------
    torch.Tensor
        (..., out_features), x's dtype, from torch's allocator on torch's current stream. It
        has a ``grad_fn`` when grad mode is on and x, weight or bias requires grad;
        ``backward()`` then runs :func:`cygemm.gemm_ops.backward_into` on the stream torch's
        autograd engine makes current.

    Raises
    ------
    TypeError
        A tensor that is not a CUDA tensor (a CPU tensor says so), a dtype the dense layer
        does not take (float64: use :func:`cygemm.matmul`), dtypes that differ.
    ValueError
        Shapes that do not fit, an unknown activation or a negative ``leaky_slope``.
    """
    if torch.compiler.is_compiling():           # torch.compile: the custom operator, kept in its graph
        return ops.linear(x, weight, bias, act=act, leaky_slope=leaky_slope, math=math, autotune=autotune)
    x, weight, bias = _check_dense(x, weight, bias)
    leaky_slope = float(leaky_slope)
    if not (leaky_slope >= 0 and leaky_slope != float("inf")):
        raise ValueError(f"leaky_slope: expected a finite number >= 0, got {leaky_slope!r}")
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return LinearFunction.apply(x, weight, bias, act, leaky_slope, math, autotune)
    _saves(act, leaky_slope)        # the activation's name is checked on both paths alike
    return _dense_forward(x, weight, bias, act, leaky_slope, math, autotune, False)[0]


from cygemm.autograd import into_ops, ops  # noqa: E402,F401  (registers torch.ops.cygemm.*; needs the names above)
