# cython: language_level=3, boundscheck=False, wraparound=False
"""FP8 GEMMs (Hopper and later), and the conversions of :mod:`cygemm.fp8_convert` re-exported.

:func:`scaled_matmul` computes ``out = act(scale_a * scale_b * (a @ b) + bias)`` with ``a`` and
``b`` in FP8 (E4M3 or E5M2) through cuBLASLt, in the plan layer like every other GEMM (one plan
per problem, timed once when large). Scales are device float32 scalars, read when the GEMM runs,
so a captured graph replays with whatever scales the buffers hold then (delayed scaling). An
FP8 output has its own quantizing scale, and the output's amax can be written on the way.

Hopper's FP8 kernels read both operands K-contiguous: ``a`` row-major (M, K) and ``b`` (K, N)
column-major, i.e. ``b = w.T`` for a C-contiguous weight ``w`` of shape (N, K), the layout of a
linear layer's weight and of ``torch._scaled_mm``. Any other layout is refused (nothing runs).

:func:`quantize` and :func:`dequantize` convert between FP8 and float32/float16/bfloat16 with
cygemm's kernels (16-byte accesses, grid sized to the GPU, allocation-free, capturable); they
live in :mod:`cygemm.fp8_convert` and are re-exported here with :func:`amax`.

CuPy has no FP8 dtype: FP8 data live in ``uint8`` arrays, and the ``format_*`` arguments say
which format the bytes hold. torch's ``float8_e4m3fn`` and ``float8_e5m2`` tensors carry theirs.
"""
from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memset


from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
from cygemm.kernels.elementwise cimport CYGEMM_ACT_NONE, CYGEMM_ACT_RELU, CYGEMM_ACT_GELU
from cygemm.epilogues cimport Activation, activation_row, NO_EPILOGUE
from cygemm._types cimport (MatrixView, ArrayDesc, ColMajorGemm, GemmTypes, is_fp8_type,
                            typed_compute_type)
from cygemm._errors cimport check_cublas
from cygemm._arrays cimport read_fp8, read_array, view_from_desc, dtype_name, desc_shape
from cygemm._args cimport (CallArgs, ArgRole, args_init, add_view, add_scalar, prepare_typed_call, ARG_READ,
                           ARG_WRITE)
from cygemm._context cimport GemmContext, call_workspace
from cygemm._streams cimport stream_is_capturing
from cygemm._launch cimport set_scale_pointers
from cygemm.plans cimport Plan, get_plan, execute_plan
from cygemm.gemm_plan cimport GemmPlan, PlannedCall, KIND_SCALED
from cygemm._mapping cimport map_rowmajor_gemm, map_or_raise, is_rowmajor, rowmajor_view
from cygemm._described cimport Addresses, layout_operand, has_memory, describe_call
from cygemm._alloc cimport empty_array, data_pointer, first_torch
from cygemm._arrays import FP8_FORMATS
from cygemm.fp8_convert import quantize, dequantize, amax

#: The largest finite value of each format: quantize saturates there.
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}

_OUT_DTYPES = {"bfloat16": CUDA_R_16BF, "float16": CUDA_R_16F, "float32": CUDA_R_32F,
               "e4m3": CUDA_R_8F_E4M3, "e5m2": CUDA_R_8F_E5M2}
_FP8_NAMES = ("uint8", "float8_e4m3fn", "float8_e5m2")


cdef bint _holds_fp8(object x):
    """Whether x is an FP8 (or uint8) array, read by read_fp8 rather than read_array."""
    dt = getattr(x, "dtype", None)
    if dt is not None:
        return str(dt).replace("torch.", "") in _FP8_NAMES
    cai = getattr(x, "__cuda_array_interface__", None)
    return cai is not None and cai.get("typestr") == "|u1"


cdef MatrixView* _fp8_matrix(CallArgs* c, object x, str name, object fmt, str fmt_arg, ArgRole role) except NULL:
    cdef ArrayDesc d
    cdef MatrixView v
    read_fp8(x, &d, name, fmt, fmt_arg)
    view_from_desc(&d, &v, name, 2, 2)
    return add_view(c, &v, name, role)


