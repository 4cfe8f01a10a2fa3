# cython: language_level=3, boundscheck=False, wraparound=False
"""A dense layer fused: Y = act(A @ B + bias) and its backward, through cuBLASLt
epilogues where they apply and cygemm's kernels where they do not.

Under the row-major swap cuBLASLt computes D = Y^T (N x M, column-major), so its
bias (length = rows of D = N) runs along the last axis of Y, as a layer wants.
Epilogues need a column-major D, which is why Y must be row-major here.
"""
import threading

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memcmp, memset

from cygemm.cudart cimport *
from cygemm.cublas cimport *
from cygemm.cublaslt cimport *
from cygemm.kernels cimport *
from cygemm._core cimport (GemmContext, MatrixView, check_cuda, check_cublas, current_context,
                           stream_workspace, view_from_object, stream_from_object, stream_is_capturing,
                           check_devices, check_no_overlap, dtype_name)
from cygemm.rowmajor cimport (ColMajorGemm, gemm_colmajor, compute_type_for, map_or_raise, rowmajor_ld,
                              is_rowmajor)

ACTIVATIONS = {
    "none": CYGEMM_ACT_NONE, "identity": CYGEMM_ACT_NONE, "relu": CYGEMM_ACT_RELU,
    "leaky_relu": CYGEMM_ACT_LEAKY_RELU, "gelu": CYGEMM_ACT_GELU, "gelu_erf": CYGEMM_ACT_GELU_ERF,
    "sigmoid": CYGEMM_ACT_SIGMOID, "tanh": CYGEMM_ACT_TANH, "silu": CYGEMM_ACT_SILU,
}


def parse_activation(act):
    """Activation name (case-insensitive) -> kernel code; ValueError lists the valid names."""
    try:
        return ACTIVATIONS[act.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"act: expected one of {sorted(ACTIVATIONS)}, got {act!r}") from None


cdef float _slope(object leaky_slope) except? -1:
    cdef double s = leaky_slope
    if not (s == s) or s in (float("inf"), float("-inf")) or s < 0:
        raise ValueError(f"leaky_slope: expected a finite number >= 0, got {leaky_slope!r}")
    return <float>s


# ---------------------------------------------------------------- cuBLASLt plans

ctypedef struct LtPlanData:
    cublasLtMatmulDesc_t desc
    cublasLtMatrixLayout_t la
    cublasLtMatrixLayout_t lb
    cublasLtMatrixLayout_t lc
    cublasLtMatmulPreference_t pref
    cublasLtMatmulAlgo_t algo
    size_t workspace_needed
    bint usable
    bint capture_ok     # cleared if cuBLASLt refused this algorithm inside a capture
    float tuned_ms      # autotuned time of the chosen algorithm (0: heuristic's first pick)


cdef class LtPlan:
    """Descriptors, layouts and the chosen algorithm of one cuBLASLt problem."""
    cdef LtPlanData d

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
    def usable(self):
        return bool(self.d.usable)

    @property
    def tuned_ms(self):
        return self.d.tuned_ms


cdef object _tls = threading.local()


cpdef dict _plans():
    try:
        return _tls.plans
    except AttributeError:
        _tls.plans = {}
        return _tls.plans


def clear_plan_cache():
    """Drop this thread's cached cuBLASLt plans (they are rebuilt on the next call)."""
    _plans().clear()
    _tls.recent = _Recent()


# The plan key as a C struct: a repeated call finds its plan among the last few by
# memcmp, without building the dict key (measured ~0.5 us of the small-call cost).
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
    uint32_t al_a
    uint32_t al_b
    uint32_t al_c
    uint32_t al_bias
    uint32_t al_aux
    uint32_t al_ws
    size_t ws_bytes

cdef enum:
    RECENT_PLANS = 16


cdef class _Recent:
    cdef PlanKey keys[RECENT_PLANS]
    cdef list plans
    cdef int next_slot

    def __cinit__(self):
        memset(self.keys, 0, sizeof(self.keys))
        self.plans = [None] * RECENT_PLANS
        self.next_slot = 0

    cdef LtPlan find(self, const PlanKey* key):
        cdef int i
        for i in range(RECENT_PLANS):
            if memcmp(&self.keys[i], key, sizeof(PlanKey)) == 0 and self.plans[i] is not None:
                return self.plans[i]
        return None

    cdef void remember(self, const PlanKey* key, LtPlan plan):
        self.keys[self.next_slot] = key[0]
        self.plans[self.next_slot] = plan
        self.next_slot = (self.next_slot + 1) % RECENT_PLANS


