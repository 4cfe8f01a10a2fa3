# cython: language_level=3
"""Allocation: new C-ordered arrays of the caller's library on the call's stream: CuPy arrays
from CuPy's pool, or, when an input is a torch tensor, torch tensors from torch's allocator.

Both pools hand out blocks by the current stream: a block freed on another stream may still
be in use there, so every allocation is made with the call's stream current. Refused (with
CaptureError) while that stream is being captured.
"""
import contextlib

from libc.stdint cimport uintptr_t

from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.engine.streams cimport stream_from_object
from cygemm.engine.errors cimport refuse_in_capture
from cygemm.engine.dtypes cimport dtype_name, is_fp8_type, DTYPES_GEMM
from cygemm.engine.dtypes import names, numpy_dtype, row_of_name

import numpy as _np

from cygemm.engine.arrays import CUPY as _cupy, CUPY_NDARRAY as _cupy_ndarray


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


def empty_on(tuple shape, dtype, uintptr_t ptr):
    """A C-ordered CuPy array allocated with the raw stream `ptr` current (no capture check)."""
    with stream_context(ptr):
        return _cupy.empty(shape, dtype=dtype)


cdef object empty_array(tuple shape, cudaDataType dtype, cudaStream_t stream, str what, object like=None):
    refuse_in_capture(stream, what)
    cdef bint fp8 = is_fp8_type(dtype)
    if like is not None:        # FP8 as torch's float8 dtype of the format
        return _torch_empty(like, shape, dtype_name(dtype), <uintptr_t>stream)
    if _cupy is None:
        raise RuntimeError(f"{what}: allocating needs CuPy; pass an existing array instead")
    # CuPy has no FP8 dtype: the codes as uint8 bytes
    return empty_on(shape, _np.dtype(_np.uint8) if fp8 else numpy_dtype(dtype_name(dtype)), <uintptr_t>stream)


cdef uintptr_t data_pointer(object x) except? 0:
    """The device address of an array empty_array made (a torch tensor or a CuPy array)."""
    if type(x) is _cupy_ndarray:
        return <uintptr_t>x.data.ptr
    return <uintptr_t>x.data_ptr()


# The dtypes a cygemm GEMM writes (int32: the int8 GEMM's exact result; int8: its scaled one).
RESULT_DTYPES = names(DTYPES_GEMM)


def empty(shape, dtype, stream=None, str what="the result", like=None):
    """A C-ordered array on `stream` (None: the current stream of `like`'s library): a torch tensor from torch's
    allocator on the device of the first torch tensor in `like` (an array or a tuple of
    them) when there is one, else a CuPy array from CuPy's pool. CaptureError, naming
    `what`, while the stream is being captured."""
    cdef cudaStream_t s
    tensor = first_torch(like) if type(like) is tuple else (like if like is not None and is_torch(like) else None)
    stream_from_object(stream, &s, tensor is not None)
    refuse_in_capture(s, f"{what}: allocating it uses device memory")
    name = str(dtype) if row_of_name(str(dtype)) is not None else _np.dtype(dtype).name
    if name not in RESULT_DTYPES:
        raise TypeError(f"dtype: expected one of {', '.join(RESULT_DTYPES)}, got {name}")
    if tensor is not None:
        return _torch_empty(tensor, tuple(shape), name, <uintptr_t>s)
    if _cupy is None:
        raise RuntimeError(f"{what}: allocating needs CuPy")
    return empty_on(tuple(shape), numpy_dtype(name), <uintptr_t>s)


# ------------------------------------------------------------ torch tensors

def as_cupy(x):
    """x as a CuPy array over the same memory: torch tensors through DLPack (torch's CAI
    refuses bfloat16 and tensors that require grad), other device arrays through their CAI or
    DLPack."""
    if type(x) is _cupy_ndarray:
        return x
    if is_torch(x):
        return _cupy.from_dlpack(x.detach())
    if hasattr(x, "__cuda_array_interface__"):
        return _cupy.asarray(x)
    return _cupy.from_dlpack(x)


cdef object first_torch(tuple arrays):
    for x in arrays:
        if x is not None and is_torch(x):
            return x
    return None


cdef object torch_dtype(object torch, cudaDataType t):
    return getattr(torch, dtype_name(t))


cdef object torch_stream(object torch, cudaStream_t s, object device):
    return torch.cuda.ExternalStream(<uintptr_t>s, device=device)


cdef object _torch_empty(object like, tuple shape, str dtype, uintptr_t s):
    """A C-ordered tensor on like's device from torch's caching allocator, which keeps a block
    for the stream current when it is allocated: so s is made current (when it is not)."""
    import torch
    dt = getattr(torch, dtype)
    if torch.cuda.current_stream(like.device).cuda_stream == s:
        return torch.empty(shape, dtype=dt, device=like.device)
    with torch.cuda.stream(torch_stream(torch, <cudaStream_t>s, like.device)):
        return torch.empty(shape, dtype=dt, device=like.device)


cdef object new_array(bint torch_lib, object like, tuple shape, cudaDataType t, cudaStream_t s):
    """A C-ordered array of the caller's library (torch_lib: a tensor on like's device), its
    memory ordered on stream s."""
    if torch_lib:
        return _torch_empty(like, shape, dtype_name(t), <uintptr_t>s)
    return empty(shape, dtype_name(t), <uintptr_t>s)
