# cython: language_level=3, boundscheck=False, wraparound=False
"""Reading and checking :func:`cygemm.fp8.scaled_matmul`'s arguments: the one path from FP8
operands, scales, out and bias to a cuBLASLt FP8 call (cygemm.fp8 runs it). Everything is
checked here, before anything runs.

Scales. cuBLASLt on Hopper (12.9 and later) scales FP8 operands four ways
(cublasLtMatmulMatrixScale_t), each a float32 device array read when the GEMM runs. Each scale
array is shaped like its operand's grid of scaled blocks, in the operand's own orientation
(scale[i, j] multiplies block (i, j)); its strides are the layout cuBLASLt reads:

=========  ========================================  ========================================
mode       scale_a of a (M, K)                       scale_b of b (K, N)
=========  ========================================  ========================================
tensor     one element                               one element
rowwise    (M, 1) or (M,)                            (1, N) or (N,)
1x128      (M, ceil(K/128)), M contiguous            (ceil(K/128), N), N contiguous
128x128    (ceil(M/128), ceil(K/128)), K contiguous, (ceil(K/128), ceil(N/128)), K contiguous,
           rows round_up(ceil(K/128), 4) apart       columns round_up(ceil(K/128), 4) apart
=========  ========================================  ========================================

These are torch._scaled_mm's layouts. The pairs cuBLASLt 13.1 runs on sm_90: tensor x tensor,
rowwise x rowwise, and 1x128 or 128x128 x 1x128 or 128x128 but not 128x128 x 128x128. A mode
is told by the scales' shapes, in that order of pairs where shapes fit more than one (a (M, 1)
scale of K <= 128 is rowwise and 1x128 at once: the same numbers); scale_mode= says it outright.
Scales other than per tensor need a bfloat16, float16 or float32 output (cuBLASLt quantizes
FP8 outputs with per-tensor scales only), 16-byte aligned scale pointers, and for the block
modes M and N multiples of 4.
"""
from libc.stdint cimport int64_t, uintptr_t

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
from cygemm.engine.epilogues cimport Activation, epilogue_activation, lt_epilogue
from cygemm.engine.errors import check_flag
from cygemm.engine.dtypes cimport fp8_bias_type, fp8_c_type, fp8_pair_ok, SCALES_DTYPE
from cygemm.engine.types cimport MatrixView, ArrayDesc, is_fp8_type, type_size
from cygemm.engine.arrays cimport read_fp8, read_array, view_from_desc, desc_shape
from cygemm.engine.dtypes cimport dtype_name
from cygemm.engine.args cimport CallArgs, ArgRole, args_init, add_view, add_scalar, ARG_READ, ARG_WRITE
from cygemm.engine.mapping cimport map_or_raise, is_rowmajor
from cygemm.engine.dtypes import FP8_FORMATS, FORMATS_EXPECTED
from cygemm.engine.dtypes cimport by_name, DTYPES_FLOAT, DTYPES_GEMM, DTYPES_FP8, DTYPES_BYTES
from cygemm.engine.dtypes import names, expected

#: What out_dtype= takes: the float types by name, the FP8 formats by their short names.
OUT_DTYPES = {**{n: v[0] for n, v in by_name(DTYPES_FLOAT).items()}, **FP8_FORMATS}
_FP8_NAMES = names(DTYPES_BYTES) + names(DTYPES_FP8)      # (the dtypes that hold FP8 codes)
DEFAULT_OUT = dtype_name(CUDA_R_16BF)      # an FP8 GEMM's output unless told: bfloat16, as torch._scaled_mm's
#: scale_mode's names, by cuBLASLt mode.
SCALE_MODES = {"tensor": SCALE_TENSOR, "rowwise": SCALE_OUTER, "1x128": SCALE_1X128, "128x128": SCALE_128X128}
_MODE_NAMES = {v: k for k, v in SCALE_MODES.items()}
# The pairs sm_90 runs (a's mode, b's), in the order a mode is told from shapes that fit several:
# DeepSeek's forward pass (activations 1x128, weights 128x128) before the weight gradient's.
_PAIRS = ((SCALE_TENSOR, SCALE_TENSOR), (SCALE_OUTER, SCALE_OUTER), (SCALE_1X128, SCALE_128X128),
          (SCALE_1X128, SCALE_1X128), (SCALE_128X128, SCALE_1X128))


