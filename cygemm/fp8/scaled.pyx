# cython: language_level=3, boundscheck=False, wraparound=False
"""FP8 GEMMs through cuBLASLt: scaled_matmul, describe_scaled_matmul and ScaledMatmulPlan (the
public calls are cygemm.fp8's; this package's docstring says what they do)."""
cimport cython
from libc.stdint cimport int64_t
from libc.string cimport memset

from cygemm.engine.streams cimport check_stream_arg
from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
# The engine, lowest layer first.
from cygemm.engine.types cimport MatrixView, ColMajorGemm, GemmTypes, Scalars, real_scalars, is_fp8_type, typed_compute_type
from cygemm.engine.dtypes cimport dtype_name
from cygemm.engine.dtypes import FP8_FORMATS, FP8_MAX as _FP8_MAX
from cygemm.engine.errors cimport check_cublas
from cygemm.engine.settings cimport Policy, call_policy, default_policy
from cygemm.engine.context cimport GemmContext, call_workspace
from cygemm.engine.mapping cimport map_rowmajor_gemm, rowmajor_view, is_rowmajor
from cygemm.engine.arrays cimport Addresses, layout_operand, has_memory, describe_call
from cygemm.engine.alloc cimport empty_array, data_pointer, first_torch
from cygemm.engine.args cimport CallArgs, prepare_call, CALL_TYPED_GEMM
from cygemm.engine.launch cimport set_scale_pointers
from cygemm.engine.plans cimport Plan, get_plan
from cygemm.engine.execute cimport run_plan, check_runnable, REFUSAL_RAISE
from cygemm.engine.epilogues cimport Activation, activation_of_code, lt_epilogue_of, no_lt_epilogue, NO_EPILOGUE
from cygemm.engine.dtypes cimport fp8_bias_type, fp8_c_type
from cygemm.engine.epilogues import EPILOGUE_NAMES
from cygemm.fp8.args cimport (ScaledCall, ScaleMode, SCALE_TENSOR, read_scaled, scale_mode_name,
                                     modes_pair, order_operands)
from cygemm.fp8.args import SCALE_MODES
from cygemm.rowmajor.plan cimport GemmPlan, PlannedCall, KIND_SCALED

#: The largest finite value of each format: quantize saturates there.
FP8_MAX = _FP8_MAX


cdef int _run_scaled(GemmContext* ctx, cudaStream_t stream, cublasComputeType_t compute, ScaledCall* s,
                     Policy policy) except -1:
    """The one way an FP8 GEMM runs: its plan (made, and timed when large, on a miss), this
    call's scale pointers, the plan executor. Raises before launching when cuBLASLt has no
    kernel."""
    cdef void* ws = call_workspace(ctx, stream)
    cdef size_t ws_bytes = ctx.workspace_bytes
    cdef Plan plan = get_plan(ctx, stream, &s.g, s.types.d, compute, s.epi, s.bias, NULL, 0,
                              ws, ws_bytes, policy, False, &s.types)
    if check_runnable(plan, stream, "FP8 GEMM"):
        raise ValueError(_no_fp8_kernel(&s.g, &s.types, s.epi))
    cdef Scalars sc = real_scalars(1.0, 0.0)
    check_cublas(<cublasStatus_t>set_scale_pointers(&plan.d, &s.types), "cublasLtMatmulDescSetAttribute(scales)")
    return run_plan(plan, ctx, stream, &s.g, s.bias, NULL, ws, ws_bytes, &sc, REFUSAL_RAISE, "FP8")


cdef str _describe_types(const GemmTypes* t):
    return (f"a {dtype_name(t.b)}, b {dtype_name(t.a)}, out {dtype_name(t.d)}, scales "
            f"{scale_mode_name(t.b_scale_mode)} x {scale_mode_name(t.a_scale_mode)}")


cdef str _no_fp8_kernel(const ColMajorGemm* g, const GemmTypes* t, cublasLtEpilogue_t epi):
    return (f"a/b/out: cuBLASLt has no FP8 kernel for this problem on this GPU ({_describe_types(t)}, "
            f"M={g.n} N={g.m} K={g.k}, epilogue {<int>epi}; FP8 GEMMs need compute capability "
            f">= 8.9, K-contiguous operands with 16-byte aligned rows, and bias/out types as documented)")


