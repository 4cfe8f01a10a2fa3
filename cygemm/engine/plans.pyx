# cython: language_level=3, boundscheck=False, wraparound=False
"""Plans: how each GEMM runs, chosen once per problem and kept in a bounded cache per thread.

Every GEMM of cygemm goes through here: `gemm`, `gemm_strided_batched`, `matmul`, the dense
forward and backward, :class:`cygemm.GemmPlan`. A plan is one problem's way to run: a cuBLASLt
algorithm (with its descriptors) or cublasGemmEx. Neither wins everywhere (H200: cuBLASLt 5.9%
faster at 1024^3 fp32, 6.4% slower at 8192^3 TF32), so a large problem's candidates are timed
once (cygemm.engine.tuning); small ones take cublasGemmEx (plain) or the heuristic's first (epilogues).
No candidate drops the end of K (cygemm.engine.ktail). Each thread keeps ``plan_cache_size`` plans.
"""
from collections import OrderedDict
import threading

from libc.stdint cimport int64_t, uint32_t, uintptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcmp, memset

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
from cygemm.engine.types cimport (ColMajorGemm, GemmTypes, Scalars, beta_is_zero, pointer_alignment, is_fp8_type,
                                  type_size, lt_batch_ok)
from cygemm.engine.errors cimport check_cublas
from cygemm.engine.errors import CygemmError
from cygemm.engine.streams cimport stream_is_capturing, check_capture_alive
from cygemm.engine.context cimport GemmContext, stream_workspace
from cygemm.engine.launch cimport (PlanData, PLAN_GEMMEX, PLAN_LT, gemm_colmajor, needs_64bit_api, plan_run,
                                   set_scale_pointers)
from cygemm.engine.lt_desc cimport make_descriptors, free_descriptors
from cygemm.engine.settings cimport (options, loaded_options, default_policy, AUTOTUNE_OFF, AUTOTUNE_EXHAUSTIVE,
                                     POLICY_RUN_TO_RUN, POLICY_BATCH_INVARIANT)
from cygemm.engine.timing cimport worth_tuning, in_route_timing
from cygemm.engine.tuning cimport lookup, remember, claim_tuning, release_tuning, forced_route
from cygemm.engine.candidates cimport tune_candidates, apply_record, record_of, bucket_record_of
from cygemm.engine.families cimport family_candidates, bucket_key
from cygemm.engine.ktail cimport make_safe, gemmex_drops
from cygemm.engine import tuning
from cygemm.engine import settings as _settings, promises as _promises

# ---------------------------------------------------------------- plans

cdef class Plan:
    """One problem's way to run: route, and for cuBLASLt its descriptors and algorithm. The
    thread caches hold these; cygemm.GemmPlan extends it with its operands and lifecycle.
    Its descriptors are freed by close() or when it is dropped (not through a subclass's close)."""

    def __dealloc__(self):
        free_descriptors(&self.d)

    def close(self):
        """Free the cuBLASLt descriptors now; the plan then runs nothing (usable is False)."""
        self.d.usable = False
        free_descriptors(&self.d)

    @property
    def route(self):
        """"cublasLt" or "cublasGemmEx"."""
        return "cublasLt" if self.d.route == PLAN_LT else "cublasGemmEx"

    @property
    def usable(self):
        """False when nothing can run it (no algorithm, closed, or a GemmPlan not planned yet)."""
        return bool(self.d.usable)

    @property
    def tuned(self):
        """Whether the algorithm was chosen by timing (here, or read from the tuning file)."""
        return bool(self.d.tuned)

    @property
    def tuned_ms(self):
        """The chosen candidate's median time in ms (0 when not timed)."""
        return self.d.tuned_ms


# The plan key as a C struct: a repeated call finds its plan among the last few by memcmp, without
# building the dict key (measured ~0.5 us of the small-call cost). It holds all that changes which
# algorithm is valid, alignment included: a plan chosen for aligned pointers never runs unaligned.
ctypedef struct PlanKey:
    int device, dtype, compute, epi
    int policy          # a determinism policy, else 0 (the autotune levels share plans)
    int opa, opb
    int64_t m, n, k, lda, ldb, ldc, aux_ld
    int64_t batch, stride_a, stride_b, stride_c
    uint32_t al_a, al_b, al_c, al_bias, al_aux, al_ws
    size_t ws_bytes
    bint typed          # GemmTypes given (FP8): the fields below count
    int a_type, b_type, c_type, bias_type
    uint32_t scale_flags    # which of a_scale, b_scale, d_scale, amax_d are set; fast_accum; scale modes

