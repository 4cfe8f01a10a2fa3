"""The dense-layer API users call: fused forward/backward into their own buffers, the
allocating conveniences, and cached workspaces for graph capture.

    ws = ensure_workspaces(M, N)
    forward_into(A, W, Y, b, act="relu", save_z=True, z_out=Z, stream=s)
    backward_into(A, W, gY, Z, act="relu", gA_out=gA, gB_out=gW, gBias_out=gb, work_dZ=ws.dZ, stream=s)
"""
from typing import Any, NamedTuple

import numpy as np

from cygemm.engine import alloc as _alloc, context as _context, errors as _errors
from cygemm.dense import (ACTIVATIONS, backward_into, clear_plan_cache, forward_into, layer_shape,
                          parse_activation)

__all__ = ["forward_into", "backward_into", "forward", "backward", "GemmWorkspaces", "ensure_workspaces",
           "clear_ws_cache", "clear_plan_cache", "ActAttrs", "parse_activation", "ACTIVATIONS"]


# ------------------------------------------------------------------ attributes

class ActAttrs(NamedTuple):
    """What a layer's epilogue is: activation, whether it has a bias, leaky_relu's slope.

    Constructed directly, nothing is checked: :meth:`make` checks the values first.

    Parameters
    ----------
    act : str
        The activation's name, as :func:`cygemm.gemm_ops.forward_into` takes it: "none"
        (default), "relu", "leaky_relu", "gelu", "gelu_erf", "sigmoid", "tanh" or "silu".
    with_bias : bool
        Whether the layer adds a bias (default True).
    leaky_slope : float
        leaky_relu's slope for negative inputs (default 0.01); unused by the other activations.
    """
    act: str = "none"
    with_bias: bool = True
    leaky_slope: float = 0.01

    @classmethod
    def make(cls, act="none", with_bias=True, leaky_slope=0.01):
        """Checked attributes: ValueError names an unknown activation or a negative or
        non-finite `leaky_slope`.

        Parameters
        ----------
        act : str
            An activation name, case-insensitive (stored lower-case): as :class:`ActAttrs`,
            "identity" too.
        with_bias : bool
            True or False (Python's or NumPy's bool; not another truthy object).
        leaky_slope : float
            A finite number >= 0 (stored as a float).

        Returns
        -------
        ActAttrs

        Raises
        ------
        ValueError
            An unknown activation, or a negative or non-finite ``leaky_slope``.
        TypeError
            A ``with_bias`` that is not a bool.
        """
        parse_activation(act)                       # ValueError names the valid ones
        slope = float(leaky_slope)
        if not np.isfinite(slope) or slope < 0:
            raise ValueError(f"leaky_slope: expected a finite number >= 0, got {leaky_slope!r}")
        return cls(act.lower(), _errors.check_flag(with_bias, "with_bias"), slope)

    def kwargs(self):
        """The attributes as keyword arguments of ``forward_into`` and ``backward_into``."""
        return {"act": self.act, "with_bias": self.with_bias, "leaky_slope": self.leaky_slope}


# ------------------------------------------------------------------ workspaces
# Cached in the engine's per-stream buffers (cygemm.engine.context.stream_buffer): one set per
# (device, stream, name, shape, dtype), allocated on that stream, kept alive by graphs captured
# while they exist.

class GemmWorkspaces(NamedTuple):
    """dZ: the backward's (M, N) buffer; lt_ws: cuBLASLt workspace bytes (None when lt_bytes=0).

    What :func:`ensure_workspaces` returns; a named tuple, so ``dZ, lt_ws = ws`` unpacks it.

    Parameters
    ----------
    dZ : cupy.ndarray (M, N)
        C-ordered, of :func:`ensure_workspaces`'s ``dtype``: pass it as ``work_dZ`` to
        :func:`cygemm.gemm_ops.backward_into`.
    lt_ws : cupy.ndarray (lt_bytes,) of uint8, or None
        A cuBLASLt workspace to pass as ``lt_workspace``; None when ``lt_bytes`` was 0.
    """
    dZ: Any
    lt_ws: Any


def ensure_workspaces(M, N, lt_bytes=4 << 20, dtype=np.float32, stream=None) -> GemmWorkspaces:
    """Buffers for the backward of layers of output (M, N) on `stream`, made once and cached.

    Parameters
    ----------
    M, N : int
        The layer's output shape; ``dZ`` is (M, N).
    lt_bytes : int
        Size of ``lt_ws`` (a cuBLASLt workspace to pass as ``lt_workspace``); 0 for none.
    dtype : dtype
        ``dZ``'s dtype (float32 or float16).
    stream : optional
        The stream the buffers will be used on (None: CuPy's current stream).

    Returns
    -------
    GemmWorkspaces
        ``(dZ, lt_ws)``, cached by (device, stream, M, N, dtype, lt_bytes) and allocated on
        that stream: work on one stream is serial, so two calls never share them at once;
        another stream (or thread on its own stream) gets its own.

    Raises
    ------
    ValueError, TypeError
        A size that is negative, or not an int (the message names it).
    CaptureError
        The first call for a key while the stream is being captured (allocate before).
    """
    M, N, lt_bytes = (_errors.check_size(v, name) for v, name in ((M, "M"), (N, "N"), (lt_bytes, "lt_bytes")))
    dtype = np.dtype(dtype)
    dZ = _context.stream_buffer("dZ", (int(M), int(N)), dtype.name, stream, _alloc.empty_on)
    lt_ws = None
    if lt_bytes:
        lt_ws = _context.stream_buffer("lt_ws", (int(lt_bytes),), np.uint8, stream, _alloc.empty_on)
    return GemmWorkspaces(dZ, lt_ws)