cdef int scaled_gemm_rowmajor(GemmContext* ctx, cudaStream_t stream, cudaDataType a_type,
                              cudaDataType w_type, cudaDataType d_type, int64_t m, int64_t n, int64_t k,
                              const void* A, int64_t lda, const void* W, int64_t ldw, void* D, int64_t ldd,
                              const float* scale_a, const float* scale_w, const float* scale_d,
                              float* amax_d, const void* bias, int act, bint fast_accum,
                              int scale_mode_a=SCALE_TENSOR, int scale_mode_w=SCALE_TENSOR) except -1 nogil:
    cdef ScaledCall s
    cdef MatrixView a, w, d
    if not modes_pair(scale_mode_a, scale_mode_w) or (scale_mode_a != SCALE_TENSOR and is_fp8_type(d_type)):
        with gil:
            raise ValueError(f"scale_mode_a/scale_mode_w: cuBLASLt has no FP8 GEMM with {scale_mode_name(scale_mode_a)} "
                             f"x {scale_mode_name(scale_mode_w)} scales and a {dtype_name(d_type)} output on this GPU")
    # Row-major D = A @ W^T, mapped as every GEMM is (to cuBLAS: D^T = W (op T) @ A^T (op N)).
    rowmajor_view(&a, A, m, k, lda, 0, 1)
    rowmajor_view(&w, W, n, k, ldw, 0, 1)
    rowmajor_view(&d, D, m, n, ldd, 0, 1)
    map_rowmajor_gemm(&a, &w, &d, False, True, &s.g)      # row-major views always map
    s.g.strided_batched = False
    order_operands(&s.types, is_rowmajor(&d), a_type, w_type, scale_a, scale_w, scale_mode_a, scale_mode_w)
    s.types.d = d_type
    s.types.c = fp8_c_type(d_type)
    s.types.bias = fp8_bias_type(d_type)
    s.types.d_scale, s.types.amax_d = scale_d, amax_d
    s.types.fast_accum = fast_accum
    s.bias = bias
    cdef const Activation* row = activation_of_code(act)
    cdef int epi = lt_epilogue_of(row, bias != NULL, False) if row != NULL else NO_EPILOGUE
    if epi == NO_EPILOGUE:
        with gil:
            raise ValueError(no_lt_epilogue(act, "FP8 GEMMs (cuBLASLt epilogues)"))
    s.epi = <cublasLtEpilogue_t>epi
    if m == 0 or n == 0:
        return 0
    with gil:
        _run_scaled(ctx, stream, typed_compute_type(&s.types), &s, default_policy())
    return 0


