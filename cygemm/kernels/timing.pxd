# The GPU side of timing (include/cygemm/timing.h, defined in cygemm/timing.cu).
from libc.stdint cimport uint64_t
from cygemm.bindings.cudart cimport cudaError_t, cudaStream_t

cdef extern from "cygemm/timing.h" nogil:
    cudaError_t cygemm_hold_stream(uint64_t nanoseconds, cudaStream_t stream)
