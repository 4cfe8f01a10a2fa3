# cython: language_level=3, boundscheck=False, wraparound=False
"""Plans: how each GEMM runs, chosen once per problem and kept in a bounded cache per thread.

Every GEMM of cygemm plans here (cygemm.engine.execute runs the plans): `gemm`, `gemm_strided_batched`, `matmul`, the dense
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
from cygemm.engine.types cimport (ColMajorGemm, GemmTypes, Scalars, pointer_alignment, is_fp8_type,
                                  lt_batch_ok)
from cygemm.engine.errors cimport check_cublas
from cygemm.engine.errors import CygemmError
from cygemm.engine.streams cimport stream_is_capturing
from cygemm.engine.context cimport GemmContext
from cygemm.engine.launch cimport PlanData, PLAN_GEMMEX, PLAN_LT, set_scale_pointers
from cygemm.engine.lt_desc cimport make_descriptors, free_descriptors
from cygemm.engine.settings cimport (options, loaded_options, Policy, Determinism, level_serves, AUTOTUNE_OFF,
                                     AUTOTUNE_EXHAUSTIVE, DETERMINISM_OFF, DETERMINISM_BATCH_INVARIANT)
from cygemm.engine.tuning cimport in_route_timing
from cygemm.engine.chooser cimport Decider, choose, worth_timing
from cygemm.engine.tuning cimport lookup, remember, forced_route
from cygemm.engine.candidates cimport tune_candidates, apply_record, record_of, bucket_record_of
from cygemm.engine.families cimport family_candidates, bucket_key
from cygemm.engine.ktail cimport make_safe, gemmex_drops
from cygemm.engine.lt_features cimport lt_extras
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
    int determinism     # a Determinism (the autotune levels share plans; the modes do not)
    int invariance      # batch_invariant kept by cuBLASLt's own flag (1) or by kernel families (0)
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


def _exercise_cache(list ops, int limit):
    """Test hook (no GPU): run ops, each ("put" | "get" | "touch", key), on a new cache of plans
    that hold no descriptors; after each, the cached keys, least recently used first, and for a
    get whether it found the key."""
    cdef _PlanCache cache = _PlanCache()
    made = {}
    trace = []
    for op, key in ops:
        found = None
        if op == "put":
            made[key] = Plan()
            cache.put(key, made[key], limit)
        elif op == "get":
            found = cache.get(key) is not None
        elif op == "touch":
            cache.touch(made[key], limit)
        else:
            raise ValueError(f"op: expected 'put', 'get' or 'touch', got {op!r}")
        trace.append((list(cache.plans), found))
    return trace


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
                       const GemmTypes* types, Determinism determinism) noexcept nogil:
    cdef int64_t batch = g.batch if g.strided_batched else 1
    cdef PlanKey k
    memset(&k, 0, sizeof(k))            # padding too: keys are compared with memcmp
    k.device, k.dtype, k.compute, k.epi, k.opa, k.opb = ctx.device, dtype, compute, epi, g.opa, g.opb
    k.determinism = determinism
    k.invariance = determinism == DETERMINISM_BATCH_INVARIANT and loaded_options().cublas_invariance
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
    if k.determinism:   # a family's choices are kept apart from the fastest kernel's
        key += ("determinism", k.determinism + 2)      # (3, 4: the codes tuning files hold)
    if k.invariance:    # cuBLASLt's own batch invariance: its choices apart from the families'
        key += ("invariance", "cublas")
    return key


cdef Plan get_plan(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                   cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                   int64_t aux_ld, void* ws, size_t ws_bytes, Policy policy, bint c_is_input,
                   const GemmTypes* types=NULL):
    cdef PlanKey k = _plan_key(ctx, g, dtype, compute, epi, bias, aux, aux_ld, ws, ws_bytes, types,
                               policy.determinism)
    cdef _PlanCache cache = _cache()
    cdef Plan plan = cache.recent.find(&k)
    if plan is not None and level_serves(plan.d.tune_level, policy):
        cache.touch(plan, loaded_options().plan_cache_size)     # the least recently used goes, not the hottest
        return plan
    key = _key_tuple(&k)
    if plan is None:
        plan = cache.get((k.device,) + key)
    if plan is not None and level_serves(plan.d.tune_level, policy):
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
        decide_plan(plan, ctx, stream, g, bias, aux, ws, ws_bytes, policy, c_is_input, &keep)
    if policy.determinism == DETERMINISM_BATCH_INVARIANT and not plan.d.usable:
        raise_no_family(plan)
    if keep:
        cache = _cache()            # deciding may have read the tuning file, which clears caches
        cache.put((k.device,) + key, plan, options().plan_cache_size)
        cache.recent.remember(&k, plan)
    return plan


cdef Plan init_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                    cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                    int64_t aux_ld, void* ws, size_t ws_bytes, const GemmTypes* types,
                    Determinism determinism):
    cdef PlanKey k = _plan_key(ctx, g, dtype, compute, epi, bias, aux, aux_ld, ws, ws_bytes, types, determinism)
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
    d.determinism, d.family = k.determinism, -1
    d.cublas_invariance = k.invariance
    # (FP8: a timed choice must agree with the first candidate, as a second check of its kernels)
    d.verify = types != NULL and (is_fp8_type(types.a) or is_fp8_type(types.b))
    cdef int found = 0, i
    cdef bint capturing = stream_is_capturing(stream)
    cdef cublasLtMatmulAlgoGetHeuristicForStream_fn for_stream
    cdef cublasStatus_t st = CUBLAS_STATUS_SUCCESS
    if k.determinism:
        if k.determinism == DETERMINISM_BATCH_INVARIANT:
            _promises.require("batch_invariant")    # (checked once where cuBLAS is unverified)
        d.gemmex_ok = False
        if batch == 1 or lt_batch_ok(g):   # (a batch cuBLASLt is not asked about finds none below)
            family_candidates(ctx, d, g, <Determinism>k.determinism, dtype, compute, epi, bias, aux, ws_bytes, k.al_a, k.al_b,
                              k.al_c, types, lookup(ctx.device, "gemm", bucket_key(key)) if shared else None)
        found = d.n_candidates
    else:
        # Inside a capture, the heuristic that knows the stream where the library has it
        # (cuBLASLt 13.10: it answers for the capture's context; 13.5.1's plain one failed there).
        for_stream = lt_extras().heuristic_for_stream if capturing else NULL
        with nogil:     # the first heuristic query of a process loads cuBLASLt's tables
            if for_stream != NULL:
                st = for_stream(ctx.lt, d.desc, d.la, d.lb, d.lc, d.ld if d.ld != NULL else d.lc, d.pref,
                                MAX_CANDIDATES, d.candidates, &found, stream)
            else:
                st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, d.desc, d.la, d.lb, d.lc, d.ld if d.ld != NULL else d.lc,
                                                    d.pref, MAX_CANDIDATES, d.candidates, &found)
    if st != CUBLAS_STATUS_SUCCESS or (k.determinism and found == 0):
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


_NOT_READ = object()


# One plan's decision, the state of the chooser's hooks.
cdef struct PlanDecision:
    void* plan                  # the Plan (borrowed)
    GemmContext* ctx
    cudaStream_t stream
    const ColMajorGemm* g
    const void* bias
    void* aux
    void* ws
    size_t ws_bytes
    int autotune                # the call's level (a determinism mode's: AUTOTUNE_AUTO)
    int decided                 # the tune level a forced or tabled choice counts as
    bint c_is_input
    bint tabled                 # the size rule: this problem's candidates are timed
    bint* keep
    void* seen                  # a list owned by decide_plan: [what the tuning table held when read]


cdef int _forced(void* self) except -1:
    cdef PlanDecision* p = <PlanDecision*>self
    cdef PlanData* d = &(<Plan>p.plan).d
    if _force_gemm == 0:
        return 0
    if _force_gemm == 1 and d.gemmex_ok:
        d.route = PLAN_GEMMEX
    d.tune_level = p.decided
    return 1


cdef int _remembered(void* self) except -1:
    cdef PlanDecision* p = <PlanDecision*>self
    cdef Plan plan = <Plan>p.plan
    record = lookup(p.ctx.device, "gemm", plan.key)
    (<list>p.seen)[0] = record
    if record is not None and apply_record(p.ctx, &plan.d, record, p.ws_bytes, p.g.k):
        plan.d.tune_level = p.decided
        return 1
    return 0


cdef int _rule(void* self, int why) except -1:
    """The heuristic's first candidate: for good when the problem is not timed; for now while a
    layer times its routes (decided at the plan's first call outside), or while capturing (then
    not cached: timed at the first eager call)."""
    cdef PlanDecision* p = <PlanDecision*>self
    cdef PlanData* d = &(<Plan>p.plan).d
    if not p.tabled:
        d.tune_level = max(d.tune_level, p.autotune)
    elif not in_route_timing() and stream_is_capturing(p.stream):
        p.keep[0] = False
    return 0


cdef object _flight(void* self):
    cdef PlanDecision* p = <PlanDecision*>self
    cdef Plan plan = <Plan>p.plan
    seen = <list>p.seen
    if seen[0] is _NOT_READ:                    # (explicit: the table was not consulted)
        seen[0] = lookup(p.ctx.device, "gemm", plan.key)
    return "gemm", plan.key, seen[0]


cdef int _time(void* self) except -1:
    cdef PlanDecision* p = <PlanDecision*>self
    cdef Plan plan = <Plan>p.plan
    cdef PlanData* d = &plan.d
    tune_candidates(p.ctx, p.stream, d, p.g, p.bias, p.aux, p.ws, p.ws_bytes, p.autotune, p.c_is_input)
    d.tune_level = p.autotune
    if d.tuned:
        remember(p.ctx.device, "gemm", plan.key, record_of(d))
        if d.determinism == DETERMINISM_BATCH_INVARIANT and not d.shared:    # (what its size bucket times)
            remember(p.ctx.device, "gemm", bucket_key(plan.key), bucket_record_of(d))
    return 1


cdef int decide_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                     const void* bias, void* aux, void* ws, size_t ws_bytes, Policy policy,
                     bint c_is_input, bint* keep, bint explicit=False) except -1:
    """Choose among the plan's candidates by the one chooser (cygemm.engine.chooser): a forced
    route, a tuned choice from the table, timing (large problems, or, explicit, any size and
    again; not during a capture or a layer's route timing), or the heuristic's first."""
    cdef PlanData* d = &plan.d
    if (level_serves(d.tune_level, policy) and not explicit) or not d.usable:
        return 0
    cdef int64_t batch = g.batch if g.strided_batched else 1
    cdef PlanDecision p
    cdef list seen = [_NOT_READ]
    p.plan, p.ctx, p.stream, p.g, p.bias, p.aux, p.ws, p.ws_bytes = <void*>plan, ctx, stream, g, bias, aux, ws, ws_bytes
    cdef int autotune = policy.autotune
    p.autotune, p.decided, p.c_is_input, p.keep, p.seen = autotune, AUTOTUNE_EXHAUSTIVE, c_is_input, keep, <void*>seen
    # The size rule; a batch-invariant family's kernels are timed at every size (few rows need
    # its small tiles), and an explicit GemmPlan.autotune at any.
    p.tabled = autotune != AUTOTUNE_OFF and d.n_candidates + d.gemmex_ok >= 2 and (
        explicit or d.determinism == DETERMINISM_BATCH_INVARIANT or worth_timing(autotune, <double>g.m * g.n * g.k * batch))
    cdef Decider c
    c.self = &p
    c.forced, c.remembered, c.time, c.rule, c.flight = _forced, _remembered, _time, _rule, _flight
    c.read_table = not explicit
    c.may_time = p.tabled and not in_route_timing()
    c.device, c.stream, c.capturing = ctx.device, stream, -1
    choose(&c)
    return 0


cdef int forced_gemm() noexcept nogil:
    return _force_gemm


cdef int raise_no_family(Plan plan) except -1:
    if plan.d.cublas_invariance:
        raise CygemmError("determinism='batch_invariant' (batch_invariance='cublas'): cuBLASLt offered no "
                          "algorithm for this problem under CUBLASLT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS; use "
                          "set_options(batch_invariance='families'), or determinism='run_to_run' or 'off'")
    raise CygemmError(f"determinism='batch_invariant': cuBLASLt has no kernel of this problem's family "
                      f"(algorithm {plan.d.family}) for it, and no other kernel gives the same rows; "
                      "run it with determinism='run_to_run' or 'off'")
