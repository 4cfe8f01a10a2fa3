# The plan layer: how each GEMM runs. Every GEMM of cygemm (gemm, batched, the dense
# forward with its epilogues, the backward's two GEMMs) goes through here.
from libc.stdint cimport int64_t, uint32_t, uintptr_t
from cygemm.cudart cimport cudaStream_t, cudaDataType
from cygemm.cublas cimport cublasOperation_t, cublasComputeType_t, cublasStatus_t
from cygemm.cublaslt cimport (cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t,
                              cublasLtMatmulAlgo_t, cublasLtEpilogue_t)
from cygemm._core cimport GemmContext


# The alignment cuBLASLt is told of a pointer: its largest power-of-two divisor, at most 256
# (NULL counts as 256: nothing is read there).
cdef inline uint32_t pointer_alignment(const void* p) noexcept nogil:
    cdef uintptr_t v = <uintptr_t>p
    if v == 0:
        return 256
    cdef uintptr_t a = v & (~v + 1)
    return <uint32_t>(a if a < 256 else 256)


# The arguments of one column-major cuBLAS call: D(m x n) = op(a) @ op(b), over `batch`
# matrices at element strides stride_a/b/c when strided_batched (0 broadcasts).
ctypedef struct ColMajorGemm:
    cublasOperation_t opa
    cublasOperation_t opb
    int64_t m
    int64_t n
    int64_t k
    const void* a
    int64_t lda
    int64_t stride_a
    const void* b
    int64_t ldb
    int64_t stride_b
    void* c
    int64_t ldc
    int64_t stride_c
    int64_t batch
    bint strided_batched


# How a plan runs its GEMM.
cdef enum PlanRoute:
    PLAN_GEMMEX = 0     # cublasGemmEx / cublasGemmStridedBatchedEx (cuBLAS's own choice)
    PLAN_LT = 1         # cublasLtMatmul with the chosen algorithm (epilogues need this)


ctypedef struct PlanData:
    cublasLtMatmulDesc_t desc
    cublasLtMatrixLayout_t la
    cublasLtMatrixLayout_t lb
    cublasLtMatrixLayout_t lc
    cublasLtMatmulPreference_t pref
    cublasLtMatmulAlgo_t algo
    size_t workspace_needed
    cudaDataType dtype
    cublasComputeType_t compute
    PlanRoute route
    bint usable         # False: cuBLASLt has no algorithm for it; the caller's fallback runs
    bint capture_ok     # cleared if cuBLASLt refused this algorithm inside a capture
    bint tuned          # chosen by timing (here or in a loaded tuning file)
    float tuned_ms      # the chosen candidate's median time (0: not timed)


cdef class Plan:
    cdef PlanData d
    cdef readonly object key


# cublasGemmEx / cublasGemmStridedBatchedEx (their _64 forms past 2**31 - 1), on the
# context's handle bound to `stream`. No plan: cuBLAS chooses the algorithm.
cdef int gemm_colmajor(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                       cudaDataType dtype, cublasComputeType_t compute,
                       const float* alpha, const float* beta) except -1 nogil

# The plan of one problem, made on a miss (heuristic query; timing of the candidates when
# the problem is large and the stream is not capturing; a tuning-file entry when one fits).
# bias/aux are epilogue pointers (NULL when the epilogue has none); ws the workspace the
# call will pass.
cdef Plan get_plan(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                   cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                   int64_t aux_ld, void* ws, size_t ws_bytes)

# Run a plan: the cuBLAS status (a refused call enqueues nothing; the caller decides), or -1
# with an exception set when binding the stream failed.
cdef int plan_run(GemmContext* ctx, cudaStream_t stream, PlanData* d, const ColMajorGemm* g,
                  const void* bias, void* aux, void* ws, size_t ws_bytes,
                  const float* alpha, const float* beta) except -1 nogil

# A plain GEMM through the plan layer: small problems (and 64-bit sizes) go straight to
# cublasGemmEx; large ones run their plan, tuned once. Raises on failure.
cdef int run_gemm(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                  cublasComputeType_t compute, const float* alpha, const float* beta) except -1 nogil

# RuntimeError when a refused cuBLASLt call invalidated the capture under way on `stream`.
cdef int check_capture_alive(cudaStream_t stream) except -1

# Whether a problem of m*n*k (*batch) multiply-adds is large enough to time candidates.
cdef bint worth_tuning(double macs) noexcept nogil

# Timing choices for the route tables: enqueue(arg, choice) enqueues one run of `choice`
# on `stream`. Each choice runs once (warm-up, and the tuning of its own plans), then
# `reps` interleaved rounds with L2 flushed before every timed run; ms[i] gets the median.
ctypedef int (*enqueue_fn)(void* arg, int choice) except -1
cdef int time_choices(GemmContext* ctx, cudaStream_t stream, enqueue_fn enqueue, void* arg,
                      const int* choices, int n, int reps, float* ms) except -1

# The process-wide table of tuned choices (also what tuning files hold): route choices of
# the layer functions, keyed by a tuple that starts with their name; device is the CUDA
# device index (the file keys by GPU model, driver and cuBLASLt version).
cdef object tuned_route(int device, tuple key)
cdef object forced_route(str kind)      # force_routes' choice for "forward"/"backward", or None
cdef int remember_route(int device, tuple key, str route, dict times) except -1
# Bumped whenever routes may change (force_routes, clear_tuning, load_tuning): a C-level memo
# of routes is valid while it holds the value it was filled under.
cdef unsigned long routes_generation() noexcept nogil
