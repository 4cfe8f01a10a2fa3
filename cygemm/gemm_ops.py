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
from typing import NamedTuple, Optional, Tuple

import numpy as np

from cygemm import _core
from cygemm.fused import ACTIVATIONS, backward_into, clear_plan_cache, forward_into, parse_activation

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
        parse_activation(act)                       # ValueError names the valid ones
        slope = float(leaky_slope)
        if not np.isfinite(slope) or slope < 0:
            raise ValueError(f"leaky_slope: expected a finite number >= 0, got {leaky_slope!r}")
        return cls(act.lower(), bool(with_bias), slope)

    def kwargs(self):
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
    d = _core.describe_array(x, name)
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
    """An uninitialised (rows, cols) CuPy array (from CuPy's pool, on its current stream)."""
    import cupy as cp
    return cp.empty((rows, cols), dtype=dtype)


def empty_like_2d(x, stream=None):
    d = as_tensor_2d(x)
    return empty_2d(d.rows, d.cols, d.dtype, stream)


def get_stream_ptr(stream=None) -> int:
    """The cudaStream_t (int) of None (CuPy's current stream), a Stream object or an int."""
    return _core.stream_pointer(stream)


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
    elsewhere nothing is needed (the build's rpath and cygemm._libs cover it)."""
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

class GemmWorkspaces(NamedTuple):
    """dZ: the backward's (M, N) buffer; lt_ws: cuBLASLt workspace bytes."""
    dZ: object
    lt_ws: object


_ws_cache = {}
_ws_lock = threading.Lock()
# A captured graph keeps what it may use alive, so clear_ws_cache never frees under it.
_core.register_graph_keepalive(lambda: list(_ws_cache.values()))


def _refuse_if_capturing(stream, what):
    if _core.is_capturing(stream):
        raise RuntimeError(f"{what} would allocate device memory while the stream is being captured; "
                           "allocate (or call ensure_workspaces) once before capturing")


def ensure_workspaces(M, N, lt_bytes=4 << 20, dtype=np.float32, stream=None) -> GemmWorkspaces:
    """Workspaces for layers of output (M, N), cached by (device, M, N, lt_bytes, dtype)."""
    import cupy as cp
    if min(M, N) < 0 or lt_bytes < 0:
        raise ValueError(f"M, N, lt_bytes: expected sizes >= 0, got {M}, {N}, {lt_bytes}")
    dtype = np.dtype(dtype)
    key = (cp.cuda.Device().id, int(M), int(N), int(lt_bytes), dtype.str)
    with _ws_lock:
        ws = _ws_cache.get(key)
        if ws is None:
            _refuse_if_capturing(stream, "ensure_workspaces")
            ws = GemmWorkspaces(cp.empty((M, N), dtype), cp.empty(lt_bytes, cp.uint8))
            _ws_cache[key] = ws
        return ws


def clear_ws_cache():
    """Forget cached workspaces. Memory a live captured graph uses stays until the graph goes."""
    with _ws_lock:
        _ws_cache.clear()


def ws_cache_keys():
    with _ws_lock:
        return list(_ws_cache)


# ------------------------------------------------------------------ allocating forms

def forward(A, B, bias=None, *, with_bias=True, act="none", leaky_slope=0.01, save_z=False,
            lt_workspace=None, math="tf32", stream=None):
    """(Y, Z): Y = act(A @ B + bias), Z = A @ B + bias when save_z (else None). Allocates Y, Z."""
    a, b = as_tensor_2d(A, "A"), as_tensor_2d(B, "B")
    _refuse_if_capturing(stream, "forward()")
    Y = empty_2d(a.rows, b.cols, a.dtype, stream)
    Z = empty_2d(a.rows, b.cols, a.dtype, stream) if save_z else None
    forward_into(A, B, Y, bias, with_bias=with_bias, act=act, leaky_slope=leaky_slope, save_z=save_z,
                 z_out=Z, lt_workspace=lt_workspace, math=math, stream=stream)
    return Y, Z


def backward(A, B, gY, Z, *, with_bias=True, act="none", leaky_slope=0.01, need_gA=True, need_gB=True,
             lt_workspace=None, math="tf32", stream=None, work_dZ: Optional[object] = None, y=None):
    """(gA, gB, gBias): allocated gradients (None where not needed or without bias)."""
    a, b = as_tensor_2d(A, "A"), as_tensor_2d(B, "B")
    _refuse_if_capturing(stream, "backward()")
    gA = empty_2d(a.rows, a.cols, a.dtype, stream) if need_gA else None
    gB = empty_2d(b.rows, b.cols, b.dtype, stream) if need_gB else None
    gBias = empty_2d(1, b.cols, b.dtype, stream).reshape(b.cols) if with_bias else None
    if work_dZ is None and parse_activation(act) != 0 and (need_gA or need_gB):
        work_dZ = ensure_workspaces(a.rows, b.cols, 0, a.dtype, stream).dZ
    backward_into(A, B, gY, Z, with_bias=with_bias, act=act, leaky_slope=leaky_slope, gA_out=gA, gB_out=gB,
                  gBias_out=gBias, work_dZ=work_dZ, lt_workspace=lt_workspace, math=math, stream=stream, y=y)
    return gA, gB, gBias
