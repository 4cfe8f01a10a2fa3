# cython: language_level=3, boundscheck=False, wraparound=False
"""GemmPlan: a GEMM you plan once, tune when you choose, run many times and free.

The module functions (:func:`cygemm.gemm`, :func:`cygemm.gemm_ops.forward_into`,
:func:`cygemm.fp8.scaled_matmul`) keep their plans in a bounded cache per thread and decide
when to tune. A GemmPlan leaves both to you, as nvmath-python's ``Matmul`` does::

    with cygemm.GemmPlan(A, B, out, bias=b, act="gelu") as p:
        p.plan()                # cuBLASLt's heuristic (and the tuning file, if it knows it)
        p.autotune()            # time the candidates now, on these operands
        for _ in range(steps):
            p.execute(stream=s)             # allocation-free, capturable
    # closed: its descriptors are freed

A GemmPlan is the plan layer's own plan (``cygemm.engine.plans.Plan``: the descriptors and the
algorithm, decided and run by the one plan executor) with its operands and lifecycle added.
Its kinds: a plain GEMM; a GEMM with a cuBLASLt epilogue (bias, relu/gelu, gelu's Z); an FP8
GEMM (:class:`cygemm.fp8.ScaledMatmulPlan`, a subclass). The epilogue and FP8 kinds run exactly
one ``cublasLtMatmul`` per execute; what no cuBLASLt epilogue does is refused when the plan is
made (``cygemm.gemm_ops.forward_into`` does it with cygemm's kernels).
"""
from libc.stdint cimport uintptr_t
from libc.string cimport memset

from cygemm.bindings.cudart cimport cudaStream_t, CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF
from cygemm.bindings.cublas cimport cublasStatus_t
from cygemm.bindings.cublaslt cimport cublasLtEpilogue_t, CUBLASLT_EPILOGUE_DEFAULT
from cygemm.kernels.elementwise cimport CYGEMM_ACT_NONE
from cygemm.engine.epilogues cimport Activation, epilogue_activation, lt_epilogue
from cygemm.engine.types cimport MatrixView, ColMajorGemm, Scalars, beta_is_zero, pointer_alignment
from cygemm.engine.errors cimport refuse_in_capture
from cygemm.engine.errors import CaptureError, check_flag
from cygemm.engine.streams cimport stream_is_capturing
from cygemm.engine.dtypes cimport dtype_name, dtype_level, expected_names, DTYPES_FLOAT
from cygemm.engine.context cimport GemmContext, call_workspace
from cygemm.engine.launch cimport PLAN_LT
from cygemm.engine.args cimport (CallArgs, add_view, add_vector, add_matrix, check_overlaps, prepare_call,
                                 CALL_GEMM, CALL_TYPED_GEMM, parse_math, ARG_READ, ARG_WRITE)
from cygemm.engine.mapping cimport is_rowmajor, rowmajor_ld
from cygemm.engine.settings cimport (Policy, Determinism, call_policy, default_policy, AUTOTUNE_OFF,
                                     DETERMINISM_BATCH_INVARIANT)
from cygemm.engine.plans cimport Plan, init_plan, decide_plan, raise_no_family
from cygemm.engine.execute cimport run_plan, REFUSAL_GEMMEX, REFUSAL_RAISE
from cygemm.engine.operands cimport read_gemm, parse_trans

_KINDS = ("gemm", "epilogue", "fp8")
_FORWARD_INTO = "cygemm.gemm_ops.forward_into does it (a GEMM and cygemm's kernel)"


cdef bint _same_layout(const ColMajorGemm* x, const ColMajorGemm* y) noexcept nogil:
    return (x.opa == y.opa and x.opb == y.opb and x.m == y.m and x.n == y.n and x.k == y.k
            and x.lda == y.lda and x.ldb == y.ldb and x.ldc == y.ldc and x.batch == y.batch
            and x.stride_a == y.stride_a and x.stride_b == y.stride_b and x.stride_c == y.stride_c
            and x.strided_batched == y.strided_batched)


cdef inline bint _is_empty(const ColMajorGemm* g) noexcept nogil:
    return g.m == 0 or g.n == 0 or g.batch == 0


