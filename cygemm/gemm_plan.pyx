# cython: language_level=3, boundscheck=False, wraparound=False
"""GemmPlan: a GEMM you plan once, tune when you choose, run many times and free.

The module functions (:func:`cygemm.gemm` and the others) keep their plans in a bounded cache
per thread and decide when to tune. A GemmPlan leaves both to you, as nvmath-python's
``Matmul`` does::

    with cygemm.GemmPlan(A, B, out) as p:
        p.plan()                # cuBLASLt's heuristic (and the tuning file, if it knows it)
        p.autotune()            # time the candidates now, on these operands
        for _ in range(steps):
            p.execute(stream=s)             # allocation-free, capturable
    # closed: its descriptors are freed
"""
from libc.stdint cimport int64_t, uintptr_t

from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType

from cygemm.bindings.cublaslt cimport CUBLASLT_EPILOGUE_DEFAULT
from cygemm._types cimport ColMajorGemm, pointer_alignment
from cygemm._errors cimport refuse_in_capture
from cygemm._context cimport GemmContext, call_workspace
from cygemm._args cimport CallArgs, prepare_call, resolve_call, check_overlaps, parse_math
from cygemm._settings cimport autotune_level, AUTOTUNE_OFF
from cygemm.plans cimport Plan, make_plan, decide_plan, run_with_fallback
from cygemm.rowmajor cimport read_gemm


cdef bint _same_layout(const ColMajorGemm* x, const ColMajorGemm* y) noexcept nogil:
    return (x.opa == y.opa and x.opb == y.opb and x.m == y.m and x.n == y.n and x.k == y.k
            and x.lda == y.lda and x.ldb == y.ldb and x.ldc == y.ldc and x.batch == y.batch
            and x.stride_a == y.stride_a and x.stride_b == y.stride_b and x.stride_c == y.stride_c
            and x.strided_batched == y.strided_batched)


