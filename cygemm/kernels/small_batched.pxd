# cygemm's batched GEMM of small matrices (include/cygemm/small_batched_kernels.h,
# defined in cygemm/kernels/small_batched.cu).
from cygemm.bindings.cudart cimport cudaError_t, cudaStream_t, cudaDataType

cdef extern from "cygemm/small_batched_kernels.h" nogil:
    ctypedef struct cygemm_small_batched_args:
        cudaDataType dtype
        int opa
        int opb
        long long m
        long long n
        long long k
        const void* a
        long long lda
        long long stride_a
        const void* b
        long long ldb
        long long stride_b
        void* c
        long long ldc
        long long stride_c
        long long batch
        double alpha_re
        double alpha_im
        double beta_re
        double beta_im
    enum:
        CYGEMM_SMALL_TILE_1X1
        CYGEMM_SMALL_TILE_2X2
        CYGEMM_SMALL_TILE_4X4
        CYGEMM_SMALL_TILE_VECTOR
        CYGEMM_SMALL_TILE_MMA
        CYGEMM_SMALL_TILES
    ctypedef struct cygemm_small_batched_shape:
        int tile
        int threads
        int smem_bytes
        int pad
        int stages
    int cygemm_small_batched_fits(const cygemm_small_batched_args* args)
    int cygemm_small_batched_vector_fits(const cygemm_small_batched_args* args)
    cygemm_small_batched_shape cygemm_small_batched_rule(const cygemm_small_batched_args* args)
    cudaError_t cygemm_small_batched(const cygemm_small_batched_args* args, cudaStream_t stream)
    cudaError_t cygemm_small_batched_shaped(const cygemm_small_batched_args* args,
                                            cygemm_small_batched_shape shape, cudaStream_t stream)
