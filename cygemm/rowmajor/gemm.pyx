# cython: language_level=3, boundscheck=False, wraparound=False
"""Row-major GEMM and strided-batched GEMM by operand swap (no copies, through the engine's
mapping): the C entry points and the gemm / gemm_strided_batched / int_mm / describe_gemm
surface over the plan layer; the arguments are read by cygemm.engine.operands."""
cimport cython
from libc.stdint cimport int64_t, uintptr_t

from cygemm.engine.streams cimport check_stream_arg
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType, CUDA_R_8I, CUDA_R_32I
from cygemm.bindings.cublas cimport *
from cygemm.engine.types cimport MatrixView, ColMajorGemm, Scalars, beta_is_zero, is_complex_type, compute_type
from cygemm.engine.context cimport GemmContext
from cygemm.engine.mapping cimport rowmajor_view, conjugate_ops, layout_error, MAP_CONJ_A  # (more: rowmajor.pxd)
from cygemm.engine.errors import check_flag
from cygemm.engine.errors cimport refuse_in_capture
from cygemm.engine.dtypes cimport dtype_name, DTYPES_WIDE, DTYPES_GEMM, INT8_DTYPE, INT8_SUMS_DTYPE
from cygemm.engine.execute cimport check_int8, run_int8

from cygemm.engine.alloc cimport empty_array, first_torch, data_pointer, is_torch, torch_stream
from cygemm.engine.args cimport (CallArgs, args_init, add_array, add_view, prepare_call, CALL_GEMM, expect_dtype, ARG_READ,
                                 ARG_WRITE)
from cygemm.engine.args cimport check_overlaps, parse_math
from cygemm.engine.arrays cimport Addresses, layout_operand, has_memory, describe_call
from cygemm.engine.settings cimport Policy, call_policy, default_policy
from cygemm.engine.execute cimport run_gemm
from cygemm.engine.small_batched cimport describe_route_of
from cygemm.engine.operands cimport parse_trans, read_gemm
from cygemm.engine.operands import ConjugateLayoutError

cdef int64_t INT32_MAX = 2147483647


# ------------------------------------------------------------ the C API

cdef inline Scalars _c_scalars(double complex alpha, double complex beta) noexcept nogil:
    cdef Scalars sc
    sc.alpha_re, sc.alpha_im, sc.beta_re, sc.beta_im = alpha.real, alpha.imag, beta.real, beta.imag
    return sc


cdef int gemm_rowmajor_strided_batched(GemmContext* ctx, cudaStream_t stream,
                                       cudaDataType dtype, cublasComputeType_t compute,
                                       bint trans_a, bint trans_b, int64_t m, int64_t n, int64_t k,
                                       double complex alpha, const void* A, int64_t lda, int64_t stride_a,
                                       const void* B, int64_t ldb, int64_t stride_b,
                                       double complex beta, void* C, int64_t ldc, int64_t stride_c,
                                       int64_t batch) except -1 nogil:
    cdef MatrixView a, b, c
    cdef ColMajorGemm g
    rowmajor_view(&a, A, k if trans_a else m, m if trans_a else k, lda, stride_a, batch)
    rowmajor_view(&b, B, n if trans_b else k, k if trans_b else n, ldb, stride_b, batch)
    rowmajor_view(&c, C, m, n, ldc, stride_c, batch)
    map_rowmajor_gemm(&a, &b, &c, trans_a, trans_b, &g)   # row-major views always map
    g.strided_batched = True
    cdef Scalars sc = _c_scalars(alpha, beta)
    return run_gemm(ctx, stream, &g, dtype, compute, &sc, default_policy())


cdef int gemm_rowmajor(GemmContext* ctx, cudaStream_t stream,
                       cudaDataType dtype, cublasComputeType_t compute,
                       bint trans_a, bint trans_b, int64_t m, int64_t n, int64_t k,
                       double complex alpha, const void* A, int64_t lda,
                       const void* B, int64_t ldb,
                       double complex beta, void* C, int64_t ldc) except -1 nogil:
    cdef MatrixView a, b, c
    cdef ColMajorGemm g
    rowmajor_view(&a, A, k if trans_a else m, m if trans_a else k, lda, 0, 1)
    rowmajor_view(&b, B, n if trans_b else k, k if trans_b else n, ldb, 0, 1)
    rowmajor_view(&c, C, m, n, ldc, 0, 1)
    map_rowmajor_gemm(&a, &b, &c, trans_a, trans_b, &g)
    g.strided_batched = False
    cdef Scalars sc = _c_scalars(alpha, beta)
    return run_gemm(ctx, stream, &g, dtype, compute, &sc, default_policy())


