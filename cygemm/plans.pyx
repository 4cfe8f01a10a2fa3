# cython: language_level=3, boundscheck=False, wraparound=False
"""The plan layer: how each GEMM runs, chosen once per problem and remembered.

Every GEMM of cygemm goes through here: `gemm`, `gemm_strided_batched`, the dense forward
(epilogues included) and the backward's two GEMMs. A plan is one problem's way to run:
a cuBLASLt algorithm (with its descriptors) or cublasGemmEx. Neither wins everywhere (on
the H200 the best cuBLASLt candidate beat cublasGemmEx by 5.9% at 1024^3 fp32 and lost by
6.4% at 8192^3 TF32), so for a large problem the candidates are timed once: the cuBLASLt
heuristic's algorithms and, for a plain GEMM, cublasGemmEx (cublasGemmStridedBatchedEx for
batches), with the L2 cache flushed before every timed run, never during a capture, without
holding the GIL while the GPU works. Small problems take cublasGemmEx (plain) or the
heuristic's first choice (epilogues): timing them costs more than it could save.

Tuned choices live in a process-wide table that a tuning file can save and load (an
environment variable, CYGEMM_TUNING_CACHE, or save_tuning/load_tuning), keyed by GPU model,
driver and cuBLASLt version and the problem, so a second process runs its first call of a
tuned shape with no timing. The route tables of the dense layer (fused.pyx) keep their
choices in the same table.
"""
import json
import os
import threading
import warnings

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcmp, memset, memcpy

from cygemm.cudart cimport *
from cygemm.timing cimport cygemm_hold_stream
from cygemm.cublas cimport *
from cygemm.cublaslt cimport *
from cygemm._core cimport (GemmContext, check_cuda, check_cublas, bind_stream, stream_is_capturing,
                           stream_workspace, defer_free)
from cygemm._core import CygemmError

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
    """One problem's way to run: route, and for cuBLASLt its descriptors and algorithm."""

    def __dealloc__(self):
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
    MAX_CANDIDATES = 8
    TUNE_REPS = 5           # rounds for every candidate
    FINAL_REPS = 11         # rounds for the finalists


cdef class _Recent:
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


# Plans hold cuBLASLt descriptors, used by one thread at a time: each thread has its own.
cdef object _tls = threading.local()


cdef dict _plans():
    try:
        return _tls.plans
    except AttributeError:
        _tls.plans = {}
        return _tls.plans


cdef _Recent _recent():
    try:
        return _tls.recent
    except AttributeError:
        _tls.recent = _Recent()
        return _tls.recent


def clear_plan_cache():
    """Drop this thread's plans (rebuilt on the next call; tuned choices are kept, see clear_tuning)."""
    _plans().clear()
    _tls.recent = _Recent()


def plan_cache_size():
    """How many plans this thread holds."""
    return len(_plans())


def thread_plans():
    """This thread's plans, {(device, *problem key): Plan} (a copy; for tests and diagnostics)."""
    return dict(_plans())


# Problems of at least this many multiply-adds time their candidates once.
cdef double TUNE_MIN_MACS = float(os.environ.get("CYGEMM_AUTOTUNE_MIN_MACS", 2.0 ** 28))


cdef bint worth_tuning(double macs) noexcept nogil:
    return macs >= TUNE_MIN_MACS


# Routes forced instead of measured (force_routes: tests, diagnostics, comparisons).
cdef int _force_gemm = 0        # 0: measured; 1: cublasGemmEx; 2: cuBLASLt's first choice
_forced_routes = {}


def force_routes(gemm=None, forward=None, backward=None):
    """Force routes instead of the measured or fixed choice; None (the default) undoes it.

    Parameters
    ----------
    gemm : {"cublasGemmEx", "cublasLt"} or None
        Every plain GEMM, small ones included, runs this way ("cublasLt": the heuristic's
        first algorithm; where cuBLASLt has none, cublasGemmEx).
    forward : str or None
        A name of cygemm.fused.FORWARD_ROUTES; a call the route does not apply to takes the
        fixed rule.
    backward : {"serial", "branches"} or None
        The backward's GEMMs on one stream or two.

    Clears this thread's plans. Tuned choices are neither used nor recorded for what is forced.
    """
    global _force_gemm
    if gemm not in (None, "cublasGemmEx", "cublasLt"):
        raise ValueError(f"gemm: expected None, 'cublasGemmEx' or 'cublasLt', got {gemm!r}")
    _force_gemm = {None: 0, "cublasGemmEx": 1, "cublasLt": 2}[gemm]
    _forced_routes.clear()
    if forward is not None:
        _forced_routes["forward"] = str(forward)
    if backward is not None:
        _forced_routes["backward"] = str(backward)
    _route_memo.clear()
    _bump_routes_generation()
    clear_plan_cache()


