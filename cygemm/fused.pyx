# cython: language_level=3, boundscheck=False, wraparound=False
"""A dense layer fused: Y = act(A @ B + bias) and its backward, each by one of several
routes (tables below): cuBLASLt epilogues, a GEMM and cygemm's kernels, one stream or two.
Large problems time the routes that apply once and keep the fastest (the plan layer's
table, which tuning files save); small ones take a fixed rule.

Under the row-major swap cuBLASLt computes D = Y^T (N x M, column-major), so its
bias (length = rows of D = N) runs along the last axis of Y, as a layer wants.
Epilogues need a column-major D, which is why Y must be row-major here.
"""
from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memcmp, memset

from cygemm.cudart cimport *
from cygemm.cublas cimport *
from cygemm.cublaslt cimport *
from cygemm.kernels cimport *
from cygemm._core cimport (GemmContext, MatrixView, check_cuda, current_context, stream_workspace,
                           view_from_object, stream_from_object, stream_is_capturing, check_devices,
                           check_no_overlap, dtype_name, fork_side, join_side)
from cygemm.plans cimport (ColMajorGemm, Plan, pointer_alignment, get_plan, plan_run, run_gemm, worth_tuning,
                           routes_generation,
                           time_choices,
                           tuned_route, forced_route, remember_route, check_capture_alive)
from cygemm.rowmajor cimport compute_type_for, map_or_raise, rowmajor_ld, is_rowmajor
from cygemm.plans import clear_plan_cache, plan_cache_size

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


# ---------------------------------------------------------------- route tables

cdef enum:
    ROUTE_REPS = 7          # timed rounds per route (median)


# The forward's routes, in the order the fixed rule for small problems prefers them.
cdef enum ForwardRoute:
    FWD_EPILOGUE = 0
    FWD_GELU_AUX = 1
    FWD_BIAS_EPILOGUE_KERNEL = 2
    FWD_GEMM_KERNEL = 3
    N_FORWARD_ROUTES = 4

FORWARD_ROUTES = {
    "epilogue": "one cuBLASLt call with the bias and activation in its epilogue (relu, gelu, none; "
                "Z not saved)",
    "gelu_aux": "one cuBLASLt call writing out and Z (GELU_AUX[_BIAS]: gelu with save_z; Z's ld a "
                "multiple of 8, 16-byte aligned)",
    "bias_epilogue_kernel": "cuBLASLt with the BIAS epilogue writes Z (or out), cygemm's kernel applies "
                            "the activation",
    "gemm_kernel": "a plain GEMM (the plan layer's choice) writes Z (or out), cygemm's kernel adds the "
                   "bias and applies the activation; the fallback of every other route",
}
_FORWARD_NAMES = ("epilogue", "gelu_aux", "bias_epilogue_kernel", "gemm_kernel")

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
_BACKWARD_NAMES = ("serial", "branches")


ctypedef struct ForwardCall:
    GemmContext* ctx
    cudaStream_t s
    ColMajorGemm g_y            # A @ B into out
    ColMajorGemm g_z            # A @ B into z_out (save_z)
    cudaDataType dtype
    cublasComputeType_t compute
    const void* bias
    void* y
    int64_t y_ld
    void* z
    int64_t z_ld
    int64_t M
    int64_t N
    int64_t K
    cygemm_act_t code
    float slope
    bint save_z
    void* ws
    size_t ws_bytes


cdef bint _fwd_applies(const ForwardCall* f, int route) noexcept nogil:
    cdef bint kernel_work = f.save_z or f.code != CYGEMM_ACT_NONE
    if route == FWD_EPILOGUE:
        return f.K > 0 and not f.save_z and f.code in (CYGEMM_ACT_NONE, CYGEMM_ACT_RELU, CYGEMM_ACT_GELU)
    if route == FWD_GELU_AUX:
        # GELU's aux output is Z itself when its ld is a multiple of 8 (cuBLASLt's rule).
        return (f.K > 0 and f.save_z and f.code == CYGEMM_ACT_GELU and f.z_ld % 8 == 0
                and pointer_alignment(f.z) >= 16)
    if route == FWD_BIAS_EPILOGUE_KERNEL:
        return f.K > 0 and f.bias != NULL and kernel_work
    return True


