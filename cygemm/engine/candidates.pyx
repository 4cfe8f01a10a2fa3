# cython: language_level=3, boundscheck=False, wraparound=False
"""Timing a plan's candidates: cuBLASLt's heuristic algorithms and cublasGemmEx, on the call's
own operands, within the tuning budget (see cygemm.engine.tuning); the fastest becomes the plan's.
And the tuning table's record of that choice: made, and applied where it still fits."""
import time
import warnings

import numpy as np

from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
from cygemm.engine.types cimport ColMajorGemm, Scalars, real_scalars, is_fp8_type, type_size
from cygemm.engine.dtypes cimport dtype_name
from cygemm.engine.dtypes import numpy_dtype
from cygemm.engine.context cimport GemmContext
from cygemm.engine.release cimport defer_free
from cygemm.engine.settings cimport AUTOTUNE_EXHAUSTIVE, DETERMINISM_OFF, DETERMINISM_BATCH_INVARIANT
from cygemm.engine.families cimport in_family
from cygemm.engine.lt_desc cimport algo_hex, algo_from_hex
from cygemm.engine.ktail cimport make_safe
from cygemm.engine.launch cimport PlanData, PlanRoute, PLAN_GEMMEX, PLAN_LT, PLAN_CANDIDATES, plan_run
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.tuning cimport time_choices, tuning_budget_ms
from cygemm.engine.tuning cimport count_tuning

cdef enum:
    TUNE_REPS = 5           # rounds for every candidate (auto: fewer when the budget says so)
    FINAL_REPS = 11         # rounds for the finalists (auto: within what is left of the budget)
    BUCKET_MEMBERS = 4      # batch-invariant: the fastest members a size bucket keeps
    BUCKET_BUDGET_MS = 12   # and the time (auto) a later size of the bucket spends on them


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
    cdef Scalars sc = real_scalars(1.0, 0.0)
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
            st = plan_run(a.ctx, a.stream, a.d, &a.g, a.bias, a.aux, a.ws, a.ws_bytes, &sc)
    finally:
        a.d.route, a.d.algo = route, algo
    return 0 if st == CUBLAS_STATUS_SUCCESS else 1


# A test hook: the next verified tuning finds this candidate fastest and its result wrong.
cdef int _fake_wrong = -1


def _fake_a_wrong_candidate(int index):
    """For tests: the next FP8 tuning times candidate `index` fastest and reads a wrong result
    from it (what cuBLASLt 13.1's faulty FP8 split-K kernels give), so the check must refuse it."""
    global _fake_wrong
    _fake_wrong = index


cdef object _output_values(_TuneArg* a):
    """The output of the last run (one matrix, column-major m x n at ldc) as float64 values."""
    cdef cudaDataType t = a.d.dtype
    cdef size_t item = type_size(t)
    cdef int64_t count = (a.g.n - 1) * a.g.ldc + a.g.m
    raw = np.empty(a.g.n * a.g.ldc * item, np.uint8)
    cdef unsigned char[::1] view = raw
    with nogil:
        check_cuda(cudaStreamSynchronize(a.stream), "cudaStreamSynchronize")
        check_cuda(cudaMemcpy(&view[0], a.g.c, count * item, cudaMemcpyDeviceToHost), "cudaMemcpy")
    return raw.view(numpy_dtype(dtype_name(t))).reshape(a.g.n, a.g.ldc)[:, :a.g.m].astype(np.float64)


cdef bint _agrees(_TuneArg* a, int choice, int first) except -1:
    """Whether `choice`'s result on the call's operands is `first`'s, within what two correct
    kernels' roundings allow (relative Frobenius error 1e-2; 0.1 for an FP8 output)."""
    global _fake_wrong
    if _tune_enqueue(a, first):
        return True                 # (the first candidate itself refused: nothing to compare with)
    want = _output_values(a)
    if _tune_enqueue(a, choice):
        return False
    got = _output_values(a)
    if _fake_wrong >= 0:
        got = got + 1.0 + np.abs(want)
        _fake_wrong = -1
    same_nan = np.array_equal(np.isnan(got), np.isnan(want))
    ok = np.nan_to_num(want)
    err = np.linalg.norm(np.nan_to_num(got) - ok) / max(np.linalg.norm(ok), 1e-30)
    return same_nan and err <= (0.1 if is_fp8_type(a.d.dtype) else 1e-2)


cdef inline bint _listed(const int* xs, int n, int x) noexcept nogil:
    cdef int i
    for i in range(n):
        if xs[i] == x:
            return True
    return False