def autotune_threshold():
    """Multiply-adds from which a problem's candidates are timed (CYGEMM_AUTOTUNE_MIN_MACS)."""
    return TUNE_MIN_MACS


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


cdef Plan get_plan(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                   cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                   int64_t aux_ld, void* ws, size_t ws_bytes):
    return _get_plan(ctx, stream, g, dtype, compute, epi, bias, aux, aux_ld, ws, ws_bytes, False)


cdef Plan _get_plan(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                    cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                    int64_t aux_ld, void* ws, size_t ws_bytes, bint c_is_input):
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
    cdef _Recent recent = _recent()
    cdef Plan plan = recent.find(&k)
    if plan is not None:
        return plan
    key = (k.dtype, k.compute, k.epi, k.opa, k.opb, k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.aux_ld,
           k.batch, k.stride_a, k.stride_b, k.stride_c, k.al_a, k.al_b, k.al_c, k.al_bias, k.al_aux,
           k.al_ws, k.ws_bytes)
    plans = _plans()
    plan = plans.get((k.device,) + key)
    if plan is not None:
        recent.remember(&k, plan)
        return plan
    cdef bint keep = True
    plan = _make_plan(ctx, stream, g, dtype, compute, epi, bias, aux, aux_ld, ws, ws_bytes, &k, key,
                      c_is_input, &keep)
    if keep:
        plans[(k.device,) + key] = plan
        recent.remember(&k, plan)
    return plan


cdef Plan _make_plan(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                     cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                     int64_t aux_ld, void* ws, size_t ws_bytes, const PlanKey* k, tuple key,
                     bint c_is_input, bint* keep):
    """A new plan; keep[0] False when it must not be cached: made during a capture, where a
    heuristic may be refused and candidates are not timed (the next eager call decides)."""
    cdef Plan plan = Plan()
    plan.key = key
    cdef PlanData* d = &plan.d
    d.capture_ok = True
    d.dtype, d.compute = dtype, compute
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
    cdef bint gemmex_ok = epi == CUBLASLT_EPILOGUE_DEFAULT and bias == NULL and aux == NULL
    cdef cublasLtMatmulHeuristicResult_t results[MAX_CANDIDATES]
    cdef int found = 0, i
    cdef bint capturing = stream_is_capturing(stream)
    cdef cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, d.desc, d.la, d.lb, d.lc, d.lc, d.pref,
                                                            MAX_CANDIDATES, results, &found)
    if st != CUBLAS_STATUS_SUCCESS:
        found = 0
    if batch > 1 and not _lt_batch_ok(g):
        found = 0
    cdef int n_ok = 0
    for i in range(found):          # keep the candidates that fit this workspace
        if results[i].state == CUBLAS_STATUS_SUCCESS and results[i].workspaceSize <= ws_bytes:
            results[n_ok] = results[i]
            n_ok += 1
    found = n_ok
    d.usable = found > 0 or gemmex_ok
    if found > 0:
        d.route = PLAN_LT
        d.algo = results[0].algo
        d.workspace_needed = results[0].workspaceSize
    else:
        d.route = PLAN_GEMMEX
    if not d.usable:
        # Some CUDA versions refuse heuristics during capture: use the fallback now, but
        # do not remember a verdict that may be the capture's fault.
        keep[0] = not capturing
        return plan
    if _force_gemm == 1 and gemmex_ok:
        d.route = PLAN_GEMMEX
    if _force_gemm:
        return plan
    gpu = _gpu_id(ctx.device)
    record = _lookup(gpu, "gemm", key)
    if record is not None and _apply_record(ctx, d, record, gemmex_ok, ws_bytes):
        return plan
    cdef double macs = <double>g.m * g.n * g.k * batch
    if worth_tuning(macs) and found + gemmex_ok > 1:
        if capturing:
            keep[0] = False     # the heuristic's choice now; timed at the first eager call
            return plan
        _tune_plan(ctx, stream, d, g, bias, aux, ws, ws_bytes, results, found, gemmex_ok, c_is_input)
        if d.tuned:
            _remember(gpu, "gemm", key, _record_of(d))
    return plan


