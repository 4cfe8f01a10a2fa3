# cython: language_level=3, boundscheck=False, wraparound=False
"""The one execute: running a plan, and what a call does when cuBLASLt refuses it.

A plan (cygemm.engine.plans) says how a problem runs; this module is the only code that runs
one. cuBLASLt may refuse an algorithm it offered (nothing is enqueued): eagerly, the plan is
marked unusable; inside a capture, uncapturable. What happens next is the call's
:c:type:`Refusal`: a plain GEMM runs cublasGemmEx instead, a route with another way out reports
the refusal, and a call that is one cuBLASLt call (FP8, int8, epilogue plans) raises.
"""
from libc.stdint cimport int64_t

from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport (cublasStatus_t, cublasComputeType_t, CUBLAS_STATUS_SUCCESS,
                                     CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_64F)
from cygemm.bindings.cublaslt cimport CUBLASLT_EPILOGUE_DEFAULT
from cygemm.engine.types cimport ColMajorGemm, Scalars, beta_is_zero, type_size, lt_batch_ok
from cygemm.engine.errors cimport check_cublas
from cygemm.engine.errors import CaptureError
from cygemm.engine.streams cimport stream_is_capturing, check_capture_alive
from cygemm.engine.context cimport GemmContext, stream_workspace
from cygemm.engine.launch cimport PLAN_GEMMEX, PLAN_LT, gemm_colmajor, needs_64bit_api, plan_run
from cygemm.engine.settings cimport Policy, DETERMINISM_BATCH_INVARIANT
from cygemm.engine.timing cimport worth_tuning
from cygemm.engine.ktail cimport gemmex_drops
from cygemm.engine.plans cimport Plan, get_plan, forced_gemm, raise_no_family
from cygemm.engine.small_batched cimport small_batched_fits, run_small_batched

# How many of the next cuBLASLt executes are answered as refused without running: the tests'
# way to reach each refusal policy (cuBLASLt refuses rarely, and not on demand).
cdef int _refuse_next = 0


cdef int execute_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                      const void* bias, void* aux, void* ws, size_t ws_bytes, const Scalars* sc,
                      int* refused_status=NULL) except -1:
    if not plan.d.usable:
        return 1
    if plan.d.route == PLAN_LT and not plan.d.capture_ok and stream_is_capturing(stream):
        return 1
    global _refuse_next
    cdef int st
    if _refuse_next > 0 and plan.d.route == PLAN_LT:
        _refuse_next -= 1
        st = CUBLAS_STATUS_NOT_SUPPORTED
    else:
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


cdef int run_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                  const void* bias, void* aux, void* ws, size_t ws_bytes, const Scalars* sc,
                  Refusal refusal, str what="cuBLASLt") except -1:
    cdef int st = CUBLAS_STATUS_SUCCESS
    if not execute_plan(plan, ctx, stream, g, bias, aux, ws, ws_bytes, sc, &st):
        return 0
    if refusal == REFUSAL_REPORT:
        return 1
    if refusal == REFUSAL_GEMMEX:
        if plan.d.determinism == DETERMINISM_BATCH_INVARIANT:
            raise_no_family(plan)               # (no other kernel gives the family's rows)
        with nogil:
            gemm_colmajor(ctx, stream, g, plan.d.dtype, plan.d.compute, sc)
        return 0
    if st != CUBLAS_STATUS_SUCCESS:             # refused now (in a capture: not in graphs from now on)
        call = f"cublasLtMatmul ({what})".encode()
        return check_cublas(<cublasStatus_t>st, call)
    if not plan.d.usable:
        raise ValueError(f"{what}: cuBLASLt refused this plan's algorithm on an earlier execute; make a new "
                         f"{what}")
    raise CaptureError(f"{what}: cuBLASLt refused this plan's algorithm inside a capture before; execute it "
                       "eagerly")


cdef int check_runnable(Plan plan, cudaStream_t stream, str label) except -1:
    if not plan.d.usable or plan.d.n_candidates == 0:
        return 1
    if not plan.d.capture_ok and stream_is_capturing(stream):
        raise ValueError(f"cublasLtMatmul refused this {label} inside a capture; run it once eagerly first")
    return 0


# ---------------------------------------------------------------- a plain GEMM

cdef int run_gemm(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                  cublasComputeType_t compute, const Scalars* sc,
                  Policy policy) except -1 nogil:
    cdef int64_t batch = g.batch if g.strided_batched else 1
    cdef int forced = forced_gemm()
    cdef bint invariant = policy.determinism == DETERMINISM_BATCH_INVARIANT
    # A batch of small matrices: cygemm's kernel where it is faster (its route table decides).
    if small_batched_fits(g, dtype, compute, policy):
        with gil:
            if run_small_batched(ctx, stream, g, dtype, compute, sc, policy):
                return 0
    # cublasGemmEx (its own kernel choice, guarded in launch) for no batch-invariant call but k = 0;
    # small problems too, unless its kernel would drop part of K (then their guarded plan).
    if g.k == 0 or (not invariant and (
            needs_64bit_api(g) or forced == 1 or compute == CUBLAS_COMPUTE_64F or (
            forced == 0 and not worth_tuning(<double>g.m * g.n * g.k * batch)
            and not gemmex_drops(ctx, g, dtype, compute)))):
        return gemm_colmajor(ctx, stream, g, dtype, compute, sc)
    cdef void* ws = stream_workspace(ctx, stream)       # may allocate: without the GIL
    with gil:
        if invariant and batch > 1 and not lt_batch_ok(g):
            _each_matrix(ctx, stream, g, dtype, compute, sc, ws, policy)
        else:
            _run_planned(ctx, stream, g, dtype, compute, sc, ws, policy)
    return 0


cdef int _each_matrix(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                      cublasComputeType_t compute, const Scalars* sc, void* ws,
                      Policy policy) except -1:
    """A batch cuBLASLt is not asked about (broadcast or interleaved), one matrix at a time:
    each by the plan of one matrix, as it would run alone."""
    cdef ColMajorGemm one = g[0]
    cdef int64_t i, size = type_size(dtype)
    one.batch, one.strided_batched = 1, False
    for i in range(g.batch):
        one.a = <const char*>g.a + i * g.stride_a * size
        one.b = <const char*>g.b + i * g.stride_b * size
        one.c = <char*>g.c + i * g.stride_c * size
        _run_planned(ctx, stream, &one, dtype, compute, sc, ws, policy)
    return 0


cdef int _run_planned(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                      cublasComputeType_t compute, const Scalars* sc, void* ws,
                      Policy policy) except -1:
    cdef size_t ws_bytes = ctx.workspace_bytes
    cdef Plan plan = get_plan(ctx, stream, g, dtype, compute, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0,
                              ws, ws_bytes, policy, not beta_is_zero(sc))
    return run_plan(plan, ctx, stream, g, NULL, NULL, ws, ws_bytes, sc, REFUSAL_GEMMEX)


# ---------------------------------------------------------------- for the tests

def refuse_next(int count=1):
    """Answer the next ``count`` cuBLASLt executes as cuBLASLt's refusal (CUBLAS_STATUS_NOT_SUPPORTED,
    nothing enqueued), so that tests reach each call's refusal policy; 0 stops it. Returns how many
    were still pending. Not thread-safe: for tests only."""
    global _refuse_next
    if count < 0:
        raise ValueError(f"count: expected 0 or more, got {count}")
    left, _refuse_next = _refuse_next, count
    return left