cdef int _fwd_default(const ForwardCall* f) noexcept nogil:
    """The fixed rule (small problems, or a capture before any eager call): one launch where
    an epilogue does it all; GELU_AUX only when small (on large problems it ran 1.54x a plain
    GEMM on the H200 against 1.36x for BIAS + our kernel); else a BIAS epilogue + kernel."""
    if _fwd_applies(f, FWD_EPILOGUE):
        return FWD_EPILOGUE
    if _fwd_applies(f, FWD_GELU_AUX) and not worth_tuning(<double>f.M * f.N * f.K):
        return FWD_GELU_AUX
    if _fwd_applies(f, FWD_BIAS_EPILOGUE_KERNEL):
        return FWD_BIAS_EPILOGUE_KERNEL
    return FWD_GEMM_KERNEL


cdef int _lt_call(ForwardCall* f, ColMajorGemm* g, cublasLtEpilogue_t epi, const void* bias, void* aux,
                  int64_t aux_ld) except -1:
    """One cuBLASLt call by its plan: 0 done, 1 refused (nothing enqueued; the caller falls back)."""
    cdef float alpha = 1.0, beta = 0.0
    cdef Plan plan = get_plan(f.ctx, f.s, g, f.dtype, f.compute, epi, bias, aux, aux_ld, f.ws, f.ws_bytes)
    if plan is None or not plan.d.usable:
        return 1
    if not plan.d.capture_ok and stream_is_capturing(f.s):
        return 1
    cdef int st
    with nogil:
        st = plan_run(f.ctx, f.s, &plan.d, g, bias, aux, f.ws, f.ws_bytes, &alpha, &beta)
    if st == CUBLAS_STATUS_SUCCESS:
        return 0
    # A refused call enqueues nothing. Inside a capture, remember that this algorithm
    # does not capture; outside, that it does not run.
    if stream_is_capturing(f.s):
        check_capture_alive(f.s)
        plan.d.capture_ok = False
    else:
        plan.d.usable = False
    return 1


cdef int _fwd_run(ForwardCall* f, int route) except -1:
    """Enqueue one route: 0 done, 1 its cuBLASLt call was refused (nothing enqueued)."""
    cdef cublasLtEpilogue_t epi
    cdef bint has_bias = f.bias != NULL
    cdef ColMajorGemm* g = &f.g_z if f.save_z else &f.g_y
    cdef void* target = f.z if f.save_z else f.y
    cdef int64_t target_ld = f.z_ld if f.save_z else f.y_ld
    if route == FWD_EPILOGUE:
        if f.code == CYGEMM_ACT_RELU:
            epi = CUBLASLT_EPILOGUE_RELU_BIAS if has_bias else CUBLASLT_EPILOGUE_RELU
        elif f.code == CYGEMM_ACT_GELU:
            epi = CUBLASLT_EPILOGUE_GELU_BIAS if has_bias else CUBLASLT_EPILOGUE_GELU
        else:
            epi = CUBLASLT_EPILOGUE_BIAS if has_bias else CUBLASLT_EPILOGUE_DEFAULT
        return _lt_call(f, &f.g_y, epi, f.bias, NULL, 0)
    if route == FWD_GELU_AUX:
        epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS if has_bias else CUBLASLT_EPILOGUE_GELU_AUX
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
    _gemm(f.ctx, f.s, g, f.dtype, f.compute, 0.0)
    with nogil:
        check_cuda(cygemm_bias_act_forward(f.dtype, f.M, f.N, target, target_ld, f.bias,
                                           f.y, f.y_ld, f.z if f.save_z else NULL, f.z_ld,
                                           f.code, f.slope, f.s),
                   "cygemm_bias_act_forward")
    return 0


cdef int _fwd_enqueue(void* arg, int route) except -1:
    return _fwd_run(<ForwardCall*>arg, route)