cdef int tune_candidates(GemmContext* ctx, cudaStream_t stream, PlanData* d, const ColMajorGemm* g,
                    const void* bias, void* aux, void* ws, size_t ws_bytes, int autotune,
                    bint c_is_input) except -1:
    """Time the candidates on the call's own operands and keep the fastest. A GEMM whose C
    is an input (beta != 0) is timed writing to a scratch output instead. Every candidate,
    then the finalists again for FINAL_REPS rounds; auto: both within the tuning budget,
    max(50 ms, 25 runs of the fastest), the finalists only if what is left holds 3 rounds."""
    cdef _TuneArg a
    cdef int choices[PLAN_CANDIDATES + 1]
    cdef float ms[PLAN_CANDIDATES + 1]
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
        extent *= type_size(d.dtype)
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
    cdef float first_ms[PLAN_CANDIDATES + 1]
    try:
        time_choices(ctx, stream, _tune_enqueue, &a, choices, n, TUNE_REPS, ms,
                     0 if exhaustive else (BUCKET_BUDGET_MS if d.shared else 1e30))
        memcpy(first_ms, ms, n * sizeof(float))
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
            left_ms = (min(<double>BUCKET_BUDGET_MS, tuning_budget_ms(fastest)) if d.shared
                       else tuning_budget_ms(fastest)) - (time.perf_counter() - start) * 1e3
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
        if _fake_wrong >= 0 and d.verify and 0 < _fake_wrong < found:
            best = _fake_wrong
        if d.verify and 0 < best < found and g.batch == 1 and not _agrees(&a, best, 0):
            warnings.warn(f"cygemm: cuBLASLt's FP8 algorithm {_algo_name(&d.candidates[best].algo)} was the fastest "
                          f"but its result differs from its first choice's on the same operands; the first "
                          f"choice is kept", RuntimeWarning, stacklevel=2)
            best = 0
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
    if d.determinism == DETERMINISM_BATCH_INVARIANT:
        _fastest_first(d, first_ms, found)
    return 0


cdef void _fastest_first(PlanData* d, float* ms, int n) noexcept:
    """Order the first BUCKET_MEMBERS candidates by their first round's times (failed ones last),
    the order bucket_record_of keeps."""
    cdef int i, j, b
    cdef float t
    cdef cublasLtMatmulHeuristicResult_t c
    for i in range(min(n, <int>BUCKET_MEMBERS)):
        b = i
        for j in range(i + 1, n):
            if ms[j] >= 0 and (ms[b] < 0 or ms[j] < ms[b]):
                b = j
        c = d.candidates[i]
        d.candidates[i] = d.candidates[b]
        d.candidates[b] = c
        t = ms[i]
        ms[i] = ms[b]
        ms[b] = t


cdef str _algo_name(const cublasLtMatmulAlgo_t* algo):
    cdef int32_t v[2]
    cdef size_t written
    v[0] = v[1] = -1
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_ID, &v[0], sizeof(int32_t), &written)
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &v[1], sizeof(int32_t), &written)
    return f"{v[0]} (split of K: {v[1]})"


# ---------------------------------------------------------------- the tuning table's records

cdef bint apply_record(GemmContext* ctx, PlanData* d, dict record, size_t ws_bytes, int64_t k):
    """Use a tuned choice if it still fits (cublasLtMatmulAlgoCheck for a stored algorithm)."""
    cdef cublasLtMatmulAlgo_t algo
    cdef cublasLtMatmulHeuristicResult_t check
    cdef float ms
    cdef size_t ws_needed
    try:
        route = record["route"]
        ms = float(record.get("ms", 0.0))
        if route == "cublasGemmEx":
            if not d.gemmex_ok:
                return False
            d.route = PLAN_GEMMEX
        elif route == "cublasLt":
            if not algo_from_hex(record["algo"], &algo):
                return False
            if cublasLtMatmulAlgoCheck(ctx.lt, d.desc, d.la, d.lb, d.lc, d.ld if d.ld != NULL else d.lc,
                                       &algo, &check) != CUBLAS_STATUS_SUCCESS:
                return False
            if check.workspaceSize > ws_bytes:
                return False
            if d.determinism != DETERMINISM_OFF and not in_family(&algo, d.family):
                return False        # (a determinism mode runs its family's kernels only)
            ws_needed = check.workspaceSize
            if make_safe(ctx.lt, d.desc, d.la, d.lb, d.lc, d.ld, &algo, d.dtype, k, ws_bytes, &ws_needed) < 0:
                return False        # (a tuned choice that would drop part of K: decided again)
            d.route, d.algo, d.workspace_needed = PLAN_LT, algo, ws_needed
        else:
            return False
    except (KeyError, ValueError, TypeError, AttributeError):
        return False
    d.tuned, d.tuned_ms = True, ms
    return True


cdef dict bucket_record_of(PlanData* d):
    record = record_of(d)
    record["members"] = [algo_hex(&d.candidates[i].algo) for i in range(min(d.n_candidates, <int>BUCKET_MEMBERS))]
    return record


cdef dict record_of(PlanData* d):
    if d.route == PLAN_GEMMEX:
        return {"route": "cublasGemmEx", "ms": d.tuned_ms}
    return {"route": "cublasLt", "algo": algo_hex(&d.algo),
            "ws": d.workspace_needed, "ms": d.tuned_ms}
