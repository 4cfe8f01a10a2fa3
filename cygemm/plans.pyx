# cython: language_level=3, boundscheck=False, wraparound=False
"""Plans: how each GEMM runs, chosen once per problem and kept in a bounded cache per thread.

Every GEMM of cygemm goes through here: `gemm`, `gemm_strided_batched`, `matmul`, the dense
forward (epilogues included), the backward's two GEMMs and :class:`cygemm.GemmPlan`. A plan is
one problem's way to run: a cuBLASLt algorithm (with its descriptors) or cublasGemmEx. Neither
wins everywhere (on the H200 the best cuBLASLt candidate beat cublasGemmEx by 5.9% at 1024^3
fp32 and lost by 6.4% at 8192^3 TF32), so for a large problem the candidates are timed once
(see cygemm.tuning). Small problems take cublasGemmEx (plain) or the heuristic's first choice
(epilogues): timing them costs more than it could save.

Each thread keeps at most ``plan_cache_size`` plans (an option), dropping the least recently
used: a server that sees many batch sizes does not grow without bound.
"""
from collections import OrderedDict
import threading
import time

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcmp, memset, memcpy

from cygemm.cudart cimport *
from cygemm.cublas cimport *
from cygemm.cublaslt cimport *
from cygemm._types cimport ColMajorGemm, pointer_alignment
from cygemm._errors cimport check_cuda, check_cublas
from cygemm._errors import CaptureError
from cygemm._streams cimport stream_is_capturing
from cygemm._release cimport defer_free
from cygemm._context cimport GemmContext, bind_stream, stream_workspace
from cygemm._settings cimport options, loaded_options, AUTOTUNE_OFF, AUTOTUNE_AUTO, AUTOTUNE_EXHAUSTIVE
from cygemm.tuning cimport (time_choices, worth_tuning, tuning_budget_ms, in_route_timing, lookup, remember,
                            count_tuning)
from cygemm import _settings, tuning

cdef int64_t INT32_MAX = 2147483647


# ---------------------------------------------------------------- cublasGemmEx
cdef int gemm_colmajor(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                       cudaDataType dtype, cublasComputeType_t compute,
                       const float* alpha, const float* beta) except -1 nogil:
    return check_cublas(<cublasStatus_t>_gemmex(ctx, stream, g, dtype, compute, alpha, beta),
                        "cublasGemmEx" if not g.strided_batched else "cublasGemmStridedBatchedEx")


cdef bint _wide(const ColMajorGemm* g) noexcept nogil:
    return (g.m > INT32_MAX or g.n > INT32_MAX or g.k > INT32_MAX or g.lda > INT32_MAX
            or g.ldb > INT32_MAX or g.ldc > INT32_MAX or g.batch > INT32_MAX)


cdef int _gemmex(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                 cudaDataType dtype, cublasComputeType_t compute,
                 const float* alpha, const float* beta) except -1 nogil:
    """The cuBLAS status of one GemmEx call (-1: binding the stream raised)."""
    bind_stream(ctx, stream)
    cdef double alpha64, beta64
    if compute == CUBLAS_COMPUTE_64F:       # the scalars take the compute type: double here
        alpha64, beta64 = alpha[0], beta[0]
        alpha, beta = <const float*>&alpha64, <const float*>&beta64
    # Past 2**31 - 1 in any size or leading dimension take cuBLAS's 64-bit API;
    # below it the 32-bit one, whose kernels and heuristics are the tuned ones.
    if g.strided_batched and _wide(g):
        return cublasGemmStridedBatchedEx_64(
            ctx.blas, g.opa, g.opb, g.m, g.n, g.k, alpha,
            g.a, dtype, g.lda, g.stride_a, g.b, dtype, g.ldb, g.stride_b,
            beta, g.c, dtype, g.ldc, g.stride_c, g.batch, compute, CUBLAS_GEMM_DEFAULT)
    if g.strided_batched:
        return cublasGemmStridedBatchedEx(
            ctx.blas, g.opa, g.opb, <int>g.m, <int>g.n, <int>g.k, alpha,
            g.a, dtype, <int>g.lda, g.stride_a, g.b, dtype, <int>g.ldb, g.stride_b,
            beta, g.c, dtype, <int>g.ldc, g.stride_c, <int>g.batch, compute, CUBLAS_GEMM_DEFAULT)
    if _wide(g):
        return cublasGemmEx_64(
            ctx.blas, g.opa, g.opb, g.m, g.n, g.k, alpha, g.a, dtype, g.lda, g.b, dtype, g.ldb,
            beta, g.c, dtype, g.ldc, compute, CUBLAS_GEMM_DEFAULT)
    return cublasGemmEx(
        ctx.blas, g.opa, g.opb, <int>g.m, <int>g.n, <int>g.k, alpha,
        g.a, dtype, <int>g.lda, g.b, dtype, <int>g.ldb,
        beta, g.c, dtype, <int>g.ldc, compute, CUBLAS_GEMM_DEFAULT)