cdef enum:
    RECENT_PLANS = 16
    MAX_CANDIDATES = 8      # the heuristic's first eight (and cublasGemmEx, timed beside them)


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
    _force_gemm = {None: 0, "cublasGemmEx": 1, "cublasLt": 2}[forced_route("gemm")]
    clear_plan_cache()


tuning.register_routes("gemm", ("cublasGemmEx", "cublasLt"), _on_routes_changed)


cdef PlanKey _plan_key(GemmContext* ctx, const ColMajorGemm* g, cudaDataType dtype,
                       cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias,
                       void* aux, int64_t aux_ld, void* ws, size_t ws_bytes,
                       const GemmTypes* types, int policy) noexcept nogil:
    cdef int64_t batch = g.batch if g.strided_batched else 1
    cdef PlanKey k
    memset(&k, 0, sizeof(k))            # padding too: keys are compared with memcmp
    k.device, k.dtype, k.compute, k.epi, k.opa, k.opb = ctx.device, dtype, compute, epi, g.opa, g.opb
    k.policy = policy if policy >= POLICY_RUN_TO_RUN else 0
    k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.aux_ld = g.m, g.n, g.k, g.lda, g.ldb, g.ldc, aux_ld
    k.batch = batch
    if batch > 1:
        k.stride_a, k.stride_b, k.stride_c = g.stride_a, g.stride_b, g.stride_c
    k.al_a, k.al_b, k.al_c = pointer_alignment(g.a), pointer_alignment(g.b), pointer_alignment(g.c)
    k.al_bias, k.al_aux = pointer_alignment(bias), pointer_alignment(aux)
    # A refused call (e.g. a misaligned lt_workspace) marks its own plan, not the aligned one's.
    k.al_ws = pointer_alignment(ws)
    k.ws_bytes = ws_bytes
    if types != NULL:
        k.typed = True
        k.a_type, k.b_type, k.c_type, k.bias_type = types.a, types.b, types.c, types.bias
        k.scale_flags = ((types.a_scale != NULL) | (types.b_scale != NULL) << 1 | (types.d_scale != NULL) << 2
                         | (types.amax_d != NULL) << 3 | (<uint32_t>types.fast_accum) << 4
                         | (<uint32_t>types.a_scale_mode) << 5 | (<uint32_t>types.b_scale_mode) << 9)
    return k


cdef tuple _key_tuple(const PlanKey* k):
    key = (k.dtype, k.compute, k.epi, k.opa, k.opb, k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.aux_ld,
           k.batch, k.stride_a, k.stride_b, k.stride_c, k.al_a, k.al_b, k.al_c, k.al_bias, k.al_aux,
           k.al_ws, k.ws_bytes)
    if k.typed:         # (plain GEMMs keep the keys their tuning files were written with)
        key += ("types", k.a_type, k.b_type, k.c_type, k.bias_type, k.scale_flags)
    if k.policy:        # a family's choices are kept apart from the fastest kernel's
        key += ("determinism", k.policy)
    return key