cdef int _aligned16(const MatrixView* v, str name, int64_t ld, int64_t lines, str dim, int64_t extent,
                    str line) except -1:
    """16-byte aligned pointer, and ld (elements between its `lines` rows or columns: `line`) a
    multiple of 16 bytes where there is more than one. The error says the rule in the user's
    terms: `dim` (K or N, of length `extent`) a multiple of 16 // itemsize where the array is
    contiguous (ld == extent), else the stride between its `line`s."""
    if (<uintptr_t>v.ptr) % 16:
        raise ValueError(f"{name}: FP8 GEMMs need 16-byte aligned operands, got address "
                         f"{<uintptr_t>v.ptr:#x}")
    if lines <= 1 or (ld * v.itemsize) % 16 == 0:
        return 0
    cdef int64_t per = 16 // v.itemsize
    cdef int64_t padded = (extent + per - 1) // per * per
    what = f"{dtype_name(v.dtype)} element" if v.itemsize > 1 else "FP8 byte"
    if ld == extent:
        fix = (f"pad K to {padded} with zeros in both a and b (the product is unchanged)" if dim == "K" else
               f"pass an out with rows padded to {padded} elements and use its first {extent} columns")
        raise ValueError(f"{name}: FP8 GEMMs need {dim} to be a multiple of {per} here, got {dim} = {extent} "
                         f"({name}'s {line}s of {extent} {what}s must each start 16 bytes apart); {fix}")
    raise ValueError(f"{name}: FP8 GEMMs need the stride between {name}'s {line}s to be a multiple of 16 "
                     f"bytes ({per} {what}s), got {ld} {what}s ({dim} = {extent}); make it contiguous "
                     f"with {dim} padded to a multiple of {per}")


ctypedef struct ScaledCall:
    ColMajorGemm g
    GemmTypes types
    cublasLtEpilogue_t epi
    const void* bias


cdef int _epilogue(const Activation* act, bint has_bias, cublasLtEpilogue_t* epi) except -1:
    if act.epilogue == NO_EPILOGUE:
        raise ValueError(f"act: FP8 GEMMs apply 'none', 'relu' or 'gelu' (cuBLASLt epilogues), got "
                         f"{act.name.decode()!r}")
    epi[0] = <cublasLtEpilogue_t>(act.epilogue_bias if has_bias else act.epilogue)
    return 0


cdef int _run_scaled(GemmContext* ctx, cudaStream_t stream, cublasComputeType_t compute, ScaledCall* s) except -1:
    """The one way an FP8 GEMM runs: its plan (made, and timed when large, on a miss), this
    call's scale pointers, the plan executor. Raises before launching when cuBLASLt has no kernel."""
    cdef void* ws = call_workspace(ctx, stream)
    cdef size_t ws_bytes = ctx.workspace_bytes
    cdef Plan plan = get_plan(ctx, stream, &s.g, s.types.d, compute, s.epi, s.bias, NULL, 0,
                              ws, ws_bytes, -1, False, &s.types)
    if not plan.d.usable or plan.d.n_candidates == 0:
        raise ValueError(_no_fp8_kernel(&s.g, &s.types, s.epi))
    if not plan.d.capture_ok and stream_is_capturing(stream):
        raise ValueError("cublasLtMatmul refused this FP8 GEMM inside a capture; run it once eagerly first")
    cdef float alpha = 1.0, beta = 0.0
    cdef int st = CUBLAS_STATUS_SUCCESS
    check_cublas(<cublasStatus_t>set_scale_pointers(&plan.d, &s.types), "cublasLtMatmulDescSetAttribute(scales)")
    if execute_plan(plan, ctx, stream, &s.g, s.bias, NULL, ws, ws_bytes, &alpha, &beta, &st):
        check_cublas(<cublasStatus_t>st, "cublasLtMatmul (FP8)")      # refused: nothing ran
    return 0


cdef str _describe_types(const GemmTypes* t):
    return f"a {dtype_name(t.b)}, b {dtype_name(t.a)}, out {dtype_name(t.d)}"


cdef str _no_fp8_kernel(const ColMajorGemm* g, const GemmTypes* t, cublasLtEpilogue_t epi):
    return (f"a/b/out: cuBLASLt has no FP8 kernel for this problem on this GPU ({_describe_types(t)}, "
            f"M={g.n} N={g.m} K={g.k}, epilogue {<int>epi}; FP8 GEMMs need compute capability "
            f">= 8.9, K-contiguous operands with 16-byte aligned rows, and bias/out types as documented)")


