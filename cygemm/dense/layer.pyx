# cython: language_level=3, boundscheck=False, wraparound=False
# kernels: elementwise
"""The dense layer: Y = act(A @ B + bias) and its backward, into buffers the caller gives
(:func:`forward_into`, :func:`backward_into`). Each call is read and checked here, then run by
one of its routes (cygemm.dense.routes: cuBLASLt epilogues, a GEMM and cygemm's kernels, one
stream or two). Large problems time the routes that apply once and keep the fastest (the
tuning table, which tuning files save); small ones take a fixed rule.
"""
cimport cython
from libc.stdint cimport int64_t

from cygemm.bindings.cudart cimport *
from cygemm.kernels.elementwise cimport *
from cygemm.engine.epilogues cimport Activation, activation_row, leaky_slope_of
from cygemm.engine.types cimport MatrixView, ColMajorGemm, ArrayDesc
from cygemm.engine.arrays cimport read_array
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.errors cimport check_flag
from cygemm.engine.context cimport GemmContext, stream_workspace
from cygemm.engine.args cimport (CallArgs, args_init, add_array, add_matrix, add_vector, call_workspace_of,
                                 expect_dtype, prepare_call, CALL_GEMM, ARG_READ, ARG_WRITE, ARG_SCRATCH)
from cygemm.engine.dtypes cimport dtype_name, DTYPES_FLOAT
from cygemm.engine.settings cimport Policy, call_policy
from cygemm.engine.mapping cimport map_or_raise, rowmajor_ld
from cygemm.dense.routes cimport ForwardCall, BackwardCall, run_forward, run_backward, dense_gemm, weight_policy

from cygemm.engine.plans import clear_plan_cache, plan_cache_size
from cygemm.engine.epilogues import ACTIVATIONS, activation_table, parse_activation
from cygemm.dense.routes import FORWARD_ROUTES, BACKWARD_ROUTES


cdef int _operands(CallArgs* c, object A, object B) except -1:
    """A layer's A (M, K) and B (K, N) into c's first two slots: 2-D, one dtype, inner
    dimensions that agree."""
    args_init(c)
    cdef MatrixView* a = add_array(c, A, "A", ARG_READ, 2, 2)
    cdef MatrixView* b = add_array(c, B, "B", ARG_READ, 2, 2)
    expect_dtype(b, "B", a.dtype, "A")
    if b.rows != a.cols:
        raise ValueError(f"B: A is ({a.rows}, {a.cols}) so B must have {a.cols} rows, got ({b.rows}, {b.cols})")
    return 0


def layer_shape(A, B):
    """(M, K, N, dtype name) of a layer's A (M, K) and B (K, N), checked as forward_into and
    backward_into check them (any layout cuBLAS can read, e.g. W.T).

    Parameters
    ----------
    A : device array (M, K)
        The layer's input, as :func:`cygemm.gemm_ops.forward_into` takes it.
    B : device array (K, N)
        The layer's weight (``W.T`` of a weight stored (N, K) too), A's dtype.

    Returns
    -------
    tuple
        ``(M, K, N, dtype)``: three ints and the dtype's name (e.g. "float32").

    Raises
    ------
    ValueError
        An operand that is not 2-D, or a B whose rows are not A's columns.
    TypeError
        An operand that is not a device array, or dtypes that differ.
    """
    cdef CallArgs c
    _operands(&c, A, B)
    return c.views[0].rows, c.views[0].cols, c.views[1].cols, dtype_name(c.views[0].dtype)


# ---------------------------------------------------------------- forward