# ------------------------------------------------------------ Python surface

cdef object _conjugated(object x, object stream, str name, tuple arrays):
    """A conjugated copy of x, made on the call's stream as gemm resolves it for the call's
    `arrays`, where the GEMM then reads it and where the copy's memory is freed in stream
    order; refused while that stream is being captured."""
    from cygemm.engine.streams import stream_pointer
    from cygemm.engine import alloc as _alloc
    cdef uintptr_t s = stream_pointer(stream, *arrays)
    refuse_in_capture(<cudaStream_t>s, f"{name}: its conjugate transpose in this memory order is read from a "
                                       f"conjugated copy, which allocates")
    if is_torch(x):
        import torch
        if torch.cuda.current_stream(x.device).cuda_stream == s:
            return x.conj().resolve_conj()
        with torch.cuda.stream(torch_stream(torch, <cudaStream_t>s, x.device)):
            return x.conj().resolve_conj()
    import cupy
    with _alloc.stream_context(s):
        # cupy.conj takes CuPy arrays only: other CUDA arrays are wrapped first (no copy)
        return cupy.conj(_alloc.as_cupy(x))


cdef tuple _read(CallArgs* c, ColMajorGemm* g, Scalars* sc, object A, object B, object out, object trans_a,
                 object trans_b, bint batched, object alpha, object beta, object stream, bint copy_conjugates):
    """The call read (read_gemm); (A, B) as read: with copy_conjugates, an operand cuBLAS cannot
    conjugate in place is copied conjugated on `stream` (else ConjugateLayoutError)."""
    cdef bint ta, tb, ca, cb
    parse_trans(trans_a, "trans_a", &ta, &ca)
    parse_trans(trans_b, "trans_b", &tb, &cb)
    for _ in range(3):
        try:
            read_gemm(c, A, B, out, ta, tb, batched, alpha, beta, sc, g, ca, cb, True)
            return A, B
        except ConjugateLayoutError as e:
            if not copy_conjugates:
                raise
            if e.operand == "A":
                A, ca = _conjugated(A, stream, "A", (A, B, out)), False
            else:
                B, cb = _conjugated(B, stream, "B", (A, B, out)), False
    raise AssertionError("read_gemm: a conjugated copy was refused again")


cdef object _run(object A, object B, object out, object trans_a, object trans_b, object alpha,
                 object beta, str math, object stream, object autotune, object determinism, bint batched,
                 bint int8_only=False):
    cdef CallArgs c
    cdef ColMajorGemm g
    cdef Scalars sc
    A, B = _read(&c, &g, &sc, A, B, out, trans_a, trans_b, batched, alpha, beta, stream, True)
    cdef Policy policy
    call_policy(autotune, determinism, &policy)
    cdef MatrixView* cv = &c.views[2]
    if int8_only and c.views[0].dtype != INT8_DTYPE:
        raise TypeError(f"A: int_mm multiplies int8 matrices, got {dtype_name(c.views[0].dtype)} "
                        "(cygemm.gemm and cygemm.matmul take the float dtypes)")
    if int8_only and cv.dtype != INT8_SUMS_DTYPE:
        raise TypeError(f"out: int_mm writes int32, got {dtype_name(cv.dtype)} (an int8 out with a real "
                        "scale: cygemm.gemm(a, b, out, alpha=...))")
    prepare_call(&c, CALL_GEMM, stream, math, cv.dtype)    # out=None: the result has no memory yet, skipped
    cdef object like
    if out is None:         # in the caller's library: a torch tensor when A or B is one
        like = first_torch((A, B))
        out = empty_array(((cv.batch,) if batched else ()) + (cv.rows, cv.cols), cv.dtype, c.stream,
                          "out: out=None allocates the result; pass out=", like)
        g.c = <void*>data_pointer(out)
    if g.m == 0 or g.n == 0 or g.batch == 0:
        return out
    if c.views[0].dtype == INT8_DTYPE:
        run_int8(c.ctx, c.stream, &g, cv, cv.dtype, &sc, policy)
        return out
    with nogil:
        run_gemm(c.ctx, c.stream, &g, cv.dtype, c.compute, &sc, policy)
    return out