cdef int _read_epilogue(CallArgs* c, PlannedCall* call, const Activation* act, object bias, object z_out,
                        bint batched) except -1:
    """The epilogue's buffers (c holds read_gemm's A, B and out) and its one cuBLASLt epilogue,
    from the epilogue table. ValueError, naming the argument, for what no epilogue does."""
    cdef cublasLtEpilogue_t epi
    try:
        epi = lt_epilogue(act, bias is not None, z_out is not None, "cuBLASLt's epilogues")
    except ValueError as e:
        raise ValueError(f"{e}; " + ("forward_into(..., save_z=True, z_out=z_out) saves it for every activation"
                                     if str(e).startswith("z_out") else _FORWARD_INTO)) from None
    if batched:
        raise ValueError("batched: a plan with bias, act or z_out is one 2-D GEMM with a cuBLASLt epilogue, "
                         "got batched=True")
    if call.g.k == 0:
        raise ValueError(f"A: K = 0 (an empty inner dimension) leaves cuBLASLt no product to apply an epilogue "
                         f"to; {_FORWARD_INTO}")
    cdef MatrixView out_v = c.views[2]
    if (bias is not None or z_out is not None) and not is_rowmajor(&out_v):
        raise ValueError(f"out: a plan with bias or z_out needs a row-major out (unit stride along its last "
                         f"axis, along which the bias runs), got element strides ({out_v.row_stride}, "
                         f"{out_v.col_stride})")
    # Inputs before outputs (check_overlaps compares each output with everything before it):
    # out moves after the bias.
    c.n = 2
    cdef MatrixView* bv = add_vector(c, bias, "bias", ARG_READ, out_v.cols, call.dtype) if bias is not None else NULL
    add_view(c, &out_v, "out", ARG_WRITE, False)      # (read by add_array: noted then)
    cdef MatrixView* z = NULL
    if z_out is not None:
        z = add_matrix(c, z_out, "z_out", ARG_WRITE, out_v.rows, out_v.cols, call.dtype, True)
        call.aux, call.aux_ld = z.ptr, rowmajor_ld(z)
        if call.aux_ld % act.aux_ld_multiple:
            raise ValueError(f"z_out: GELU_AUX needs a row stride that is a multiple of {act.aux_ld_multiple} "
                             f"elements, got {call.aux_ld}; {_FORWARD_INTO}")
        if pointer_alignment(z.ptr) < <unsigned>act.aux_alignment:
            raise ValueError(f"z_out: GELU_AUX needs a {act.aux_alignment}-byte aligned z_out, got address "
                             f"{<uintptr_t>z.ptr:#x}; {_FORWARD_INTO}")
    call.bias = bv.ptr if bv != NULL else NULL
    call.epi = epi
    return 0


cdef int _check_open(GemmPlan p) except -1:
    if p.closed or p.operands is None:
        raise ValueError("GemmPlan: the plan is closed")
    return 0


cdef int _resolve(GemmPlan p, CallArgs* c, object stream) except -1:
    """The stream and this thread's context for c (whose overlaps were checked), on the plan's device."""
    if p.call.typed:
        c.types = &p.call.types
        prepare_call(c, CALL_TYPED_GEMM, stream, None, CUDA_R_32F, False)
    else:
        prepare_call(c, CALL_GEMM, stream, p.math, p.call.dtype, False)
    if p.device < 0:
        p.device = c.ctx.device
    elif c.ctx.device != p.device:
        raise ValueError(f"stream: the plan was made on device {p.device} but device {c.ctx.device} is "
                         f"current (make that device current)")
    return 0


cdef int _check_like_planned(const PlannedCall* x, const PlannedCall* planned) except -1:
    """New operands for execute: the planned layout, types and at least the planned alignment."""
    cdef bint same_types = not planned.typed or (x.types.a == planned.types.a and x.types.b == planned.types.b
                                                 and x.types.c == planned.types.c and x.types.d == planned.types.d)
    if not _same_layout(&x.g, &planned.g) or x.dtype != planned.dtype or not same_types:
        raise ValueError("A/B/out: not the planned shapes, strides and dtype; make a new GemmPlan")
    if (pointer_alignment(x.g.a) < pointer_alignment(planned.g.a) or pointer_alignment(x.g.b) < pointer_alignment(planned.g.b)
            or pointer_alignment(x.g.c) < pointer_alignment(planned.g.c)):
        raise ValueError("A/B/out: less aligned than the planned operands (cuBLASLt's algorithm "
                         "may need their alignment); make a new GemmPlan")
    return 0