cdef void order_operands(GemmTypes* t, bint swapped, int type_a, int type_b, const float* scale_a,
                         const float* scale_b, int mode_a, int mode_b) noexcept nogil:
    if swapped:
        type_a, type_b, scale_a, scale_b, mode_a, mode_b = type_b, type_a, scale_b, scale_a, mode_b, mode_a
    t.a, t.b = <cudaDataType>type_a, <cudaDataType>type_b
    t.a_scale, t.b_scale = scale_a, scale_b
    t.a_scale_mode, t.b_scale_mode = mode_a, mode_b


cdef str scale_mode_name(int mode):
    return _MODE_NAMES.get(mode, str(mode))


cdef bint modes_pair(int mode_a, int mode_b) noexcept nogil:
    if mode_a == SCALE_TENSOR or mode_a == SCALE_OUTER or mode_b == SCALE_TENSOR or mode_b == SCALE_OUTER:
        return mode_a == mode_b
    return (mode_a == SCALE_1X128 or mode_a == SCALE_128X128) and (mode_b == SCALE_1X128 or (
        mode_b == SCALE_128X128 and mode_a == SCALE_1X128))


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
    return add_view(c, &v, name, role, d.torch)


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


_FP8_EPILOGUES = "FP8 GEMMs (cuBLASLt epilogues)"


cdef int _epilogue(const Activation* act, bint has_bias, cublasLtEpilogue_t* epi) except -1:
    epi[0] = lt_epilogue(act, has_bias, False, _FP8_EPILOGUES)
    return 0




cdef inline int64_t _cdiv(int64_t x, int64_t y) noexcept nogil:
    return (x + y - 1) // y


cdef int _layout(int mode, bint is_a, int64_t rows, int64_t k, int64_t* shape, int64_t* strides) noexcept nogil:
    """The 2-D shape and element strides a scale of `mode` has (a: rows = M; b: rows = N, and
    the shape is b's orientation, (K..., N...)). Tensor scales have none (any one element)."""
    cdef int64_t kb = _cdiv(k, 128), blocks = _cdiv(rows, 128), ld = _cdiv(_cdiv(k, 128), 4) * 4
    cdef int64_t along_k = 1 if mode == SCALE_OUTER else kb
    cdef int64_t along_rows = blocks if mode == SCALE_128X128 else rows
    # (a: rows along its first axis; b: along its second. 128x128 is K-contiguous, the others
    # contiguous along the rows.)
    cdef int64_t rows_stride = ld if mode == SCALE_128X128 else 1
    cdef int64_t k_stride = 1 if mode == SCALE_128X128 else rows
    if is_a:
        shape[0], shape[1], strides[0], strides[1] = along_rows, along_k, rows_stride, k_stride
    else:
        shape[0], shape[1], strides[0], strides[1] = along_k, along_rows, k_stride, rows_stride
    return 0


cdef bint _fits(const ArrayDesc* d, int mode, bint is_a, int64_t rows, int64_t k) noexcept nogil:
    """Whether the array d is a scale of `mode` for its operand (strides of size-1 axes aside)."""
    cdef int64_t size = 1
    cdef int64_t shape[2]
    cdef int64_t strides[2]
    cdef int i
    for i in range(d.ndim):
        size *= d.shape[i]
    if mode == SCALE_TENSOR:
        return size == 1
    if mode == SCALE_OUTER and d.ndim == 1:
        return d.shape[0] == rows and (rows <= 1 or d.strides[0] == 1)
    if d.ndim != 2:
        return False
    _layout(mode, is_a, rows, k, shape, strides)
    for i in range(2):
        if d.shape[i] != shape[i] or (d.shape[i] > 1 and d.strides[i] != strides[i]):
            return False
    return True