# ---------------------------------------------------------------- plans

cdef class Plan:
    """One problem's way to run: route, and for cuBLASLt its descriptors and algorithm.
    Its descriptors are freed by close() or when it is dropped."""

    def __dealloc__(self):
        self.close()

    def close(self):
        """Free the cuBLASLt descriptors now; the plan then runs nothing (usable is False)."""
        self.d.usable = False
        if self.d.pref != NULL:
            cublasLtMatmulPreferenceDestroy(self.d.pref)
        if self.d.lc != NULL:
            cublasLtMatrixLayoutDestroy(self.d.lc)
        if self.d.lb != NULL:
            cublasLtMatrixLayoutDestroy(self.d.lb)
        if self.d.la != NULL:
            cublasLtMatrixLayoutDestroy(self.d.la)
        if self.d.desc != NULL:
            cublasLtMatmulDescDestroy(self.d.desc)
        self.d.pref, self.d.lc, self.d.lb, self.d.la, self.d.desc = NULL, NULL, NULL, NULL, NULL


    @property
    def route(self):
        return "cublasLt" if self.d.route == PLAN_LT else "cublasGemmEx"

    @property
    def usable(self):
        return bool(self.d.usable)

    @property
    def tuned(self):
        return bool(self.d.tuned)

    @property
    def tuned_ms(self):
        return self.d.tuned_ms


# The plan key as a C struct: a repeated call finds its plan among the last few by memcmp,
# without building the dict key (measured ~0.5 us of the small-call cost). It holds
# everything that changes which algorithm is valid, alignment included, so a plan chosen
# for aligned pointers never runs on unaligned ones.
ctypedef struct PlanKey:
    int device
    int dtype
    int compute
    int epi
    int opa
    int opb
    int64_t m
    int64_t n
    int64_t k
    int64_t lda
    int64_t ldb
    int64_t ldc
    int64_t aux_ld
    int64_t batch
    int64_t stride_a
    int64_t stride_b
    int64_t stride_c
    uint32_t al_a
    uint32_t al_b
    uint32_t al_c
    uint32_t al_bias
    uint32_t al_aux
    uint32_t al_ws
    size_t ws_bytes

cdef enum:
    RECENT_PLANS = 16
    MAX_CANDIDATES = 8      # the heuristic's first eight (and cublasGemmEx)
    TUNE_REPS = 5           # rounds for every candidate (auto: fewer when the budget says so)
    FINAL_REPS = 11         # rounds for the finalists (auto: within what is left of the budget)


cdef class _RecentPlans:
    """The last few plans of a thread by C key (no Python key built on a hit)."""
    cdef PlanKey keys[RECENT_PLANS]
    cdef list plans
    cdef int next_slot

    def __cinit__(self):
        memset(self.keys, 0, sizeof(self.keys))
        self.plans = [None] * RECENT_PLANS
        self.next_slot = 0

    cdef Plan find(self, const PlanKey* key):
        cdef int i
        for i in range(RECENT_PLANS):
            if memcmp(&self.keys[i], key, sizeof(PlanKey)) == 0 and self.plans[i] is not None:
                return self.plans[i]
        return None

    cdef void remember(self, const PlanKey* key, Plan plan):
        self.keys[self.next_slot] = key[0]
        self.plans[self.next_slot] = plan
        self.next_slot = (self.next_slot + 1) % RECENT_PLANS


