"""The dense-layer API users call: fused forward/backward into their own buffers, the
allocating conveniences, cached workspaces for graph capture, and small helpers.

    ws = ensure_workspaces(M, N)
    forward_into(A, W, Y, b, act="relu", save_z=True, z_out=Z, stream=s)
    backward_into(A, W, gY, Z, act="relu", gA_out=gA, gB_out=gW, gBias_out=gb, work_dZ=ws.dZ, stream=s)
"""
import ctypes
import os
import sys
import threading
from typing import Any, NamedTuple, Optional, Tuple

import numpy as np

from cygemm import _alloc, _arrays, _context, _streams
from cygemm._errors import CaptureError
from cygemm.dense import (ACTIVATIONS, backward_into, clear_plan_cache, forward_into, layer_shape,
                          parse_activation)

__all__ = ["forward_into", "backward_into", "forward", "backward", "GemmWorkspaces", "ensure_workspaces",
           "clear_ws_cache", "clear_plan_cache", "ActAttrs", "parse_activation", "ACTIVATIONS",
           "TensorDesc", "as_tensor_2d", "assert_f32_2d", "empty_2d", "empty_like_2d",
           "get_stream_ptr", "to_voidp_capsule", "ensure_cuda_dlls"]


# ------------------------------------------------------------------ attributes and helpers

class ActAttrs(NamedTuple):
    """What a layer's epilogue is: activation, whether it has a bias, leaky_relu's slope."""
    act: str = "none"
    with_bias: bool = True
    leaky_slope: float = 0.01

    @classmethod
    def make(cls, act="none", with_bias=True, leaky_slope=0.01):
        """Checked attributes: ValueError names an unknown activation or a negative or
        non-finite `leaky_slope`."""
        parse_activation(act)                       # ValueError names the valid ones
        slope = float(leaky_slope)
        if not np.isfinite(slope) or slope < 0:
            raise ValueError(f"leaky_slope: expected a finite number >= 0, got {leaky_slope!r}")
        return cls(act.lower(), bool(with_bias), slope)

    def kwargs(self):
        """The attributes as keyword arguments of ``forward_into`` and ``backward_into``."""
        return {"act": self.act, "with_bias": self.with_bias, "leaky_slope": self.leaky_slope}


class TensorDesc(NamedTuple):
    """A 2-D device array as the Cython layer sees it (ld: elements between rows)."""
    ptr: int
    rows: int
    cols: int
    ld: int
    dtype: str


def as_tensor_2d(x, name="x") -> TensorDesc:
    """Describe a row-major 2-D device array (unit stride along its last axis);
    errors name the argument as `name`."""
    d = _arrays.describe_array(x, name)
    if d["batch"] != 1 or len(_shape(x)) != 2:
        raise ValueError(f"{name}: expected a 2-D array, got shape {_shape(x)}")
    if d["col_stride"] != 1 and d["cols"] > 1:
        raise ValueError(f"{name}: expected unit stride along the last axis, got {d['col_stride']} elements")
    return TensorDesc(d["ptr"], d["rows"], d["cols"], d["row_stride"], d["dtype"])


def assert_f32_2d(x, name="x") -> Tuple[int, int]:
    """(rows, cols) of a row-major 2-D float32 device array; TypeError/ValueError otherwise."""
    d = as_tensor_2d(x, name)
    if d.dtype != "float32":
        raise TypeError(f"{name}: expected float32, got {d.dtype}")
    return d.rows, d.cols


def _shape(x):
    return tuple(getattr(x, "shape", None) or x.__cuda_array_interface__["shape"])


def empty_2d(rows, cols, dtype=np.float32, stream=None):
    """An uninitialised (rows, cols) CuPy array from CuPy's pool on `stream` (None: CuPy's
    current stream), so that its memory is ordered with the work enqueued there."""
    return _alloc.empty((rows, cols), dtype, stream)


def empty_like_2d(x, stream=None):
    """An uninitialised array of the shape and dtype of the 2-D device array `x`, on `stream`."""
    d = _arrays.describe_array(x)
    if d["batch"] != 1 or len(_shape(x)) != 2:
        raise ValueError(f"x: expected a 2-D array, got shape {_shape(x)}")
    return empty_2d(d["rows"], d["cols"], d["dtype"], stream)


def get_stream_ptr(stream=None) -> int:
    """The cudaStream_t (int) of None (CuPy's current stream), a Stream object or an int."""
    return _streams.stream_pointer(stream)


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def to_voidp_capsule(ptr: int):
    """A PyCapsule (unnamed) holding `ptr` as void*, for extensions that take one."""
    if not ptr:
        raise ValueError("ptr: expected a non-null address, got 0")   # PyCapsule cannot hold NULL
    return _PyCapsule_New(ptr, None, None)


def ensure_cuda_dlls():
    """On Windows, add the CUDA toolkit's and the pip wheels' DLL folders to the search path;
    elsewhere nothing is needed (cygemm._cuda_paths loads cuBLAS at import)."""
    if sys.platform != "win32":
        return []
    added = []
    roots = [os.environ.get("CUDA_PATH", ""), *sys.path]
    for root in roots:
        for sub in ("bin", os.path.join("nvidia", "cu13", "bin"), os.path.join("nvidia", "cublas", "bin")):
            d = os.path.join(root, sub)
            if root and os.path.isdir(d):
                os.add_dll_directory(d)
                added.append(d)
    return added


