# cygemm's grouped-GEMM kernel (cygemm/kernels/include/cygemm/grouped_kernels.h, in cygemm/grouped_kernels.cu).
from cygemm.bindings.cudart cimport cudaError_t, cudaStream_t

cdef extern from "cygemm/grouped_kernels.h" nogil:
    enum: CYGEMM_GROUPED_PTRS_PER_LAUNCH
    ctypedef struct cygemm_ptr_triples:
        const void* a[128]
        const void* b[128]
        void* c[128]
    cudaError_t cygemm_write_pointer_table(const cygemm_ptr_triples* src, int count, const void** a_out,
                                           const void** b_out, void** c_out, cudaStream_t stream)