cdef Plan get_plan(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                   cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                   int64_t aux_ld, void* ws, size_t ws_bytes, int autotune, bint c_is_input,
                   const GemmTypes* types=NULL):
    if autotune < 0:
        options()
        autotune = default_policy()
    cdef PlanKey k = _plan_key(ctx, g, dtype, compute, epi, bias, aux, aux_ld, ws, ws_bytes, types, autotune)
    cdef _PlanCache cache = _cache()
    cdef Plan plan = cache.recent.find(&k)
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
        plan = _make_plan(Plan(), ctx, stream, g, dtype, compute, epi, bias, aux, aux_ld, ws, ws_bytes, &k, key,
                          &keep, types)
    elif types != NULL and plan.d.desc != NULL:
        # Deciding runs the GEMM: with this call's scales and amax, not those an earlier call
        # left in the descriptor (their buffers may be gone, and amax would be written there).
        check_cublas(<cublasStatus_t>set_scale_pointers(&plan.d, types), "cublasLtMatmulDescSetAttribute(scales)")
    if keep:
        decide_plan(plan, ctx, stream, g, bias, aux, ws, ws_bytes, autotune, c_is_input, &keep)
    if autotune == POLICY_BATCH_INVARIANT and not plan.d.usable:
        raise_no_family(plan)
    if keep:
        cache = _cache()            # deciding may have read the tuning file, which clears caches
        cache.put((k.device,) + key, plan, options().plan_cache_size)
        cache.recent.remember(&k, plan)
    return plan


cdef Plan init_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                    cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                    int64_t aux_ld, void* ws, size_t ws_bytes, const GemmTypes* types=NULL, int policy=-1):
    if policy < 0:
        options()
        policy = default_policy()
    cdef PlanKey k = _plan_key(ctx, g, dtype, compute, epi, bias, aux, aux_ld, ws, ws_bytes, types, policy)
    cdef bint keep = True
    free_descriptors(&plan.d)           # what it held before (a plan made again): none left behind
    memset(&plan.d, 0, sizeof(PlanData))
    return _make_plan(plan, ctx, stream, g, dtype, compute, epi, bias, aux, aux_ld, ws, ws_bytes, &k,
                      _key_tuple(&k), &keep, types, False)


