# cython: language_level=3, boundscheck=False, wraparound=False
# kernels: elementwise
"""The dense layer's routes: the forward's (cuBLASLt epilogues, a GEMM and cygemm's kernels) and
the backward's (its two GEMMs on one stream or two), each a table that cygemm.engine.chooser chooses
from: forced, tuned, timed once for large problems, else a fixed rule.

Under the row-major swap cuBLASLt computes D = Y^T (N x M, column-major), so its bias (length
= rows of D = N) runs along the last axis of Y, as a layer wants. Epilogues need a
column-major D, which is why Y must be row-major here.
"""
from libc.stdint cimport int64_t

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
from cygemm.kernels.elementwise cimport *
from cygemm.engine.epilogues cimport has_lt_epilogue, lt_epilogue_of
from cygemm.engine.epilogues import EPILOGUE_ACTS
from cygemm.engine.types cimport ColMajorGemm, Scalars, real_scalars, pointer_alignment
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.errors import CygemmError
from cygemm.engine.context cimport GemmContext, run_forked
from cygemm.engine.settings cimport Policy, AUTOTUNE_OFF, DETERMINISM_OFF, DETERMINISM_RUN_TO_RUN, DETERMINISM_BATCH_INVARIANT
from cygemm.engine.chooser cimport is_large
from cygemm.engine.plans cimport Plan, get_plan
from cygemm.engine.execute cimport run_plan, run_gemm, REFUSAL_REPORT
from cygemm.engine.chooser cimport RouteTable, route_table, choose_route


cdef int dense_gemm(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                    cublasComputeType_t compute, float beta, Policy policy) except -1:
    cdef Scalars sc = real_scalars(1.0, beta)
    with nogil:
        run_gemm(ctx, stream, g, dtype, compute, &sc, policy)
    return 0


# ---------------------------------------------------------------- the forward's routes

# In the order the fixed rule for small problems prefers them.
cdef enum ForwardRoute:
    FWD_EPILOGUE = 0
    FWD_GELU_AUX = 1
    FWD_BIAS_EPILOGUE_KERNEL = 2
    FWD_GEMM_KERNEL = 3

FORWARD_ROUTES = {
    "epilogue": f"one cuBLASLt call with the bias and activation in its epilogue ({EPILOGUE_ACTS}; "
                "Z not saved)",
    "gelu_aux": "one cuBLASLt call writing out and Z (GELU_AUX[_BIAS]: gelu with save_z; Z's ld a "
                "multiple of 8, 16-byte aligned)",
    "bias_epilogue_kernel": "cuBLASLt with the BIAS epilogue writes Z (or out), cygemm's kernel applies "
                            "the activation",
    "gemm_kernel": "a plain GEMM (the plan layer's choice) writes Z (or out), cygemm's kernel adds the "
                   "bias and applies the activation; the fallback of every other route",
}


cdef bint _fwd_applies(const ForwardCall* f, int route) noexcept nogil:
    cdef bint kernel_work = f.save_z or f.code != CYGEMM_ACT_NONE
    if route == FWD_EPILOGUE:
        return f.K > 0 and not f.save_z and has_lt_epilogue(f.act, False)
    if route == FWD_GELU_AUX:
        return (f.K > 0 and f.save_z and has_lt_epilogue(f.act, True)
                and f.z_ld % f.act.aux_ld_multiple == 0 and pointer_alignment(f.z) >= f.act.aux_alignment)
    if route == FWD_BIAS_EPILOGUE_KERNEL:
        return f.K > 0 and f.bias != NULL and kernel_work
    return True


cdef int _fwd_default(const ForwardCall* f) noexcept nogil:
    """The fixed rule (small problems, or a capture before any eager call): one launch where
    an epilogue does it all; GELU_AUX only when small (on large problems it ran 1.54x a plain
    GEMM on the H200 against 1.36x for BIAS + our kernel); else a BIAS epilogue + kernel."""
    if _fwd_applies(f, FWD_EPILOGUE):
        return FWD_EPILOGUE
    # (Under a determinism mode the route must not depend on M: never GELU_AUX.)
    if (_fwd_applies(f, FWD_GELU_AUX) and not is_large(<double>f.M * f.N * f.K)
            and f.policy.determinism == DETERMINISM_OFF):
        return FWD_GELU_AUX
    if _fwd_applies(f, FWD_BIAS_EPILOGUE_KERNEL):
        return FWD_BIAS_EPILOGUE_KERNEL
    return FWD_GEMM_KERNEL