cdef class GemmPlan(Plan):
    """GemmPlan(A, B, out, *, bias=None, act="none", z_out=None, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, math="tf32", batched=False, determinism=None)

    out = act(alpha * op(A) @ op(B) + beta * out + bias), planned once for these operands.

    Parameters
    ----------
    A, B : device arrays
        As :func:`cygemm.gemm` (``batched=False``) or :func:`cygemm.gemm_strided_batched`
        (``batched=True``) take them.
    out : device array
        Required (a plan allocates nothing); as :func:`cygemm.gemm` takes it. Row-major when
        ``bias`` or ``z_out`` is given (the bias runs along its last axis).
    bias : device array (N,) or (1, N), optional
        Added in cuBLASLt's epilogue; the dtype of A.
    act : {"none", "relu", "gelu"}
        Applied in cuBLASLt's epilogue (gelu: the tanh approximation). The other activations
        of :func:`cygemm.gemm_ops.forward_into` have no cuBLASLt epilogue: refused.
    z_out : device array (M, N), optional
        With ``act="gelu"``: the pre-activation ``alpha * op(A) @ op(B) + beta * out + bias``
        written beside out by the same call (GELU_AUX: row-major, its row stride a multiple of
        8 elements, 16-byte aligned), what :func:`cygemm.gemm_ops.backward_into` takes as Z.
    trans_a, trans_b, alpha, beta, math
        As :func:`cygemm.gemm`.
    batched : bool
        A strided-batched GEMM over 3-D operands (no bias, act or z_out).
    determinism : {None, "off", "run_to_run", "batch_invariant"}
        Which kernels :meth:`plan` and :meth:`autotune` may choose (None: the option's when the
        plan is made; see :doc:`/reproducibility`).

    Attributes
    ----------
    closed : bool
        Whether :meth:`close` has run (a closed plan refuses every call).
    key : tuple
        The problem as the tuning table keys it (shapes, layouts, dtypes, alignment).

    Raises
    ------
    ValueError, TypeError
        As :func:`cygemm.gemm`, and for what no cuBLASLt epilogue does (another activation;
        ``z_out`` without gelu or off GELU_AUX's rules; K = 0; batched), each naming the
        argument and pointing to :func:`cygemm.gemm_ops.forward_into`. Before anything is made.

    Notes
    -----
    A plan without bias, act or z_out runs cuBLASLt's algorithm or cublasGemmEx, whichever
    was chosen (cublasGemmEx where cuBLASLt refuses the call); with them, exactly one
    ``cublasLtMatmul`` per :meth:`execute`. :meth:`execute` may take other arrays of the same
    shapes, strides and dtype (and at least the alignment of those planned for), e.g. the
    next batch in the same buffers' layout. It runs on any stream of the plan's device and can
    be captured into a CUDA graph. The plan uses the calling thread's cuBLAS handles and the
    stream's workspace (owned by cygemm's per-stream workspaces, so two streams never share
    one); use one plan from one thread at a time. A GemmPlan is a ``cygemm.engine.plans.Plan``.
    """

    def __cinit__(self, *args, **kwargs):
        self.determinism = -1

    def __init__(self, A, B, out, *, bias=None, act="none", z_out=None, trans_a=False,
                 trans_b=False, alpha=1.0, beta=0.0, str math="tf32", batched=False,
                 determinism=None):
        batched = check_flag(batched, "batched")
        cdef Policy policy
        if determinism is not None:
            call_policy(None, determinism, &policy)
            self.determinism = policy.determinism
        self.act = epilogue_activation(act, "cuBLASLt's epilogues")
        self.alpha, self.beta = alpha, beta
        parse_trans(trans_a, "trans_a", &self.trans_a, &self.conj_a)
        parse_trans(trans_b, "trans_b", &self.trans_b, &self.conj_b)
        self.batched, self.math = batched, math
        self.plan_kind = KIND_GEMM
        if bias is not None or z_out is not None or self.act.code != CYGEMM_ACT_NONE:
            self.plan_kind = KIND_EPILOGUE
        self._setup((A, B, out, bias, z_out))
        parse_math(math)

    cdef int _setup(self, tuple operands) except -1:
        if operands[2] is None:
            raise ValueError("out: a GemmPlan writes into a given array (it allocates nothing), got None")
        self.device = -1
        self._read(&self.args, &self.call, operands)
        # The planned operands do not change, so their overlaps are checked here once (later
        # calls only resolve the stream and context).
        check_overlaps(&self.args)
        self.operands = operands
        return 0

    cdef int _read(self, CallArgs* c, PlannedCall* call, tuple operands) except -1:
        A, B, out, bias, z_out = operands
        memset(call, 0, sizeof(PlannedCall))
        read_gemm(c, A, B, out, self.trans_a, self.trans_b, self.batched, self.alpha, self.beta, &self.scalars,
                  &call.g, self.conj_a, self.conj_b)
        call.dtype = c.views[0].dtype
        call.epi = CUBLASLT_EPILOGUE_DEFAULT
        if self.plan_kind == KIND_EPILOGUE:
            if dtype_level(call.dtype) != DTYPES_FLOAT:
                raise TypeError(f"A: bias, act and z_out take {expected_names(DTYPES_FLOAT)} operands (cuBLASLt's "
                                f"epilogues), got {dtype_name(call.dtype)}: plan the plain GEMM and apply them apart")
            _read_epilogue(c, call, self.act, bias, z_out, self.batched)
        return 0

    cdef str _no_algorithm(self):
        cdef const ColMajorGemm* g = &self.call.g
        return (f"act/bias/z_out: cuBLASLt has no algorithm for this epilogue (cublasLtEpilogue_t "
                f"{<int>self.call.epi}) on this problem ({dtype_name(self.call.dtype)}, cuBLAS m={g.m} n={g.n} "
                f"k={g.k}); {_FORWARD_INTO}")

    def plan(self, stream=None):
        """Make the cuBLASLt descriptors and take the heuristic's first algorithm (or the
        tuning file's choice for this problem, when it has one). Returns the plan.

        Raises
        ------
        ValueError
            An epilogue or FP8 plan for which cuBLASLt has no algorithm (nothing else runs it).
        """
        _check_open(self)
        _resolve(self, &self.args, stream)
        if self.planned or _is_empty(&self.call.g):
            return self                 # (an empty problem has nothing to plan, as gemm)
        cdef GemmContext* ctx = self.args.ctx
        cdef cudaStream_t s = self.args.stream
        cdef void* ws = call_workspace(ctx, s)
        cdef PlannedCall* c = &self.call
        cdef bint keep = True
        cdef Policy policy                  # (not timed when planned: autotune() times)
        policy.autotune = AUTOTUNE_OFF
        policy.determinism = <Determinism>(self.determinism if self.determinism >= 0 else default_policy().determinism)
        init_plan(self, ctx, s, &c.g, c.dtype, self.args.compute, c.epi, c.bias, c.aux, c.aux_ld, ws,
                  ctx.workspace_bytes, &c.types if c.typed else NULL, policy.determinism)
        self.planned = True
        decide_plan(self, ctx, s, &c.g, c.bias, c.aux, ws, ctx.workspace_bytes, policy, not beta_is_zero(&self.scalars),
                    &keep)
        if self.d.determinism == DETERMINISM_BATCH_INVARIANT and not self.d.usable:
            raise_no_family(self)
        if self.plan_kind != KIND_GEMM and (self.d.n_candidates == 0 or not self.d.usable):
            why = self._no_algorithm()
            if stream_is_capturing(s):
                why += " (planned while the stream is being captured: plan() before capturing)"
            raise ValueError(why)
        return self

    def autotune(self, mode="auto", stream=None):
        """Time the candidates on the planned operands now and keep the fastest (recorded in
        the tuning file as the module functions' choices are). Each call times them again,
        also when the tuning file or an earlier call chose already. The timed runs write the
        result into the planned ``out`` (with beta != 0 a scratch buffer instead), and
        ``z_out`` and ``amax_out`` where given.

        Parameters
        ----------
        mode : {"auto", "exhaustive"}
            "auto": a few candidates within max(50 ms, 25 runs); "exhaustive": every
            candidate, then the finalists again.
        stream : optional
            Where to time them (not while it is being captured).

        Returns
        -------
        GemmPlan
            The plan (``tuned_ms`` then says the chosen candidate's median time).

        Raises
        ------
        CaptureError
            The stream is being captured.
        """
        cdef Policy policy
        if mode not in ("auto", "exhaustive"):
            raise ValueError(f"mode: expected 'auto' or 'exhaustive', got {mode!r}")
        call_policy(mode, "off", &policy)       # (the level alone: a plan times its own family's kernels)
        self.plan(stream)
        refuse_in_capture(self.args.stream, "GemmPlan.autotune: timing runs the GEMM many times")
        if not self.planned:
            return self                 # an empty problem
        cdef GemmContext* ctx = self.args.ctx
        cdef void* ws = call_workspace(ctx, self.args.stream)
        cdef PlannedCall* c = &self.call
        cdef bint keep = True
        policy.determinism = <Determinism>self.d.determinism
        decide_plan(self, ctx, self.args.stream, &c.g, c.bias, c.aux, ws, ctx.workspace_bytes, policy,
                    not beta_is_zero(&self.scalars), &keep, True)
        return self

    def execute(self, A=None, B=None, out=None, *, stream=None):
        """Run the GEMM on `stream` (None: the current stream of the arrays' library): on the
        planned operands, or on those given (each of the planned one's layout; the others as
        planned). Plans first if not yet planned. Allocates nothing; can be captured. Returns out.

        Parameters
        ----------
        A, B, out : device arrays, optional
            Operands to run on instead of the planned ones (e.g. the next batch in the same
            buffers' layout): each with the planned one's shape, strides and dtype and at least
            its alignment. None: the planned one.
        stream : optional
            As :func:`cygemm.gemm` takes it, a stream of the plan's device.

        Returns
        -------
        device array
            out: the one given, else the planned one.

        Raises
        ------
        ValueError
            A closed plan; operands not of the planned shapes, strides and dtype, or less
            aligned (make a new GemmPlan); a stream of another device than the plan's; and as
            :meth:`plan`, where it plans first.
        """
        _check_open(self)
        cdef PlannedCall given_call
        cdef PlannedCall* c = &self.call
        cdef CallArgs fresh
        cdef bint given = A is not None or B is not None or out is not None
        if given:
            A0, B0, out0 = self.operands[:3]
            operands = ((A0 if A is None else A), (B0 if B is None else B),
                        (out0 if out is None else out)) + self.operands[3:]
            self._read(&fresh, &given_call, operands)       # new operands: checked now
            _check_like_planned(&given_call, &self.call)
            check_overlaps(&fresh)
            _resolve(self, &fresh, stream)
            c, out = &given_call, operands[2]
        else:
            out = self.operands[2]
        if _is_empty(&c.g):
            return out              # nothing to compute (as gemm: no plan for an empty problem)
        if not self.planned:
            self.plan(stream)
        if not given:
            _resolve(self, &self.args, stream)
            fresh.ctx, fresh.stream = self.args.ctx, self.args.stream
        cdef void* ws = call_workspace(fresh.ctx, fresh.stream)
        # A plain GEMM has cublasGemmEx where cuBLASLt refuses its plan; the epilogue and FP8
        # kinds are that one cuBLASLt call: they raise, with nothing enqueued.
        run_plan(self, fresh.ctx, fresh.stream, &c.g, c.bias, c.aux, ws, fresh.ctx.workspace_bytes, &self.scalars,
                 REFUSAL_GEMMEX if self.plan_kind == KIND_GEMM else REFUSAL_RAISE, "GemmPlan")
        return out

    def close(self):
        """Free the plan's descriptors now; execute then raises. Idempotent."""
        Plan.close(self)
        self.planned = False
        self.operands = None
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def route(self):
        """"cublasLt" or "cublasGemmEx" (None before plan())."""
        if not self.planned:
            return None
        return "cublasLt" if self.d.route == PLAN_LT else "cublasGemmEx"

    @property
    def kind(self):
        """"gemm" (plain), "epilogue" (bias, act or z_out) or "fp8" (one call each but "gemm")."""
        return _KINDS[<int>self.plan_kind]