cdef class GemmPlan:
    """GemmPlan(A, B, out, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, math="tf32", batched=False)

    out = alpha * op(A) @ op(B) + beta * out, planned once for these operands' layout.

    Parameters
    ----------
    A, B, out : device arrays
        As :func:`cygemm.gemm` (``batched=False``) or :func:`cygemm.gemm_strided_batched`
        (``batched=True``) take them; ``out`` is required (a plan allocates nothing).
    trans_a, trans_b, alpha, beta, math
        As :func:`cygemm.gemm`.
    batched : bool
        A strided-batched GEMM over 3-D operands.

    Attributes
    ----------
    closed : bool
        Whether :meth:`close` has run (a closed plan refuses every call).

    Raises
    ------
    ValueError, TypeError
        As :func:`cygemm.gemm`, before anything is made.

    Notes
    -----
    :meth:`execute` may take other arrays of the same shapes, strides and dtype (and at least
    the alignment of those planned for), e.g. the next batch in the same buffers' layout. It
    runs on any stream of the plan's device and can be captured into a CUDA graph. The plan
    uses the calling thread's cuBLAS handles and the stream's workspace (owned by cygemm's
    per-stream workspaces, so two streams never share one); use one plan from one thread at
    a time.
    """
    cdef CallArgs args
    cdef ColMajorGemm g
    cdef cudaDataType dtype
    cdef float alpha_f, beta_f
    cdef bint trans_a, trans_b, batched
    cdef int device
    cdef Plan _plan
    cdef object operands
    cdef str math
    cdef readonly bint closed

    def __init__(self, A, B, out, *, bint trans_a=False, bint trans_b=False, alpha=1.0, beta=0.0,
                 str math="tf32", bint batched=False):
        if out is None:
            raise ValueError("out: a GemmPlan writes into a given array, got None")
        self.alpha_f, self.beta_f = alpha, beta
        read_gemm(&self.args, A, B, out, trans_a, trans_b, batched, self.beta_f, &self.g)
        # Every error an argument can cause, before anything is made. The planned operands do
        # not change, so their overlaps are checked here once (later calls only resolve_call).
        check_overlaps(&self.args)
        parse_math(math)
        self.dtype = self.args.views[0].dtype
        self.trans_a, self.trans_b, self.batched, self.math = trans_a, trans_b, batched, math
        self.operands = (A, B, out)
        self.device = -1
        self.closed = False

    cdef int _prepare(self, object stream) except -1:
        """Check devices and resolve the stream and this thread's context for the planned
        operands (their overlaps were checked when the plan was made)."""
        if self.closed:
            raise ValueError("GemmPlan: the plan is closed")
        resolve_call(&self.args, self.math, self.dtype, stream)
        if self.device < 0:
            self.device = self.args.ctx.device
        elif self.args.ctx.device != self.device:
            raise ValueError(f"stream: the plan was made on device {self.device} but device "
                             f"{self.args.ctx.device} is current (make that device current)")
        return 0

    def plan(self, stream=None):
        """Make the cuBLASLt descriptors and take the heuristic's first algorithm (or the
        tuning file's choice for this problem, when it has one). Returns the plan."""
        self._prepare(stream)
        cdef GemmContext* ctx = self.args.ctx
        cdef cudaStream_t s = self.args.stream
        cdef void* ws = call_workspace(ctx, s)
        cdef bint keep = True
        if self._plan is None:
            self._plan = make_plan(ctx, s, &self.g, self.dtype, self.args.compute, CUBLASLT_EPILOGUE_DEFAULT,
                                   NULL, NULL, 0, ws, ctx.workspace_bytes)
            decide_plan(self._plan, ctx, s, &self.g, NULL, NULL, ws, ctx.workspace_bytes, AUTOTUNE_OFF,
                        self.beta_f != 0, &keep)
        return self

    def autotune(self, mode="auto", stream=None):
        """Time the candidates on the planned operands now and keep the fastest (recorded in
        the tuning file as the module functions' choices are). The timed runs write A @ B
        into the planned ``out`` (with beta != 0 they write a scratch buffer instead).

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
        cdef int level = autotune_level(mode)
        if level == AUTOTUNE_OFF:
            raise ValueError(f"mode: expected 'auto' or 'exhaustive', got {mode!r}")
        self.plan(stream)
        refuse_in_capture(self.args.stream, "GemmPlan.autotune: timing runs the GEMM many times")
        cdef GemmContext* ctx = self.args.ctx
        cdef void* ws = call_workspace(ctx, self.args.stream)
        cdef bint keep = True
        decide_plan(self._plan, ctx, self.args.stream, &self.g, NULL, NULL, ws, ctx.workspace_bytes, level,
                    self.beta_f != 0, &keep, True)
        return self

    def execute(self, A=None, B=None, out=None, *, stream=None):
        """Run the GEMM on `stream` (None: CuPy's current one): on the planned operands, or
        on those given (each of the planned one's layout). Plans first if not yet planned.
        Allocates nothing; can be captured. Returns out."""
        if self.closed:
            raise ValueError("GemmPlan: the plan is closed")
        cdef ColMajorGemm g = self.g
        cdef CallArgs fresh
        cdef bint given = A is not None or B is not None or out is not None
        if given:
            A0, B0, out0 = self.operands
            A, B, out = (A0 if A is None else A), (B0 if B is None else B), (out0 if out is None else out)
            read_gemm(&fresh, A, B, out, self.trans_a, self.trans_b, self.batched, self.beta_f, &g)
            if not _same_layout(&g, &self.g) or fresh.views[0].dtype != self.dtype:
                raise ValueError("A/B/out: not the planned shapes, strides and dtype; make a new GemmPlan")
            if (pointer_alignment(g.a) < pointer_alignment(self.g.a) or pointer_alignment(g.b) < pointer_alignment(self.g.b)
                    or pointer_alignment(g.c) < pointer_alignment(self.g.c)):
                raise ValueError("A/B/out: less aligned than the planned operands (cuBLASLt's algorithm "
                                 "may need their alignment); make a new GemmPlan")
            prepare_call(&fresh, self.math, self.dtype, stream)     # new operands: checked now
            if fresh.ctx.device != self.device and self.device >= 0:
                raise ValueError(f"stream: the plan was made on device {self.device} but device "
                                 f"{fresh.ctx.device} is current")
        else:
            out = self.operands[2]
        if g.m == 0 or g.n == 0 or g.batch == 0:
            return out              # nothing to compute (as gemm: no plan for an empty problem)
        if self._plan is None:
            self.plan(stream)
        if not given:
            self._prepare(stream)
            fresh.ctx, fresh.stream = self.args.ctx, self.args.stream
        cdef void* ws = call_workspace(fresh.ctx, fresh.stream)
        run_with_fallback(self._plan, fresh.ctx, fresh.stream, &g, ws, fresh.ctx.workspace_bytes,
                          &self.alpha_f, &self.beta_f)
        return out

    def close(self):
        """Free the plan's descriptors now; execute then raises. Idempotent."""
        if self._plan is not None:
            self._plan.close()
            self._plan = None
        self.operands = (None, None, None)
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def route(self):
        """"cublasLt" or "cublasGemmEx" (None before plan())."""
        return None if self._plan is None else self._plan.route

    @property
    def tuned(self):
        """Whether the algorithm was chosen by timing (here, or read from the tuning file)."""
        return self._plan is not None and self._plan.tuned

    @property
    def tuned_ms(self):
        """The chosen candidate's median time in ms (0 when not timed)."""
        return 0.0 if self._plan is None else self._plan.tuned_ms
