# cython: language_level=3
"""cygemm's exceptions and status checks.

Every failure cygemm raises is one of these: a CUDA, driver or cuBLAS call that failed
(naming its status and the call), or a call refused because the stream is being captured.
Argument errors are plain ``TypeError`` / ``ValueError`` naming the argument.
"""
from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport cublasGetStatusName, cublasGetStatusString, CUBLAS_STATUS_SUCCESS


class CygemmError(RuntimeError):
    """A CUDA, cuBLAS or cuBLASLt call failed, or cygemm refused a call (see subclasses)."""


# Why no GPU is usable, asked of the CUDA runtime once (the answer cannot change while the
# process runs: the runtime keeps its first initialization's failure): (reason or None, status).
cdef object _unavailable = None


cdef tuple _gpu_unavailable():
    global _unavailable
    if _unavailable is not None:
        return _unavailable
    cdef int n = 0
    cdef cudaError_t err = cudaGetDeviceCount(&n)
    if err == cudaSuccess and n > 0:
        _unavailable = (None, 0)
        return _unavailable
    cudaGetLastError()
    cdef int status = <int>(cudaErrorNoDevice if err == cudaSuccess else err)
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        reason = "no NVIDIA GPU/driver found (the driver library libcuda.so.1 is not installed)"
    else:
        if err == cudaSuccess or err == cudaErrorNoDevice:
            reason = "no NVIDIA GPU found (the driver is installed but sees no device)"
        elif err == cudaErrorInsufficientDriver:
            reason = ("the NVIDIA driver is too old for this CUDA runtime "
                      f"(cudaGetDeviceCount: {cudaGetErrorName(err).decode()}); CUDA 13 needs driver >= 580")
        else:
            reason = (f"no usable NVIDIA GPU (cudaGetDeviceCount failed with {cudaGetErrorName(err).decode()}: "
                      f"{cudaGetErrorString(err).decode()})")
    _unavailable = (reason, status)
    return _unavailable


def gpu_unavailable_reason():
    """Why no GPU is usable here, in plain words, or None when one is (asked once, then cached;
    see cygemm.gpu_unavailable_reason)."""
    return _gpu_unavailable()[0]


cdef object no_gpu_error(int status, str call):
    """NoGpuError for a call that failed because no GPU is usable here, else None."""
    if status != cudaErrorInsufficientDriver and status != cudaErrorNoDevice:
        return None
    reason = _gpu_unavailable()[0]
    return None if reason is None else NoGpuError(status, call, reason)


def require_gpu():
    """Raise NoGpuError (its message :func:`gpu_unavailable_reason`'s, and nothing else) where
    no GPU is usable; return at once where one is (the answer is cached). The one check of the
    entries that ask before their first CUDA call (cygemm.nn, cygemm.backend); the core entries
    get the same error from their first failing CUDA call (check_cuda)."""
    reason, status = _gpu_unavailable()
    if reason is not None:
        raise NoGpuError(status, "cudaGetDeviceCount", reason)


class _StatusError(CygemmError):
    """A failed call: its ``status``, the status's ``name`` and the ``call``; picklable."""

    def __init__(self, int status, str call):
        self.status = status
        self.call = call
        self.name, text = self._describe(status)
        super().__init__(f"{call} failed with {self.name} ({status}): {text}" if text
                         else f"{call} failed with {self.name}")

    def __reduce__(self):
        return (type(self), (self.status, self.call))


class CudaError(_StatusError):
    """A CUDA runtime call failed: ``status`` (cudaError_t), its ``name`` and the ``call``."""

    @staticmethod
    def _describe(int status):
        return (cudaGetErrorName(<cudaError_t>status).decode(),
                cudaGetErrorString(<cudaError_t>status).decode())


class NoGpuError(CudaError):
    """No usable GPU here: the message is :func:`cygemm.gpu_unavailable_reason`'s plain words and
    nothing else (not the CUDA status's text, which on a machine without a driver reads "CUDA
    driver version is insufficient"); ``status``, ``name`` and ``call`` say which call found out."""

    def __init__(self, int status, str call, str reason):
        self.status = status
        self.call = call
        self.name = cudaGetErrorName(<cudaError_t>status).decode()
        CygemmError.__init__(self, reason)

    def __reduce__(self):
        return (type(self), (self.status, self.call, str(self)))


class CudaDriverError(_StatusError):
    """A CUDA driver call failed: ``status`` is its CUresult."""

    @staticmethod
    def _describe(int status):
        return f"CUresult {status}", ""


class CublasError(_StatusError):
    """A cuBLAS or cuBLASLt call failed: ``status`` (cublasStatus_t), its ``name`` and the ``call``."""

    @staticmethod
    def _describe(int status):
        return (cublasGetStatusName(<cublasStatus_t>status).decode(),
                cublasGetStatusString(<cublasStatus_t>status).decode())


class CaptureError(CygemmError):
    """A call that would allocate, copy or time was refused because its stream is being
    captured into a CUDA graph (that work would break the capture or not be replayed)."""


cdef int check_cuda(cudaError_t status, const char* call) except -1 nogil:
    if status == cudaSuccess:
        return 0
    with gil:
        cudaGetLastError()  # clear the sticky-free error so the next call starts clean
        raise cuda_error(<int>status, call.decode())


cdef object cuda_error(int status, str call):
    """The error for a failed CUDA call: NoGpuError where no GPU is usable, else CudaError."""
    err = no_gpu_error(status, call)
    return err if err is not None else CudaError(status, call)


cdef int check_cublas(cublasStatus_t status, const char* call) except -1 nogil:
    if status == CUBLAS_STATUS_SUCCESS:
        return 0
    with gil:
        raise CublasError(<int>status, call.decode())


cdef int check_driver(int result, const char* call) except -1 nogil:
    if result == 0:
        return 0
    with gil:
        raise CudaDriverError(result, call.decode())


cdef int refuse_in_capture(cudaStream_t stream, str what) except -1:
    cdef cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone
    check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing")
    if status != cudaStreamCaptureStatusNone:
        raise CaptureError(f"{what}, which is not allowed while the stream is being captured "
                           "(do it once before capturing, or pass preallocated buffers)")
    return 0


# ---- arguments that are not arrays: one check each, naming the argument (no GPU needed)

cpdef object check_flag(object value, str name):
    """`value` as a bool where it is one (Python's or NumPy's), else TypeError naming `name`: a
    flag takes True or False, not any object that happens to be truthy."""
    if value is True or value is False or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(f"{name}: expected True or False, got {value!r}")


import numbers as _numbers


def check_size(value, str name):
    """`value` as an int >= 0 where it is an integer (not a bool), else TypeError or ValueError
    naming `name`."""
    if type(value) is int and value >= 0:          # (the common case, without the ABC check)
        return value
    if isinstance(value, bool) or not isinstance(value, _numbers.Integral):
        raise TypeError(f"{name}: expected an int >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {value}")
    return int(value)


cpdef object check_real(object value, str name):
    """`value` as a float where it is a real number (not a bool), else TypeError naming `name`."""
    if type(value) is float:                        # (a call's hot path: no ABC check)
        return value
    if isinstance(value, bool) or not isinstance(value, _numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {value!r}")
    return float(value)
