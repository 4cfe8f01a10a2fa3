# Row-major GEMM over cuBLAS (the mapping is _mapping's): the nogil C API and gemm's argument path.
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasOperation_t, cublasComputeType_t
from cygemm.engine.types cimport MatrixView, ColMajorGemm, Scalars
from cygemm.engine.context cimport GemmContext
from cygemm.engine.args cimport CallArgs
# The mapping lives in _mapping; cimportable from here too, as cygemm.rowmajor documented it.
from cygemm.engine.mapping cimport (MapResult, MAP_OK, MAP_BAD_A, MAP_BAD_B, MAP_BAD_OUT, map_rowmajor_gemm,
                                    rowmajor_ld, is_rowmajor, map_or_raise, check_batch_disjoint)


# cimport API. Row-major (C-order) matrices given by pointer and leading
# dimension (elements between rows): C(m x n) = alpha op(A) op(B) + beta C, through the plan
# layer (large problems run the fastest of cuBLASLt's candidates and cublasGemmEx, timed once),
# op(A) m x k, op(B) k x n. The caller guarantees valid, device-resident
# pointers of `dtype` and lda/ldb/ldc >= the stored row length.
cdef int gemm_rowmajor(GemmContext* ctx, cudaStream_t stream,
                       cudaDataType dtype, cublasComputeType_t compute,
                       bint trans_a, bint trans_b, int64_t m, int64_t n, int64_t k,
                       double complex alpha, const void* A, int64_t lda,
                       const void* B, int64_t ldb,
                       double complex beta, void* C, int64_t ldc) except -1 nogil

# The same over `batch` matrices at element strides stride_a/b/c (0 broadcasts).
cdef int gemm_rowmajor_strided_batched(GemmContext* ctx, cudaStream_t stream,
                                       cudaDataType dtype, cublasComputeType_t compute,
                                       bint trans_a, bint trans_b, int64_t m, int64_t n, int64_t k,
                                       double complex alpha, const void* A, int64_t lda, int64_t stride_a,
                                       const void* B, int64_t ldb, int64_t stride_b,
                                       double complex beta, void* C, int64_t ldc, int64_t stride_c,
                                       int64_t batch) except -1 nogil

# The GEMM reader (read_gemm, parse_trans) is the engine's: cygemm.engine.operands.