cdef _Recent _recent():
    try:
        return _tls.recent
    except AttributeError:
        _tls.recent = _Recent()
        return _tls.recent


def plan_cache_size():
    return len(_plans())


cdef inline uint32_t _alignment(const void* p) noexcept nogil:
    cdef uintptr_t v = <uintptr_t>p
    if v == 0:
        return 256
    cdef uintptr_t a = v & (~v + 1)
    return <uint32_t>(a if a < 256 else 256)


cdef int _set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                   size_t size) except -1 nogil:
    return check_cublas(cublasLtMatmulDescSetAttribute(desc, attr, buf, size), "cublasLtMatmulDescSetAttribute")


import os as _os
# Problems of at least this many multiply-adds time the heuristic's candidates once.
cdef double AUTOTUNE_MIN_MACS = float(_os.environ.get("CYGEMM_AUTOTUNE_MIN_MACS", 2.0 ** 32))
cdef enum:
    MAX_CANDIDATES = 8


cdef LtPlan _get_plan(GemmContext* ctx, cudaStream_t stream, ColMajorGemm* g, cudaDataType dtype,
                      cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                      int64_t aux_ld, void* ws, size_t ws_bytes):
    """The cached plan for this problem, made (heuristic query included) on a miss."""
    cdef uint32_t al_a = _alignment(g.a), al_b = _alignment(g.b), al_c = _alignment(g.c)
    # The key holds everything that changes the algorithm's validity, alignment
    # included, so a plan chosen for aligned pointers never runs on unaligned ones.
    cdef PlanKey k
    memset(&k, 0, sizeof(k))            # padding too: keys are compared with memcmp
    k.device, k.dtype, k.compute, k.epi, k.opa, k.opb = ctx.device, dtype, compute, epi, g.opa, g.opb
    k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.aux_ld = g.m, g.n, g.k, g.lda, g.ldb, g.ldc, aux_ld
    k.al_a, k.al_b, k.al_c, k.al_bias, k.al_aux = al_a, al_b, al_c, _alignment(bias), _alignment(aux)
    # A refused call (e.g. a misaligned lt_workspace) marks its own plan, not the aligned one's.
    k.al_ws = _alignment(ws)
    k.ws_bytes = ws_bytes
    cdef _Recent recent = _recent()
    cdef LtPlan plan = recent.find(&k)
    if plan is not None:
        return plan
    key = (k.device, k.dtype, k.compute, k.epi, k.opa, k.opb, k.m, k.n, k.k, k.lda, k.ldb, k.ldc,
           k.aux_ld, k.al_a, k.al_b, k.al_c, k.al_bias, k.al_aux, k.al_ws, k.ws_bytes)
    plans = _plans()
    plan = plans.get(key)
    if plan is not None:
        recent.remember(&k, plan)
        return plan
    plan = LtPlan()
    cdef LtPlanData* d = &plan.d
    d.capture_ok = True
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
    check_cublas(cublasLtMatrixLayoutCreate(&d.la, dtype, g.m if g.opa == CUBLAS_OP_N else g.k,
                                            g.k if g.opa == CUBLAS_OP_N else g.m, g.lda),
                 "cublasLtMatrixLayoutCreate(A)")
    check_cublas(cublasLtMatrixLayoutCreate(&d.lb, dtype, g.k if g.opb == CUBLAS_OP_N else g.n,
                                            g.n if g.opb == CUBLAS_OP_N else g.k, g.ldb),
                 "cublasLtMatrixLayoutCreate(B)")
    check_cublas(cublasLtMatrixLayoutCreate(&d.lc, dtype, g.m, g.n, g.ldc), "cublasLtMatrixLayoutCreate(D)")
    check_cublas(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate")
    cdef uint64_t ws64 = ws_bytes
    check_cublas(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws64, sizeof(ws64)), "cublasLtMatmulPreferenceSetAttribute")
    for attr, al in ((CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a),
                     (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b),
                     (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c),
                     (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_c)):
        _set_pref_u32(d.pref, attr, al)
    cdef cublasLtMatmulHeuristicResult_t results[MAX_CANDIDATES]
    cdef int found = 0
    cdef bint capturing = stream_is_capturing(stream)
    cdef cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, d.desc, d.la, d.lb, d.lc, d.lc, d.pref,
                                                            MAX_CANDIDATES, results, &found)
    d.usable = st == CUBLAS_STATUS_SUCCESS and found > 0 and results[0].state == CUBLAS_STATUS_SUCCESS
    if d.usable:
        d.algo = results[0].algo
        d.workspace_needed = results[0].workspaceSize
        if not capturing and found > 1 and <double>g.m * g.n * g.k >= AUTOTUNE_MIN_MACS:
            # Timing waits for the GPU (tens of ms): other Python threads run meanwhile.
            with nogil:
                _autotune(ctx, stream, d, g, bias, aux, ws, ws_bytes, results, found)
    elif capturing:
        # Some CUDA versions refuse heuristics during capture: use the fallback
        # now, but do not remember a verdict that may be the capture's fault.
        return plan
    plans[key] = plan
    recent.remember(&k, plan)
    return plan