cdef int scaled_gemm_rowmajor(GemmContext* ctx, cudaStream_t stream, cudaDataType a_type,
                              cudaDataType w_type, cudaDataType d_type, int64_t m, int64_t n, int64_t k,
                              const void* A, int64_t lda, const void* W, int64_t ldw, void* D, int64_t ldd,
                              const float* scale_a, const float* scale_w, const float* scale_d,
                              float* amax_d, const void* bias, int act, bint fast_accum) except -1 nogil:
    cdef ScaledCall s
    cdef MatrixView a, w, d
    # Row-major D = A @ W^T, mapped as every GEMM is (to cuBLAS: D^T = W (op T) @ A^T (op N)).
    rowmajor_view(&a, A, m, k, lda, 0, 1)
    rowmajor_view(&w, W, n, k, ldw, 0, 1)
    rowmajor_view(&d, D, m, n, ldd, 0, 1)
    map_rowmajor_gemm(&a, &w, &d, False, True, &s.g)      # row-major views always map
    s.g.strided_batched = False
    s.types.a, s.types.b, s.types.d = w_type, a_type, d_type
    s.types.c = CUDA_R_16BF if is_fp8_type(d_type) else d_type
    s.types.bias = CUDA_R_16F if d_type == CUDA_R_16F else CUDA_R_16BF
    s.types.a_scale, s.types.b_scale, s.types.d_scale, s.types.amax_d = scale_w, scale_a, scale_d, amax_d
    s.types.fast_accum = fast_accum
    s.bias = bias
    if act == CYGEMM_ACT_RELU:
        s.epi = CUBLASLT_EPILOGUE_RELU_BIAS if bias != NULL else CUBLASLT_EPILOGUE_RELU
    elif act == CYGEMM_ACT_GELU:
        s.epi = CUBLASLT_EPILOGUE_GELU_BIAS if bias != NULL else CUBLASLT_EPILOGUE_GELU
    elif act == CYGEMM_ACT_NONE:
        s.epi = CUBLASLT_EPILOGUE_BIAS if bias != NULL else CUBLASLT_EPILOGUE_DEFAULT
    else:
        with gil:
            raise ValueError(f"act: FP8 GEMMs apply none (0), relu (1) or gelu (3) in cuBLASLt's epilogue, "
                             f"got {act}")
    if m == 0 or n == 0:
        return 0
    with gil:
        _run_scaled(ctx, stream, typed_compute_type(&s.types), &s)
    return 0


