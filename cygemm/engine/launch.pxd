# Enqueueing GEMMs: cublasGemmEx, cublasLtMatmul by a plan's descriptors, the grouped calls.
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasComputeType_t, cublasOperation_t
from cygemm.bindings.cublaslt cimport (cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t,
                              cublasLtMatmulAlgo_t, cublasLtMatmulHeuristicResult_t)
from cygemm.engine.types cimport ColMajorGemm, GemmTypes, Scalars
from cygemm.engine.context cimport GemmContext


# How a plan runs its GEMM.
cdef enum PlanRoute:
    PLAN_GEMMEX = 0     # cublasGemmEx / cublasGemmStridedBatchedEx (cuBLAS's own choice)
    PLAN_LT = 1         # cublasLtMatmul with the chosen algorithm (epilogues need this)


cdef enum:
    PLAN_CANDIDATES = 32    # what a plan holds: the heuristic's first 8, or a kernel family's members


ctypedef struct PlanData:
    cublasLtMatmulDesc_t desc
    cublasLtMatrixLayout_t la
    cublasLtMatrixLayout_t lb
    cublasLtMatrixLayout_t lc
    cublasLtMatrixLayout_t ld   # D's layout where its type differs from C's (FP8 outputs), else NULL
    cublasLtMatmulPreference_t pref
    cublasLtMatmulAlgo_t algo
    size_t workspace_needed
    cudaDataType dtype
    cublasComputeType_t compute
    int device
    PlanRoute route
    bint usable         # False: cuBLASLt has no algorithm for it (or closed); the caller's fallback runs
    bint capture_ok     # cleared if cuBLASLt refused this algorithm inside a capture
    bint gemmex_ok      # a plain GEMM: cublasGemmEx is a candidate
    bint tuned          # chosen by timing (here or in a loaded tuning file)
    float tuned_ms      # the chosen candidate's median time (0: not timed)
    int tune_level      # the autotune level it was decided under (-1: not yet)
    int n_candidates
    int determinism     # the Determinism mode the plan was made under (cygemm.engine.settings)
    int family          # under a determinism mode: the cuBLASLt algorithm id of its kernels
    bint verify         # a timed choice is kept only if its result agrees with the first candidate's (FP8)
    bint shared         # batch-invariant: its candidates are its size bucket's fastest members (cygemm.engine.families)
    bint cublas_invariance  # batch-invariant by cuBLASLt's own flag, set on desc (family FAMILY_CUBLAS)
    cublasLtMatmulHeuristicResult_t candidates[PLAN_CANDIDATES]


# cublasGemmEx / cublasGemmStridedBatchedEx (their _64 forms past 2**31 - 1), on the
# context's handle bound to `stream`. No plan: cuBLAS chooses the algorithm.
cdef int gemm_colmajor(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                       cudaDataType dtype, cublasComputeType_t compute, const Scalars* sc) except -1 nogil

# Whether any size or leading dimension passes 2**31 - 1 (cuBLAS's 64-bit API then).
cdef bint needs_64bit_api(const ColMajorGemm* g) noexcept nogil

# Run a plan: the cuBLAS status (a refused call enqueues nothing; the caller decides), or -1
# with an exception set when binding the stream failed.
cdef int plan_run(GemmContext* ctx, cudaStream_t stream, PlanData* d, const ColMajorGemm* g,
                  const void* bias, void* aux, void* ws, size_t ws_bytes, const Scalars* sc) except -1 nogil

# Point a plan's descriptor at this call's scales and amax (FP8; pointers change between calls
# that share a plan, as bias and aux do): the cuBLAS status.
cdef int set_scale_pointers(PlanData* d, const GemmTypes* t) noexcept nogil

# One cuBLASLt grouped matmul (CUBLASLT_BATCH_MODE_GROUPED): every group's pointers, sizes and
# leading dimensions, and alpha and beta, are in device memory at `table` (cygemm.grouped.lt_grouped
# lays it out); the descriptors point into it. The cuBLAS status (the caller raises).
cdef int grouped_lt_run(GemmContext* ctx, cudaStream_t stream, cublasLtMatmulDesc_t desc,
                        cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                        cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t* algo, const void* alpha,
                        const void* a, const void* b, const void* beta, const void* c, void* d, void* ws,
                        size_t ws_bytes) noexcept nogil

# cublasGemmGroupedBatchedEx over `count` groups of one GEMM each, on `stream`. The host arrays
# hold their parts `part` elements apart: ops the transposes of A, then of B; dims m, n, k, lda,
# ldb, ldc; scalars alpha, then beta. a, b, c: pointer arrays in device memory. Raises on failure.
cdef int grouped_batched_run(GemmContext* ctx, cudaStream_t stream, const cublasOperation_t* ops, const int* dims,
                             const float* scalars, int64_t part, const void* const* a, const void* const* b,
                             void* const* c, cudaDataType dtype, int count, const int* ones,
                             cublasComputeType_t compute) except -1 nogil