cdef bint _lt_batch_ok(const ColMajorGemm* g) noexcept nogil:
    """Batches cuBLASLt is asked about: every operand's matrices one after another. Broadcast
    (stride 0) and interleaved batches stay with cublasGemmStridedBatchedEx, which is
    documented for them."""
    cdef int64_t a_cols = g.k if g.opa == CUBLAS_OP_N else g.m
    cdef int64_t b_cols = g.n if g.opb == CUBLAS_OP_N else g.k
    return (g.stride_a >= g.lda * a_cols and g.stride_b >= g.ldb * b_cols
            and g.stride_c >= g.ldc * g.n)


cdef bint _apply_record(GemmContext* ctx, PlanData* d, dict record, bint gemmex_ok, size_t ws_bytes):
    """Use a tuned choice if it still fits (cublasLtMatmulAlgoCheck for a stored algorithm)."""
    cdef cublasLtMatmulAlgo_t algo
    cdef cublasLtMatmulHeuristicResult_t check
    cdef float ms
    try:
        route = record["route"]
        ms = float(record.get("ms", 0.0))
        if route == "cublasGemmEx":
            if not gemmex_ok:
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
                  cublasComputeType_t compute, const float* alpha, const float* beta) except -1 nogil:
    cdef int64_t batch = g.batch if g.strided_batched else 1
    if _wide(g) or _force_gemm == 1 or g.k == 0 or compute == CUBLAS_COMPUTE_64F or (
            _force_gemm == 0 and not worth_tuning(<double>g.m * g.n * g.k * batch)):
        return gemm_colmajor(ctx, stream, g, dtype, compute, alpha, beta)
    with gil:
        _run_planned(ctx, stream, g, dtype, compute, alpha, beta)
    return 0


cdef int _run_planned(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                      cublasComputeType_t compute, const float* alpha, const float* beta) except -1:
    cdef void* ws = stream_workspace(ctx, stream)
    cdef size_t ws_bytes = ctx.workspace_bytes
    cdef Plan plan = _get_plan(ctx, stream, g, dtype, compute, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0,
                               ws, ws_bytes, beta[0] != 0)
    cdef int st = CUBLAS_STATUS_NOT_SUPPORTED
    if plan is not None and plan.d.usable and (plan.d.capture_ok or plan.d.route == PLAN_GEMMEX
                                               or not stream_is_capturing(stream)):
        with nogil:
            st = plan_run(ctx, stream, &plan.d, g, NULL, NULL, ws, ws_bytes, alpha, beta)
        if st != CUBLAS_STATUS_SUCCESS and plan.d.route == PLAN_LT:
            # A refused call enqueues nothing: cublasGemmEx runs instead. Inside a capture,
            # remember that this algorithm does not capture.
            if stream_is_capturing(stream):
                check_capture_alive(stream)
                plan.d.capture_ok = False
            else:
                plan.d.usable = False
        elif st != CUBLAS_STATUS_SUCCESS:
            return check_cublas(<cublasStatus_t>st, "cublasGemmEx")
    if st != CUBLAS_STATUS_SUCCESS:
        with nogil:
            gemm_colmajor(ctx, stream, g, dtype, compute, alpha, beta)
    return 0


cdef int check_capture_alive(cudaStream_t stream) except -1:
    cdef cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone
    check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing")
    if status == cudaStreamCaptureStatusInvalidated:
        raise RuntimeError("cublasLtMatmul invalidated the stream's capture; call the function once "
                           "before capturing, or capture with mode='relaxed'")
    return 0


# ---------------------------------------------------------------- timing

# One buffer per device, twice its L2 size, written before every timed run so that no
# candidate finds its operands in L2 left there by the previous one. Made on the first
# tuning on that device and kept for the life of the process.
cdef void* _flush_buf[64]
cdef size_t _flush_bytes[64]


