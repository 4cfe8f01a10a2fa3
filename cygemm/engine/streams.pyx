# cython: language_level=3, boundscheck=False, wraparound=False
"""Streams as cygemm's arguments name them, whether one is being captured, and its device."""
import sys

from libc.stdint cimport uintptr_t

from cygemm.bindings.cudart cimport *
from cygemm.engine.errors cimport check_cuda, check_driver, cuda_error
from cygemm.engine.errors import CudaError, CaptureError
from cygemm.engine.arrays cimport is_torch

try:
    import cupy as _cupy
    _current_stream = _cupy.cuda.get_current_stream
except ImportError:  # cupy is needed only for stream=None
    _current_stream = None


cdef object _cupy_current_stream_ptr():
    """CuPy's current stream; CuPy's own CUDA error as cygemm's (NoGpuError, only the plain-words
    reason, where no GPU is usable; else CudaError)."""
    try:
        return _current_stream().ptr
    except Exception as exc:
        status = getattr(exc, "status", None)
        if type(exc).__name__ == "CUDARuntimeError" and isinstance(status, int):
            err = cuda_error(status, "cupy.cuda.get_current_stream (stream=None)")
            if type(err) is not CudaError:
                raise err from None          # CuPy's status text would only mislead
            raise err from exc
        raise


cdef uintptr_t _torch_current_stream_ptr() except? 0:
    """torch's current stream on torch's current device (torch is imported: a tensor came)."""
    return <uintptr_t>sys.modules["torch"].cuda.current_stream().cuda_stream


cdef int check_stream_arg(object stream) except -1:
    """stream_from_object's rules, without asking for a current stream (describe_*: no GPU)."""
    cdef cudaStream_t unused
    return 0 if stream is None else stream_from_object(stream, &unused)


cdef int stream_from_object(object stream, cudaStream_t* out, bint torch_arrays=False) except -1:
    # stream=None, in every entry point: the current stream of the arrays' library. torch's
    # streams are non-blocking, so work on a torch stream is ordered only with torch's current one.
    if stream is None:
        if torch_arrays:
            out[0] = <cudaStream_t>_torch_current_stream_ptr()
            return 0
        out[0] = <cudaStream_t><uintptr_t>(_cupy_current_stream_ptr() if _current_stream is not None else 0)
    elif type(stream) is int:
        if stream < 0:
            raise ValueError(f"stream: expected a cudaStream_t handle (int >= 0), got {stream}")
        out[0] = <cudaStream_t><uintptr_t>stream
    elif hasattr(stream, "ptr"):                 # cupy.cuda.Stream / ExternalStream
        out[0] = <cudaStream_t><uintptr_t>stream.ptr
    elif hasattr(stream, "__cuda_stream__"):     # CUDA stream protocol (cuda.core, numba)
        out[0] = <cudaStream_t><uintptr_t>stream.__cuda_stream__()[1]
    elif hasattr(stream, "cuda_stream"):         # torch.cuda.Stream
        out[0] = <cudaStream_t><uintptr_t>stream.cuda_stream
    else:
        raise TypeError("stream: expected None, a cupy.cuda.Stream, an object with "
                        f"__cuda_stream__, or an int cudaStream_t; got {type(stream).__name__}")
    return 0


cdef bint stream_is_capturing(cudaStream_t stream) except -1 nogil:
    cdef cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone
    check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing")
    return status != cudaStreamCaptureStatusNone


cdef int check_capture_alive(cudaStream_t stream) except -1:
    cdef cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone
    check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing")
    if status == cudaStreamCaptureStatusInvalidated:
        raise CaptureError("cublasLtMatmul invalidated the stream's capture; call the function once "
                           "before capturing, or capture with mode='relaxed'")
    return 0


def is_capturing(stream=None):
    """Whether `stream` (as cygemm resolves it) is being captured into a CUDA graph."""
    cdef cudaStream_t s
    stream_from_object(stream, &s)
    return stream_is_capturing(s)