cdef str _expected(int mode, bint is_a, int64_t rows, int64_t k):
    """What a scale of `mode` is for its operand, in the user's terms, with a way to make one."""
    cdef int64_t shape[2]
    cdef int64_t strides[2]
    if mode == SCALE_TENSOR:
        return "one float32 element (per tensor)"
    _layout(mode, is_a, rows, k, shape, strides)
    dims = f"({shape[0]}, {shape[1]}) float32"
    if mode == SCALE_OUTER:
        return f"{dims}, contiguous (rowwise: one per {'row of a' if is_a else 'column of b'})"
    if mode == SCALE_1X128:
        along = "M" if is_a else "N"
        make = (f"cupy.empty(({shape[1]}, {shape[0]}), cupy.float32).T" if is_a
                else f"cupy.empty(({shape[0]}, {shape[1]}), cupy.float32)")
        return (f"{dims} stored {along}-contiguous, element strides ({strides[0]}, {strides[1]}) "
                f"(1x128: one per {'row' if is_a else 'column'} and 128 elements of K), e.g. {make}")
    cdef int64_t ld = strides[0] if is_a else strides[1]
    lines = "rows" if is_a else "columns"
    cdef int64_t kb = shape[1] if is_a else shape[0]
    cdef int64_t blocks = shape[0] if is_a else shape[1]
    make = f"cupy.empty(({blocks}, {ld}), cupy.float32){f'[:, :{kb}]' if ld != kb else ''}{'' if is_a else '.T'}"
    return (f"{dims} stored K-contiguous with {lines} {ld} apart, element strides ({strides[0]}, "
            f"{strides[1]}) (128x128: one per block of 128 x 128), e.g. {make}")


cdef int _read_scale(const ArrayDesc* d, object x, str name) except -1:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        raise TypeError(f"{name}: expected a device float32 array (read on the GPU when the call runs), "
                        f"got a host number {x!r}: pass cupy.asarray({float(x)!r}, cupy.float32)")
    read_array(x, <ArrayDesc*>d, name, DTYPES_GEMM)     # (every dtype a reader takes: the one rule below names float32)
    if d.dtype != SCALES_DTYPE:
        raise TypeError(f"{name}: FP8 scales are float32, got {dtype_name(d.dtype)} of shape {desc_shape(d)}")
    if d.ndim > 2:
        raise ValueError(f"{name}: expected a scale of at most 2 dimensions, got shape {desc_shape(d)}")
    return 0


cdef tuple _parse_modes(object scale_mode):
    if scale_mode is None:
        return None
    names = (scale_mode, scale_mode) if isinstance(scale_mode, str) else scale_mode
    if not isinstance(names, (tuple, list)) or len(names) != 2 or any(n not in SCALE_MODES for n in names):
        raise ValueError(f"scale_mode: expected None, one of {sorted(SCALE_MODES)} or a pair of them "
                         f"(a's, b's), got {scale_mode!r}")
    return SCALE_MODES[names[0]], SCALE_MODES[names[1]]


cdef str _operand(bint is_a, int64_t m, int64_t n, int64_t k):
    return f"a (M, K) = ({m}, {k})" if is_a else f"b (K, N) = ({k}, {n})"


cdef str _got(const ArrayDesc* d):
    return f"got shape {desc_shape(d)} with element strides {tuple(d.strides[i] for i in range(d.ndim))}"


cdef int expect_scale(const ArrayDesc* d, int mode, bint is_a, int64_t m, int64_t n, int64_t k, str name) except -1:
    if not _fits(d, mode, is_a, m if is_a else n, k):
        raise ValueError(f"{name}: a {scale_mode_name(mode)} scale of {_operand(is_a, m, n, k)} is "
                         f"{_expected(mode, is_a, m if is_a else n, k)}; {_got(d)}")
    return 0