cdef class _PlanCache:
    """A thread's plans: at most plan_cache_size (an option), least recently used dropped
    (its descriptors go when no caller holds it any more), and the C memo of recent ones."""
    cdef object plans           # OrderedDict: key -> Plan, most recent last
    cdef _RecentPlans recent
    cdef long puts              # plans added so far: how stale a plan's place in the order is

    def __cinit__(self):
        self.plans = OrderedDict()
        self.recent = _RecentPlans()
        self.puts = 0

    cdef Plan get(self, tuple key):
        plan = self.plans.get(key)
        if plan is not None:
            self.plans.move_to_end(key)
        return plan

    cdef void touch(self, Plan plan, int limit):
        # Moved to the recent end only once half the cache was added since: a repeated call
        # costs no dict operation, and a plan in use never reaches the old end.
        if self.puts - plan.touched_at > limit // 2 and plan.cache_key in self.plans:
            self.plans.move_to_end(plan.cache_key)
            plan.touched_at = self.puts

    cdef void put(self, tuple key, Plan plan, int limit):
        plan.cache_key = key
        self.puts += 1
        plan.touched_at = self.puts
        self.plans[key] = plan
        self.plans.move_to_end(key)
        while len(self.plans) > limit:
            self.plans.popitem(last=False)


# Plans hold cuBLASLt descriptors, used by one thread at a time: each thread has its own.
cdef object _tls = threading.local()


cdef _PlanCache _cache():
    try:
        return _tls.cache
    except AttributeError:
        _tls.cache = _PlanCache()
        return _tls.cache


def clear_plan_cache():
    """Drop this thread's plans (rebuilt on the next call; tuned choices are kept, see clear_tuning)."""
    _tls.cache = _PlanCache()


def plan_cache_size():
    """How many plans this thread holds."""
    return len(_cache().plans)


def thread_plans():
    """This thread's plans, {(device, *problem key): Plan} (a copy; for tests and diagnostics)."""
    return dict(_cache().plans)


# Routes "gemm" forced by force_routes (tests, diagnostics, comparisons): 0 measured;
# 1 cublasGemmEx; 2 cuBLASLt's first choice. Read from the route registry when routes change.
cdef int _force_gemm = 0


def _on_routes_changed():
    global _force_gemm
    forced = tuning.forced_gemm_route()
    _force_gemm = {None: 0, "cublasGemmEx": 1, "cublasLt": 2}[forced]
    clear_plan_cache()


tuning.register_routes("gemm", ("cublasGemmEx", "cublasLt"), _on_routes_changed)


cdef int _set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                   size_t size) except -1 nogil:
    return check_cublas(cublasLtMatmulDescSetAttribute(desc, attr, buf, size), "cublasLtMatmulDescSetAttribute")


cdef int _set_pref_u32(cublasLtMatmulPreference_t pref, int attr, uint32_t value) except -1:
    return check_cublas(cublasLtMatmulPreferenceSetAttribute(
        pref, <cublasLtMatmulPreferenceAttributes_t>attr, &value, sizeof(value)),
        "cublasLtMatmulPreferenceSetAttribute")


cdef int _layout(cublasLtMatrixLayout_t* layout, cudaDataType dtype, int64_t rows, int64_t cols,
                 int64_t ld, int64_t batch, int64_t stride, const char* what) except -1:
    check_cublas(cublasLtMatrixLayoutCreate(layout, dtype, rows, cols, ld), what)
    cdef int32_t count = <int32_t>batch
    if batch > 1:
        check_cublas(cublasLtMatrixLayoutSetAttribute(layout[0], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                      &count, sizeof(count)), what)
        check_cublas(cublasLtMatrixLayoutSetAttribute(layout[0], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                      &stride, sizeof(stride)), what)
    return 0


