"""Deprecated: small helpers cygemm.gemm_ops used to offer beside the dense layer's API.

They are re-exported from :mod:`cygemm.gemm_ops` for one release; each warns
(DeprecationWarning) when called, and they go in the release after. What to use instead is in
each warning: :func:`cygemm.stream_pointer` for the stream, the array's own ``shape``, ``dtype``
and ``__cuda_array_interface__`` for its layout, ``cupy.empty`` for a new array.
"""
import ctypes
import functools
import warnings
from typing import NamedTuple, Tuple

import numpy as np

from cygemm.engine import alloc as _alloc, arrays as _arrays, streams as _streams

__all__ = ["TensorDesc", "as_tensor_2d", "assert_f32_2d", "empty_2d", "empty_like_2d", "get_stream_ptr",
           "to_voidp_capsule", "ensure_cuda_dlls"]


def _deprecated(instead):
    """Make a helper warn, naming what to use instead, each time it is called."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            warnings.warn(f"cygemm.gemm_ops.{fn.__name__} is deprecated and will be removed in the next "
                          f"release: {instead}", DeprecationWarning, stacklevel=2)
            return fn(*args, **kwargs)
        return call
    return wrap


class _TensorDesc(NamedTuple):
    ptr: int
    rows: int
    cols: int
    ld: int
    dtype: str


class TensorDesc(_TensorDesc):
    """A 2-D device array as the Cython layer sees it (ld: elements between rows). Deprecated."""
    __slots__ = ()

    def __new__(cls, ptr, rows, cols, ld, dtype):
        warnings.warn("cygemm.gemm_ops.TensorDesc is deprecated and will be removed in the next release: "
                      "read the array's __cuda_array_interface__", DeprecationWarning, stacklevel=2)
        return super().__new__(cls, ptr, rows, cols, ld, dtype)


def _shape(x):
    return tuple(getattr(x, "shape", None) or x.__cuda_array_interface__["shape"])


def _describe_2d(x, name):
    d = _arrays.describe_array(x, name)
    if d["batch"] != 1 or len(_shape(x)) != 2:
        raise ValueError(f"{name}: expected a 2-D array, got shape {_shape(x)}")
    if d["col_stride"] != 1 and d["cols"] > 1:
        raise ValueError(f"{name}: expected unit stride along the last axis, got {d['col_stride']} elements")
    # _make builds the tuple without TensorDesc.__new__: one warning per call, the caller's.
    return TensorDesc._make((d["ptr"], d["rows"], d["cols"], d["row_stride"], d["dtype"]))


@_deprecated("read the array's shape, dtype and __cuda_array_interface__")
def as_tensor_2d(x, name="x") -> TensorDesc:
    """Describe a row-major 2-D device array (unit stride along its last axis);
    errors name the argument as `name`."""
    return _describe_2d(x, name)


@_deprecated("check the array's shape and dtype")
def assert_f32_2d(x, name="x") -> Tuple[int, int]:
    """(rows, cols) of a row-major 2-D float32 device array; TypeError/ValueError otherwise."""
    d = _describe_2d(x, name)
    if d.dtype != np.dtype(np.float32).name:
        raise TypeError(f"{name}: expected float32, got {d.dtype}")
    return d.rows, d.cols


@_deprecated("use cupy.empty with the stream current")
def empty_2d(rows, cols, dtype=np.float32, stream=None):
    """An uninitialised (rows, cols) CuPy array from CuPy's pool on `stream` (None: CuPy's
    current stream), so that its memory is ordered with the work enqueued there."""
    return _alloc.empty((rows, cols), dtype, stream)


@_deprecated("use cupy.empty_like with the stream current")
def empty_like_2d(x, stream=None):
    """An uninitialised array of the shape and dtype of the 2-D device array `x`, on `stream`."""
    d = _arrays.describe_array(x)
    if d["batch"] != 1 or len(_shape(x)) != 2:
        raise ValueError(f"x: expected a 2-D array, got shape {_shape(x)}")
    return _alloc.empty((d["rows"], d["cols"]), d["dtype"], stream)


@_deprecated("use cygemm.stream_pointer")
def get_stream_ptr(stream=None) -> int:
    """The cudaStream_t (int) of None (CuPy's current stream), a Stream object or an int."""
    return _streams.stream_pointer(stream)


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


@_deprecated("make the capsule with ctypes.pythonapi.PyCapsule_New")
def to_voidp_capsule(ptr: int):
    """A PyCapsule (unnamed) holding `ptr` as void*, for extensions that take one."""
    if not ptr:
        raise ValueError("ptr: expected a non-null address, got 0")   # PyCapsule cannot hold NULL
    return _PyCapsule_New(ptr, None, None)


@_deprecated("cygemm is Linux-only and loads cuBLAS at import; nothing is needed")
def ensure_cuda_dlls():
    """Does nothing and returns ``[]`` (no DLL folders added): cygemm is Linux-only, and
    cygemm.engine.cuda_paths loads cuBLAS at import."""
    return []
