"""cygemm's grouped (mixture-of-experts) GEMMs as torch custom operators: the ``cygemm::moe_*``
rows of :mod:`cygemm.autograd.ops`' table, which exports the functions below."""
from typing import List, Optional

import torch

from cygemm import grouped
from cygemm.autograd import _OUT_DTYPES, _stream_of

__all__ = ["moe_gemm", "moe_gemm_wgrad", "moe_scaled_gemm"]

_Tensor = torch.Tensor


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