# cuBLASLt's grouped matmul with the group sizes on the GPU (see lt_grouped.pyx): one call's
# problem, whether it can run, and running it.
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaDataType, cudaStream_t
from cygemm.bindings.cublas cimport cublasOperation_t
from cygemm.kernels.grouped cimport cygemm_grouped_problem
from cygemm.engine.context cimport GemmContext

# Which arguments cuBLAS's A, B and D are, for messages: the call's kind.
cdef enum:
    LT_NAMES_FORWARD = 0        # A: w, B: x, D: out
    LT_NAMES_WGRAD_KN = 1       # A: dy, B: x, D: dw
    LT_NAMES_WGRAD_NK = 2       # A: x, B: dy, D: dw

ctypedef struct LtGroupedCall:
    int names                       # LT_NAMES_*
    cudaDataType dtype              # C's and D's (and A's and B's unless FP8 sets them)
    cudaDataType a_type             # cuBLAS's A and B storage types (FP8: E4M3 or E5M2)
    cudaDataType b_type
    bint scaled                     # FP8: p.scale_a and p.scale_b give each group's scales
    int scale_mode_a                # their cublasLtMatmulMatrixScale_t (per group: PER_BATCH_SCALAR_32F,
    int scale_mode_b                # BLK128x128_32F, VEC128_32F)
    const float* scale_rows_src     # 1x128 token scales to regroup per group first (NULL: none), into
    float* scale_rows_dst           # scale_rows_dst (p.scale_b's base), scale_kblocks K-blocks a row
    int scale_kblocks
    bint fast_accum
    int groups
    const void* offsets             # groups + 1, on the device
    bint offsets_64bit
    cygemm_grouped_problem p        # cuBLAS's terms: operands, fixed sizes, which is ragged
    cublasOperation_t opa
    cublasOperation_t opb
    int64_t avg_m                   # the heuristic's hints: D's average rows and columns, K's
    int64_t avg_n
    int64_t avg_k
    # Ragged K (a weight gradient): the output of a group with no rows is zeroed (NULL: none)
    void* zero_out
    int64_t zero_group_stride       # bytes
    int64_t zero_rows
    int64_t zero_cols
    int64_t zero_row_stride         # bytes
    int elem_bytes

# Why the grouped matmul cannot run this call on `device` (None: it can): the library and GPU
# (cygemm.engine.lt_features), the dtype, the group count, the alignment of every group's
# matrices. Needs no GPU but for the GPU's compute capability.
cdef object why_not(const LtGroupedCall* f, int device, bint capturing)
# Enqueue the call on `stream`: the table kernel, the zeroing of empty groups' outputs where
# asked, and one cublasLtMatmul. Raises on any failed CUDA/cuBLAS call.
cdef int run_lt_grouped(GemmContext* ctx, cudaStream_t stream, const LtGroupedCall* f) except -1