cdef Plan _make_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                     cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                     int64_t aux_ld, void* ws, size_t ws_bytes, const PlanKey* k, tuple key, bint* keep,
                     const GemmTypes* types=NULL, bint shared=True):
    """Fill `plan` (a new one) with the heuristic's candidates; keep[0] False when it must not be
    cached: made during a capture, where a heuristic may be refused (the next eager call decides).
    shared: a batch-invariant plan may take its size bucket's member (not a GemmPlan's)."""
    plan.key = key
    cdef PlanData* d = &plan.d
    d.capture_ok = True
    d.dtype, d.compute, d.device = dtype, compute, ctx.device
    d.tune_level = -1
    cdef int64_t batch = k.batch
    make_descriptors(d, g, batch, dtype, compute, epi, bias, aux, aux_ld, ws_bytes, k.al_a, k.al_b, k.al_c, types)
    # cublasGemmEx is a candidate for plain GEMMs (it has no epilogues), but for no determinism
    # policy: it picks its kernel by the problem's size.
    d.gemmex_ok = epi == CUBLASLT_EPILOGUE_DEFAULT and bias == NULL and aux == NULL and types == NULL
    d.policy, d.family = k.policy, -1
    # (FP8: a timed choice must agree with the first candidate, as a second check of its kernels)
    d.verify = types != NULL and (is_fp8_type(types.a) or is_fp8_type(types.b))
    cdef int found = 0, i
    cdef bint capturing = stream_is_capturing(stream)
    cdef cublasStatus_t st = CUBLAS_STATUS_SUCCESS
    if k.policy:
        if k.policy == POLICY_BATCH_INVARIANT:
            _promises.require("batch_invariant")    # (checked once where cuBLAS is unverified)
        d.gemmex_ok = False
        if batch == 1 or lt_batch_ok(g):   # (a batch cuBLASLt is not asked about finds none below)
            family_candidates(ctx, d, g, k.policy, dtype, compute, epi, bias, aux, ws_bytes, k.al_a, k.al_b,
                              k.al_c, types, lookup(ctx.device, "gemm", bucket_key(key)) if shared else None)
        found = d.n_candidates
    else:
        with nogil:     # the first heuristic query of a process loads cuBLASLt's tables
            st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, d.desc, d.la, d.lb, d.lc, d.ld if d.ld != NULL else d.lc,
                                                d.pref, MAX_CANDIDATES, d.candidates, &found)
    if st != CUBLAS_STATUS_SUCCESS or (k.policy and found == 0):
        found = 0
        if capturing:               # perhaps the capture's fault: decided again eagerly
            keep[0] = False
    if batch > 1 and not lt_batch_ok(g):
        found = 0
    cdef int n_ok = 0
    for i in range(found):          # keep the candidates that fit this workspace
        if d.candidates[i].state == CUBLAS_STATUS_SUCCESS and d.candidates[i].workspaceSize <= ws_bytes:
            d.candidates[n_ok] = d.candidates[i]
            n_ok += 1
    cdef int safe         # no candidate may drop the end of K: a flagged split moves (cygemm.engine.ktail)
    cdef size_t ws_needed = 0
    found, n_ok = n_ok, 0
    for i in range(found):
        ws_needed = d.candidates[i].workspaceSize
        safe = make_safe(ctx.lt, d.desc, d.la, d.lb, d.lc, d.ld, &d.candidates[i].algo, dtype, g.k, ws_bytes, &ws_needed)
        if safe >= 0:
            d.candidates[n_ok] = d.candidates[i]
            d.candidates[n_ok].workspaceSize = ws_needed
            n_ok += 1
    d.gemmex_ok = d.gemmex_ok and not gemmex_drops(ctx, g, dtype, compute)     # (its kernel's K tail)
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
                     bint c_is_input, bint* keep, bint explicit=False) except -1:
    """Choose among the plan's candidates as `autotune` says: a forced route, a tuned choice
    from the table, timing (large problems, or, explicit, any size and again; not during a
    capture), or the heuristic's first. Threads deciding one new problem at once time it once:
    the others wait for that thread's choice (cygemm.engine.tuning.claim_tuning)."""
    cdef PlanData* d = &plan.d
    if (d.tune_level >= autotune and not explicit) or not d.usable:
        return 0
    cdef int decided = max(autotune, <int>AUTOTUNE_EXHAUSTIVE)     # what a forced or tabled choice counts as
    if _force_gemm == 1 and d.gemmex_ok:
        d.route = PLAN_GEMMEX
    if _force_gemm:
        d.tune_level = decided
        return 0
    record = lookup(ctx.device, "gemm", plan.key)
    if record is not None and not explicit and apply_record(ctx, d, record, ws_bytes, g.k):
        d.tune_level = decided
        return 0
    cdef int64_t batch = g.batch if g.strided_batched else 1
    cdef double macs = <double>g.m * g.n * g.k * batch
    # (A batch-invariant family's kernels are timed at every size: few rows need its small tiles.)
    if autotune == AUTOTUNE_OFF or d.n_candidates + d.gemmex_ok < 2 or not (
            explicit or worth_tuning(macs) or d.policy == POLICY_BATCH_INVARIANT):
        d.tune_level = max(d.tune_level, autotune)
        return 0
    if in_route_timing():           # a layer is timing its routes: the heuristic's choice for now,
        return 0                    # decided at the plan's first call outside route timing
    if stream_is_capturing(stream):
        keep[0] = False             # the heuristic's choice now; timed at the first eager call
        return 0
    if not claim_tuning(ctx.device, "gemm", plan.key, record):
        # Another thread timed this problem (perhaps while this one waited): its choice.
        # Or this thread is timing it already: the heuristic's for now, decided next call.
        record = lookup(ctx.device, "gemm", plan.key)
        if record is not None and apply_record(ctx, d, record, ws_bytes, g.k):
            d.tune_level = decided
        return 0
    try:
        tune_candidates(ctx, stream, d, g, bias, aux, ws, ws_bytes, autotune, c_is_input)
        d.tune_level = autotune
        if d.tuned:
            remember(ctx.device, "gemm", plan.key, record_of(d))
            if d.policy == POLICY_BATCH_INVARIANT and not d.shared:    # (what its size bucket times)
                remember(ctx.device, "gemm", bucket_key(plan.key), bucket_record_of(d))
    finally:
        release_tuning(ctx.device, "gemm", plan.key)
    return 0


# ---------------------------------------------------------------- running a plan