cdef int _flush_l2(int device, cudaStream_t stream) except -1:
    cdef int l2 = 0
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    cdef cudaError_t err
    if device < 0 or device >= 64:
        return 0
    if _flush_buf[device] == NULL:
        check_cuda(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute(L2)")
        cudaThreadExchangeStreamCaptureMode(&mode)
        err = cudaMalloc(&_flush_buf[device], 2 * <size_t>l2 + 256)
        cudaThreadExchangeStreamCaptureMode(&mode)
        check_cuda(err, "cudaMalloc(L2 flush buffer)")
        _flush_bytes[device] = 2 * <size_t>l2 + 256
    return check_cuda(cudaMemsetAsync(_flush_buf[device], 0, _flush_bytes[device], stream),
                      "cudaMemsetAsync(L2 flush)")


# CYGEMM_TUNING_MODE: how a candidate is timed.
#   "sustained": SUSTAINED_CALLS calls back to back, queued behind a kernel that holds the
#                stream while the host enqueues the round, so the GPU runs them without
#                gaps, as in a training loop or a benchmark;
#   "cold": one call after L2 is flushed (a buffer twice the L2 size written);
#   "hot": one call, no flush.
cdef int _tune_mode = {"cold": 0, "hot": 1, "sustained": 2}.get(os.environ.get("CYGEMM_TUNING_MODE", "cold"), 0)

cdef enum:
    SUSTAINED_CALLS = 3
    HOLD_NS_PER_CALL = 40000       # host time to enqueue one call, with a margin


cdef int time_choices(GemmContext* ctx, cudaStream_t stream, enqueue_fn enqueue, void* arg,
                      const int* choices, int n, int reps, float* ms) except -1:
    cdef int i, r, j, st, c
    cdef int calls = SUSTAINED_CALLS if _tune_mode == 2 else 1
    cdef int n_events = 2 * n * reps + 1      # the last one: recorded after every round
    cdef cudaEvent_t* ev = <cudaEvent_t*>malloc(n_events * sizeof(cudaEvent_t))
    cdef float* t = <float*>malloc(n * reps * sizeof(float))
    cdef bint* ok = <bint*>malloc(n * sizeof(bint))
    cdef float x
    if ev == NULL or t == NULL or ok == NULL:
        free(ev); free(t); free(ok)
        raise MemoryError()
    memset(ev, 0, n_events * sizeof(cudaEvent_t))
    try:
        for i in range(n_events):
            check_cuda(cudaEventCreate(&ev[i]), "cudaEventCreate")
        for i in range(n):          # warm-up: kernels loaded, the choice's own plans made
            ok[i] = enqueue(arg, choices[i]) == 0
        for r in range(reps):       # interleaved rounds: drift hits every choice alike
            if calls > 1:
                check_cuda(cygemm_hold_stream(<uint64_t>min(n * calls * HOLD_NS_PER_CALL + 100000, 20000000),
                                              stream), "cygemm_hold_stream")
            for i in range(n):
                if not ok[i]:
                    continue
                if _tune_mode == 0:
                    _flush_l2(ctx.device, stream)
                check_cuda(cudaEventRecord(ev[2 * (r * n + i)], stream), "cudaEventRecord")
                for c in range(calls):
                    if ok[i]:
                        ok[i] = enqueue(arg, choices[i]) == 0
                check_cuda(cudaEventRecord(ev[2 * (r * n + i) + 1], stream), "cudaEventRecord")
        check_cuda(cudaEventRecord(ev[n_events - 1], stream), "cudaEventRecord")
        with nogil:
            st = cudaEventSynchronize(ev[n_events - 1])
        check_cuda(<cudaError_t>st, "cudaEventSynchronize")
        for i in range(n):
            ms[i] = -1
            if not ok[i]:
                continue
            for r in range(reps):
                check_cuda(cudaEventElapsedTime(&t[i * reps + r], ev[2 * (r * n + i)], ev[2 * (r * n + i) + 1]),
                           "cudaEventElapsedTime")
            for r in range(1, reps):        # insertion sort: reps is small
                x = t[i * reps + r]
                j = r - 1
                while j >= 0 and t[i * reps + j] > x:
                    t[i * reps + j + 1] = t[i * reps + j]
                    j -= 1
                t[i * reps + j + 1] = x
            ms[i] = t[i * reps + reps // 2] / calls
    finally:
        for i in range(n_events):
            if ev[i] != NULL:
                cudaEventDestroy(ev[i])
        free(ev); free(t); free(ok)
    return 0


ctypedef struct _TuneArg:
    GemmContext* ctx
    cudaStream_t stream
    PlanData* d
    ColMajorGemm g
    const void* bias
    void* aux
    void* ws
    size_t ws_bytes
    cublasLtMatmulHeuristicResult_t* results
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
        a.d.algo = a.results[choice].algo
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
                    const void* bias, void* aux, void* ws, size_t ws_bytes,
                    cublasLtMatmulHeuristicResult_t* results, int found, bint gemmex_ok,
                    bint c_is_input) except -1:
    """Time the candidates on the call's own operands and keep the fastest. A GEMM whose C
    is an input (beta != 0) is timed writing to a scratch output instead."""
    global _tuning_count
    cdef _TuneArg a
    cdef int choices[MAX_CANDIDATES + 1]
    cdef float ms[MAX_CANDIDATES + 1]
    cdef int i, n = found + (1 if gemmex_ok else 0), best = -1
    cdef void* scratch = NULL
    cdef size_t extent
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    cdef cudaError_t err
    a.ctx, a.stream, a.d, a.g = ctx, stream, d, g[0]
    a.bias, a.aux, a.ws, a.ws_bytes, a.results, a.n_lt = bias, aux, ws, ws_bytes, results, found
    if c_is_input:
        extent = <size_t>((g.n - 1) * g.ldc + g.m)
        if g.strided_batched and g.batch > 1:
            extent += <size_t>((g.batch - 1) * g.stride_c)
        extent *= 8 if d.dtype == CUDA_R_64F else (4 if d.dtype == CUDA_R_32F else 2)
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
        time_choices(ctx, stream, _tune_enqueue, &a, choices, n, TUNE_REPS, ms)
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
        # choice and cublasGemmEx) are timed again, longer; a default is left only for a
        # candidate at least 1% faster than it, so a choice does not hinge on noise.
        for i in (0, found if gemmex_ok else -1, best, second):
            if i >= 0 and ms[i] >= 0 and not _listed(final, n_final, i):
                final[n_final] = i
                n_final += 1
        if n_final > 1:
            time_choices(ctx, stream, _tune_enqueue, &a, final, n_final, FINAL_REPS, final_ms)
            best = -1
            for i in range(n_final):
                if final_ms[i] < 0:
                    continue
                ms[final[i]] = final_ms[i]
                if best < 0 or final_ms[i] < ms[best]:
                    best = final[i]
                if (final[i] == 0 or final[i] == found) and (base < 0 or final_ms[i] < ms[base]):
                    base = final[i]
            if best < 0:
                return 0
            if base >= 0 and ms[best] > 0.99 * ms[base]:
                best = base
    finally:
        if scratch != NULL:
            defer_free(scratch)
    _tuning_count += 1
    if best == found:
        d.route = PLAN_GEMMEX
    else:
        d.route, d.algo, d.workspace_needed = PLAN_LT, results[best].algo, results[best].workspaceSize
    d.tuned = True
    d.tuned_ms = ms[best]
    return 0


# ---------------------------------------------------------------- the table of tuned choices

_TUNING_FORMAT = "cygemm-tuning/1"
_tuned = {}                     # (gpu, kind, key) -> record; shared by every thread
_tuned_lock = threading.RLock()
cdef long _tuning_count = 0     # how many problems this process timed
_gpu_ids = {}
_env_loaded = False


def _versions():
    cdef int driver = 0
    cudaDriverGetVersion(&driver)
    return {"cublasLt": int(cublasLtGetVersion()), "driver": driver}


cdef str _gpu_id(int device):
    """The GPU model as tuning files key it: name and compute capability."""
    cdef cudaDeviceProp prop
    cdef int major = 0, minor = 0
    gid = _gpu_ids.get(device)
    if gid is None:
        check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties")
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)
        gid = f"{prop.name.decode(errors='replace')} sm_{major}{minor}"
        _gpu_ids[device] = gid
    return gid