cdef int _lt_call(ForwardCall* f, ColMajorGemm* g, cublasLtEpilogue_t epi, const void* bias, void* aux,
                  int64_t aux_ld) except -1:
    """One cuBLASLt call by its plan: 0 done, 1 refused (nothing enqueued; the caller falls back)."""
    cdef Scalars sc = real_scalars(1.0, 0.0)
    cdef Plan plan = get_plan(f.ctx, f.s, g, f.dtype, f.compute, epi, bias, aux, aux_ld, f.ws, f.ws_bytes,
                              f.policy, False)
    if plan is None:
        return 1
    return run_plan(plan, f.ctx, f.s, g, bias, aux, f.ws, f.ws_bytes, &sc, REFUSAL_REPORT)


cdef int _fwd_run(ForwardCall* f, int route) except -1:
    """Enqueue one route: 0 done, 1 its cuBLASLt call was refused (nothing enqueued)."""
    cdef cublasLtEpilogue_t epi
    cdef bint has_bias = f.bias != NULL
    cdef ColMajorGemm* g = &f.g_z if f.save_z else &f.g_y
    cdef void* target = f.z if f.save_z else f.y
    cdef int64_t target_ld = f.z_ld if f.save_z else f.y_ld
    if route == FWD_EPILOGUE:
        epi = <cublasLtEpilogue_t>lt_epilogue_of(f.act, has_bias, False)
        return _lt_call(f, &f.g_y, epi, f.bias, NULL, 0)
    if route == FWD_GELU_AUX:
        epi = <cublasLtEpilogue_t>lt_epilogue_of(f.act, has_bias, True)
        return _lt_call(f, &f.g_y, epi, f.bias, f.z, f.z_ld)
    if route == FWD_BIAS_EPILOGUE_KERNEL:
        if _lt_call(f, g, CUBLASLT_EPILOGUE_BIAS, f.bias, NULL, 0):
            return 1
        with nogil:
            check_cuda(cygemm_bias_act_forward(f.dtype, f.M, f.N, target, target_ld, NULL,
                                               f.y, f.y_ld, NULL, 0, f.code, f.slope, f.s),
                       "cygemm_bias_act_forward")
        return 0
    # FWD_GEMM_KERNEL: always runs (the plan layer falls back to cublasGemmEx itself).
    dense_gemm(f.ctx, f.s, g, f.dtype, f.compute, 0.0, f.policy)
    with nogil:
        check_cuda(cygemm_bias_act_forward(f.dtype, f.M, f.N, target, target_ld, f.bias,
                                           f.y, f.y_ld, f.z if f.save_z else NULL, f.z_ld,
                                           f.code, f.slope, f.s),
                   "cygemm_bias_act_forward")
    return 0


# The forward's table for cygemm.engine.chooser.
cdef int _fwd_applies_hook(void* call, int route) except -1:
    return _fwd_applies(<const ForwardCall*>call, route)


cdef int _fwd_rule_hook(void* call) except -1:
    return _fwd_default(<const ForwardCall*>call)


cdef object _fwd_key(void* call):
    cdef const ForwardCall* f = <const ForwardCall*>call
    return ("forward", <int>f.dtype, <int>f.compute, <int>f.code, f.bias != NULL, f.save_z, f.M, f.N, f.K,
            <int>f.g_y.opa, <int>f.g_y.opb, f.g_y.lda, f.g_y.ldb, f.y_ld, f.z_ld, f.ws_bytes)


cdef int _fwd_enqueue(void* call, int route) except -1:
    return _fwd_run(<ForwardCall*>call, route)


cdef RouteTable _FORWARD = route_table("forward", ("epilogue", "gelu_aux", "bias_epilogue_kernel", "gemm_kernel"),
                                       _fwd_applies_hook, _fwd_rule_hook, _fwd_key, _fwd_enqueue)


cdef int run_forward(ForwardCall* f) except -1:
    # Large problems are in the tuning table (timed now when new and the stream is not capturing).
    cdef int route = choose_route(_FORWARD, f, f.ctx, f.s, f.policy, <double>f.M * f.N * f.K, True, -1, NULL)
    if _fwd_run(f, route) != 0:
        if f.policy.determinism == DETERMINISM_BATCH_INVARIANT:    # another route gives other bits
            raise CygemmError(f"determinism='batch_invariant': cuBLASLt refused the dense layer's "
                              f"{_FORWARD.names[route]} route for this problem")
        _fwd_run(f, FWD_GEMM_KERNEL)       # always correct
    return 0