def clear_ws_cache():
    """Forget the buffers of ensure_workspaces. Memory a live captured graph uses stays until the graph goes."""
    _context.clear_stream_buffers()


def ws_cache_keys():
    """The keys (device, stream, name, shape, dtype) of the cached buffers."""
    return _context.stream_buffer_keys()


# ------------------------------------------------------------------ allocating forms

def forward(A, B, bias=None, *, with_bias=True, act="none", leaky_slope=0.01, save_z=False,
            lt_workspace=None, math="tf32", stream=None, autotune=None, determinism=None):
    """Y = act(A @ B + bias), allocating Y (and Z = A @ B + bias with save_z).

    Takes every layout and argument that :func:`forward_into` takes (``W.T`` included) but the
    outputs ``out`` and ``z_out``, which it allocates on `stream`, in the inputs' library: torch
    tensors from torch's allocator when A or B is a torch tensor, else CuPy arrays from CuPy's
    pool.

    Parameters
    ----------
    A, B, bias, with_bias, act, leaky_slope, save_z, lt_workspace, math, stream, autotune, determinism
        As :func:`forward_into`.

    Returns
    -------
    (Y, Z)
        Row-major (M, N) arrays; Z is None unless save_z.

    Raises
    ------
    TypeError, ValueError
        As forward_into; A and B are checked before anything is allocated, the rest after.
    CaptureError
        The stream is being captured (use forward_into with buffers made before).
    """
    save_z = _errors.check_flag(save_z, "save_z")      # (before anything is allocated)
    M, K, N, dtype = layer_shape(A, B)
    Y = _alloc.empty((M, N), dtype, stream, "forward(): Y", like=(A, B))
    Z = _alloc.empty((M, N), dtype, stream, "forward(): Z", like=(A, B)) if save_z else None
    forward_into(A, B, Y, bias, with_bias=with_bias, act=act, leaky_slope=leaky_slope, save_z=save_z,
                 z_out=Z, lt_workspace=lt_workspace, math=math, stream=stream, autotune=autotune,
                 determinism=determinism)
    return Y, Z


def backward(A, B, gY, Z, *, with_bias=True, act="none", leaky_slope=0.01, need_gA=True, need_gB=True,
             lt_workspace=None, math="tf32", stream=None, work_dZ=None, y=None, autotune=None, determinism=None):
    """Gradients of Y = act(A @ B + bias), allocated: see :func:`backward_into`.

    The gradients and, when needed and not given, the dZ buffer are allocated on `stream` for
    this call alone, in the inputs' library as :func:`forward` does, so concurrent calls on
    other streams or threads never share them. gB has B's shape and is C-ordered (for
    ``B = W.T`` its transpose is W's gradient).

    Parameters
    ----------
    A, B, gY, Z, with_bias, act, leaky_slope, lt_workspace, math, stream, work_dZ, y, autotune, determinism
        As :func:`backward_into`.
    need_gA, need_gB : bool
        Whether to compute (and allocate) gA and gB.

    Returns
    -------
    (gA, gB, gBias)
        None where not needed (``need_gA``/``need_gB`` False, or no bias).

    Raises
    ------
    TypeError, ValueError, CaptureError
        As :func:`forward` raises them, for :func:`backward_into`'s arguments.
    """
    with_bias = _errors.check_flag(with_bias, "with_bias")     # (before anything is allocated)
    need_gA, need_gB = _errors.check_flag(need_gA, "need_gA"), _errors.check_flag(need_gB, "need_gB")
    M, K, N, dtype = layer_shape(A, B)
    like = (A, B)
    gA = _alloc.empty((M, K), dtype, stream, "backward(): gA", like=like) if need_gA else None
    gB = _alloc.empty((K, N), dtype, stream, "backward(): gB", like=like) if need_gB else None
    gBias = _alloc.empty((N,), dtype, stream, "backward(): gBias", like=like) if with_bias else None
    if work_dZ is None and parse_activation(act) != 0 and (need_gA or need_gB):
        work_dZ = _alloc.empty((M, N), dtype, stream, "backward(): dZ", like=like)
    backward_into(A, B, gY, Z, with_bias=with_bias, act=act, leaky_slope=leaky_slope, gA_out=gA, gB_out=gB,
                  gBias_out=gBias, work_dZ=work_dZ, lt_workspace=lt_workspace, math=math, stream=stream, y=y,
                  autotune=autotune, determinism=determinism)
    return gA, gB, gBias