cdef int run_gemm(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                  cublasComputeType_t compute, const Scalars* sc,
                  int autotune) except -1 nogil:
    cdef int64_t batch = g.batch if g.strided_batched else 1
    if autotune < 0:
        autotune = default_policy()
    # cublasGemmEx (its own kernel choice, guarded in _launch) for no batch-invariant call but k = 0;
    # small problems too, unless its kernel would drop part of K (then their guarded plan).
    if g.k == 0 or (autotune != POLICY_BATCH_INVARIANT and (
            needs_64bit_api(g) or _force_gemm == 1 or compute == CUBLAS_COMPUTE_64F or (
            _force_gemm == 0 and not worth_tuning(<double>g.m * g.n * g.k * batch)
            and not gemmex_drops(ctx, g, dtype, compute)))):
        return gemm_colmajor(ctx, stream, g, dtype, compute, sc)
    cdef void* ws = stream_workspace(ctx, stream)       # may allocate: without the GIL
    with gil:
        if autotune == POLICY_BATCH_INVARIANT and batch > 1 and not lt_batch_ok(g):
            _each_matrix(ctx, stream, g, dtype, compute, sc, ws, autotune)
        else:
            _run_planned(ctx, stream, g, dtype, compute, sc, ws, autotune)
    return 0


cdef int _each_matrix(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                      cublasComputeType_t compute, const Scalars* sc, void* ws,
                      int autotune) except -1:
    """A batch cuBLASLt is not asked about (broadcast or interleaved), one matrix at a time:
    each by the plan of one matrix, as it would run alone."""
    cdef ColMajorGemm one = g[0]
    cdef int64_t i, size = type_size(dtype)
    one.batch, one.strided_batched = 1, False
    for i in range(g.batch):
        one.a = <const char*>g.a + i * g.stride_a * size
        one.b = <const char*>g.b + i * g.stride_b * size
        one.c = <char*>g.c + i * g.stride_c * size
        _run_planned(ctx, stream, &one, dtype, compute, sc, ws, autotune)
    return 0


cdef int execute_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                      const void* bias, void* aux, void* ws, size_t ws_bytes, const Scalars* sc,
                      int* refused_status=NULL) except -1:
    if not plan.d.usable:
        return 1
    if plan.d.route == PLAN_LT and not plan.d.capture_ok and stream_is_capturing(stream):
        return 1
    cdef int st
    with nogil:
        st = plan_run(ctx, stream, &plan.d, g, bias, aux, ws, ws_bytes, sc)
    if st == CUBLAS_STATUS_SUCCESS:
        return 0
    if plan.d.route == PLAN_GEMMEX:         # cuBLAS's own choice failed: nothing to fall back to
        return check_cublas(<cublasStatus_t>st, "cublasGemmEx")
    # cuBLASLt refused the call (nothing enqueued). Inside a capture, remember that this
    # algorithm does not capture; outside, that it does not run.
    if refused_status != NULL:
        refused_status[0] = st
    if stream_is_capturing(stream):
        check_capture_alive(stream)
        plan.d.capture_ok = False
    else:
        plan.d.usable = False
    return 1


cdef int run_with_fallback(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                           void* ws, size_t ws_bytes, const Scalars* sc) except -1:
    """Run a plain GEMM's plan; where cuBLASLt refuses it (nothing enqueued), cublasGemmEx (but
    under the batch-invariant policy, CygemmError)."""
    if execute_plan(plan, ctx, stream, g, NULL, NULL, ws, ws_bytes, sc):
        if plan.d.policy == POLICY_BATCH_INVARIANT:
            raise_no_family(plan)
        with nogil:
            gemm_colmajor(ctx, stream, g, plan.d.dtype, plan.d.compute, sc)
    return 0


cdef int _run_planned(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                      cublasComputeType_t compute, const Scalars* sc, void* ws,
                      int autotune) except -1:
    cdef size_t ws_bytes = ctx.workspace_bytes
    cdef Plan plan = get_plan(ctx, stream, g, dtype, compute, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0,
                              ws, ws_bytes, autotune, not beta_is_zero(sc))
    return run_with_fallback(plan, ctx, stream, g, ws, ws_bytes, sc)


cdef int raise_no_family(Plan plan) except -1:
    raise CygemmError(f"determinism='batch_invariant': cuBLASLt has no kernel of this problem's family "
                      f"(algorithm {plan.d.family}) for it, and no other kernel gives the same rows; "
                      "run it with determinism='run_to_run' or 'off'")