cdef PlanKey _plan_key(GemmContext* ctx, const ColMajorGemm* g, cudaDataType dtype,
                       cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias,
                       void* aux, int64_t aux_ld, void* ws, size_t ws_bytes) noexcept nogil:
    cdef int64_t batch = g.batch if g.strided_batched else 1
    cdef PlanKey k
    memset(&k, 0, sizeof(k))            # padding too: keys are compared with memcmp
    k.device, k.dtype, k.compute, k.epi, k.opa, k.opb = ctx.device, dtype, compute, epi, g.opa, g.opb
    k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.aux_ld = g.m, g.n, g.k, g.lda, g.ldb, g.ldc, aux_ld
    k.batch = batch
    if batch > 1:
        k.stride_a, k.stride_b, k.stride_c = g.stride_a, g.stride_b, g.stride_c
    k.al_a, k.al_b, k.al_c = pointer_alignment(g.a), pointer_alignment(g.b), pointer_alignment(g.c)
    k.al_bias, k.al_aux = pointer_alignment(bias), pointer_alignment(aux)
    # A refused call (e.g. a misaligned lt_workspace) marks its own plan, not the aligned one's.
    k.al_ws = pointer_alignment(ws)
    k.ws_bytes = ws_bytes
    return k


cdef tuple _key_tuple(const PlanKey* k):
    return (k.dtype, k.compute, k.epi, k.opa, k.opb, k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.aux_ld,
            k.batch, k.stride_a, k.stride_b, k.stride_c, k.al_a, k.al_b, k.al_c, k.al_bias, k.al_aux,
            k.al_ws, k.ws_bytes)


cdef Plan get_plan(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                   cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                   int64_t aux_ld, void* ws, size_t ws_bytes, int autotune, bint c_is_input):
    cdef PlanKey k = _plan_key(ctx, g, dtype, compute, epi, bias, aux, aux_ld, ws, ws_bytes)
    cdef _PlanCache cache = _cache()
    cdef Plan plan = cache.recent.find(&k)
    if autotune < 0:
        autotune = options().autotune
    if plan is not None and plan.d.tune_level >= autotune:
        cache.touch(plan, loaded_options().plan_cache_size)     # the least recently used goes, not the hottest
        return plan
    key = _key_tuple(&k)
    if plan is None:
        plan = cache.get((k.device,) + key)
    if plan is not None and plan.d.tune_level >= autotune:
        cache.recent.remember(&k, plan)
        return plan
    cdef bint keep = True
    if plan is None:
        plan = _make_plan(ctx, stream, g, dtype, compute, epi, bias, aux, aux_ld, ws, ws_bytes, &k, key, &keep)
    if keep:
        decide_plan(plan, ctx, stream, g, bias, aux, ws, ws_bytes, autotune, c_is_input, &keep)
    if keep:
        cache = _cache()            # deciding may have read the tuning file, which clears caches
        cache.put((k.device,) + key, plan, options().plan_cache_size)
        cache.recent.remember(&k, plan)
    return plan


cdef Plan make_plan(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                    cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                    int64_t aux_ld, void* ws, size_t ws_bytes):
    cdef PlanKey k = _plan_key(ctx, g, dtype, compute, epi, bias, aux, aux_ld, ws, ws_bytes)
    cdef bint keep = True
    return _make_plan(ctx, stream, g, dtype, compute, epi, bias, aux, aux_ld, ws, ws_bytes, &k,
                      _key_tuple(&k), &keep)