cdef int _autotune(GemmContext* ctx, cudaStream_t stream, LtPlanData* d, const ColMajorGemm* g,
                   const void* bias, void* aux, void* ws, size_t ws_bytes,
                   cublasLtMatmulHeuristicResult_t* results, int found) except -1 nogil:
    """Time the heuristic's candidates on the call's own buffers and keep the fastest.

    The heuristic's first pick is not always the fastest (measured: GELU epilogues at
    8192x8192x1024). Runs once per plan of a large problem, never during capture, without
    the GIL; it waits for the stream. CYGEMM_AUTOTUNE_MIN_MACS sets the size threshold.
    A CUDA failure here keeps the heuristic's first pick: timing is an optimisation.
    """
    cdef cudaEvent_t start = NULL, end = NULL
    cdef float alpha = 1.0, beta = 0.0, ms = 0.0, best = -1.0
    cdef int i, r, best_i = 0
    cdef cublasStatus_t st
    d.algo = results[0].algo
    if cudaEventCreate(&start) != cudaSuccess:
        cudaGetLastError()
        return 0
    if cudaEventCreate(&end) != cudaSuccess:
        cudaGetLastError()
        cudaEventDestroy(start)
        return 0
    for i in range(found):
        if results[i].state != CUBLAS_STATUS_SUCCESS or results[i].workspaceSize > ws_bytes:
            continue
        d.algo = results[i].algo
        st = _lt_run(ctx, stream, d, g, bias, aux, ws, ws_bytes, &alpha, &beta)   # warm-up
        if st != CUBLAS_STATUS_SUCCESS:
            continue
        cudaEventRecord(start, stream)
        for r in range(3):
            st = _lt_run(ctx, stream, d, g, bias, aux, ws, ws_bytes, &alpha, &beta)
        if cudaEventRecord(end, stream) != cudaSuccess or st != CUBLAS_STATUS_SUCCESS:
            continue
        if cudaEventSynchronize(end) != cudaSuccess or cudaEventElapsedTime(&ms, start, end) != cudaSuccess:
            cudaGetLastError()
            continue
        if best < 0 or ms < best:
            best, best_i = ms, i
    if best >= 0:
        d.algo = results[best_i].algo
        d.workspace_needed = results[best_i].workspaceSize
        d.tuned_ms = best / 3
    else:
        d.algo = results[0].algo
    cudaEventDestroy(start)
    cudaEventDestroy(end)
    return 0


cdef int _check_capture_alive(cudaStream_t stream) except -1:
    cdef cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone
    check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing")
    if status == cudaStreamCaptureStatusInvalidated:
        raise RuntimeError("cublasLtMatmul invalidated the stream's capture; call forward_into once "
                           "before capturing, or capture with mode='relaxed'")
    return 0


cdef int _set_pref_u32(cublasLtMatmulPreference_t pref, int attr, uint32_t value) except -1:
    return check_cublas(cublasLtMatmulPreferenceSetAttribute(
        pref, <cublasLtMatmulPreferenceAttributes_t>attr, &value, sizeof(value)),
        "cublasLtMatmulPreferenceSetAttribute")


cdef cublasStatus_t _lt_run(GemmContext* ctx, cudaStream_t stream, LtPlanData* d, const ColMajorGemm* g,
                            const void* bias, void* aux, void* ws, size_t ws_bytes,
                            const float* alpha, const float* beta) noexcept nogil:
    # Pointers change between calls that share a plan; setting them is a host-side copy.
    cdef cublasStatus_t st
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