# ---------------------------------------------------------------- the backward's routes

cdef Policy weight_policy(Policy policy) noexcept nogil:
    """The weight gradient sums over the batch's rows: no kernel makes it batch-invariant, so
    under that policy it is run-to-run deterministic (the bias gradient's kernel always is)."""
    if policy.determinism == DETERMINISM_BATCH_INVARIANT:
        policy.determinism = DETERMINISM_RUN_TO_RUN
    return policy


# The backward's routes for its two GEMMs (the activation's backward kernel runs first).
# The chained DRELU_BGRAD/DGELU_BGRAD epilogues are not among them: on the H200 they ran
# 2.2-4.9x a plain GEMM, slower than a plain GEMM plus cygemm's kernel.
cdef enum BackwardRoute:
    BWD_SERIAL = 0
    BWD_BRANCHES = 1

BACKWARD_ROUTES = {
    "serial": "gA = dZ @ B.T, then gB = A.T @ dZ, on the caller's stream",
    "branches": "gB on a second stream forked from the caller's and joined back with events, gA on "
                "the caller's: the two GEMMs overlap (a graph captured from it has two branches)",
}


cdef int _bwd_branches(void* call, cudaStream_t main, cudaStream_t side) except -1:
    cdef BackwardCall* b = <BackwardCall*>call
    dense_gemm(b.ctx, side, &b.g_b, b.dtype, b.compute, b.beta, weight_policy(b.policy))
    dense_gemm(b.ctx, main, &b.g_a, b.dtype, b.compute, b.beta, b.policy)
    return 0


cdef int _bwd_run(BackwardCall* b, int route) except -1:
    if route == BWD_SERIAL:
        dense_gemm(b.ctx, b.s, &b.g_a, b.dtype, b.compute, b.beta, b.policy)
        dense_gemm(b.ctx, b.s, &b.g_b, b.dtype, b.compute, b.beta, weight_policy(b.policy))
        return 0
    return run_forked(b.ctx, b.s, _bwd_branches, b)


# The backward's table for cygemm.engine.chooser: both routes always apply; serial until timed. Timed
# at every size (the branches pay where one GEMM leaves the GPU idle, i.e. on small problems).
cdef int _bwd_applies_hook(void* call, int route) except -1:
    return 1


cdef int _bwd_rule_hook(void* call) except -1:
    return BWD_SERIAL


cdef object _bwd_key(void* call):
    cdef const BackwardCall* b = <const BackwardCall*>call
    return ("backward", <int>b.dtype, <int>b.compute, b.M, b.N, b.K, <int>b.g_a.opa, <int>b.g_a.opb, b.g_a.lda,
            b.g_a.ldb, b.g_a.ldc, <int>b.g_b.opa, <int>b.g_b.opb, b.g_b.lda, b.g_b.ldb, b.g_b.ldc)


cdef int _bwd_enqueue(void* call, int route) except -1:
    return _bwd_run(<BackwardCall*>call, route)


cdef void _bwd_ckey(void* call, int64_t* k) noexcept nogil:
    """The backward's memo key: a repeated small backward finds its route without a Python key."""
    cdef const BackwardCall* b = <const BackwardCall*>call
    k[0], k[1], k[2], k[3], k[4], k[5] = b.ctx.device, <int>b.dtype, <int>b.compute, b.M, b.N, b.K
    k[6] = (<int>b.g_a.opa) | (<int>b.g_a.opb << 8) | (<int>b.g_b.opa << 16) | (<int>b.g_b.opb << 24)
    k[7], k[8], k[9] = b.g_a.lda, b.g_a.ldb, b.g_a.ldc
    k[10], k[11], k[12] = b.g_b.lda, b.g_b.ldb, b.g_b.ldc


cdef RouteTable _BACKWARD = route_table("backward", ("serial", "branches"), _bwd_applies_hook, _bwd_rule_hook,
                                        _bwd_key, _bwd_enqueue, _bwd_ckey, True)


cdef int run_backward(BackwardCall* b, bint accumulate) except -1:
    """Serial or branches, chosen by cygemm.engine.chooser (remembered by C key; the tuned table is
    read at every size and autotune level; timed outside capture, on a call that does not
    accumulate: timing runs write the gradients)."""
    return _bwd_run(b, choose_route(_BACKWARD, b, b.ctx, b.s, b.policy, 0, not accumulate, -1, NULL))