cdef Plan _make_plan(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                     cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                     int64_t aux_ld, void* ws, size_t ws_bytes, const PlanKey* k, tuple key, bint* keep):
    """A new plan with the heuristic's candidates; keep[0] False when it must not be cached:
    made during a capture, where a heuristic may be refused (the next eager call decides)."""
    cdef Plan plan = Plan()
    plan.key = key
    cdef PlanData* d = &plan.d
    d.capture_ok = True
    d.dtype, d.compute, d.device = dtype, compute, ctx.device
    d.tune_level = -1
    cdef int64_t batch = k.batch
    check_cublas(cublasLtMatmulDescCreate(&d.desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate")
    cdef int32_t opa = g.opa, opb = g.opb
    cdef uint32_t epi32 = epi
    _set_desc(d.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa))
    _set_desc(d.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb))
    _set_desc(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi32, sizeof(epi32))
    if bias != NULL:
        _set_desc(d.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias))
    if aux != NULL:
        _set_desc(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux))
        _set_desc(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld))
    _layout(&d.la, dtype, g.m if g.opa == CUBLAS_OP_N else g.k, g.k if g.opa == CUBLAS_OP_N else g.m,
            g.lda, batch, g.stride_a, "cublasLtMatrixLayoutCreate(A)")
    _layout(&d.lb, dtype, g.k if g.opb == CUBLAS_OP_N else g.n, g.n if g.opb == CUBLAS_OP_N else g.k,
            g.ldb, batch, g.stride_b, "cublasLtMatrixLayoutCreate(B)")
    _layout(&d.lc, dtype, g.m, g.n, g.ldc, batch, g.stride_c, "cublasLtMatrixLayoutCreate(D)")
    check_cublas(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate")
    cdef uint64_t ws64 = ws_bytes
    check_cublas(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws64, sizeof(ws64)), "cublasLtMatmulPreferenceSetAttribute")
    for attr, al in ((CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.al_a),
                     (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.al_b),
                     (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.al_c),
                     (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.al_c)):
        _set_pref_u32(d.pref, attr, al)
    # cublasGemmEx is a candidate for plain GEMMs (it has no epilogues).
    d.gemmex_ok = epi == CUBLASLT_EPILOGUE_DEFAULT and bias == NULL and aux == NULL
    cdef int found = 0, i
    cdef bint capturing = stream_is_capturing(stream)
    cdef cublasStatus_t st
    with nogil:         # the first heuristic query of a process loads cuBLASLt's tables
        st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, d.desc, d.la, d.lb, d.lc, d.lc, d.pref,
                                            MAX_CANDIDATES, d.candidates, &found)
    if st != CUBLAS_STATUS_SUCCESS:
        found = 0
        if capturing:               # perhaps the capture's fault: decided again eagerly
            keep[0] = False
    if batch > 1 and not _lt_batch_ok(g):
        found = 0
    cdef int n_ok = 0
    for i in range(found):          # keep the candidates that fit this workspace
        if d.candidates[i].state == CUBLAS_STATUS_SUCCESS and d.candidates[i].workspaceSize <= ws_bytes:
            d.candidates[n_ok] = d.candidates[i]
            n_ok += 1
    d.n_candidates = n_ok
    d.usable = n_ok > 0 or d.gemmex_ok
    if n_ok > 0:
        d.route = PLAN_LT
        d.algo = d.candidates[0].algo
        d.workspace_needed = d.candidates[0].workspaceSize
    else:
        d.route = PLAN_GEMMEX
    if not d.usable:
        # Some CUDA versions refuse heuristics during capture: use the fallback now, but
        # do not remember a verdict that may be the capture's fault.
        keep[0] = not capturing
        d.tune_level = AUTOTUNE_EXHAUSTIVE
    return plan


cdef int decide_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                     const void* bias, void* aux, void* ws, size_t ws_bytes, int autotune,
                     bint c_is_input, bint* keep, bint any_size=False) except -1:
    """Choose among the plan's candidates as `autotune` says: a forced route, a tuned choice
    from the table, timing (large problems, or any size when any_size; not during a capture),
    or the heuristic's first."""
    cdef PlanData* d = &plan.d
    if d.tune_level >= autotune or not d.usable:
        return 0
    if _force_gemm == 1 and d.gemmex_ok:
        d.route = PLAN_GEMMEX
    if _force_gemm:
        d.tune_level = AUTOTUNE_EXHAUSTIVE
        return 0
    record = lookup(ctx.device, "gemm", plan.key)
    if record is not None and _apply_record(ctx, d, record, ws_bytes):
        d.tune_level = AUTOTUNE_EXHAUSTIVE
        return 0
    cdef int64_t batch = g.batch if g.strided_batched else 1
    cdef double macs = <double>g.m * g.n * g.k * batch
    if autotune == AUTOTUNE_OFF or d.n_candidates + d.gemmex_ok < 2 or not (any_size or worth_tuning(macs)):
        d.tune_level = max(d.tune_level, autotune)
        return 0
    if in_route_timing():           # a layer is timing its routes: the heuristic's choice for now,
        return 0                    # decided at the plan's first call outside route timing
    if stream_is_capturing(stream):
        keep[0] = False             # the heuristic's choice now; timed at the first eager call
        return 0
    _tune_plan(ctx, stream, d, g, bias, aux, ws, ws_bytes, autotune, c_is_input)
    d.tune_level = autotune
    if d.tuned:
        remember(ctx.device, "gemm", plan.key, _record_of(d))
    return 0