@cython.binding(False)             # a builtin function: torch.compile takes its stand-in (cygemm.autograd.traced)
@cython.embedsignature(True)
@cython.embedsignature.format("clinic")   # (inspect.signature reads it)
def gemm(A, B, out=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
         str math="tf32", stream=None, autotune=None, determinism=None):
    """out = alpha * op(A) @ op(B) + beta * out, one cuBLAS GEMM on 2-D device arrays.

    Parameters
    ----------
    A, B : device arrays, 2-D
        float16, bfloat16, float32, float64, complex64 or complex128 (both alike), or int8 (both,
        read along K: see :func:`int_mm`): CuPy arrays, torch CUDA tensors, or objects with
        ``__cuda_array_interface__`` / ``__dlpack__``. A matrix is read in place when one axis
        has unit stride and the other a stride >= its length (C or F order, slices, ``.T``).
    out : device array, optional
        (M, N), the dtype of A (int8 operands: int32 with integer ``alpha`` and ``beta``, exact;
        or int8 with real ones, rounded and saturated); any such layout. None: a new C-ordered
        array (int32 for int8 operands) of the inputs' library (a torch tensor when A or B is
        one, else a CuPy array).
    trans_a, trans_b : bool or {"N", "T", "H"}
        Use A.T / B.T (True or "T", no copy), or the conjugate transpose ("H", also "C"; for
        real dtypes the same as "T"), which cuBLAS reads in place where the operand's memory
        order allows and gemm otherwise reads from a conjugated copy made on ``stream``.
    alpha, beta : number
        Scalars, complex for complex operands (full precision for float64 and complex128); a
        nonzero beta needs ``out``.
    math : {"tf32", "fp32", "cupy"}
        float32 and complex64 products with ``CUBLAS_COMPUTE_32F_FAST_TF32`` ("tf32", the
        default), strict fp32 ("fp32"), or as ``cupy.matmul`` computes them ("cupy": TF32
        only when the environment sets ``CUPY_TF32=1``); float16 and bfloat16 accumulate in
        fp32 either way, float64 and complex128 in fp64.
    stream : optional
        None (torch's current stream when an array is a torch tensor, else CuPy's), a CuPy or
        torch stream, an object with ``__cuda_stream__``, or an int ``cudaStream_t``. The GEMM
        is enqueued there.
    autotune : {None, "off", "auto", "exhaustive"}
        How a large problem's algorithm is chosen the first time (None: the option's, see
        :func:`cygemm.set_options`).
    determinism : {None, "off", "run_to_run", "batch_invariant"}
        The same bits in every process, or also for every number of rows (None: the option's;
        see :doc:`/reproducibility`). Other than "off", it replaces ``autotune``.

    Returns
    -------
    device array
        ``out``, or the new array, allocated on ``stream`` (from torch's allocator for torch
        inputs, else from CuPy's pool).

    Raises
    ------
    ValueError
        Shapes that do not multiply, a layout cuBLAS cannot read in place, an ``out`` that
        overlaps A or B, arrays or stream of another device, ``out=None`` with a nonzero beta.
    TypeError
        Not a device array, an unsupported or mismatched dtype.
    CaptureError
        ``out=None`` while the stream is being captured (it would allocate).
    CublasError, CudaError
        A failed cuBLAS/CUDA call, naming the status and the call.

    Notes
    -----
    With ``out`` given it allocates nothing and can be captured into a CUDA graph. Problems
    of at least ``autotune_min_macs`` multiply-adds (an option) run the fastest of cuBLASLt's
    candidates and ``cublasGemmEx``, timed once and kept in the tuning file (see
    ``cygemm.engine.tuning``). For a plan you hold and tune yourself, see :class:`cygemm.GemmPlan`.
    """
    return _run(A, B, out, trans_a, trans_b, alpha, beta, math, stream, autotune, determinism, False)