cdef int _fwd_route(ForwardCall* f) except -1:
    """The route for this call: the tuned one for a large problem (timed now if new and the
    stream is not capturing), else the fixed rule."""
    cdef int route
    forced = forced_route("forward")
    if forced is not None and forced in _FORWARD_NAMES:
        route = _FORWARD_NAMES.index(forced)
        return route if _fwd_applies(f, route) else _fwd_default(f)
    if not worth_tuning(<double>f.M * f.N * f.K):
        return _fwd_default(f)
    g = &f.g_y
    key = ("forward", <int>f.dtype, <int>f.compute, <int>f.code, f.bias != NULL, f.save_z, f.M, f.N, f.K,
           <int>g.opa, <int>g.opb, g.lda, g.ldb, f.y_ld, f.z_ld, f.ws_bytes)
    name = tuned_route(f.ctx.device, key)
    if name is not None and name in _FORWARD_NAMES:
        route = _FORWARD_NAMES.index(name)
        return route if _fwd_applies(f, route) else _fwd_default(f)
    if stream_is_capturing(f.s):
        return _fwd_default(f)
    cdef int choices[N_FORWARD_ROUTES]
    cdef float ms[N_FORWARD_ROUTES]
    cdef int n = 0, i, best = -1
    for i in range(N_FORWARD_ROUTES):
        if _fwd_applies(f, i):
            choices[n] = i
            n += 1
    time_choices(f.ctx, f.s, _fwd_enqueue, f, choices, n, ROUTE_REPS, ms)
    for i in range(n):
        if ms[i] >= 0 and (best < 0 or ms[i] < ms[best]):
            best = i
    if best < 0:
        return _fwd_default(f)
    remember_route(f.ctx.device, key, _FORWARD_NAMES[choices[best]],
                   {_FORWARD_NAMES[choices[i]]: ms[i] for i in range(n)})
    return choices[best]


ctypedef struct BackwardCall:
    GemmContext* ctx
    cudaStream_t s
    ColMajorGemm g_a
    ColMajorGemm g_b
    cudaDataType dtype
    cublasComputeType_t compute
    float beta


cdef int _bwd_run(BackwardCall* b, int route) except -1:
    if route == BWD_SERIAL:
        _gemm(b.ctx, b.s, &b.g_a, b.dtype, b.compute, b.beta)
        _gemm(b.ctx, b.s, &b.g_b, b.dtype, b.compute, b.beta)
        return 0
    cdef cudaStream_t side
    cdef cudaEvent_t join
    fork_side(b.ctx, b.s, &side, &join)
    try:
        _gemm(b.ctx, side, &b.g_b, b.dtype, b.compute, b.beta)
        _gemm(b.ctx, b.s, &b.g_a, b.dtype, b.compute, b.beta)
    except BaseException:
        join_side(b.ctx, b.s, side, join, True)      # the original error matters more
        raise
    join_side(b.ctx, b.s, side, join, False)
    return 0


cdef int _bwd_enqueue(void* arg, int route) except -1:
    return _bwd_run(<BackwardCall*>arg, route)


# The routes of recent backward problems, keyed in C: a repeated small backward finds its
# route without building a Python key. Filled only with routes from the table (tuned or
# forced); valid while plans.routes_generation() is what it was. Used with the GIL held.
ctypedef struct _BwdKey:
    int64_t device, dtype, compute, M, N, K
    int64_t ops, lda_a, ldb_a, ldc_a, lda_b, ldb_b, ldc_b

cdef enum:
    BWD_MEMO = 16

cdef _BwdKey _bwd_memo_key[BWD_MEMO]
cdef int _bwd_memo_route[BWD_MEMO]
cdef int _bwd_memo_n = 0, _bwd_memo_next = 0
cdef unsigned long _bwd_memo_generation = 0


cdef void _bwd_key(const BackwardCall* b, int64_t M, int64_t N, int64_t K, _BwdKey* k) noexcept nogil:
    memset(k, 0, sizeof(_BwdKey))
    k.device, k.dtype, k.compute, k.M, k.N, k.K = b.ctx.device, <int>b.dtype, <int>b.compute, M, N, K
    k.ops = (<int>b.g_a.opa) | (<int>b.g_a.opb << 8) | (<int>b.g_b.opa << 16) | (<int>b.g_b.opb << 24)
    k.lda_a, k.ldb_a, k.ldc_a = b.g_a.lda, b.g_a.ldb, b.g_a.ldc
    k.lda_b, k.ldb_b, k.ldc_b = b.g_b.lda, b.g_b.ldb, b.g_b.ldc


cdef int _bwd_memo_find(const _BwdKey* k) noexcept nogil:
    global _bwd_memo_n, _bwd_memo_generation
    cdef int i
    if _bwd_memo_generation != routes_generation():
        _bwd_memo_n = 0
        _bwd_memo_generation = routes_generation()
        return -1
    for i in range(_bwd_memo_n):
        if memcmp(&_bwd_memo_key[i], k, sizeof(_BwdKey)) == 0:
            return _bwd_memo_route[i]
    return -1


