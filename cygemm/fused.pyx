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

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
from cygemm.kernels.elementwise cimport *
from cygemm.epilogues cimport Activation, NO_EPILOGUE, activation_row, leaky_slope_of
from cygemm._layer cimport (layer_matrix, layer_vector, layer_operands, layer_workspace, layer_gemm,
                            time_routes)
from cygemm._types cimport MatrixView, ColMajorGemm, pointer_alignment
from cygemm._errors cimport check_cuda
from cygemm._streams cimport stream_is_capturing
from cygemm._context cimport GemmContext, stream_workspace, fork_side, join_side
from cygemm._args cimport CallArgs, add_array, prepare_call, ARG_READ, ARG_WRITE, ARG_SCRATCH
from cygemm._arrays cimport dtype_name
from cygemm._settings cimport autotune_level, AUTOTUNE_OFF
from cygemm._launch cimport plan_run
from cygemm.plans cimport Plan, get_plan, check_capture_alive
from cygemm.tuning cimport worth_tuning, tuned_route, forced_route, remember_route, routes_generation
from cygemm._mapping cimport map_or_raise, rowmajor_ld
from cygemm.plans import clear_plan_cache, plan_cache_size
from cygemm import tuning


from cygemm.epilogues import ACTIVATIONS, activation_table, parse_activation


# ---------------------------------------------------------------- route tables

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
tuning.register_routes("forward", _FORWARD_NAMES)
tuning.register_routes("backward", _BACKWARD_NAMES)


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
    const Activation* act
    cygemm_act_t code
    float slope
    bint save_z
    void* ws
    size_t ws_bytes
    int autotune


