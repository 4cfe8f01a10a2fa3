# cygemm's grouped-GEMM kernel (include/cygemm/grouped_kernels.h, in cygemm/grouped_kernels.cu).
from cygemm.bindings.cudart cimport cudaError_t, cudaStream_t

cdef extern from "cygemm/grouped_kernels.h" nogil:
    enum: CYGEMM_GROUPED_PTRS_PER_LAUNCH
    ctypedef struct cygemm_ptr_triples:
        const void* a[128]
        const void* b[128]
        void* c[128]
    cudaError_t cygemm_write_pointer_table(const cygemm_ptr_triples* src, int count, const void** a_out,
                                           const void** b_out, void** c_out, cudaStream_t stream)

    # cuBLASLt's grouped matmul with the sizes on the GPU: its table, written from device offsets.
    enum: CYGEMM_LT_GROUPED_MAX_GROUPS
    enum: CYGEMM_RAGGED_M
    enum: CYGEMM_RAGGED_N
    enum: CYGEMM_RAGGED_K
    ctypedef struct cygemm_grouped_operand:
        const char* base
        long long group_stride
        long long row_stride
    ctypedef struct cygemm_grouped_problem:
        cygemm_grouped_operand a
        cygemm_grouped_operand b
        cygemm_grouped_operand d
        cygemm_grouped_operand scale_a
        cygemm_grouped_operand scale_b
        long long scale_b_kblocks
        long long m, n, k
        long long lda, ldb, ldd
        int ragged
        long long rows
    ctypedef struct cygemm_grouped_table:
        long long a, b, c, d
        long long scale_a, scale_b
        long long m, n, k
        long long lda, ldb, ldd
        long long alpha, beta
        long long bytes
    cygemm_grouped_table cygemm_grouped_table_layout(int groups)
    cudaError_t cygemm_write_grouped_table(const void* offsets, int offsets_64bit, int groups,
                                           const cygemm_grouped_problem* p, void* table, cudaStream_t stream)
    cudaError_t cygemm_zero_empty_groups(const void* offsets, int offsets_64bit, int groups, long long total_rows,
                                         void* out, long long group_stride, long long rows, long long cols,
                                         long long row_stride, int elem_bytes, cudaStream_t stream)
    cudaError_t cygemm_group_row_scales(const float* src, long long rows, int kblocks, const void* offsets,
                                        int offsets_64bit, int groups, float* dst, cudaStream_t stream)