cdef void _bwd_memo_add(const _BwdKey* k, int route, unsigned long generation) noexcept nogil:
    global _bwd_memo_n, _bwd_memo_next
    if generation != routes_generation() or generation != _bwd_memo_generation:
        return                          # chosen under routes that have changed since
    cdef int i = _bwd_memo_next
    if _bwd_memo_n < BWD_MEMO:
        i = _bwd_memo_n
        _bwd_memo_n += 1
    else:
        _bwd_memo_next = (_bwd_memo_next + 1) % BWD_MEMO
    _bwd_memo_key[i] = k[0]
    _bwd_memo_route[i] = route


cdef int _bwd_route(BackwardCall* b, bint accumulate, int64_t M, int64_t N, int64_t K) except -1:
    """Serial or branches: timed once per problem (every size: the branches pay where one GEMM
    leaves the GPU idle, i.e. on small ones), outside capture, on a call that does not
    accumulate (timing runs write the gradients); else serial until timed."""
    cdef _BwdKey ck
    _bwd_key(b, M, N, K, &ck)
    # Timing below waits without the GIL: another thread may force or clear routes meanwhile,
    # and then a route chosen now must not enter the memo.
    cdef unsigned long generation = routes_generation()
    cdef int route = _bwd_memo_find(&ck)
    if route >= 0:
        return route
    forced = forced_route("backward")
    if forced is not None and forced in _BACKWARD_NAMES:
        route = _BACKWARD_NAMES.index(forced)
        _bwd_memo_add(&ck, route, generation)
        return route
    key = ("backward", <int>b.dtype, <int>b.compute, M, N, K, <int>b.g_a.opa, <int>b.g_a.opb, b.g_a.lda,
           b.g_a.ldb, b.g_a.ldc, <int>b.g_b.opa, <int>b.g_b.opb, b.g_b.lda, b.g_b.ldb, b.g_b.ldc)
    name = tuned_route(b.ctx.device, key)
    if name is not None and name in _BACKWARD_NAMES:
        route = _BACKWARD_NAMES.index(name)
        _bwd_memo_add(&ck, route, generation)
        return route
    if accumulate or stream_is_capturing(b.s):
        return BWD_SERIAL
    cdef int choices[2]
    cdef float ms[2]
    choices[0], choices[1] = BWD_SERIAL, BWD_BRANCHES
    time_choices(b.ctx, b.s, _bwd_enqueue, b, choices, 2, ROUTE_REPS, ms)
    cdef int best = BWD_SERIAL if ms[1] < 0 or (0 <= ms[0] <= ms[1]) else BWD_BRANCHES
    remember_route(b.ctx.device, key, _BACKWARD_NAMES[best], {"serial": ms[0], "branches": ms[1]})
    _bwd_memo_add(&ck, best, generation)
    return best


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


cdef tuple _shape_of(object x):
    shape = getattr(x, "shape", None)
    if shape is None:
        shape = x.__cuda_array_interface__["shape"]
    return tuple(shape)


cdef int _vector(object x, MatrixView* v, str name, int64_t n, cudaDataType dtype) except -1:
    view_from_object(x, v, name, 1, 2)
    if v.rows != 1 or v.cols != n:
        raise ValueError(f"{name}: expected shape ({n},) or (1, {n}), got {_shape_of(x)}")
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
        run_gemm(ctx, stream, g, dtype, compute, &alpha, &beta)
    return 0


# ---------------------------------------------------------------- forward