def exchange_capture_mode(int mode):
    """cudaThreadExchangeStreamCaptureMode for this thread: set `mode` (0 global, 1 thread local,
    2 relaxed), return the one it replaces. Relaxed lets this thread allocate and synchronize
    other streams while some stream is captured (the first-use checks, cygemm.engine.promises)."""
    cdef cudaStreamCaptureMode m = <cudaStreamCaptureMode>mode
    check_cuda(cudaThreadExchangeStreamCaptureMode(&m), "cudaThreadExchangeStreamCaptureMode")
    return <int>m


def stream_pointer(stream=None, *arrays):
    """The raw cudaStream_t (int) that `stream` denotes, as cygemm resolves it for a call on
    `arrays` (stream=None: torch's current stream when one of them is a torch tensor, else
    CuPy's).

    Parameters
    ----------
    stream : optional
        A ``cupy.cuda.Stream`` (or ``ExternalStream``), a ``torch.cuda.Stream``, an object
        with ``__cuda_stream__``, or an int ``cudaStream_t`` (>= 0), as every cygemm call
        takes it. None: the current stream of the arrays' library.
    *arrays
        The arrays of the call; only whether one is a torch tensor matters (with
        ``stream=None``).

    Returns
    -------
    int
        The ``cudaStream_t`` handle (with ``stream=None`` and CuPy not installed, 0: the
        default stream).

    Raises
    ------
    TypeError
        A ``stream`` of none of these kinds.
    ValueError
        A negative int.
    """
    cdef cudaStream_t s
    stream_from_object(stream, &s, stream is None and any_torch(arrays))
    return <uintptr_t>s


cdef bint any_torch(tuple arrays) except -1:
    """Whether one of `arrays` is a torch tensor."""
    for x in arrays:
        if is_torch(x):
            return True
    return False

# The stream's device, through the driver: cudaStreamGetDevice (cuStreamGetDevice) is
# refused while the stream is being captured (cudaErrorStreamCaptureUnsupported, seen on a
# two-GPU H200 host), cuStreamGetCtx is not. Looked up once, at the first such question
# (asked only where there are several GPUs).
ctypedef int (*_cuStreamGetCtx_t)(cudaStream_t, void**) noexcept nogil
ctypedef int (*_cuCtxGetDevice_v2_t)(int*, void*) noexcept nogil
cdef _cuStreamGetCtx_t _cuStreamGetCtx = NULL
cdef _cuCtxGetDevice_v2_t _cuCtxGetDevice_v2 = NULL
cdef bint _looked_up = False


cdef int _load_driver_entry_points() except -1:
    global _cuStreamGetCtx, _cuCtxGetDevice_v2, _looked_up
    _looked_up = True
    cdef void* fn = NULL
    cdef cudaDriverEntryPointQueryResult found
    if cudaGetDriverEntryPointByVersion(b"cuStreamGetCtx", &fn, 9020, cudaEnableDefault, &found) == cudaSuccess \
            and found == cudaDriverEntryPointSuccess:
        _cuStreamGetCtx = <_cuStreamGetCtx_t>fn
    fn = NULL
    # The base name at 13000 is the two-argument cuCtxGetDevice_v2 (at 12080 it is the
    # one-argument v1, which reports the current device); "cuCtxGetDevice_v2" is not found.
    if cudaGetDriverEntryPointByVersion(b"cuCtxGetDevice", &fn, 13000, cudaEnableDefault, &found) == cudaSuccess \
            and found == cudaDriverEntryPointSuccess:
        _cuCtxGetDevice_v2 = <_cuCtxGetDevice_v2_t>fn
    cudaGetLastError()
    return 0


cdef int stream_device(cudaStream_t stream, int* device) except -1:
    """The stream's device; left as given (unchecked) when only cudaStreamGetDevice could
    tell and the stream is capturing: that call would invalidate the capture."""
    cdef void* sctx = NULL
    cdef int rc
    if not _looked_up:
        _load_driver_entry_points()
    if _cuStreamGetCtx != NULL and _cuCtxGetDevice_v2 != NULL:
        rc = _cuStreamGetCtx(stream, &sctx)
        if rc == 0:
            rc = _cuCtxGetDevice_v2(device, sctx)
        return check_driver(rc, "cuStreamGetCtx/cuCtxGetDevice_v2 (the stream's device)")
    if stream_is_capturing(stream):
        return 0
    return check_cuda(cudaStreamGetDevice(stream, device), "cudaStreamGetDevice")