@cython.binding(False)             # a builtin function: torch.compile takes its stand-in (cygemm.autograd.traced)
@cython.embedsignature(True)
@cython.embedsignature.format("clinic")   # (inspect.signature reads it)
def gemm_strided_batched(A, B, out=None, *, trans_a=False, trans_b=False, alpha=1.0,
                         beta=0.0, str math="tf32", stream=None, autotune=None, determinism=None):
    """out[i] = alpha * op(A[i]) @ op(B[i]) + beta * out[i] for every i of a batch.

    Parameters
    ----------
    A, B : device arrays, 3-D (batch, rows, cols) or 2-D
        As in :func:`gemm`, with any batch stride: a 2-D operand, one of batch 1, or one of
        batch stride 0 (``cp.broadcast_to``) is broadcast over the batch.
    out : device array, optional
        (batch, M, N); any batch stride whose matrices do not overlap. None: a new C-ordered
        array of the inputs' library, as in :func:`gemm`.
    trans_a, trans_b, alpha, beta, math, stream, autotune
        As in :func:`gemm`.

    Returns
    -------
    device array
        ``out``, or the new (batch, M, N) array, allocated as :func:`gemm` allocates.

    Raises
    ------
    ValueError
        As :func:`gemm`; also batches that do not match (nor are 1) and an ``out`` whose
        matrices overlap one another.
    TypeError, CublasError, CudaError
        As :func:`gemm`.

    Notes
    -----
    One ``cublasGemmStridedBatchedEx`` (or, for large problems whose matrices lie one after
    another, a timed cuBLASLt batched plan). For NumPy's ``matmul`` rules (N-D broadcasting,
    1-D operands) use :func:`cygemm.matmul`.
    """
    return _run(A, B, out, trans_a, trans_b, alpha, beta, math, stream, autotune, determinism, True)


@cython.binding(False)             # a builtin function: torch.compile takes its stand-in (cygemm.autograd.traced)
@cython.embedsignature(True)
@cython.embedsignature.format("clinic")   # (inspect.signature reads it)
def int_mm(A, B, out=None, *, stream=None, autotune=None, determinism=None):
    """out = A @ B for int8 matrices, summed exactly in int32 on the integer tensor cores.

    What ``torch._int_mm`` computes (the GEMM of W8A8 inference): one cuBLASLt int8 GEMM with
    int32 accumulation and no scale, so each element is the exact integer sum where it fits int32:
    always for K up to 131071 (128 * 128 * K < 2**31). A longer K is taken too, and is exact
    while every sum stays within int32 (the accumulator is int32, as torch._int_mm's).

    Parameters
    ----------
    A : device array, int8, (M, K)
        Read along K: C-ordered (or any layout whose rows are contiguous).
    B : device array, int8, (K, N)
        Read along K too: F-ordered, i.e. ``w.T`` of a C-ordered (N, K) weight ``w``, the
        layout of a linear layer's weight and of ``torch._int_mm``'s fast path.
    out : device array, int32, (M, N), optional
        Any layout cuBLAS reads; None: a new C-ordered int32 array of the inputs' library.
    stream : optional
        As :func:`gemm`.
    autotune, determinism : optional
        As :func:`gemm`: whether a large call times cuBLASLt's int8 kernels, and the
        determinism mode. Integer sums do not depend on their order, so every kernel gives the
        same bits: each mode holds whichever kernel runs.

    Returns
    -------
    device array
        ``out``, or the new int32 array.

    Raises
    ------
    ValueError
        Before anything runs, naming the argument, the rule and the fix: an operand not
        contiguous along K, a leading dimension that is not a multiple of 4 elements, data not
        aligned to 4 bytes, K = 0, or a problem cuBLASLt has no int8 kernel for.
    TypeError
        Operands that are not int8, an ``out`` that is not int32.

    Notes
    -----
    :func:`gemm` and :func:`gemm_strided_batched` take int8 operands too: into an int32 ``out``
    with integer ``alpha`` and ``beta``, or into an int8 ``out`` with real ones (rounded to
    nearest and saturated). :func:`cygemm.matmul` follows NumPy for int8 (an int8 result that
    wraps) and runs CuPy's kernel for it. Integer sums do not depend on their order, so every
    kernel gives the same bits: ``determinism`` needs nothing here.
    """
    return _run(A, B, out, False, False, 1, 0, "tf32", stream, autotune, determinism, False, True)