@cython.binding(False)             # a builtin function: torch.compile takes its stand-in (cygemm.autograd.traced)
@cython.embedsignature(True)
@cython.embedsignature.format("clinic")   # (inspect.signature reads it)
def scaled_matmul(a, b, scale_a, scale_b, *, out=None, out_dtype=None, bias=None, act="none",
                  scale_out=None, amax_out=None, format_a=None, format_b=None, format_out=None,
                  fast_accum=False, scale_mode=None, determinism=None, stream=None, autotune=None):
    """``out = act(scale_a * scale_b * (a @ b) + bias)`` with FP8 operands, through cuBLASLt.

    Parameters
    ----------
    a : device array, (M, K), FP8, row-major
        torch ``float8_e4m3fn``/``float8_e5m2``, or ``uint8`` bytes with ``format_a``.
    b : device array, (K, N), FP8, column-major
        ``w.T`` for a C-contiguous weight ``w`` of shape (N, K) (Hopper's FP8 kernels read both
        operands K-contiguous). Not both operands E5M2.
    scale_a, scale_b : device float32 arrays
        Dequantizing scales (``a``'s real values are ``scale_a * a``, scaled as the mode says),
        read when the GEMM runs. Each is shaped like its operand's grid of scaled blocks, in
        the layout cuBLASLt reads (``torch._scaled_mm``'s):

        - per tensor: one element each;
        - ``"rowwise"``: ``scale_a`` (M, 1), ``scale_b`` (1, N), contiguous;
        - ``"1x128"`` (one per 128 elements along K): ``scale_a`` (M, ceil(K/128)) stored
          M-contiguous (``cupy.empty((ceil(K/128), M), cupy.float32).T``), ``scale_b``
          (ceil(K/128), N) stored N-contiguous;
        - ``"128x128"`` (one per 128 x 128 block): ``scale_a`` (ceil(M/128), ceil(K/128)),
          ``scale_b`` (ceil(K/128), ceil(N/128)), stored K-contiguous with rows (columns of
          ``scale_b``) ``round_up(ceil(K/128), 4)`` elements apart.

        Pairs on Hopper: tensor and tensor, rowwise and rowwise, ``1x128`` or ``128x128``
        with ``1x128`` or ``128x128`` (not both ``128x128``: DeepSeek-V3's forward pass is
        activations ``1x128`` with weights ``128x128``, its weight gradient ``1x128`` with
        ``1x128``). Scales other than per tensor need a bfloat16, float16 or float32 output,
        16-byte aligned scales, and for the block modes M and N multiples of 4.
    out : device array, (M, N), row-major, optional
        bfloat16, float16, float32, or FP8 (torch float8, or ``uint8`` with ``format_out``).
        None: a new array of ``out_dtype``: a torch tensor when ``a`` or ``b`` is one (FP8 as
        torch float8), else a CuPy array (bfloat16 through ``ml_dtypes``, FP8 as ``uint8``).
    out_dtype : {'bfloat16', 'float16', 'float32', 'e4m3', 'e5m2'}, optional
        The new result's type (default bfloat16), or a check of ``out``'s.
    bias : device array, (N,), optional
        bfloat16 (float16 for a float16 out), added before the activation.
    act : {'none', 'relu', 'gelu'}
        Applied in cuBLASLt's epilogue (gelu: the tanh approximation).
    scale_out : device float32 scalar, optional
        An FP8 out's quantizing scale: ``out = saturate(scale_out * result)``.
    amax_out : device float32 scalar, optional
        Receives ``max |result|`` (before ``scale_out``): what delayed scaling records. FP8
        outputs only (cuBLASLt computes it for no other); for others use :func:`amax`.
    format_a, format_b, format_out : {'e4m3', 'e5m2'}, optional
        The format of ``uint8`` bytes (required for them; a torch float8 tensor's must agree).
    fast_accum : bool
        cuBLASLt's FP8 fast accumulation (no periodic promotion of partial sums: faster, less
        accurate over long K).
    scale_mode : {None, 'tensor', 'rowwise', '1x128', '128x128'} or a pair of them
        How the scales apply (a pair: ``a``'s, ``b``'s). None: told by their shapes, the
        first of the pairs above that both fit (shapes can fit several modes where M, N or K
        are small; their numbers then mean the same).
    determinism : {None, 'off', 'run_to_run', 'batch_invariant'}
        This call's determinism mode (None: the option's); see :doc:`reproducibility`.
    stream : optional
        The stream (default: the current stream of the arrays' library: torch's when one is
        a torch tensor, else CuPy's).
    autotune : {None, "off", "auto", "exhaustive"}
        Whether a large call times cuBLASLt's FP8 kernels (None: the option's), as
        :func:`cygemm.gemm`; a determinism mode other than "off" replaces it.

    Returns
    -------
    device array
        ``out``, or the new result of ``out_dtype``.

    Raises
    ------
    ValueError, TypeError
        Before anything runs: a layout other than row-major ``a`` / column-major ``b``, shapes,
        dtypes and formats, alignment (16-byte pointers and rows), or a problem cuBLASLt has no
        FP8 kernel for; each names the argument and what it needs.
    CublasError
        cuBLASLt refused the call (status and call named).
    """
    cdef CallArgs c
    cdef ScaledCall s
    cdef Policy policy
    call_policy(autotune, determinism, &policy)
    read_scaled(&c, &s, a, b, scale_a, scale_b, out, out_dtype, bias, act, scale_out, amax_out,
                format_a, format_b, format_out, fast_accum, scale_mode)
    c.types = &s.types
    prepare_call(&c, CALL_TYPED_GEMM, stream)      # the compute type from a's, b's and out's types
    if out is None:     # in the caller's library: a torch tensor when a or b is one
        out = empty_array((s.g.n, s.g.m), s.types.d, c.stream, "scaled_matmul(out=None): allocating the result",
                          first_torch((a, b)))
        s.g.c = <void*>data_pointer(out)
    if s.g.m == 0 or s.g.n == 0:
        return out
    _run_scaled(c.ctx, c.stream, c.compute, &s, policy)
    return out


