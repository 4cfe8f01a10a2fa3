# One exception hierarchy and the status checks every module calls after a CUDA, cuBLAS or
# driver call. The checks run without the GIL and take it only to raise.
from cygemm.bindings.cudart cimport cudaError_t, cudaStream_t
from cygemm.bindings.cublas cimport cublasStatus_t

cdef int check_cuda(cudaError_t status, const char* call) except -1 nogil
# The error for a failed CUDA call (status, call): NoGpuError, whose message is only
# gpu_unavailable_reason()'s plain words, where the failure means no GPU is usable; else CudaError.
cdef object cuda_error(int status, str call)
cdef int check_cublas(cublasStatus_t status, const char* call) except -1 nogil
# A CUDA driver API result (CUresult), for the few driver entry points cygemm looks up.
cdef int check_driver(int result, const char* call) except -1 nogil
# CaptureError naming `what` when `stream` is being captured: the one refusal of every call
# that would allocate, copy or time while a capture is open.
cdef int refuse_in_capture(cudaStream_t stream, str what) except -1

# Argument checks of the entry points' hot paths (also Python-visible): a flag as a bool, a real
# number as a float, else TypeError naming the argument (errors.pyx).
cpdef object check_flag(object value, str name)
cpdef object check_real(object value, str name)
