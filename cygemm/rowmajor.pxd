# Row-major GEMM over cuBLAS: the operand-swap mapping and the nogil C API.
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasOperation_t, cublasComputeType_t
from cygemm._types cimport MatrixView, ColMajorGemm
from cygemm._context cimport GemmContext
from cygemm._args cimport CallArgs


cdef enum MapResult:
    MAP_OK = 0
    MAP_BAD_A = 1
    MAP_BAD_B = 2
    MAP_BAD_OUT = 3


# The one place where row-major views become cuBLAS arguments.
cdef MapResult map_rowmajor_gemm(const MatrixView* a, const MatrixView* b, const MatrixView* c,
                                 bint trans_a, bint trans_b, ColMajorGemm* g) noexcept nogil

# The leading dimension cuBLAS and cygemm's kernels take for a row-major view (unit
# stride along its last axis): its row stride, or, for a single row, its length (a
# single row's stride is meaningless: y[None] and x.T of an (N, 1) array have 0 or 1).
cdef int64_t rowmajor_ld(const MatrixView* v) noexcept nogil
# Whether v is row-major as rowmajor_ld needs (the mapping reads it that way).
cdef bint is_rowmajor(const MatrixView* v) noexcept nogil
# map_rowmajor_gemm, raising ValueError that names the argument cuBLAS cannot read
# (`names`: the names of a, b and c). The one message for every entry point.
cdef int map_or_raise(const MatrixView* a, const MatrixView* b, const MatrixView* c, bint trans_a,
                      bint trans_b, ColMajorGemm* g, tuple names) except -1
# ValueError unless the `batch` matrices of the mapped output do not overlap one another
# (exact for any batch stride: interleaved batches, e.g. heads of one (S, H*D) buffer, pass).
cdef int check_batch_disjoint(const ColMajorGemm* g, str name) except -1

# cimport API. Row-major (C-order) matrices given by pointer and leading
# dimension (elements between rows): C(m x n) = alpha op(A) op(B) + beta C, through the plan
# layer (large problems run the fastest of cuBLASLt's candidates and cublasGemmEx, timed once),
# op(A) m x k, op(B) k x n. The caller guarantees valid, device-resident
# pointers of `dtype` and lda/ldb/ldc >= the stored row length.
cdef int gemm_rowmajor(GemmContext* ctx, cudaStream_t stream,
                       cudaDataType dtype, cublasComputeType_t compute,
                       bint trans_a, bint trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const void* A, int64_t lda,
                       const void* B, int64_t ldb,
                       float beta, void* C, int64_t ldc) except -1 nogil

# The same over `batch` matrices at element strides stride_a/b/c (0 broadcasts).
cdef int gemm_rowmajor_strided_batched(GemmContext* ctx, cudaStream_t stream,
                                       cudaDataType dtype, cublasComputeType_t compute,
                                       bint trans_a, bint trans_b, int64_t m, int64_t n, int64_t k,
                                       float alpha, const void* A, int64_t lda, int64_t stride_a,
                                       const void* B, int64_t ldb, int64_t stride_b,
                                       float beta, void* C, int64_t ldc, int64_t stride_c,
                                       int64_t batch) except -1 nogil

# The argument path of gemm, gemm_strided_batched and GemmPlan: operands read into c (A, B,
# out) and mapped to cuBLAS; out=None gives a row-major result whose pointer is NULL.
cdef int read_gemm(CallArgs* c, object A, object B, object out, bint trans_a, bint trans_b,
                   bint batched, double beta, ColMajorGemm* g) except -1