cdef object _lookup(str gpu, str kind, tuple key):
    _load_env_file()
    with _tuned_lock:
        return _tuned.get((gpu, kind, key))


cdef int _remember(str gpu, str kind, tuple key, dict record) except -1:
    with _tuned_lock:
        _tuned[(gpu, kind, key)] = record
    path = os.environ.get("CYGEMM_TUNING_CACHE")
    if path:
        try:
            save_tuning(path)
        except OSError as exc:
            warnings.warn(f"CYGEMM_TUNING_CACHE: could not write {path!r} ({exc}); tuning is kept in "
                          "this process only", RuntimeWarning, stacklevel=2)
    return 0


_route_memo = {}                # (device, key) -> route name: the hot path's lookup
cdef unsigned long _routes_generation = 1


cdef void _bump_routes_generation() noexcept:
    global _routes_generation
    _routes_generation += 1


cdef unsigned long routes_generation() noexcept nogil:
    return _routes_generation


cdef object forced_route(str kind):
    return _forced_routes.get(kind) if _forced_routes else None


cdef object tuned_route(int device, tuple key):
    forced = _forced_routes.get(key[0]) if _forced_routes else None
    if forced is not None:
        return forced
    name = _route_memo.get((device, key))
    if name is None:
        record = _lookup(_gpu_id(device), key[0], key[1:])
        if record is not None:
            name = record.get("route")
            _route_memo[(device, key)] = name
    return name