cdef bint _lt_batch_ok(const ColMajorGemm* g) noexcept nogil:
    """Batches cuBLASLt is asked about: every operand's matrices one after another. Broadcast
    (stride 0) and interleaved batches stay with cublasGemmStridedBatchedEx, which is
    documented for them."""
    cdef int64_t a_cols = g.k if g.opa == CUBLAS_OP_N else g.m
    cdef int64_t b_cols = g.n if g.opb == CUBLAS_OP_N else g.k
    return (g.stride_a >= g.lda * a_cols and g.stride_b >= g.ldb * b_cols
            and g.stride_c >= g.ldc * g.n)


cdef bint _apply_record(GemmContext* ctx, PlanData* d, dict record, size_t ws_bytes):
    """Use a tuned choice if it still fits (cublasLtMatmulAlgoCheck for a stored algorithm)."""
    cdef cublasLtMatmulAlgo_t algo
    cdef cublasLtMatmulHeuristicResult_t check
    cdef float ms
    try:
        route = record["route"]
        ms = float(record.get("ms", 0.0))
        if route == "cublasGemmEx":
            if not d.gemmex_ok:
                return False
            d.route = PLAN_GEMMEX
        elif route == "cublasLt":
            raw = bytes.fromhex(record["algo"])
            if len(raw) != sizeof(cublasLtMatmulAlgo_t):
                return False
            memcpy(&algo, <const char*>raw, sizeof(algo))
            if cublasLtMatmulAlgoCheck(ctx.lt, d.desc, d.la, d.lb, d.lc, d.lc, &algo, &check) != CUBLAS_STATUS_SUCCESS:
                return False
            if check.workspaceSize > ws_bytes:
                return False
            d.route, d.algo, d.workspace_needed = PLAN_LT, algo, check.workspaceSize
        else:
            return False
    except (KeyError, ValueError, TypeError, AttributeError):
        return False
    d.tuned, d.tuned_ms = True, ms
    return True


cdef dict _record_of(PlanData* d):
    if d.route == PLAN_GEMMEX:
        return {"route": "cublasGemmEx", "ms": d.tuned_ms}
    return {"route": "cublasLt", "algo": (<char*>&d.algo)[:sizeof(cublasLtMatmulAlgo_t)].hex(),
            "ws": d.workspace_needed, "ms": d.tuned_ms}


# ---------------------------------------------------------------- running a plan

cdef int plan_run(GemmContext* ctx, cudaStream_t stream, PlanData* d, const ColMajorGemm* g,
                  const void* bias, void* aux, void* ws, size_t ws_bytes,
                  const float* alpha, const float* beta) except -1 nogil:
    cdef cublasStatus_t st
    if d.route == PLAN_GEMMEX:
        return _gemmex(ctx, stream, g, d.dtype, d.compute, alpha, beta)
    # Pointers change between calls that share a plan; setting them is a host-side copy.
    if bias != NULL:
        st = cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias))
        if st != CUBLAS_STATUS_SUCCESS:
            return st
    if aux != NULL:
        st = cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux))
        if st != CUBLAS_STATUS_SUCCESS:
            return st
    return cublasLtMatmul(ctx.lt, d.desc, alpha, g.a, d.la, g.b, d.lb, beta, g.c, d.lc, g.c, d.lc,
                          &d.algo, ws, ws_bytes, stream)