def describe_scaled_matmul(a, b, scale_a, scale_b, *, out=None, out_dtype=None, bias=None, act="none",
                           scale_out=None, amax_out=None, format_a=None, format_b=None, format_out=None,
                           fast_accum=False, scale_mode=None, determinism=None, stream=None, autotune=None):
    """What :func:`scaled_matmul` with these arguments runs, without running it (no GPU needed).

    Parameters
    ----------
    a, b, scale_a, scale_b, out, bias, scale_out, amax_out : device array, NumPy array, or (shape, dtype) pair
        What :func:`scaled_matmul` takes, or a stand-in read for its layout only (describing
        never touches memory): a NumPy array in host memory (its shape, strides, dtype and
        address) or a ``(shape, dtype)`` pair (C-contiguous, no memory). FP8: ``float8_e4m3fn``
        / ``float8_e5m2`` (torch's, ml_dtypes', those names, or ``"e4m3"`` / ``"e5m2"``), or
        ``uint8`` with ``format_*``. ``b`` is column-major, so describe it as ``w.T`` of a
        NumPy array ``w`` (N, K). Scales: float32, e.g. ``((), "float32")`` per tensor, a
        NumPy array of the layout (``np.empty((kb, M), np.float32).T`` for a 1x128
        ``scale_a``) for the others.
    out_dtype, act, format_a, format_b, format_out, fast_accum, scale_mode, determinism, autotune
        As :func:`scaled_matmul`, checked as it checks them.
    stream
        Taken as :func:`scaled_matmul` takes it; describing enqueues nothing.

    Returns
    -------
    dict
        The keys of :func:`cygemm.describe_matmul`'s calls, in its order and with its meanings:
        ``M``, ``N``, ``K``, ``batch`` (1), ``swapped`` (True: out is row-major), ``cublas_a``
        ("b"), ``cublas_b`` ("a"), ``why``; then ``opa``, ``opb``, ``m``, ``n``, ``k``, ``lda``,
        ``ldb``, ``ldc``, ``stride_a``, ``stride_b``, ``stride_c`` (0) and the pointers ``a``,
        ``b``, ``c`` (None where there is no memory: a (shape, dtype) pair, out=None's result),
        ``compute`` ("fp32": FP8 products are summed in fp32) and ``autotune`` (the level the call runs at: a determinism mode runs at "auto").
        Then FP8's own: ``call`` ("cublasLtMatmul"); ``a_type``, ``b_type``, ``c_type``,
        ``d_type`` (cuBLAS's A, B, C and D, e.g. "float8_e4m3fn", "bfloat16") and ``bias_type``
        (None without a bias); ``epilogue`` ("default", "bias", "relu", "relu_bias", "gelu",
        "gelu_bias"); ``scales`` ({"a", "b", "out"}: whether each scale is set),
        ``scale_modes`` ({"a", "b"}: "tensor", "rowwise", "1x128" or "128x128"), ``amax``
        (whether the output's amax is written) and ``fast_accum``.

    Raises
    ------
    ValueError, TypeError
        As :func:`scaled_matmul` raises them before it runs (layouts, shapes, dtypes and
        formats, alignment), naming the argument; also a sequence that is no (shape, dtype)
        pair.
    """
    check_stream_arg(stream)
    cdef Addresses addresses = Addresses()
    names = ("a", "b", "scale_a", "scale_b", "out", "bias", "scale_out", "amax_out")
    # (a host number as a scale: the scale reader says to pass it as a device array)
    a, b, scale_a, scale_b, out, bias, scale_out, amax_out = [
        x if x is None or (n.startswith("scale") and isinstance(x, (int, float))) else layout_operand(x, n, addresses)
        for x, n in zip((a, b, scale_a, scale_b, out, bias, scale_out, amax_out), names)]
    cdef CallArgs c
    cdef ScaledCall s
    read_scaled(&c, &s, a, b, scale_a, scale_b, out, out_dtype, bias, act, scale_out, amax_out,
                format_a, format_b, format_out, fast_accum, scale_mode)
    cdef int i, at_out = 0
    for i in range(c.n):
        if <str>c.names[i] == "out":
            at_out = i
    cdef Policy policy
    call_policy(autotune, determinism, &policy)
    d = describe_call(&c.views[0], &c.views[1], &c.views[at_out], &s.g, False, False, ("a", "b", "out"),
                      (has_memory(a), has_memory(b), out is not None and has_memory(out)), policy,
                      CUBLAS_COMPUTE_32F)
    epilogues = EPILOGUE_NAMES
    d.update(call="cublasLtMatmul",
             a_type=dtype_name(s.types.a), b_type=dtype_name(s.types.b), c_type=dtype_name(s.types.c),
             d_type=dtype_name(s.types.d), bias_type=dtype_name(s.types.bias) if bias is not None else None,
             epilogue=epilogues.get(s.epi, str(<int>s.epi)),
             scales=dict(a=s.types.b_scale != NULL, b=s.types.a_scale != NULL, out=s.types.d_scale != NULL),
             scale_modes=dict(a=scale_mode_name(s.types.b_scale_mode), b=scale_mode_name(s.types.a_scale_mode)),
             amax=s.types.amax_d != NULL, fast_accum=bool(s.types.fast_accum))
    return d