def describe_gemm(A, B, out=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, str math="tf32",
                  stream=None, autotune=None, determinism=None, batched=False):
    """The cuBLAS call :func:`gemm` (``batched``: :func:`gemm_strided_batched`) makes for these
    arguments, without launching anything (no GPU needed).

    Parameters
    ----------
    A, B : device array, NumPy array, or (shape, dtype) pair
        What :func:`gemm` takes, or a stand-in read for its layout only (describing never
        touches memory): a NumPy array in host memory (its shape, strides, dtype and address)
        or a ``(shape, dtype)`` pair (C-contiguous, no memory). 2-D (``batched``: 2-D or 3-D);
        float16, bfloat16 (torch's, ml_dtypes', or ``"bfloat16"``), float32, float64, complex64,
        complex128 or int8, both alike (int8 is checked against the int8 GEMM's rules).
    out : the same, optional
        (M, N) (``batched``: (batch, M, N)) of A's dtype (int8 operands: int32 or int8). None:
        the new C-ordered result ``gemm(A, B)`` allocates.
    trans_a, trans_b : bool or {"N", "T", "H"}
        As :func:`gemm` (an operand gemm would copy conjugated is refused here).
    alpha, beta, math, autotune, determinism
        As :func:`gemm`, checked as it checks them; the description is of the call with them
        (its compute type, policy and route).
    stream
        Taken as :func:`gemm` takes it; describing enqueues nothing.
    batched : bool
        Describe :func:`gemm_strided_batched` (one operand of batch 1 is broadcast).

    Returns
    -------
    dict
        The keys of :func:`cygemm.describe_matmul`'s calls, in its order and with its meanings
        (here "A", "B" name the operands in ``cublas_a``, ``cublas_b`` and ``why``, and
        ``op(X)`` is X.T under ``trans_x``): ``M``, ``N``, ``K``, ``batch``, ``swapped``,
        ``cublas_a``, ``cublas_b``, ``why``; then ``opa``, ``opb``, ``m``, ``n``, ``k``,
        ``lda``, ``ldb``, ``ldc``, ``stride_a``, ``stride_b``, ``stride_c`` and the pointers
        ``a``, ``b``, ``c`` (None for a (shape, dtype) pair and for out=None's result), and
        ``compute`` (the compute type: "tf32", "fp32", "fp64" or "int32") and ``autotune`` (the
        level the call runs at: a determinism mode other than "off" runs at "auto"). Then
        ``strided_batched`` (``cublasGemmStridedBatchedEx`` rather than ``cublasGemmEx``),
        ``int64_api`` (a size or leading dimension past 2**31 - 1: the ``_64`` API) and
        ``route`` ("kernel": cygemm's kernel for batches of small matrices; "cublas"; "timed":
        both timed on the first call).

    Raises
    ------
    ValueError, TypeError
        As :func:`gemm` raises them before it launches (shapes, dtypes, a layout cuBLAS cannot
        read in place, an ``out`` overlapping A or B), naming the argument; also a sequence
        that is no (shape, dtype) pair.
    """
    batched = check_flag(batched, "batched")
    cdef Addresses addresses = Addresses()
    check_stream_arg(stream)
    A, B = layout_operand(A, "A", addresses), layout_operand(B, "B", addresses)
    if out is not None:
        out = layout_operand(out, "out", addresses)
    cdef CallArgs c
    cdef ColMajorGemm g
    cdef Scalars sc
    _read(&c, &g, &sc, A, B, out, trans_a, trans_b, batched, alpha, beta, None, False)
    cdef Policy policy
    call_policy(autotune, determinism, &policy)
    cdef cublasComputeType_t compute = compute_type(c.views[0].dtype, parse_math(math))
    check_overlaps(&c)                  # as gemm's prepare_call (out=None: no memory, skipped)
    if not g.strided_batched:           # cublasGemmEx takes no batch strides
        g.stride_a = g.stride_b = g.stride_c = 0
    cdef bint ta, tb, ca, cb
    parse_trans(trans_a, "trans_a", &ta, &ca)     # ("N" is no transpose: not the string's truth)
    parse_trans(trans_b, "trans_b", &tb, &cb)
    d = describe_call(&c.views[0], &c.views[1], &c.views[2], &g, ta, tb, ("A", "B", "out"),
                      (has_memory(A), has_memory(B), out is not None and has_memory(out)), policy, compute)
    if c.views[0].dtype == INT8_DTYPE:
        d["kernels"] = ("cuBLASLt's int8 kernels, int32 accumulation (the fastest, timed once when large; "
                        "every one gives the same exact sums)")
    d.update(strided_batched=bool(g.strided_batched),
             int64_api=max(g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch) > INT32_MAX)
    d.update(describe_route_of(&g, c.views[2].dtype, compute, policy))
    return d