# ---------------------------------------------------------------- validation helpers

cdef int _matrix(object x, MatrixView* v, str name, int64_t rows, int64_t cols, cudaDataType dtype,
                 bint row_major) except -1:
    view_from_object(x, v, name, 2, 2)
    if v.rows != rows or v.cols != cols:
        raise ValueError(f"{name}: expected shape ({rows}, {cols}), got ({v.rows}, {v.cols})")
    if v.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype_name(dtype)}, got {dtype_name(v.dtype)}")
    if row_major and not is_rowmajor(v):
        raise ValueError(f"{name}: expected a row-major array (unit stride along the last axis, rows "
                         f"not overlapping), got element strides ({v.row_stride}, {v.col_stride})")
    return 0


cdef int _layer_operands(object A, object B, MatrixView* a, MatrixView* b) except -1:
    """A layer's A (M, K) and B (K, N): 2-D, one dtype, inner dimensions that agree."""
    view_from_object(A, a, "A", 2, 2)
    view_from_object(B, b, "B", 2, 2)
    if b.dtype != a.dtype:
        raise TypeError(f"B: expected the dtype of A ({dtype_name(a.dtype)}), got {dtype_name(b.dtype)}")
    if b.rows != a.cols:
        raise ValueError(f"B: A is ({a.rows}, {a.cols}) so B must have {a.cols} rows, got ({b.rows}, {b.cols})")
    return 0


def layer_shape(A, B):
    """(M, K, N, dtype name) of a layer's A (M, K) and B (K, N), checked as forward_into and
    backward_into check them (any layout cuBLAS can read, e.g. W.T)."""
    cdef MatrixView a, b
    _layer_operands(A, B, &a, &b)
    return a.rows, a.cols, b.cols, dtype_name(a.dtype)


cdef int _vector(object x, MatrixView* v, str name, int64_t n, cudaDataType dtype) except -1:
    view_from_object(x, v, name, 1, 2)
    if v.rows != 1 or v.cols != n:
        raise ValueError(f"{name}: expected shape ({n},) or (1, {n}), got ({v.rows}, {v.cols})")
    if v.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype_name(dtype)}, got {dtype_name(v.dtype)}")
    if v.col_stride != 1 and n > 1:
        raise ValueError(f"{name}: expected a contiguous vector, got element stride {v.col_stride}")
    return 0


cdef int _workspace(object ws, void** ptr, size_t* nbytes, GemmContext* ctx, cudaStream_t stream) except -1:
    """The caller's lt_workspace (any device array) or this stream's own workspace."""
    if ws is None:
        ptr[0] = stream_workspace(ctx, stream)
        nbytes[0] = ctx.workspace_bytes
        return 0
    cai = ws.__cuda_array_interface__       # checked by _check_lt_workspace before
    ptr[0] = <void*><uintptr_t>cai["data"][0]
    nbytes[0] = ws.nbytes
    return 0


cdef int _check_lt_workspace(object ws) except -1:
    if ws is not None and not hasattr(ws, "__cuda_array_interface__"):
        raise TypeError(f"lt_workspace: expected a device array, got {type(ws).__name__}")
    return 0


cdef int _map(MatrixView* a, bint ta, MatrixView* b, bint tb, MatrixView* c, tuple names,
              ColMajorGemm* g) except -1:
    return map_or_raise(a, b, c, ta, tb, g, names)


cdef int _gemm(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
               cublasComputeType_t compute, float beta) except -1:
    cdef float alpha = 1.0
    with nogil:
        gemm_colmajor(ctx, stream, g, dtype, compute, &alpha, &beta)
    return 0


# ---------------------------------------------------------------- forward