def forward_into(A, B, out, bias=None, *, bint with_bias=True, act="none", leaky_slope=0.01,
                 bint save_z=False, z_out=None, lt_workspace=None, str math="tf32", stream=None):
    """out = act(A @ B + bias), and z_out = A @ B + bias with save_z, into given buffers.

    Parameters
    ----------
    A : device array (M, K)
        Row-major (unit stride along its last axis; row slices too).
    B : device array (K, N)
        Any 2-D layout cuBLAS reads in place: ``W.T`` of a weight stored (N, K), as torch's
        ``nn.Linear`` keeps it, is read without a copy.
    out : device array (M, N)
        Row-major; the dtype of A (float32, float16 or bfloat16).
    bias : device array (N,) or (1, N), optional
        None, or ``with_bias=False``: no bias.
    act : str
        "none"/"identity", "relu", "leaky_relu" (``leaky_slope``), "gelu" (tanh
        approximation, as cuBLASLt), "gelu_erf", "sigmoid", "tanh" or "silu".
    save_z, z_out : bool, device array (M, N)
        With ``save_z``, also write the pre-activation Z to ``z_out`` (the backward's input).
    lt_workspace : device array, optional
        A cuBLASLt workspace to use instead of cygemm's own one for the stream.
    math : {"tf32", "fp32"}
        As :func:`cygemm.gemm`.
    stream : optional
        As :func:`cygemm.gemm`; everything is enqueued there.

    Returns
    -------
    device array
        ``out``.

    Raises
    ------
    ValueError
        Shapes that do not fit, a layout that is not row-major where one is needed, an output
        that overlaps an input, ``z_out`` missing with ``save_z`` (or given without it), an
        unknown activation, arrays or stream of another device.
    TypeError, CublasError, CudaError
        As :func:`cygemm.gemm`.

    Notes
    -----
    Allocates nothing and can be captured. The route (one cuBLASLt epilogue, a BIAS epilogue
    plus cygemm's kernel, ...) is chosen by the route table of ``cygemm.fused``: timed once
    for large problems, a fixed rule for small ones.
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
    # Leading dimensions as the mapping reads them (a single row's stride may be 0 or 1).
    cdef int64_t y_ld = rowmajor_ld(&y)
    cdef int64_t z_ld = rowmajor_ld(&z) if save_z else 0

    cdef ForwardCall f
    f.ctx, f.s, f.g_y, f.dtype, f.compute = ctx, s, g, a.dtype, compute
    if save_z:
        f.g_z = gz
    f.bias = bv.ptr if use_bias else NULL
    f.y, f.y_ld = y.ptr, y_ld
    f.z, f.z_ld = NULL, 0
    if save_z:
        f.z, f.z_ld = z.ptr, z_ld
    f.M, f.N, f.K, f.code, f.slope, f.save_z = M, N, K, code, slope, save_z
    f.ws, f.ws_bytes = ws, ws_bytes
    if _fwd_run(&f, _fwd_route(&f)) != 0:
        _fwd_run(&f, FWD_GEMM_KERNEL)       # always correct
    return out


# ---------------------------------------------------------------- backward

def backward_into(A, B, gY, Z, *, bint with_bias=True, act="none", leaky_slope=0.01, gA_out=None,
                  gB_out=None, gBias_out=None, work_dZ=None, lt_workspace=None, str math="tf32",
                  stream=None, bint accumulate=False, y=None):
    """Gradients of out = act(A @ B + bias) given gY = dL/dout, into given buffers.

    dZ = gY * act'(Z) (into ``work_dZ``), gBias = dZ.sum(0), gA = dZ @ B.T, gB = A.T @ dZ.

    Parameters
    ----------
    A, B, with_bias, act, leaky_slope, lt_workspace, math, stream
        As in :func:`forward_into` (the forward's operands).
    gY : device array (M, N)
        The gradient of the loss with respect to the forward's ``out``.
    Z : device array (M, N) or None
        The forward's ``z_out``. None when act is "none", or when ``y`` is given.
    y : device array (M, N), optional
        The forward's ``out``, instead of Z, for relu, leaky_relu (slope > 0), sigmoid and
        tanh, whose derivative the output fixes: then the forward need not save Z.
    gA_out, gB_out, gBias_out : device arrays, optional
        (M, K), (K, N), (N,); any left None is not computed. gB_out may be ``gW.T`` of a
        weight gradient stored (N, K).
    work_dZ : device array (M, N), optional
        Scratch for dZ; needed unless act is "none" (see ``gemm_ops.ensure_workspaces``).
    accumulate : bool
        Add into the gradients (beta = 1) instead of overwriting them.

    Returns
    -------
    tuple
        ``(gA_out, gB_out, gBias_out)``.

    Raises
    ------
    ValueError, TypeError, CublasError, CudaError
        As :func:`forward_into`; also a missing ``work_dZ`` or Z.

    Notes
    -----
    Allocates nothing and can be captured. The two GEMMs run on the caller's stream, or, where
    timing found it faster, the weight gradient on a side stream forked from and joined to it
    (the ``branches`` route; a captured graph then has two branches).
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
    cdef bint run_ga = want_ga and M > 0 and K > 0, run_gb = want_gb and K > 0 and N > 0
    cdef BackwardCall bc
    bc.ctx, bc.s, bc.dtype, bc.compute, bc.beta = ctx, s, a.dtype, compute, beta
    if run_ga and run_gb:
        bc.g_a, bc.g_b = g_a, g_b
        _bwd_run(&bc, _bwd_route(&bc, accumulate, M, N, K))
    elif run_ga:
        _gemm(ctx, s, &g_a, a.dtype, compute, beta)
    elif run_gb:
        _gemm(ctx, s, &g_b, a.dtype, compute, beta)
    return (gA_out, gB_out, gBias_out)