cdef int _read_scaled(CallArgs* c, ScaledCall* s, object a, object b, object scale_a, object scale_b,
                      object out, object out_dtype, object bias, object act, object scale_out,
                      object amax_out, object format_a, object format_b, object format_out,
                      bint fast_accum) except -1:
    """Every check of scaled_matmul, before anything runs; fills s (out's pointer NULL when
    out is None: allocated by the caller)."""
    args_init(c)
    cdef MatrixView* va = _fp8_matrix(c, a, "a", format_a, "format_a", ARG_READ)
    cdef MatrixView* vb = _fp8_matrix(c, b, "b", format_b, "format_b", ARG_READ)
    if vb.rows != va.cols:
        raise ValueError(f"b: a is ({va.rows}, {va.cols}) so b must have {va.cols} rows, got ({vb.rows}, {vb.cols})")
    if va.dtype == CUDA_R_8F_E5M2 and vb.dtype == CUDA_R_8F_E5M2:
        raise TypeError("a/b: cuBLASLt has no E5M2 x E5M2 GEMM; hold one operand in E4M3 (gradients "
                        "in E5M2 pair with weights or activations in E4M3)")
    if va.cols == 0:
        raise ValueError("a: K = 0 (an empty inner dimension) has no FP8 GEMM; the product is zero")
    cdef MatrixView* vsa = add_scalar(c, scale_a, "scale_a", ARG_READ)
    cdef MatrixView* vsb = add_scalar(c, scale_b, "scale_b", ARG_READ)
    # The output's type: out's own, out_dtype, or bfloat16.
    cdef cudaDataType d_type
    cdef ArrayDesc dd
    cdef MatrixView vo
    if out_dtype is not None and out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype: expected one of {sorted(_OUT_DTYPES)}, got {out_dtype!r}")
    if out is not None:
        if _holds_fp8(out):
            read_fp8(out, &dd, "out", format_out if format_out is not None else (
                out_dtype if out_dtype in FP8_FORMATS else None), "format_out")
        else:
            read_array(out, &dd, "out", False)
        view_from_desc(&dd, &vo, "out", 2, 2)
        if out_dtype is not None and _OUT_DTYPES[out_dtype] != vo.dtype:
            raise TypeError(f"out: its dtype is {dtype_name(vo.dtype)} but out_dtype={out_dtype!r}")
        if vo.rows != va.rows or vo.cols != vb.cols:
            raise ValueError(f"out: expected shape ({va.rows}, {vb.cols}), got ({vo.rows}, {vo.cols})")
        if not is_rowmajor(&vo):
            raise ValueError(f"out: expected a row-major array (unit stride along the last axis), got "
                             f"element strides ({vo.row_stride}, {vo.col_stride})")
    else:
        d_name = out_dtype if out_dtype is not None else (format_out if format_out is not None else "bfloat16")
        if d_name not in _OUT_DTYPES:
            raise ValueError(f"format_out: expected 'e4m3' or 'e5m2', got {d_name!r}")
        vo.dtype = _OUT_DTYPES[d_name]
        vo.itemsize = 1 if is_fp8_type(vo.dtype) else (4 if vo.dtype == CUDA_R_32F else 2)
        vo.ptr, vo.device = NULL, -1
        vo.batch, vo.rows, vo.cols, vo.batch_stride = 1, va.rows, vb.cols, 0
        vo.row_stride, vo.col_stride = max(vb.cols, 1), 1
    d_type = vo.dtype
    cdef bint fp8_out = is_fp8_type(d_type)
    cdef cudaDataType bias_type = CUDA_R_16F if d_type == CUDA_R_16F else CUDA_R_16BF
    cdef ArrayDesc db
    cdef MatrixView vbias
    cdef MatrixView* pbias = NULL
    if bias is not None:
        read_array(bias, &db, "bias", False)
        view_from_desc(&db, &vbias, "bias", 1, 1)
        if vbias.cols != vb.cols:
            raise ValueError(f"bias: expected shape ({vb.cols},), got {desc_shape(&db)}")
        if vbias.dtype != bias_type:
            raise TypeError(f"bias: an FP8 GEMM with a {dtype_name(d_type)} output takes a "
                            f"{dtype_name(bias_type)} bias, got {dtype_name(vbias.dtype)}")
        if vbias.col_stride != 1 and vbias.cols > 1:
            raise ValueError(f"bias: expected a contiguous vector, got element stride {vbias.col_stride}")
        pbias = add_view(c, &vbias, "bias", ARG_READ)
    cdef MatrixView* vso = NULL
    if scale_out is not None:
        if not fp8_out:
            raise ValueError(f"scale_out: quantizes an FP8 output; out is {dtype_name(d_type)}")
        vso = add_scalar(c, scale_out, "scale_out", ARG_READ)
    cdef MatrixView* pout = add_view(c, &vo, "out", ARG_WRITE)
    cdef MatrixView* vam = NULL
    if amax_out is not None:
        # cuBLASLt (13.0 on the H200) computes amax only for FP8 outputs: other outputs find no
        # kernel. Measure those with cygemm.fp8.amax(out).
        if not fp8_out:
            raise ValueError(f"amax_out: cuBLASLt computes the output's amax only for an FP8 out; out is "
                             f"{dtype_name(d_type)} (use cygemm.fp8.amax(out, amax) after the GEMM)")
        vam = add_scalar(c, amax_out, "amax_out", ARG_WRITE)
    if va.rows == 0 or vb.cols == 0:          # an empty result: nothing runs, no layout to check
        _epilogue(activation_row(act), bias is not None, &s.epi)
        s.g.m, s.g.n, s.g.k = vb.cols, va.rows, va.cols
        s.g.c = pout.ptr
        s.g.a, s.g.b, s.g.batch, s.g.stride_a, s.g.stride_b, s.g.stride_c = vb.ptr, va.ptr, 1, 0, 0, 0
        s.g.opa, s.g.opb, s.g.lda, s.g.ldb, s.g.ldc = CUBLAS_OP_T, CUBLAS_OP_N, 0, 0, 0
        s.types.a, s.types.b, s.types.d, s.types.c, s.types.bias = vb.dtype, va.dtype, d_type, d_type, bias_type
        s.types.a_scale = s.types.b_scale = s.types.d_scale = NULL
        s.types.amax_d = NULL
        s.types.fast_accum = fast_accum
        s.epi, s.bias = CUBLASLT_EPILOGUE_DEFAULT, NULL
        return 0
    # The layout: Hopper's FP8 kernels are "TN" (cuBLAS's A transposed, B not), which under the
    # row-major swap is a row-major a and a column-major b. The one mapping says what we have.
    map_or_raise(va, vb, pout, False, False, &s.g, ("a", "b", "out"))
    if s.g.opb != CUBLAS_OP_N:
        raise ValueError(f"a: FP8 GEMMs need a row-major a (K contiguous: element strides (K', 1)), got "
                         f"element strides ({va.row_stride}, {va.col_stride}); make one with "
                         f"cupy.ascontiguousarray(a)")
    if s.g.opa != CUBLAS_OP_T:
        raise ValueError(f"b: FP8 GEMMs need b column-major (K contiguous): b = w.T for a C-contiguous w "
                         f"of shape (N, K), got element strides ({vb.row_stride}, {vb.col_stride}); make "
                         f"one with cupy.ascontiguousarray(b.T).T")
    _aligned16(va, "a", s.g.ldb, va.rows, "K", va.cols, "row")
    _aligned16(vb, "b", s.g.lda, vb.cols, "K", vb.rows, "column")     # column-major: ld steps between columns
    if pout.ptr != NULL:
        _aligned16(pout, "out", s.g.ldc, pout.rows, "N", pout.cols, "row")
    elif (s.g.ldc * pout.itemsize) % 16:
        raise ValueError(f"out: FP8 GEMMs need N to be a multiple of {16 // pout.itemsize} for a "
                         f"{dtype_name(d_type)} output, got N = {vb.cols} (the rows of a new ({va.rows}, {vb.cols}) "
                         f"result, {vb.cols * pout.itemsize} bytes each, must each start 16 bytes apart); pass an "
                         f"out with rows padded to a multiple of {16 // pout.itemsize} elements and use its "
                         f"first {vb.cols} columns")
    if pbias != NULL and (<uintptr_t>pbias.ptr) % 16:
        raise ValueError(f"bias: FP8 GEMMs need a 16-byte aligned bias, got address {<uintptr_t>pbias.ptr:#x}")
    cdef const Activation* row = activation_row(act)
    _epilogue(row, bias is not None, &s.epi)
    s.types.a, s.types.b, s.types.d = vb.dtype, va.dtype, d_type
    s.types.c = CUDA_R_16BF if fp8_out else d_type
    s.types.bias = bias_type
    s.types.a_scale, s.types.b_scale = <const float*>vsb.ptr, <const float*>vsa.ptr
    s.types.d_scale = <const float*>vso.ptr if vso != NULL else NULL
    s.types.amax_d = <float*>vam.ptr if vam != NULL else NULL
    s.types.fast_accum = fast_accum
    s.bias = pbias.ptr if pbias != NULL else NULL
    return 0