# ------------------------------------------------------------------ workspaces

# Buffers of ensure_workspaces (the backward's dZ, a cuBLASLt workspace), one set per
# (device, stream, name, shape, dtype): work on one stream is serial, so they are never used
# by two kernels at once. Allocated on that stream; process-wide, under a lock. A graph
# captured while they exist keeps them alive (registered with the context's keepalive).
_stream_buffers = {}
_stream_buffers_lock = threading.Lock()


def _stream_buffer(name, shape, dtype, stream=None):
    ptr = _streams.stream_pointer(stream)
    key = (_context.current_device(), ptr, name, shape, str(dtype))
    with _stream_buffers_lock:
        buf = _stream_buffers.get(key)
        if buf is None:
            if _streams.is_capturing(ptr):
                raise CaptureError(f"{name}: allocating it would break the stream's capture; call "
                                   "ensure_workspaces once on this stream before capturing")
            buf = _alloc.empty_on(shape, dtype, ptr)
            _stream_buffers[key] = buf
        return buf


def _all_stream_buffers():
    with _stream_buffers_lock:
        return list(_stream_buffers.values())


_context.add_capture_keepalive(_all_stream_buffers)

class GemmWorkspaces(NamedTuple):
    """dZ: the backward's (M, N) buffer; lt_ws: cuBLASLt workspace bytes (None when lt_bytes=0)."""
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
    ValueError
        Negative sizes.
    CaptureError
        The first call for a key while the stream is being captured (allocate before).
    """
    if min(M, N) < 0 or lt_bytes < 0:
        raise ValueError(f"M, N, lt_bytes: expected sizes >= 0, got {M}, {N}, {lt_bytes}")
    dtype = np.dtype(dtype)
    dZ = _stream_buffer("dZ", (int(M), int(N)), dtype.name, stream)
    lt_ws = _stream_buffer("lt_ws", (int(lt_bytes),), "uint8", stream) if lt_bytes else None
    return GemmWorkspaces(dZ, lt_ws)


def clear_ws_cache():
    """Forget the buffers of ensure_workspaces. Memory a live captured graph uses stays until the graph goes."""
    with _stream_buffers_lock:
        _stream_buffers.clear()


def ws_cache_keys():
    """The keys (device, stream, name, shape, dtype) of the cached buffers."""
    with _stream_buffers_lock:
        return list(_stream_buffers)


# ------------------------------------------------------------------ allocating forms

def forward(A, B, bias=None, *, with_bias=True, act="none", leaky_slope=0.01, save_z=False,
            lt_workspace=None, math="tf32", stream=None):
    """Y = act(A @ B + bias), allocating Y (and Z = A @ B + bias with save_z).

    Takes every layout and argument that :func:`forward_into` takes (``W.T`` included) and
    allocates the results from CuPy's pool on `stream`.

    Returns
    -------
    (Y, Z)
        Row-major (M, N) CuPy arrays; Z is None unless save_z.

    Raises
    ------
    TypeError, ValueError
        As forward_into; A and B are checked before anything is allocated, the rest after.
    CaptureError
        The stream is being captured (use forward_into with buffers made before).
    """
    M, K, N, dtype = layer_shape(A, B)
    Y = _alloc.empty((M, N), dtype, stream, "forward(): Y")
    Z = _alloc.empty((M, N), dtype, stream, "forward(): Z") if save_z else None
    forward_into(A, B, Y, bias, with_bias=with_bias, act=act, leaky_slope=leaky_slope, save_z=save_z,
                 z_out=Z, lt_workspace=lt_workspace, math=math, stream=stream)
    return Y, Z


def backward(A, B, gY, Z, *, with_bias=True, act="none", leaky_slope=0.01, need_gA=True, need_gB=True,
             lt_workspace=None, math="tf32", stream=None, work_dZ=None, y=None):
    """Gradients of Y = act(A @ B + bias), allocated: see :func:`backward_into`.

    The gradients and, when needed and not given, the dZ buffer are allocated from CuPy's pool on
    `stream` for this call alone, so concurrent calls on other streams or threads never share
    them. gB has B's shape and is C-ordered (for ``B = W.T`` its transpose is W's gradient).

    Returns
    -------
    (gA, gB, gBias)
        None where not needed (``need_gA``/``need_gB`` False, or no bias).

    Raises
    ------
    TypeError, ValueError
        As backward_into; A and B are checked before anything is allocated, the rest after.
    CaptureError
        The stream is being captured (use backward_into with buffers made before).
    """
    M, K, N, dtype = layer_shape(A, B)
    gA = _alloc.empty((M, K), dtype, stream, "backward(): gA") if need_gA else None
    gB = _alloc.empty((K, N), dtype, stream, "backward(): gB") if need_gB else None
    gBias = _alloc.empty((N,), dtype, stream, "backward(): gBias") if with_bias else None
    if work_dZ is None and parse_activation(act) != 0 and (need_gA or need_gB):
        work_dZ = _alloc.empty((M, N), dtype, stream, "backward(): dZ")
    backward_into(A, B, gY, Z, with_bias=with_bias, act=act, leaky_slope=leaky_slope, gA_out=gA, gB_out=gB,
                  gBias_out=gBias, work_dZ=work_dZ, lt_workspace=lt_workspace, math=math, stream=stream, y=y)
    return gA, gB, gBias
