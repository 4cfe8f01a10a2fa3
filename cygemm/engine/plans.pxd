# Plans: how each GEMM runs. Every GEMM of cygemm (gemm, batched, matmul, the dense forward
# with its epilogues, the backward's two GEMMs, FP8) goes through here. Plan is the one plan
# class: the caches hold Plans, and cygemm.GemmPlan (gemm_plan.pxd) is a Plan of its own.
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasComputeType_t
from cygemm.bindings.cublaslt cimport cublasLtEpilogue_t
from cygemm.engine.types cimport ColMajorGemm, GemmTypes, Scalars
from cygemm.engine.launch cimport PlanData
from cygemm.engine.context cimport GemmContext
from cygemm.engine.settings cimport Policy, Determinism


cdef class Plan:
    cdef PlanData d
    cdef readonly object key
    cdef object cache_key       # its key in the thread's cache (None: not cached)
    cdef long touched_at        # the cache's put count when it was last moved to the recent end


# The cached plan of one problem, made and decided on a miss (the tuning table, timing of the
# candidates when the problem is large and the stream is not capturing, or the heuristic's
# first choice). bias/aux are epilogue pointers (NULL when the epilogue has none); ws the
# workspace the call will pass. policy: the call's (settings.call_policy or default_policy);
# under DETERMINISM_BATCH_INVARIANT a plan with no kernel raises CygemmError. types: the
# storage types and scales of a mixed-type GEMM (FP8; dtype is then D's), NULL for one dtype.
cdef Plan get_plan(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                   cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                   int64_t aux_ld, void* ws, size_t ws_bytes, Policy policy, bint c_is_input,
                   const GemmTypes* types=*)
# Make `plan` (its owner's, not cached: a cygemm.GemmPlan) for this problem, as get_plan makes
# a new one: the heuristic's candidates (under a determinism mode, its family's), its first
# chosen (whatever it held before is freed). Returns it.
cdef Plan init_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                    cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                    int64_t aux_ld, void* ws, size_t ws_bytes, const GemmTypes* types,
                    Determinism determinism)
# Choose among a plan's candidates as `policy` says (keep[0] False: decided during a capture).
# explicit (GemmPlan.autotune): time them at any size, also when decided or recorded before.
cdef int decide_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                     const void* bias, void* aux, void* ws, size_t ws_bytes, Policy policy,
                     bint c_is_input, bint* keep, bint explicit=*) except -1

# The cublasGemmEx forcing of cygemm.engine.tuning.force_routes(gemm=...): 0 none, 1 cublasGemmEx,
# 2 cuBLASLt.
cdef int forced_gemm() noexcept nogil

# CygemmError: the batch-invariant policy found no kernel of the plan's family for its problem.
cdef int raise_no_family(Plan plan) except -1