cdef class ScaledMatmulPlan(GemmPlan):
    """ScaledMatmulPlan(a, b, scale_a, scale_b, *, out, out_dtype=None, bias=None, act="none", scale_out=None, amax_out=None, format_a=None, format_b=None, format_out=None, fast_accum=False, scale_mode=None, determinism=None)

    :func:`scaled_matmul` planned once: a :class:`cygemm.GemmPlan` of one cuBLASLt FP8 call.

    ``out = act(scale_a * scale_b * (a @ b) + bias)``, with the lifecycle of
    :class:`cygemm.GemmPlan`: :meth:`plan`, :meth:`autotune`, :meth:`execute` on any stream
    (capturable, allocation-free), :meth:`close`.

    Parameters
    ----------
    a, b, scale_a, scale_b, out_dtype, bias, act, scale_out, amax_out, format_a, format_b, format_out, fast_accum, scale_mode
        As :func:`scaled_matmul`.
    out : device array, (M, N), row-major
        Required (a plan allocates nothing); as :func:`scaled_matmul` takes it.
    determinism : {None, "off", "run_to_run", "batch_invariant"}
        Which kernels :meth:`plan` and :meth:`autotune` may choose, as :class:`cygemm.GemmPlan`'s
        (None: the option's when the plan is made). How much timing is :meth:`autotune`'s
        ``mode``: a plan takes no ``autotune`` of its own.

    Attributes
    ----------
    closed : bool
        Whether :meth:`close` has run.
    key : tuple
        The problem as the tuning table keys it.

    Raises
    ------
    ValueError, TypeError
        As :func:`scaled_matmul`, before anything is made; :meth:`plan` raises ValueError
        where cuBLASLt has no FP8 kernel for the problem.

    Notes
    -----
    Exactly one ``cublasLtMatmul`` per :meth:`execute`, bitwise the same as
    :func:`scaled_matmul` running the same algorithm. The scales (and amax) are device scalars
    read (written) when the GEMM runs: a captured graph replays with the scales their buffers
    hold then. ``execute(a, b, out)`` takes other operands of the planned layout, types and
    alignment; the scales, bias and amax stay those planned.
    """
    cdef object out_dtype, act_name, format_a, format_b, format_out, scale_mode
    cdef bint fast_accum

    def __init__(self, a, b, scale_a, scale_b, *, out, out_dtype=None, bias=None, act="none", scale_out=None,
                 amax_out=None, format_a=None, format_b=None, format_out=None, fast_accum=False,
                 scale_mode=None, determinism=None):
        cdef Policy policy
        if determinism is not None:
            call_policy(None, determinism, &policy)
            self.determinism = policy.determinism
        self.out_dtype, self.act_name, self.fast_accum, self.scale_mode = out_dtype, act, fast_accum, scale_mode
        self.format_a, self.format_b, self.format_out = format_a, format_b, format_out
        self.plan_kind = KIND_SCALED
        self.alpha, self.beta, self.math = 1.0, 0.0, "fp32"
        self.scalars = real_scalars(1.0, 0.0)
        self._setup((a, b, out, scale_a, scale_b, bias, scale_out, amax_out))

    cdef int _read(self, CallArgs* c, PlannedCall* call, tuple operands) except -1:
        """scaled_matmul's reader, every check of it, into the plan's call."""
        a, b, out, scale_a, scale_b, bias, scale_out, amax_out = operands
        cdef ScaledCall s
        memset(&s, 0, sizeof(s))
        read_scaled(c, &s, a, b, scale_a, scale_b, out, self.out_dtype, bias, self.act_name, scale_out,
                    amax_out, self.format_a, self.format_b, self.format_out, self.fast_accum, self.scale_mode)
        memset(call, 0, sizeof(PlannedCall))
        call.g, call.types, call.epi, call.bias = s.g, s.types, s.epi, s.bias
        call.typed, call.dtype = True, s.types.d
        return 0

    cdef str _no_algorithm(self):
        return _no_fp8_kernel(&self.call.g, &self.call.types, self.call.epi)

    def execute(self, a=None, b=None, out=None, *, stream=None):
        """Run it on `stream` (None: the current stream of the arrays' library), on the planned
        operands or on those given (of the planned layout). Allocates nothing; can be captured.

        Parameters
        ----------
        a, b, out : device arrays, optional
            Operands to run on instead of the planned ones: each with the planned one's shape,
            strides and dtype and at least its alignment. None: the planned one.
        stream : optional
            As :func:`scaled_matmul` takes it, a stream of the plan's device.

        Returns
        -------
        device array
            out: the one given, else the planned one.
        """
        return GemmPlan.execute(self, a, b, out, stream=stream)
