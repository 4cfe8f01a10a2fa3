# cython: language_level=3
"""Allocation: new C-ordered CuPy arrays from CuPy's pool on the call's stream.

CuPy's pool hands out blocks by the current stream: a block freed on another stream may still
be in use there, so every allocation is made with the call's stream current. Refused (with
CaptureError) while that stream is being captured.
"""
import contextlib

from libc.stdint cimport uintptr_t

from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm._streams cimport stream_from_object
from cygemm._errors cimport refuse_in_capture
from cygemm._arrays cimport dtype_name

import numpy as _np

try:
    import cupy as _cupy
except ImportError:
    _cupy = None


class _RawStream:
    """A cudaStream_t as the CUDA stream protocol (__cuda_stream__) presents it."""
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


cdef object _cupy_stream(uintptr_t ptr):
    """A CuPy stream object for the raw stream `ptr`, to make it CuPy's current stream."""
    from_external = getattr(_cupy.cuda.Stream, "from_external", None)     # CuPy >= 14
    if from_external is not None:
        return from_external(_RawStream(ptr))
    return _cupy.cuda.ExternalStream(ptr)


def stream_context(uintptr_t ptr):
    """A context manager that makes the raw stream `ptr` CuPy's current stream (nothing
    when it is already), so CuPy's allocations and kernels go to it."""
    if _cupy.cuda.get_current_stream().ptr == ptr:
        return contextlib.nullcontext()
    return _cupy_stream(ptr)


def numpy_dtype(name):
    """The NumPy dtype CuPy allocates for `name` (bfloat16 through ml_dtypes, as CuPy 14 reads it)."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError("bfloat16: allocating a CuPy bfloat16 array needs the ml_dtypes package "
                            "(pip install ml_dtypes), or pass torch tensors / out=") from None
        return _np.dtype(ml_dtypes.bfloat16)
    return _np.dtype(name)


def empty_on(tuple shape, dtype, uintptr_t ptr):
    """A C-ordered CuPy array allocated with the raw stream `ptr` current (no capture check)."""
    with stream_context(ptr):
        return _cupy.empty(shape, dtype=dtype)


cdef object empty_array(tuple shape, cudaDataType dtype, cudaStream_t stream, str what):
    refuse_in_capture(stream, what)
    if _cupy is None:
        raise RuntimeError(f"{what}: allocating needs CuPy; pass an existing array instead")
    return empty_on(shape, numpy_dtype(dtype_name(dtype)), <uintptr_t>stream)


def empty(shape, dtype, stream=None, str what="the result"):
    """A C-ordered CuPy array from CuPy's pool on `stream` (None: CuPy's current stream).
    CaptureError, naming `what`, while the stream is being captured."""
    cdef cudaStream_t s
    stream_from_object(stream, &s)
    refuse_in_capture(s, f"{what}: allocating it uses device memory")
    name = str(dtype) if str(dtype) == "bfloat16" else _np.dtype(dtype).name
    if name not in ("float32", "float16", "float64", "bfloat16"):
        raise TypeError(f"dtype: expected float16, bfloat16, float32 or float64, got {name}")
    if _cupy is None:
        raise RuntimeError(f"{what}: allocating needs CuPy")
    return empty_on(tuple(shape), numpy_dtype(name), <uintptr_t>s)
