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


cdef str _no_gpu_note(int status):
    """Plain words for the statuses a machine without a usable GPU gives (else "")."""
    if status != cudaErrorInsufficientDriver and status != cudaErrorNoDevice:
        return ""
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "; no NVIDIA GPU/driver found (the driver library libcuda.so.1 is not installed)"
    if status == cudaErrorNoDevice:
        return "; no NVIDIA GPU found (the driver is installed but sees no device)"
    return "; the NVIDIA driver is too old for this CUDA runtime (CUDA 13 needs driver >= 580)"


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
                cudaGetErrorString(<cudaError_t>status).decode() + _no_gpu_note(status))


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
        raise CudaError(<int>status, call.decode())


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