def scaled_matmul(a, b, scale_a, scale_b, *, out=None, out_dtype=None, bias=None, act="none",
                  scale_out=None, amax_out=None, format_a=None, format_b=None, format_out=None,
                  bint fast_accum=False, stream=None):
    """``out = act(scale_a * scale_b * (a @ b) + bias)`` with FP8 operands, through cuBLASLt.

    Parameters
    ----------
    a : device array, (M, K), FP8, row-major
        torch ``float8_e4m3fn``/``float8_e5m2``, or ``uint8`` bytes with ``format_a``.
    b : device array, (K, N), FP8, column-major
        ``w.T`` for a C-contiguous weight ``w`` of shape (N, K) (Hopper's FP8 kernels read both
        operands K-contiguous). Not both operands E5M2.
    scale_a, scale_b : device float32 scalars
        Dequantizing scales (``a``'s real values are ``scale_a * a``), read when the GEMM runs.
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
    stream : optional
        The stream (default: CuPy's current stream).

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
    _read_scaled(&c, &s, a, b, scale_a, scale_b, out, out_dtype, bias, act, scale_out, amax_out,
                 format_a, format_b, format_out, fast_accum)
    prepare_typed_call(&c, &s.types, stream)      # the compute type from a's, b's and out's types
    if out is None:     # in the caller's library: a torch tensor when a or b is one
        out = empty_array((s.g.n, s.g.m), s.types.d, c.stream, "scaled_matmul(out=None): allocating the result",
                          first_torch((a, b)))
        s.g.c = <void*>data_pointer(out)
    if s.g.m == 0 or s.g.n == 0:
        return out
    _run_scaled(c.ctx, c.stream, c.compute, &s)
    return out


def describe_scaled_matmul(a, b, scale_a, scale_b, *, out=None, out_dtype=None, bias=None, act="none",
                           scale_out=None, amax_out=None, format_a=None, format_b=None, format_out=None,
                           bint fast_accum=False):
    """What :func:`scaled_matmul` with these arguments runs, without running it (no GPU needed).

    Parameters
    ----------
    a, b, scale_a, scale_b, out, bias, scale_out, amax_out : device array, NumPy array, or (shape, dtype) pair
        What :func:`scaled_matmul` takes, or a stand-in read for its layout only (describing
        never touches memory): a NumPy array in host memory (its shape, strides, dtype and
        address) or a ``(shape, dtype)`` pair (C-contiguous, no memory). FP8: ``float8_e4m3fn``
        / ``float8_e5m2`` (torch's, ml_dtypes', those names, or ``"e4m3"`` / ``"e5m2"``), or
        ``uint8`` with ``format_*``. ``b`` is column-major, so describe it as ``w.T`` of a
        NumPy array ``w`` (N, K). Scales: one float32 element, e.g. ``((), "float32")``.
    out_dtype, act, format_a, format_b, format_out, fast_accum
        As :func:`scaled_matmul`.

    Returns
    -------
    dict
        The keys of :func:`cygemm.describe_matmul`'s calls, in its order and with its meanings:
        ``M``, ``N``, ``K``, ``batch`` (1), ``swapped`` (True: out is row-major), ``cublas_a``
        ("b"), ``cublas_b`` ("a"), ``why``; then ``opa``, ``opb``, ``m``, ``n``, ``k``, ``lda``,
        ``ldb``, ``ldc``, ``stride_a``, ``stride_b``, ``stride_c`` (0) and the pointers ``a``,
        ``b``, ``c`` (None where there is no memory: a (shape, dtype) pair, out=None's result).
        Then FP8's own: ``call`` ("cublasLtMatmul"); ``a_type``, ``b_type``, ``c_type``,
        ``d_type`` (cuBLAS's A, B, C and D, e.g. "float8_e4m3", "bfloat16") and ``bias_type``
        (None without a bias); ``epilogue`` ("default", "bias", "relu", "relu_bias", "gelu",
        "gelu_bias"); ``scales`` ({"a", "b", "out"}: whether each scale is set), ``amax``
        (whether the output's amax is written) and ``fast_accum``.

    Raises
    ------
    ValueError, TypeError
        As :func:`scaled_matmul` raises them before it runs (layouts, shapes, dtypes and
        formats, alignment), naming the argument; also a sequence that is no (shape, dtype)
        pair.
    """
    cdef Addresses addresses = Addresses()
    names = ("a", "b", "scale_a", "scale_b", "out", "bias", "scale_out", "amax_out")
    a, b, scale_a, scale_b, out, bias, scale_out, amax_out = [None if x is None else layout_operand(x, n, addresses)
        for x, n in zip((a, b, scale_a, scale_b, out, bias, scale_out, amax_out), names)]
    cdef CallArgs c
    cdef ScaledCall s
    _read_scaled(&c, &s, a, b, scale_a, scale_b, out, out_dtype, bias, act, scale_out, amax_out,
                 format_a, format_b, format_out, fast_accum)
    cdef int i, at_out = 0
    for i in range(c.n):
        if <str>c.names[i] == "out":
            at_out = i
    d = describe_call(&c.views[0], &c.views[1], &c.views[at_out], &s.g, False, False, ("a", "b", "out"),
                      (has_memory(a), has_memory(b), out is not None and has_memory(out)))
    epilogues = {CUBLASLT_EPILOGUE_DEFAULT: "default", CUBLASLT_EPILOGUE_BIAS: "bias",
                 CUBLASLT_EPILOGUE_RELU: "relu", CUBLASLT_EPILOGUE_RELU_BIAS: "relu_bias",
                 CUBLASLT_EPILOGUE_GELU: "gelu", CUBLASLT_EPILOGUE_GELU_BIAS: "gelu_bias"}
    d.update(call="cublasLtMatmul",
             a_type=dtype_name(s.types.a), b_type=dtype_name(s.types.b), c_type=dtype_name(s.types.c),
             d_type=dtype_name(s.types.d), bias_type=dtype_name(s.types.bias) if bias is not None else None,
             epilogue=epilogues.get(s.epi, str(<int>s.epi)),
             scales=dict(a=s.types.b_scale != NULL, b=s.types.a_scale != NULL, out=s.types.d_scale != NULL),
             amax=s.types.amax_d != NULL, fast_accum=bool(s.types.fast_accum))
    return d


cdef class ScaledMatmulPlan(GemmPlan):
    """ScaledMatmulPlan(a, b, scale_a, scale_b, *, out, out_dtype=None, bias=None, act="none", scale_out=None, amax_out=None, format_a=None, format_b=None, format_out=None, fast_accum=False)

    :func:`scaled_matmul` planned once: a :class:`cygemm.GemmPlan` of one cuBLASLt FP8 call.

    ``out = act(scale_a * scale_b * (a @ b) + bias)``, with the lifecycle of
    :class:`cygemm.GemmPlan`: :meth:`plan`, :meth:`autotune`, :meth:`execute` on any stream
    (capturable, allocation-free), :meth:`close`.

    Parameters
    ----------
    a, b, scale_a, scale_b, out_dtype, bias, act, scale_out, amax_out, format_a, format_b, format_out, fast_accum
        As :func:`scaled_matmul`.
    out : device array, (M, N), row-major
        Required (a plan allocates nothing); as :func:`scaled_matmul` takes it.

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
    cdef object out_dtype, act_name, format_a, format_b, format_out
    cdef bint fast_accum

    def __init__(self, a, b, scale_a, scale_b, *, out, out_dtype=None, bias=None, act="none", scale_out=None,
                 amax_out=None, format_a=None, format_b=None, format_out=None, bint fast_accum=False):
        self.out_dtype, self.act_name, self.fast_accum = out_dtype, act, fast_accum
        self.format_a, self.format_b, self.format_out = format_a, format_b, format_out
        self.plan_kind = KIND_SCALED
        self.alpha_f, self.beta_f, self.math = 1.0, 0.0, "fp32"
        self._setup((a, b, out, scale_a, scale_b, bias, scale_out, amax_out))

    cdef int _read(self, CallArgs* c, PlannedCall* call, tuple operands) except -1:
        """scaled_matmul's reader, every check of it, into the plan's call."""
        a, b, out, scale_a, scale_b, bias, scale_out, amax_out = operands
        cdef ScaledCall s
        memset(&s, 0, sizeof(s))
        _read_scaled(c, &s, a, b, scale_a, scale_b, out, self.out_dtype, bias, self.act_name, scale_out,
                     amax_out, self.format_a, self.format_b, self.format_out, self.fast_accum)
        memset(call, 0, sizeof(PlannedCall))
        call.g, call.types, call.epi, call.bias = s.g, s.types, s.epi, s.bias
        call.typed, call.dtype = True, s.types.d
        return 0

    cdef str _no_algorithm(self):
        return _no_fp8_kernel(&self.call.g, &self.call.types, self.call.epi)

    def execute(self, a=None, b=None, out=None, *, stream=None):
        """Run it on `stream` (None: CuPy's current one), on the planned operands or on those
        given (of the planned layout). Allocates nothing; can be captured. Returns out."""
        return GemmPlan.execute(self, a, b, out, stream=stream)