cdef list _fitting(const ArrayDesc* d, bint is_a, int64_t m, int64_t n, int64_t k):
    """The modes d fits as a scale of its operand; none raises, listing what each would be."""
    cdef int64_t rows = m if is_a else n
    fits = [mode for mode in SCALE_MODES.values() if _fits(d, mode, is_a, rows, k)]
    if not fits:
        listed = "; or ".join(_expected(mode, is_a, rows, k) for mode in SCALE_MODES.values())
        raise ValueError(f"{'scale_a' if is_a else 'scale_b'}: expected a scale of {_operand(is_a, m, n, k)}: "
                         f"{listed}; {_got(d)}")
    return fits


cdef int _scale_modes(const ArrayDesc* da, const ArrayDesc* db, object scale_mode, int64_t m, int64_t n,
                      int64_t k, int* mode_a, int* mode_b) except -1:
    """The pair of modes: scale_mode's (the scales checked against it), else the first pair of
    _PAIRS both scales fit."""
    given = _parse_modes(scale_mode)
    if given is not None:
        mode_a[0], mode_b[0] = given
        if not modes_pair(mode_a[0], mode_b[0]):
            raise ValueError(f"scale_mode: cuBLASLt has no FP8 GEMM with {scale_mode_name(mode_a[0])} scales "
                             f"for a and {scale_mode_name(mode_b[0])} for b on Hopper; it pairs tensor with "
                             f"tensor, rowwise with rowwise, and 1x128 or 128x128 with 1x128 or 128x128, not "
                             f"128x128 with 128x128")
        expect_scale(da, mode_a[0], True, m, n, k, "scale_a")
        expect_scale(db, mode_b[0], False, m, n, k, "scale_b")
        return 0
    for pa, pb in _PAIRS:
        if _fits(da, pa, True, m, k) and _fits(db, pb, False, n, k):
            mode_a[0], mode_b[0] = pa, pb
            return 0
    fits_a = _fitting(da, True, m, n, k)
    fits_b = _fitting(db, False, m, n, k)
    raise ValueError(f"scale_a/scale_b: cuBLASLt has no FP8 GEMM pairing these scales on Hopper (scale_a "
                     f"fits {' or '.join(scale_mode_name(x) for x in fits_a)}, scale_b "
                     f"{' or '.join(scale_mode_name(x) for x in fits_b)}); it pairs tensor with tensor, rowwise "
                     f"with rowwise, and 1x128 or 128x128 with 1x128 or 128x128, not 128x128 with 128x128")


cdef MatrixView* _add_scale(CallArgs* c, const ArrayDesc* d, int mode, str name) except NULL:
    """The scale as a read argument (device and overlap checks), its pointer checked."""
    cdef MatrixView v
    v.ptr, v.device, v.dtype, v.itemsize = d.ptr, d.device, d.dtype, 4
    v.batch, v.batch_stride = 1, 0
    if d.ndim == 2:
        v.rows, v.cols, v.row_stride, v.col_stride = d.shape[0], d.shape[1], d.strides[0], d.strides[1]
    else:
        v.rows, v.cols, v.row_stride = 1, d.shape[0] if d.ndim == 1 else 1, 1
        v.col_stride = d.strides[0] if d.ndim == 1 else 1
    if mode != SCALE_TENSOR and v.rows * v.cols > 0 and (<uintptr_t>d.ptr) % 16:
        raise ValueError(f"{name}: FP8 GEMMs read {scale_mode_name(mode)} scales from 16-byte aligned memory, "
                         f"got address {<uintptr_t>d.ptr:#x}")
    return add_view(c, &v, name, ARG_READ, d.torch)