def forward_into(A, B, out, bias=None, *, bint with_bias=True, act="none", leaky_slope=0.01,
                 bint save_z=False, z_out=None, lt_workspace=None, str math="tf32", stream=None):
    """out = act(A @ B + bias), and z_out = A @ B + bias with save_z. Allocates nothing.

    A (M, K), B (K, N) (a transposed view is read in place), out and z_out
    row-major (M, N), bias (N,) or (1, N); bias=None or with_bias=False: no bias.
    """
    cdef MatrixView a, b, y, z, bv
    cdef cygemm_act_t code = parse_activation(act)
    cdef float slope = _slope(leaky_slope)
    _layer_operands(A, B, &a, &b)
    cdef int64_t M = a.rows, K = a.cols, N = b.cols
    _matrix(out, &y, "out", M, N, a.dtype, True)
    cdef bint use_bias = with_bias and bias is not None
    if use_bias:
        _vector(bias, &bv, "bias", N, a.dtype)
    if save_z:
        if z_out is None:
            raise ValueError("z_out: save_z=True needs z_out (forward_into never allocates), got None")
        _matrix(z_out, &z, "z_out", M, N, a.dtype, True)
    elif z_out is not None:
        raise ValueError("z_out: given but save_z=False; pass save_z=True to write it")
    cdef ColMajorGemm g, gz
    _map(&a, False, &b, False, &y, ("A", "B", "out"), &g)
    if save_z:      # the GEMM writes Z when the activation runs after it
        _map(&a, False, &b, False, &z, ("A", "B", "z_out"), &gz)
    check_no_overlap(&y, "out", &a, "A")
    check_no_overlap(&y, "out", &b, "B")
    if use_bias:
        check_no_overlap(&y, "out", &bv, "bias")
    if save_z:
        check_no_overlap(&z, "z_out", &a, "A")
        check_no_overlap(&z, "z_out", &b, "B")
        check_no_overlap(&z, "z_out", &y, "out")
        if use_bias:
            check_no_overlap(&z, "z_out", &bv, "bias")
    cdef cublasComputeType_t compute = compute_type_for(a.dtype, math)
    _check_lt_workspace(lt_workspace)
    cdef cudaStream_t s
    stream_from_object(stream, &s)
    cdef GemmContext* ctx = current_context()
    cdef const MatrixView* views[5]
    views[0], views[1], views[2] = &a, &b, &y
    views[3] = &bv if use_bias else NULL
    views[4] = &z if save_z else NULL
    check_devices(ctx, s, views, ["A", "B", "out", "bias", "z_out"])
    if M == 0 or N == 0:
        return out
    cdef void* ws
    cdef size_t ws_bytes
    _workspace(lt_workspace, &ws, &ws_bytes, ctx, s)
    cdef const void* bias_ptr = bv.ptr if use_bias else NULL
    cdef void* z_ptr = z.ptr if save_z else NULL
    # Leading dimensions as the mapping reads them (a single row's stride may be 0 or 1).
    cdef int64_t y_ld = rowmajor_ld(&y)
    cdef int64_t z_ld = rowmajor_ld(&z) if save_z else 0

    # Route: an epilogue does the whole layer when it can; else a bias epilogue
    # (or none) writes Z and one kernel applies the activation.
    cdef cublasLtEpilogue_t epi
    cdef void* aux = NULL
    cdef int64_t aux_ld = 0
    cdef bint post_kernel = False
    cdef void* target = y.ptr
    cdef int64_t target_ld = y_ld
    if not save_z and code in (CYGEMM_ACT_NONE, CYGEMM_ACT_RELU, CYGEMM_ACT_GELU):
        if code == CYGEMM_ACT_RELU:
            epi = CUBLASLT_EPILOGUE_RELU_BIAS if use_bias else CUBLASLT_EPILOGUE_RELU
        elif code == CYGEMM_ACT_GELU:
            epi = CUBLASLT_EPILOGUE_GELU_BIAS if use_bias else CUBLASLT_EPILOGUE_GELU
        else:
            epi = CUBLASLT_EPILOGUE_BIAS if use_bias else CUBLASLT_EPILOGUE_DEFAULT
    elif (save_z and code == CYGEMM_ACT_GELU and z_ld % 8 == 0 and _alignment(z_ptr) >= 16
          and <double>M * N * K < AUTOTUNE_MIN_MACS):
        # GELU's aux output is Z itself (ld a multiple of 8): one GEMM writes both,
        # one launch. On large problems the GELU_AUX kernels ran slower on the H200
        # (1.54x a plain GEMM at 8192x8192x1024) than BIAS + our kernel (1.36x).
        epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS if use_bias else CUBLASLT_EPILOGUE_GELU_AUX
        aux, aux_ld = z_ptr, z_ld
    else:
        # RELU's aux is a bit-mask, not Z, and other activations have no epilogue.
        epi = CUBLASLT_EPILOGUE_BIAS if use_bias else CUBLASLT_EPILOGUE_DEFAULT
        post_kernel = True
        if save_z:
            g = gz
            target, target_ld = z.ptr, z_ld
    cdef float alpha = 1.0, beta = 0.0
    cdef LtPlan plan = None
    cdef cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED
    if K > 0:
        plan = _get_plan(ctx, s, &g, a.dtype, compute, epi, bias_ptr, aux, aux_ld, ws, ws_bytes)
    cdef bint capturing = False
    if plan is not None and plan.d.usable:
        capturing = not plan.d.capture_ok and stream_is_capturing(s)
    if plan is not None and plan.d.usable and not capturing:
        with nogil:
            st = _lt_run(ctx, s, &plan.d, &g, bias_ptr, aux, ws, ws_bytes, &alpha, &beta)
        if st != CUBLAS_STATUS_SUCCESS:
            # A refused call enqueues nothing: take the fallback below. Inside a
            # capture, remember that this algorithm does not capture.
            if stream_is_capturing(s):
                _check_capture_alive(s)
                plan.d.capture_ok = False
            else:
                plan.d.usable = False
    if st == CUBLAS_STATUS_SUCCESS:
        if post_kernel:
            with nogil:
                check_cuda(cygemm_bias_act_forward(a.dtype, M, N, target, target_ld, NULL,
                                                   y.ptr, y_ld, NULL, 0, code, slope, s),
                           "cygemm_bias_act_forward")
        return out
    # Fallback, always correct: plain cuBLAS GEMM into Z (or Y), then bias + activation.
    if save_z:
        g = gz
        target, target_ld = z.ptr, z_ld
    else:
        target, target_ld = y.ptr, y_ld
    _gemm(ctx, s, &g, a.dtype, compute, 0.0)
    with nogil:
        check_cuda(cygemm_bias_act_forward(a.dtype, M, N, target, target_ld, bias_ptr,
                                           y.ptr, y_ld, z_ptr, z_ld, code, slope, s),
                   "cygemm_bias_act_forward")
    return out