cdef int run_gemm(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                  cublasComputeType_t compute, const float* alpha, const float* beta,
                  int autotune) except -1 nogil:
    cdef int64_t batch = g.batch if g.strided_batched else 1
    if _wide(g) or _force_gemm == 1 or g.k == 0 or compute == CUBLAS_COMPUTE_64F or (
            _force_gemm == 0 and not worth_tuning(<double>g.m * g.n * g.k * batch)):
        return gemm_colmajor(ctx, stream, g, dtype, compute, alpha, beta)
    cdef void* ws = stream_workspace(ctx, stream)       # may allocate: without the GIL
    with gil:
        _run_planned(ctx, stream, g, dtype, compute, alpha, beta, ws, autotune)
    return 0


cdef int run_with_fallback(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                           void* ws, size_t ws_bytes, const float* alpha, const float* beta) except -1:
    """Run a plain GEMM's plan; where cuBLASLt refuses it (nothing enqueued), cublasGemmEx."""
    cdef int st = CUBLAS_STATUS_NOT_SUPPORTED
    if plan.d.usable and (plan.d.capture_ok or plan.d.route == PLAN_GEMMEX
                                               or not stream_is_capturing(stream)):
        with nogil:
            st = plan_run(ctx, stream, &plan.d, g, NULL, NULL, ws, ws_bytes, alpha, beta)
        if st != CUBLAS_STATUS_SUCCESS and plan.d.route == PLAN_LT:
            # Inside a capture, remember that this algorithm does not capture.
            if stream_is_capturing(stream):
                check_capture_alive(stream)
                plan.d.capture_ok = False
            else:
                plan.d.usable = False
        elif st != CUBLAS_STATUS_SUCCESS:
            return check_cublas(<cublasStatus_t>st, "cublasGemmEx")
    if st != CUBLAS_STATUS_SUCCESS:
        with nogil:
            gemm_colmajor(ctx, stream, g, plan.d.dtype, plan.d.compute, alpha, beta)
    return 0


cdef int _run_planned(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                      cublasComputeType_t compute, const float* alpha, const float* beta, void* ws,
                      int autotune) except -1:
    cdef size_t ws_bytes = ctx.workspace_bytes
    cdef Plan plan = get_plan(ctx, stream, g, dtype, compute, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0,
                              ws, ws_bytes, autotune, beta[0] != 0)
    return run_with_fallback(plan, ctx, stream, g, ws, ws_bytes, alpha, beta)


cdef int check_capture_alive(cudaStream_t stream) except -1:
    cdef cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone
    check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing")
    if status == cudaStreamCaptureStatusInvalidated:
        raise CaptureError("cublasLtMatmul invalidated the stream's capture; call the function once "
                           "before capturing, or capture with mode='relaxed'")
    return 0


# ---------------------------------------------------------------- timing a plan's candidates

ctypedef struct _TuneArg:
    GemmContext* ctx
    cudaStream_t stream
    PlanData* d
    ColMajorGemm g
    const void* bias
    void* aux
    void* ws
    size_t ws_bytes
    int n_lt


cdef int _tune_enqueue(void* arg, int choice) except -1:
    cdef _TuneArg* a = <_TuneArg*>arg
    cdef float alpha = 1.0, beta = 0.0
    cdef PlanRoute route = a.d.route
    cdef cublasLtMatmulAlgo_t algo = a.d.algo
    cdef int st
    if choice == a.n_lt:            # the last choice: cublasGemmEx
        a.d.route = PLAN_GEMMEX
    else:
        a.d.route = PLAN_LT
        a.d.algo = a.d.candidates[choice].algo
    try:
        with nogil:
            st = plan_run(a.ctx, a.stream, a.d, &a.g, a.bias, a.aux, a.ws, a.ws_bytes, &alpha, &beta)
    finally:
        a.d.route, a.d.algo = route, algo
    return 0 if st == CUBLAS_STATUS_SUCCESS else 1


cdef inline bint _listed(const int* xs, int n, int x) noexcept nogil:
    cdef int i
    for i in range(n):
        if xs[i] == x:
            return True
    return False


