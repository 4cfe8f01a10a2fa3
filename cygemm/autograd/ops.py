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
from typing import Optional, Tuple

import torch

import cygemm
from cygemm import fp8
from cygemm.autograd import _OUT_DTYPES, _dense_forward, _matrix_grads, _saves, _stream_of, linear_backward

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


from cygemm.autograd.moe_ops import moe_gemm, moe_gemm_wgrad, moe_scaled_gemm  # noqa: E402,F401