# ---------------------------------------------------------------- backward

def backward_into(A, B, gY, Z, *, bint with_bias=True, act="none", leaky_slope=0.01, gA_out=None,
                  gB_out=None, gBias_out=None, work_dZ=None, lt_workspace=None, str math="tf32",
                  stream=None, bint accumulate=False, y=None):
    """Gradients of out = act(A @ B + bias) given gY = dL/dout and Z = A @ B + bias.

    dZ = gY * act'(Z) (into work_dZ), gBias = dZ.sum(0), gA = dZ @ B.T, gB = A.T @ dZ;
    an output left None is skipped. accumulate=True adds into the grads (beta = 1).
    Z may be None when act is "none", or when the forward's output is passed as `y`
    and act is relu, leaky_relu (slope > 0), sigmoid or tanh, whose derivative the
    output determines: then the forward need not save Z. Allocates nothing.
    """
    cdef MatrixView a, b, gy, zv, ga, gb, gbias, dz
    cdef cygemm_act_t code = parse_activation(act)
    cdef float slope = _slope(leaky_slope)
    _layer_operands(A, B, &a, &b)
    cdef int64_t M = a.rows, K = a.cols, N = b.cols
    _matrix(gY, &gy, "gY", M, N, a.dtype, True)
    cdef bint from_output = False
    if code != CYGEMM_ACT_NONE:
        if Z is not None:
            _matrix(Z, &zv, "Z", M, N, a.dtype, True)
        elif y is not None:
            if code not in (CYGEMM_ACT_RELU, CYGEMM_ACT_LEAKY_RELU, CYGEMM_ACT_SIGMOID, CYGEMM_ACT_TANH) or (
                    code == CYGEMM_ACT_LEAKY_RELU and slope <= 0):
                raise ValueError(f"y: act={act!r} cannot be differentiated from its output; pass Z")
            _matrix(y, &zv, "y", M, N, a.dtype, True)
            from_output = True
        else:
            raise ValueError(f"Z: act={act!r} needs the pre-activation Z (or, for relu, leaky_relu, "
                             "sigmoid and tanh, the output y), got None")
    cdef bint want_ga = gA_out is not None, want_gb = gB_out is not None
    cdef bint want_gbias = with_bias and gBias_out is not None
    if want_ga:
        _matrix(gA_out, &ga, "gA_out", M, K, a.dtype, False)
    if want_gb:
        _matrix(gB_out, &gb, "gB_out", K, N, a.dtype, False)
    if want_gbias:
        _vector(gBias_out, &gbias, "gBias_out", N, a.dtype)
    cdef bint need_dz = code != CYGEMM_ACT_NONE and (want_ga or want_gb)
    if need_dz:
        if work_dZ is None:
            raise ValueError(f"work_dZ: act={act!r} with gA_out/gB_out needs a ({M}, {N}) work_dZ "
                             "(backward_into never allocates; see ensure_workspaces), got None")
        _matrix(work_dZ, &dz, "work_dZ", M, N, a.dtype, True)
    cdef MatrixView* dZ = &dz if need_dz else &gy
    dz_name = "work_dZ" if need_dz else "gY"
    cdef ColMajorGemm g_a, g_b
    if want_ga:
        _map(dZ, False, &b, True, &ga, (dz_name, "B", "gA_out"), &g_a)      # gA = dZ @ B^T
    if want_gb:
        # gB = A^T @ dZ. Under the swap cuBLAS computes gB^T (N x K) = dZ^T A, whose first
        # operand is dZ^T (N x M): its row sums over M are the bias gradient, i.e. the
        # BGRADA epilogue (BGRADB for a column-major gB_out). Not used: our kernel's pass
        # already yields the bias gradient for every activation, accumulate included.
        _map(&a, True, dZ, False, &gb, ("A", dz_name, "gB_out"), &g_b)
    # No output may share memory with an input or with another output.
    cdef const MatrixView* views[8]
    names = ["A", "B", "gY", "Z" if Z is not None else "y", None, None, None, None]
    views[0], views[1], views[2], views[3] = &a, &b, &gy, &zv
    cdef int n_in = 4 if code != CYGEMM_ACT_NONE else 3, n, i, j
    if n_in == 3:
        views[3] = NULL
    n = 4
    if want_ga:
        views[n], names[n], n = &ga, "gA_out", n + 1
    if want_gb:
        views[n], names[n], n = &gb, "gB_out", n + 1
    if want_gbias:
        views[n], names[n], n = &gbias, "gBias_out", n + 1
    if need_dz:
        views[n], names[n], n = &dz, "work_dZ", n + 1
    for i in range(4, n):
        for j in range(i):
            if views[j] != NULL:
                check_no_overlap(views[i], names[i], views[j], names[j])
    cdef cublasComputeType_t compute = compute_type_for(a.dtype, math)
    _check_lt_workspace(lt_workspace)
    cdef cudaStream_t s
    stream_from_object(stream, &s)
    cdef float beta = 1.0 if accumulate else 0.0
    cdef GemmContext* ctx = current_context()
    cdef int64_t scratch_floats = cygemm_act_backward_scratch_floats(M, N) if want_gbias else 0
    if <size_t>scratch_floats * 4 > ctx.workspace_bytes:
        raise ValueError(f"gBias_out: N={N} needs {scratch_floats * 4} bytes of scratch, more than "
                         f"the stream workspace ({ctx.workspace_bytes})")
    check_devices(ctx, s, views, names[:n])     # every input and output; the last check
    cdef float* scratch = NULL
    cdef int64_t gy_ld = rowmajor_ld(&gy)
    cdef int64_t z_ld = rowmajor_ld(&zv) if code != CYGEMM_ACT_NONE else 0
    cdef int64_t dz_ld = rowmajor_ld(&dz) if need_dz else 0
    if want_gbias or need_dz:
        if want_gbias:
            # Scratch lives in the stream's (or the capture's) workspace: the GEMMs that
            # follow on this stream use it only after the reduction has finished.
            scratch = <float*>stream_workspace(ctx, s)
        with nogil:
            check_cuda(cygemm_act_backward(a.dtype, M, N, gy.ptr, gy_ld,
                                           zv.ptr if code != CYGEMM_ACT_NONE else NULL, z_ld,
                                           dz.ptr if need_dz else NULL, dz_ld,
                                           gbias.ptr if want_gbias else NULL, beta, scratch, code, slope,
                                           from_output, s),
                       "cygemm_act_backward")
    if want_ga and M > 0 and K > 0:
        _gemm(ctx, s, &g_a, a.dtype, compute, beta)
    if want_gb and K > 0 and N > 0:
        _gemm(ctx, s, &g_b, a.dtype, compute, beta)
    return (gA_out, gB_out, gBias_out)