@cython.binding(False)             # a builtin function: torch.compile takes its stand-in (cygemm.autograd.traced)
@cython.embedsignature(True)
@cython.embedsignature.format("clinic")   # (inspect.signature reads it)
def forward_into(A, B, out, bias=None, *, with_bias=True, act="none", leaky_slope=0.01,
                 save_z=False, z_out=None, lt_workspace=None, str math="tf32", stream=None,
                 autotune=None, determinism=None):
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
    math : {"tf32", "fp32", "cupy"}
        As :func:`cygemm.gemm`.
    stream : optional
        As :func:`cygemm.gemm`; everything is enqueued there.
    autotune, determinism : optional
        As :func:`cygemm.gemm`; for a large problem ``autotune`` also decides the route, and
        a determinism mode other than "off" replaces it (the fixed rule picks the route).

    Returns
    -------
    device array
        ``out``, holding ``act(A @ B + bias)``.

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
    plus cygemm's kernel, ...) is chosen by the route table of ``cygemm.dense``: timed once
    for large problems, a fixed rule for small ones.
    """
    with_bias, save_z = check_flag(with_bias, "with_bias"), check_flag(save_z, "save_z")
    cdef const Activation* row = activation_row(act)
    cdef float slope = leaky_slope_of(leaky_slope)
    cdef Policy policy
    call_policy(autotune, determinism, &policy)
    cdef CallArgs c
    _operands(&c, A, B)
    cdef cudaDataType dtype = c.views[0].dtype
    cdef int64_t M = c.views[0].rows, K = c.views[0].cols, N = c.views[1].cols
    cdef bint use_bias = with_bias and bias is not None
    cdef MatrixView* bv = add_vector(&c, bias, "bias", ARG_READ, N, dtype) if use_bias else NULL
    cdef MatrixView* y = add_matrix(&c, out, "out", ARG_WRITE, M, N, dtype, True)
    cdef MatrixView* z = NULL
    if save_z:
        if z_out is None:
            raise ValueError("z_out: save_z=True needs z_out (forward_into never allocates), got None")
        z = add_matrix(&c, z_out, "z_out", ARG_WRITE, M, N, dtype, True)
    elif z_out is not None:
        raise ValueError("z_out: given but save_z=False; pass save_z=True to write it")
    cdef MatrixView* wv = add_array(&c, lt_workspace, "lt_workspace", ARG_SCRATCH, 1, 1) \
        if lt_workspace is not None else NULL
    cdef ColMajorGemm g, gz
    map_or_raise(&c.views[0], &c.views[1], y, False, False, &g, ("A", "B", "out"))
    if save_z:      # the GEMM writes Z when the activation runs after it
        map_or_raise(&c.views[0], &c.views[1], z, False, False, &gz, ("A", "B", "z_out"))
    prepare_call(&c, CALL_GEMM, stream, math, dtype)
    if M == 0 or N == 0:
        return out

    cdef ForwardCall f
    f.ctx, f.s, f.g_y, f.dtype, f.compute = c.ctx, c.stream, g, dtype, c.compute
    call_workspace_of(&c, wv, &f.ws, &f.ws_bytes)
    if save_z:
        f.g_z = gz
    f.bias = bv.ptr if use_bias else NULL
    # Leading dimensions as the mapping reads them (a single row's stride may be 0 or 1).
    f.y, f.y_ld = y.ptr, rowmajor_ld(y)
    f.z, f.z_ld = NULL, 0
    if save_z:
        f.z, f.z_ld = z.ptr, rowmajor_ld(z)
    f.M, f.N, f.K, f.act, f.code, f.slope, f.save_z = M, N, K, row, row.code, slope, save_z
    f.policy = policy
    run_forward(&f)
    return out


# ---------------------------------------------------------------- backward

cdef int _unused_buffer(object x, str name, bint unused) except -1:
    """An optional buffer this call does not use (work_dZ without an activation, y beside Z) is
    still checked to be a device array: nonsense is refused naming it, not ignored."""
    cdef ArrayDesc d
    if unused and x is not None:
        read_array(x, &d, name, DTYPES_FLOAT)
    return 0


def backward_into(A, B, gY, Z, *, with_bias=True, act="none", leaky_slope=0.01, gA_out=None,
                  gB_out=None, gBias_out=None, work_dZ=None, lt_workspace=None, str math="tf32",
                  stream=None, accumulate=False, y=None, autotune=None, determinism=None):
    """Gradients of out = act(A @ B + bias) given gY = dL/dout, into given buffers.

    dZ = gY * act'(Z) (into ``work_dZ``), gBias = dZ.sum(0), gA = dZ @ B.T, gB = A.T @ dZ.

    Parameters
    ----------
    A, B, with_bias, act, leaky_slope, lt_workspace, math, stream, autotune, determinism
        As in :func:`forward_into` (the forward's operands). ``lt_workspace`` is checked as
        there; the backward's GEMMs use the stream's own workspaces. Under "batch_invariant",
        gA's rows are batch-invariant; gB and gBias sum over every row, so no kernel can make
        them so: they are run-to-run deterministic.
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
    accumulate, with_bias = check_flag(accumulate, "accumulate"), check_flag(with_bias, "with_bias")
    cdef const Activation* row = activation_row(act)
    cdef cygemm_act_t code = row.code
    cdef float slope = leaky_slope_of(leaky_slope)
    cdef Policy policy
    call_policy(autotune, determinism, &policy)
    cdef CallArgs c
    _operands(&c, A, B)
    cdef MatrixView* a = &c.views[0]
    cdef MatrixView* b = &c.views[1]
    cdef cudaDataType dtype = a.dtype
    cdef int64_t M = a.rows, K = a.cols, N = b.cols
    cdef MatrixView* gy = add_matrix(&c, gY, "gY", ARG_READ, M, N, dtype, True)
    cdef MatrixView* zv = NULL
    cdef bint from_output = False
    if code != CYGEMM_ACT_NONE:
        if Z is not None:
            zv = add_matrix(&c, Z, "Z", ARG_READ, M, N, dtype, True)
        elif y is not None:
            if not row.grad_from_output or (code == CYGEMM_ACT_LEAKY_RELU and slope <= 0):
                raise ValueError(f"y: act={act!r} cannot be differentiated from its output; pass Z")
            zv = add_matrix(&c, y, "y", ARG_READ, M, N, dtype, True)
            from_output = True
        else:
            raise ValueError(f"Z: act={act!r} needs the pre-activation Z (or, for relu, leaky_relu, "
                             "sigmoid and tanh, the output y), got None")
    cdef bint want_ga = gA_out is not None, want_gb = gB_out is not None
    cdef bint want_gbias = with_bias and gBias_out is not None
    # Outputs after the inputs: none may share memory with an input or another output.
    cdef MatrixView* ga = add_matrix(&c, gA_out, "gA_out", ARG_WRITE, M, K, dtype, False) if want_ga else NULL
    cdef MatrixView* gb = add_matrix(&c, gB_out, "gB_out", ARG_WRITE, K, N, dtype, False) if want_gb else NULL
    cdef MatrixView* gbias = add_vector(&c, gBias_out, "gBias_out", ARG_WRITE, N, dtype) if want_gbias else NULL
    cdef bint need_dz = code != CYGEMM_ACT_NONE and (want_ga or want_gb)
    cdef MatrixView* dz = NULL
    if need_dz:
        if work_dZ is None:
            raise ValueError(f"work_dZ: act={act!r} with gA_out/gB_out needs a ({M}, {N}) work_dZ "
                             "(backward_into never allocates; see ensure_workspaces), got None")
        dz = add_matrix(&c, work_dZ, "work_dZ", ARG_WRITE, M, N, dtype, True)
    if lt_workspace is not None:
        add_array(&c, lt_workspace, "lt_workspace", ARG_SCRATCH, 1, 1)
    _unused_buffer(work_dZ, "work_dZ", not need_dz)
    _unused_buffer(y, "y", not from_output)
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
    prepare_call(&c, CALL_GEMM, stream, math, dtype)
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
    bc.ctx, bc.s, bc.dtype, bc.compute, bc.beta, bc.policy = ctx, s, dtype, c.compute, beta, policy
    if run_ga and run_gb:
        bc.g_a, bc.g_b, bc.M, bc.N, bc.K = g_a, g_b, M, N, K
        run_backward(&bc, accumulate)
    elif run_ga:
        dense_gemm(ctx, s, &g_a, dtype, c.compute, beta, policy)
    elif run_gb:
        dense_gemm(ctx, s, &g_b, dtype, c.compute, beta, weight_policy(policy))
    return (gA_out, gB_out, gBias_out)