cdef bint _fwd_applies(const ForwardCall* f, int route) noexcept nogil:
    cdef bint kernel_work = f.save_z or f.code != CYGEMM_ACT_NONE
    if route == FWD_EPILOGUE:
        return f.K > 0 and not f.save_z and f.act.epilogue != NO_EPILOGUE
    if route == FWD_GELU_AUX:
        return (f.K > 0 and f.save_z and f.act.aux_epilogue != NO_EPILOGUE
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
    if _fwd_applies(f, FWD_GELU_AUX) and not worth_tuning(<double>f.M * f.N * f.K):
        return FWD_GELU_AUX
    if _fwd_applies(f, FWD_BIAS_EPILOGUE_KERNEL):
        return FWD_BIAS_EPILOGUE_KERNEL
    return FWD_GEMM_KERNEL


cdef int _lt_call(ForwardCall* f, ColMajorGemm* g, cublasLtEpilogue_t epi, const void* bias, void* aux,
                  int64_t aux_ld) except -1:
    """One cuBLASLt call by its plan: 0 done, 1 refused (nothing enqueued; the caller falls back)."""
    cdef float alpha = 1.0, beta = 0.0
    cdef Plan plan = get_plan(f.ctx, f.s, g, f.dtype, f.compute, epi, bias, aux, aux_ld, f.ws, f.ws_bytes,
                              f.autotune, False)
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
        epi = <cublasLtEpilogue_t>(f.act.epilogue_bias if has_bias else f.act.epilogue)
        return _lt_call(f, &f.g_y, epi, f.bias, NULL, 0)
    if route == FWD_GELU_AUX:
        epi = <cublasLtEpilogue_t>(f.act.aux_epilogue_bias if has_bias else f.act.aux_epilogue)
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
    layer_gemm(f.ctx, f.s, g, f.dtype, f.compute, 0.0, f.autotune)
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
    if f.autotune == AUTOTUNE_OFF or not worth_tuning(<double>f.M * f.N * f.K):
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
    time_routes(f.ctx, f.s, _fwd_enqueue, f, choices, n, ms, f.autotune)
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
    int autotune


cdef int _bwd_run(BackwardCall* b, int route) except -1:
    if route == BWD_SERIAL:
        layer_gemm(b.ctx, b.s, &b.g_a, b.dtype, b.compute, b.beta, b.autotune)
        layer_gemm(b.ctx, b.s, &b.g_b, b.dtype, b.compute, b.beta, b.autotune)
        return 0
    cdef cudaStream_t side
    cdef cudaEvent_t join
    with nogil:             # the first fork creates a stream and allocates its workspace
        fork_side(b.ctx, b.s, &side, &join)
    try:
        layer_gemm(b.ctx, side, &b.g_b, b.dtype, b.compute, b.beta, b.autotune)
        layer_gemm(b.ctx, b.s, &b.g_a, b.dtype, b.compute, b.beta, b.autotune)
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
    if accumulate or b.autotune == AUTOTUNE_OFF or stream_is_capturing(b.s):
        return BWD_SERIAL
    cdef int choices[2]
    cdef float ms[2]
    choices[0], choices[1] = BWD_SERIAL, BWD_BRANCHES
    time_routes(b.ctx, b.s, _bwd_enqueue, b, choices, 2, ms, b.autotune)
    cdef int best = BWD_SERIAL if ms[1] < 0 or (0 <= ms[0] <= ms[1]) else BWD_BRANCHES
    remember_route(b.ctx.device, key, _BACKWARD_NAMES[best], {"serial": ms[0], "branches": ms[1]})
    _bwd_memo_add(&ck, best, generation)
    return best


def layer_shape(A, B):
    """(M, K, N, dtype name) of a layer's A (M, K) and B (K, N), checked as forward_into and
    backward_into check them (any layout cuBLAS can read, e.g. W.T)."""
    cdef CallArgs c
    layer_operands(&c, A, B)
    return c.views[0].rows, c.views[0].cols, c.views[1].cols, dtype_name(c.views[0].dtype)


# ---------------------------------------------------------------- forward

def forward_into(A, B, out, bias=None, *, bint with_bias=True, act="none", leaky_slope=0.01,
                 bint save_z=False, z_out=None, lt_workspace=None, str math="tf32", stream=None,
                 autotune=None):
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
        A cuBLASLt workspace to use instead of cygemm's own one for the stream: contiguous,
        256-byte aligned, on the call's device, sharing memory with no other argument.
    math : {"tf32", "fp32"}
        As :func:`cygemm.gemm`.
    stream : optional
        As :func:`cygemm.gemm`; everything is enqueued there.
    autotune : {None, "off", "auto", "exhaustive"}
        As :func:`cygemm.gemm`; for a large problem it also decides the route.

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
    cdef const Activation* row = activation_row(act)
    cdef float slope = leaky_slope_of(leaky_slope)
    cdef int level = autotune_level(autotune)
    cdef CallArgs c
    layer_operands(&c, A, B)
    cdef cudaDataType dtype = c.views[0].dtype
    cdef int64_t M = c.views[0].rows, K = c.views[0].cols, N = c.views[1].cols
    cdef bint use_bias = with_bias and bias is not None
    cdef MatrixView* bv = layer_vector(&c, bias, "bias", ARG_READ, N, dtype) if use_bias else NULL
    cdef MatrixView* y = layer_matrix(&c, out, "out", ARG_WRITE, M, N, dtype, True)
    cdef MatrixView* z = NULL
    if save_z:
        if z_out is None:
            raise ValueError("z_out: save_z=True needs z_out (forward_into never allocates), got None")
        z = layer_matrix(&c, z_out, "z_out", ARG_WRITE, M, N, dtype, True)
    elif z_out is not None:
        raise ValueError("z_out: given but save_z=False; pass save_z=True to write it")
    cdef MatrixView* wv = add_array(&c, lt_workspace, "lt_workspace", ARG_SCRATCH, 1, 1) \
        if lt_workspace is not None else NULL
    cdef ColMajorGemm g, gz
    map_or_raise(&c.views[0], &c.views[1], y, False, False, &g, ("A", "B", "out"))
    if save_z:      # the GEMM writes Z when the activation runs after it
        map_or_raise(&c.views[0], &c.views[1], z, False, False, &gz, ("A", "B", "z_out"))
    prepare_call(&c, math, dtype, stream)
    if M == 0 or N == 0:
        return out

    cdef ForwardCall f
    f.ctx, f.s, f.g_y, f.dtype, f.compute = c.ctx, c.stream, g, dtype, c.compute
    layer_workspace(&c, lt_workspace, wv, &f.ws, &f.ws_bytes)
    if save_z:
        f.g_z = gz
    f.bias = bv.ptr if use_bias else NULL
    # Leading dimensions as the mapping reads them (a single row's stride may be 0 or 1).
    f.y, f.y_ld = y.ptr, rowmajor_ld(y)
    f.z, f.z_ld = NULL, 0
    if save_z:
        f.z, f.z_ld = z.ptr, rowmajor_ld(z)
    f.M, f.N, f.K, f.act, f.code, f.slope, f.save_z = M, N, K, row, row.code, slope, save_z
    f.autotune = level
    if _fwd_run(&f, _fwd_route(&f)) != 0:
        _fwd_run(&f, FWD_GEMM_KERNEL)       # always correct
    return out


# ---------------------------------------------------------------- backward

def backward_into(A, B, gY, Z, *, bint with_bias=True, act="none", leaky_slope=0.01, gA_out=None,
                  gB_out=None, gBias_out=None, work_dZ=None, lt_workspace=None, str math="tf32",
                  stream=None, bint accumulate=False, y=None, autotune=None):
    """Gradients of out = act(A @ B + bias) given gY = dL/dout, into given buffers.

    dZ = gY * act'(Z) (into ``work_dZ``), gBias = dZ.sum(0), gA = dZ @ B.T, gB = A.T @ dZ.

    Parameters
    ----------
    A, B, with_bias, act, leaky_slope, lt_workspace, math, stream, autotune
        As in :func:`forward_into` (the forward's operands). ``lt_workspace`` is checked as
        there; the backward's GEMMs use the stream's own workspaces.
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
    cdef const Activation* row = activation_row(act)
    cdef cygemm_act_t code = row.code
    cdef float slope = leaky_slope_of(leaky_slope)
    cdef int level = autotune_level(autotune)
    cdef CallArgs c
    layer_operands(&c, A, B)
    cdef MatrixView* a = &c.views[0]
    cdef MatrixView* b = &c.views[1]
    cdef cudaDataType dtype = a.dtype
    cdef int64_t M = a.rows, K = a.cols, N = b.cols
    cdef MatrixView* gy = layer_matrix(&c, gY, "gY", ARG_READ, M, N, dtype, True)
    cdef MatrixView* zv = NULL
    cdef bint from_output = False
    if code != CYGEMM_ACT_NONE:
        if Z is not None:
            zv = layer_matrix(&c, Z, "Z", ARG_READ, M, N, dtype, True)
        elif y is not None:
            if not row.grad_from_output or (code == CYGEMM_ACT_LEAKY_RELU and slope <= 0):
                raise ValueError(f"y: act={act!r} cannot be differentiated from its output; pass Z")
            zv = layer_matrix(&c, y, "y", ARG_READ, M, N, dtype, True)
            from_output = True
        else:
            raise ValueError(f"Z: act={act!r} needs the pre-activation Z (or, for relu, leaky_relu, "
                             "sigmoid and tanh, the output y), got None")
    cdef bint want_ga = gA_out is not None, want_gb = gB_out is not None
    cdef bint want_gbias = with_bias and gBias_out is not None
    # Outputs after the inputs: none may share memory with an input or another output.
    cdef MatrixView* ga = layer_matrix(&c, gA_out, "gA_out", ARG_WRITE, M, K, dtype, False) if want_ga else NULL
    cdef MatrixView* gb = layer_matrix(&c, gB_out, "gB_out", ARG_WRITE, K, N, dtype, False) if want_gb else NULL
    cdef MatrixView* gbias = layer_vector(&c, gBias_out, "gBias_out", ARG_WRITE, N, dtype) if want_gbias else NULL
    cdef bint need_dz = code != CYGEMM_ACT_NONE and (want_ga or want_gb)
    cdef MatrixView* dz = NULL
    if need_dz:
        if work_dZ is None:
            raise ValueError(f"work_dZ: act={act!r} with gA_out/gB_out needs a ({M}, {N}) work_dZ "
                             "(backward_into never allocates; see ensure_workspaces), got None")
        dz = layer_matrix(&c, work_dZ, "work_dZ", ARG_WRITE, M, N, dtype, True)
    if lt_workspace is not None:
        add_array(&c, lt_workspace, "lt_workspace", ARG_SCRATCH, 1, 1)
    cdef MatrixView* dZ = dz if need_dz else gy
    dz_name = "work_dZ" if need_dz else "gY"
    cdef ColMajorGemm g_a, g_b
    if want_ga:
        map_or_raise(dZ, b, ga, False, True, &g_a, (dz_name, "B", "gA_out"))      # gA = dZ @ B^T
    if want_gb:
        # gB = A^T @ dZ. Under the swap cuBLAS computes gB^T (N x K) = dZ^T A, whose first
        # operand is dZ^T (N x M): its row sums over M are the bias gradient, i.e. the
        # BGRADA epilogue (BGRADB for a column-major gB_out). Not used: our kernel's pass
        # already yields the bias gradient for every activation, accumulate included.
        map_or_raise(a, dZ, gb, True, False, &g_b, ("A", dz_name, "gB_out"))
    prepare_call(&c, math, dtype, stream)
    cdef GemmContext* ctx = c.ctx
    cdef cudaStream_t s = c.stream
    cdef float beta = 1.0 if accumulate else 0.0
    cdef int64_t scratch_floats = cygemm_act_backward_scratch_floats(M, N) if want_gbias else 0
    if <size_t>scratch_floats * 4 > ctx.workspace_bytes:
        raise ValueError(f"gBias_out: N={N} needs {scratch_floats * 4} bytes of scratch, more than "
                         f"the stream workspace ({ctx.workspace_bytes})")
    cdef float* scratch = NULL
    cdef int64_t gy_ld = rowmajor_ld(gy)
    cdef int64_t z_ld = rowmajor_ld(zv) if zv != NULL else 0
    cdef int64_t dz_ld = rowmajor_ld(dz) if need_dz else 0
    if want_gbias or need_dz:
        with nogil:
            if want_gbias:
                # Scratch lives in the stream's (or the capture's) workspace: the GEMMs that
                # follow on this stream use it only after the reduction has finished.
                scratch = <float*>stream_workspace(ctx, s)
            check_cuda(cygemm_act_backward(dtype, M, N, gy.ptr, gy_ld,
                                           zv.ptr if zv != NULL else NULL, z_ld,
                                           dz.ptr if need_dz else NULL, dz_ld,
                                           gbias.ptr if want_gbias else NULL, beta, scratch, code, slope,
                                           from_output, s),
                       "cygemm_act_backward")
    cdef bint run_ga = want_ga and M > 0 and K > 0, run_gb = want_gb and K > 0 and N > 0
    cdef BackwardCall bc
    bc.ctx, bc.s, bc.dtype, bc.compute, bc.beta, bc.autotune = ctx, s, dtype, c.compute, beta, level
    if run_ga and run_gb:
        bc.g_a, bc.g_b = g_a, g_b
        _bwd_run(&bc, _bwd_route(&bc, accumulate, M, N, K))
    elif run_ga:
        layer_gemm(ctx, s, &g_a, dtype, c.compute, beta, level)
    elif run_gb:
        layer_gemm(ctx, s, &g_b, dtype, c.compute, beta, level)
    return (gA_out, gB_out, gBias_out)