cdef int remember_route(int device, tuple key, str route, dict times) except -1:
    global _tuning_count
    _tuning_count += 1
    _route_memo[(device, key)] = route
    return _remember(_gpu_id(device), key[0], key[1:], {"route": route, "ms": times})


def tuning_count():
    """How many problems (plans and routes) this process has timed."""
    return _tuning_count


def tuning_entries():
    """The tuned choices this process holds: a list of dicts (the record: route, ms, ...; and
    gpu, kind, key)."""
    with _tuned_lock:
        return [dict(record, gpu=g, kind=kind, key=list(key)) for (g, kind, key), record in _tuned.items()]


def _entries_of(data):
    """The well-formed entries of a parsed tuning file, {(gpu, kind, key): record}; others skipped."""
    out = {}
    for e in data.get("entries", []) if isinstance(data.get("entries"), list) else []:
        try:
            record = e["record"]
            if not isinstance(record, dict) or not isinstance(record.get("route"), str):
                continue
            key = tuple(e["key"])
            if not all(isinstance(x, (int, bool)) for x in key):
                continue
            out[(str(e["gpu"]), str(e["kind"]), key)] = record
        except (KeyError, TypeError):
            continue
    return out


def clear_tuning():
    """Forget every tuned choice (and this thread's plans): the next large call times again."""
    with _tuned_lock:
        _tuned.clear()
    _route_memo.clear()
    _bump_routes_generation()
    clear_plan_cache()


def _load_env_file():
    global _env_loaded
    if _env_loaded:
        return
    _env_loaded = True
    path = os.environ.get("CYGEMM_TUNING_CACHE")
    if path and os.path.exists(path):
        load_tuning(path)


def save_tuning(path):
    """Write the tuned choices to `path` (JSON), merged with those already there.

    Parameters
    ----------
    path : str or os.PathLike
        The tuning file. Written atomically (a temporary file, then a rename). Entries of the
        file that this process does not hold are kept when the file has the same format,
        driver and cuBLASLt version; otherwise the file is replaced.

    Returns
    -------
    int
        How many entries the file holds now.

    Raises
    ------
    OSError
        The file or its folder cannot be written (nothing is left half-written).
    """
    path = os.fspath(path)
    header = dict(format=_TUNING_FORMAT, **_versions())
    merged = {}
    try:
        with open(path) as f:
            old = json.load(f)
        if isinstance(old, dict) and all(old.get(k) == v for k, v in header.items()):
            merged = _entries_of(old)
    except (OSError, ValueError, RecursionError):
        pass
    with _tuned_lock:
        merged.update(_tuned)
    entries = [{"gpu": g, "kind": kind, "key": list(key), "record": record}
               for (g, kind, key), record in merged.items()]
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(dict(header, entries=entries), f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return len(entries)


def load_tuning(path):
    """Add the tuned choices of a tuning file to this process's table.

    A file that cannot be read or parsed, of another format, or made with another driver or
    cuBLASLt version is ignored with a RuntimeWarning (its choices may not hold here);
    entries of other GPU models are kept but only used on those GPUs. A stored cuBLASLt
    algorithm is checked (cublasLtMatmulAlgoCheck) before its first use.

    Parameters
    ----------
    path : str or os.PathLike
        A file written by :func:`save_tuning` (or through ``CYGEMM_TUNING_CACHE``).

    Returns
    -------
    int
        How many entries were added (0 when the file was ignored).

    Raises
    ------
    Nothing for a bad file: a missing, unreadable, corrupt or foreign one gives a
    ``RuntimeWarning`` and is ignored.
    """
    path = os.fspath(path)
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        header = dict(format=_TUNING_FORMAT, **_versions())
        for k, v in header.items():
            if data.get(k) != v:
                warnings.warn(f"tuning file {path!r} ignored: it was made with {k}={data.get(k)!r}, "
                              f"this process has {v!r}", RuntimeWarning, stacklevel=2)
                return 0
        if not isinstance(data.get("entries"), list):
            raise ValueError("no list of entries")
        added = _entries_of(data)       # malformed entries are skipped one by one
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        warnings.warn(f"tuning file {path!r} ignored: {type(exc).__name__}: {exc}", RuntimeWarning,
                      stacklevel=2)
        return 0
    with _tuned_lock:
        _tuned.update(added)
    _route_memo.clear()
    _bump_routes_generation()
    clear_plan_cache()          # plans made before may now have a tuned choice
    return len(added)