cdef int read_scaled(CallArgs* c, ScaledCall* s, object a, object b, object scale_a, object scale_b,
                     object out, object out_dtype, object bias, object act, object scale_out,
                     object amax_out, object format_a, object format_b, object format_out,
                     object fast_accum, object scale_mode) except -1:
    """Every check of scaled_matmul, in the order its arguments come (flags first), before anything runs."""
    cdef bint accum = check_flag(fast_accum, "fast_accum")
    args_init(c)
    cdef MatrixView* va = _fp8_matrix(c, a, "a", format_a, "format_a", ARG_READ)
    cdef MatrixView* vb = _fp8_matrix(c, b, "b", format_b, "format_b", ARG_READ)
    if vb.rows != va.cols:
        raise ValueError(f"b: a is ({va.rows}, {va.cols}) so b must have {va.cols} rows, got ({vb.rows}, {vb.cols})")
    if not fp8_pair_ok(va.dtype, vb.dtype):
        raise TypeError("a/b: cuBLASLt has no E5M2 x E5M2 GEMM; hold one operand in E4M3 (gradients "
                        "in E5M2 pair with weights or activations in E4M3)")
    if va.cols == 0:
        raise ValueError("a: K = 0 (an empty inner dimension) has no FP8 GEMM; the product is zero")
    cdef ArrayDesc dsa, dsb
    cdef int mode_a, mode_b
    _read_scale(&dsa, scale_a, "scale_a")
    _read_scale(&dsb, scale_b, "scale_b")
    _scale_modes(&dsa, &dsb, scale_mode, va.rows, vb.cols, va.cols, &mode_a, &mode_b)
    cdef MatrixView* vsa = _add_scale(c, &dsa, mode_a, "scale_a")
    cdef MatrixView* vsb = _add_scale(c, &dsb, mode_b, "scale_b")
    # The output's type: out's own, out_dtype, or bfloat16.
    cdef cudaDataType d_type
    cdef ArrayDesc dd
    cdef MatrixView vo
    if out_dtype is not None and out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype: expected one of {sorted(OUT_DTYPES)}, got {out_dtype!r}")
    if format_out is not None and format_out not in FP8_FORMATS:     # (checked even where out is not FP8)
        raise ValueError(f"format_out: expected None or {FORMATS_EXPECTED}, got {format_out!r}")
    if format_out is not None and out_dtype is not None and out_dtype != format_out:
        raise ValueError(f"format_out: {format_out!r} contradicts out_dtype={out_dtype!r} (give one of them)")
    if out is not None:
        if _holds_fp8(out):
            read_fp8(out, &dd, "out", format_out if format_out is not None else (
                out_dtype if out_dtype in FP8_FORMATS else None), "format_out")
        else:
            read_array(out, &dd, "out", False)
        view_from_desc(&dd, &vo, "out", 2, 2)
        if out_dtype is not None and OUT_DTYPES[out_dtype] != vo.dtype:
            raise TypeError(f"out: its dtype is {dtype_name(vo.dtype)} but out_dtype={out_dtype!r}")
        if vo.rows != va.rows or vo.cols != vb.cols:
            raise ValueError(f"out: expected shape ({va.rows}, {vb.cols}), got ({vo.rows}, {vo.cols})")
        if not is_rowmajor(&vo):
            raise ValueError(f"out: expected a row-major array (unit stride along the last axis), got "
                             f"element strides ({vo.row_stride}, {vo.col_stride})")
    else:
        d_name = out_dtype if out_dtype is not None else (format_out if format_out is not None else DEFAULT_OUT)
        if d_name not in OUT_DTYPES:
            raise ValueError(f"format_out: expected {FORMATS_EXPECTED}, got {d_name!r}")
        vo.dtype = OUT_DTYPES[d_name]
        vo.itemsize = type_size(vo.dtype)
        vo.ptr, vo.device = NULL, -1
        vo.batch, vo.rows, vo.cols, vo.batch_stride = 1, va.rows, vb.cols, 0
        vo.row_stride, vo.col_stride = max(vb.cols, 1), 1
    d_type = vo.dtype
    cdef bint fp8_out = is_fp8_type(d_type)
    if fp8_out and mode_a != SCALE_TENSOR:
        raise ValueError(f"out: an FP8 GEMM with {scale_mode_name(mode_a)} scales writes {expected(DTYPES_FLOAT)} "
                         f"(cuBLASLt quantizes an FP8 output only under per-tensor scales), got "
                         f"{dtype_name(d_type)}")
    if (mode_a == SCALE_1X128 or mode_a == SCALE_128X128) and (va.rows % 4 or vb.cols % 4):
        if va.rows % 4:
            raise ValueError(f"a: FP8 GEMMs with block scales need M to be a multiple of 4, got M = {va.rows}; "
                             f"pad a (and its scales) with zero rows")
        raise ValueError(f"b: FP8 GEMMs with block scales need N to be a multiple of 4, got N = {vb.cols}; "
                         f"pad b (and its scales) with zero columns")
    cdef cudaDataType bias_type = fp8_bias_type(d_type)
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
        pbias = add_view(c, &vbias, "bias", ARG_READ, db.torch)
    cdef MatrixView* vso = NULL
    if scale_out is not None:
        if not fp8_out:
            raise ValueError(f"scale_out: quantizes an FP8 output; out is {dtype_name(d_type)}")
        vso = add_scalar(c, scale_out, "scale_out", ARG_READ)
    cdef MatrixView* pout = add_view(c, &vo, "out", ARG_WRITE, out is not None and dd.torch)
    cdef MatrixView* vam = NULL
    if amax_out is not None:
        # cuBLASLt (13.0 on the H200) computes amax only for FP8 outputs: other outputs find no
        # kernel. Measure those with cygemm.fp8.amax(out).
        if not fp8_out:
            raise ValueError(f"amax_out: cuBLASLt computes the output's amax only for an FP8 out; out is "
                             f"{dtype_name(d_type)} (use cygemm.fp8.amax(out, amax) after the GEMM)")
        vam = add_scalar(c, amax_out, "amax_out", ARG_WRITE)
    if va.rows == 0 or vb.cols == 0:          # an empty result: nothing runs, no layout to check
        _epilogue(epilogue_activation(act, _FP8_EPILOGUES), bias is not None, &s.epi)
        s.g.m, s.g.n, s.g.k = vb.cols, va.rows, va.cols
        s.g.c = pout.ptr
        s.g.a, s.g.b, s.g.batch, s.g.stride_a, s.g.stride_b, s.g.stride_c = vb.ptr, va.ptr, 1, 0, 0, 0
        s.g.opa, s.g.opb, s.g.lda, s.g.ldb, s.g.ldc = CUBLAS_OP_T, CUBLAS_OP_N, 0, 0, 0
        order_operands(&s.types, is_rowmajor(pout), va.dtype, vb.dtype, NULL, NULL, mode_a, mode_b)
        s.types.d, s.types.c, s.types.bias = d_type, d_type, bias_type
        s.types.d_scale = s.types.amax_d = NULL
        s.types.fast_accum = accum
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
    cdef const Activation* row = epilogue_activation(act, _FP8_EPILOGUES)
    _epilogue(row, bias is not None, &s.epi)
    order_operands(&s.types, is_rowmajor(pout), va.dtype, vb.dtype, <const float*>vsa.ptr, <const float*>vsb.ptr,
                   mode_a, mode_b)
    s.types.d = d_type
    s.types.c = fp8_c_type(d_type)
    s.types.bias = bias_type
    s.types.d_scale = <const float*>vso.ptr if vso != NULL else NULL
    s.types.amax_d = <float*>vam.ptr if vam != NULL else NULL
    s.types.fast_accum = accum
    s.bias = pbias.ptr if pbias != NULL else NULL
    return 0