cdef int _tune_plan(GemmContext* ctx, cudaStream_t stream, PlanData* d, const ColMajorGemm* g,
                    const void* bias, void* aux, void* ws, size_t ws_bytes, int autotune,
                    bint c_is_input) except -1:
    """Time the candidates on the call's own operands and keep the fastest. A GEMM whose C
    is an input (beta != 0) is timed writing to a scratch output instead. Every candidate,
    then the finalists again for FINAL_REPS rounds; auto: both within the tuning budget,
    max(50 ms, 25 runs of the fastest), the finalists only if what is left holds 3 rounds."""
    cdef _TuneArg a
    cdef int choices[MAX_CANDIDATES + 1]
    cdef float ms[MAX_CANDIDATES + 1]
    cdef bint exhaustive = autotune == AUTOTUNE_EXHAUSTIVE
    cdef int found = d.n_candidates
    cdef double start = time.perf_counter(), left_ms = 0, fastest
    cdef int i, n = found + (1 if d.gemmex_ok else 0), best = -1
    cdef void* scratch = NULL
    cdef size_t extent
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    cdef cudaError_t err
    a.ctx, a.stream, a.d, a.g = ctx, stream, d, g[0]
    a.bias, a.aux, a.ws, a.ws_bytes, a.n_lt = bias, aux, ws, ws_bytes, found
    if c_is_input:
        extent = <size_t>((g.n - 1) * g.ldc + g.m)
        if g.strided_batched and g.batch > 1:
            extent += <size_t>((g.batch - 1) * g.stride_c)
        extent *= 8 if d.dtype == CUDA_R_64F else (4 if d.dtype == CUDA_R_32F else 2)
        with nogil:
            cudaThreadExchangeStreamCaptureMode(&mode)
            err = cudaMalloc(&scratch, extent)
            cudaThreadExchangeStreamCaptureMode(&mode)
        if err != cudaSuccess:
            cudaGetLastError()
            return 0            # no room to time it: the heuristic's first choice stays
        a.g.c = scratch
    for i in range(n):
        choices[i] = i
    cdef int second = -1, n_final = 0, base = -1
    cdef int final[4]
    cdef float final_ms[4]
    try:
        time_choices(ctx, stream, _tune_enqueue, &a, choices, n, TUNE_REPS, ms, 0 if exhaustive else 1e30)
        for i in range(n):
            if ms[i] < 0:
                continue
            if best < 0 or ms[i] < ms[best]:
                best, second = i, best
            elif second < 0 or ms[i] < ms[second]:
                second = i
        if best < 0:
            return 0
        # Candidates often lie within a percent or two, as close as one timing's noise. The
        # finalists (the two fastest and the defaults other libraries run: cuBLASLt's first
        # choice and cublasGemmEx) are timed again, longer.
        for i in (0, found if d.gemmex_ok else -1, best, second):
            if i >= 0 and ms[i] >= 0 and not _listed(final, n_final, i):
                final[n_final] = i
                n_final += 1
        fastest = ms[best]
        if not exhaustive:
            left_ms = tuning_budget_ms(fastest) - (time.perf_counter() - start) * 1e3
        if n_final > 1 and (exhaustive or left_ms > 3 * n_final * fastest * 1.2):
            time_choices(ctx, stream, _tune_enqueue, &a, final, n_final, FINAL_REPS, final_ms,
                         0 if exhaustive else left_ms)
            for i in range(n):          # the choice is among the finalists, on their new times
                if not _listed(final, n_final, i):
                    ms[i] = -1
            for i in range(n_final):
                ms[final[i]] = final_ms[i]
        # A default (cuBLASLt's first choice, cublasGemmEx) is left only for a candidate at
        # least 1% faster than it, so a choice does not hinge on noise.
        best = -1
        for i in range(n):
            if ms[i] < 0:
                continue
            if best < 0 or ms[i] < ms[best]:
                best = i
            if (i == 0 or i == found) and (base < 0 or ms[i] < ms[base]):
                base = i
        if best < 0:
            return 0
        if base >= 0 and ms[best] > 0.99 * ms[base]:
            best = base
    finally:
        if scratch != NULL:
            with nogil:             # may free the queue: cudaFree synchronizes the device
                defer_free(scratch)
    count_tuning()
    if best == found:
        d.route = PLAN_GEMMEX
    else:
        d.route, d.algo, d.workspace_needed = PLAN_LT, d.candidates[best].algo, d.candidates[best].workspaceSize
    d.tuned = True
    d.tuned_ms = ms[best]
    return 0
