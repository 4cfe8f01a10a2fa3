# cython: language_level=3, boundscheck=False, wraparound=False
"""The GEMM reader: a row-major GEMM's operands, transposes and scalars read, checked and mapped to
column-major cuBLAS (no GPU state). gemm, gemm_strided_batched, describe_gemm, GemmPlan and the
grouped GEMMs all read their arguments here."""
from libc.stdint cimport int64_t

from cygemm.bindings.cudart cimport cudaDataType, CUDA_R_8I, CUDA_R_32I
from cygemm.engine.types cimport MatrixView, ColMajorGemm, Scalars, beta_is_zero, is_complex_type
from cygemm.engine.mapping cimport (MapResult, MAP_OK, MAP_CONJ_A, conjugate_ops, layout_error, map_or_raise,
                                    check_batch_disjoint)
from cygemm.engine.dtypes cimport (dtype_name, expected_names, DTYPES_WIDE, DTYPES_GEMM, INT8_DTYPE,
                                   INT8_SUMS_DTYPE)
from cygemm.engine.execute cimport check_int8
from cygemm.engine.args cimport CallArgs, args_init, add_array, add_view, expect_dtype, ARG_READ, ARG_WRITE


cdef str _shape_str(const MatrixView* v, bint batched):
    if batched:
        return f"({v.batch}, {v.rows}, {v.cols})"
    return f"({v.rows}, {v.cols})"


cdef int read_scalars(object alpha, object beta, cudaDataType dtype, Scalars* sc) except -1:
    """alpha and beta into sc; complex values only for complex operands."""
    cdef str name
    cdef object value
    for name, value in (("alpha", alpha), ("beta", beta)):
        if isinstance(value, (str, bytes)):     # (complex() parses "2": not a number here)
            raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
        try:
            z = complex(value)
        except (TypeError, ValueError):
            raise TypeError(f"{name}: expected a number, got {type(value).__name__}") from None
        if z.imag != 0 and not is_complex_type(dtype):
            raise ValueError(f"{name}: a complex value ({value!r}) needs complex operands, got "
                             f"{dtype_name(dtype)} ones")
        if name == "alpha":
            sc.alpha_re, sc.alpha_im = z.real, z.imag
        else:
            sc.beta_re, sc.beta_im = z.real, z.imag
    return 0


class ConjugateLayoutError(ValueError):
    """An operand whose conjugate transpose cuBLAS cannot read in its memory order (`operand`:
    "A" or "B"); gemm then reads a conjugated copy, a GemmPlan refuses it."""

    def __init__(self, message, operand):
        super().__init__(message)
        self.operand = operand


cdef int parse_trans(object value, str name, bint* trans, bint* conj) except -1:
    """trans_a / trans_b: False or "N" (as stored), True or "T" (transposed), "H" or "C" (the
    conjugate transpose; for real dtypes the same as "T")."""
    if isinstance(value, str):
        v = value.upper()
        if v in ("N", "T", "H", "C"):
            trans[0], conj[0] = v != "N", v in ("H", "C")
            return 0
    elif value is True or value is False or (type(value).__name__ == "bool_") or value in (0, 1):
        trans[0], conj[0] = bool(value), False
        return 0
    raise ValueError(f"{name}: expected False/True or 'N', 'T', 'H' (conjugate transpose), got {value!r}")


cdef int read_gemm(CallArgs* c, object A, object B, object out, bint trans_a, bint trans_b,
                   bint batched, object alpha, object beta, Scalars* sc, ColMajorGemm* g,
                   bint conj_a=False, bint conj_b=False, bint ints=False) except -1:
    """The argument path of gemm, gemm_strided_batched, GemmPlan and describe_gemm: read and
    check the operands into c (A, B, then out), alpha and beta into sc, and map them to cuBLAS
    (out=None: a row-major result, its pointer NULL until allocated). No GPU state."""
    cdef int min_nd = 2
    cdef int max_nd = 3 if batched else 2
    cdef int level = DTYPES_GEMM if ints else DTYPES_WIDE
    args_init(c)
    cdef MatrixView* a = add_array(c, A, "A", ARG_READ, min_nd, max_nd, level)
    cdef MatrixView* b = add_array(c, B, "B", ARG_READ, min_nd, max_nd, level)
    if a.dtype == INT8_SUMS_DTYPE:
        raise TypeError(f"A: expected {expected_names(DTYPES_GEMM)}, got "
                        "int32 (cuBLAS multiplies int8 into int32, not int32: use cupy.matmul for int32)")
    expect_dtype(b, "B", a.dtype, "A")
    cdef bint int8 = a.dtype == INT8_DTYPE
    read_scalars(alpha, beta, a.dtype, sc)
    cdef int64_t M = a.cols if trans_a else a.rows
    cdef int64_t K = a.rows if trans_a else a.cols
    cdef int64_t K2 = b.cols if trans_b else b.rows
    cdef int64_t N = b.rows if trans_b else b.cols
    if K != K2 and not (trans_a or trans_b):       # (int_mm has no transposes to name)
        raise ValueError(f"B: A is {M}x{K} so B must have {K} rows, got {K2}x{N}")
    if K != K2:
        raise ValueError(f"B: op(A) is {M}x{K} (trans_a={bool(trans_a)}) so op(B) must have {K} rows, "
                         f"got {K2}x{N} (trans_b={bool(trans_b)})")
    cdef int64_t batch = 1
    if batched:
        if a.batch != 1 and b.batch != 1 and a.batch != b.batch:
            raise ValueError(f"B: batch {b.batch} does not match A's batch {a.batch} (nor is either 1)")
        batch = a.batch if a.batch != 1 else b.batch
        if a.batch == 1:
            a.batch_stride = 0      # one matrix broadcast over the batch
        if b.batch == 1:
            b.batch_stride = 0
        a.batch = b.batch = batch
    cdef MatrixView res
    cdef MatrixView* cv
    if out is None:
        if not beta_is_zero(sc):
            raise ValueError(f"beta: a nonzero beta ({beta!r}) needs an existing out=, got out=None")
        res.ptr = NULL
        res.device = -1
        res.rows, res.cols, res.row_stride, res.col_stride = M, N, N, 1
        res.batch, res.batch_stride, res.dtype, res.itemsize = batch, M * N, a.dtype, a.itemsize
        if int8:            # the exact sums
            res.dtype, res.itemsize = INT8_SUMS_DTYPE, 4
        cv = add_view(c, &res, "out", ARG_WRITE, False)
    else:
        cv = add_array(c, out, "out", ARG_WRITE, max_nd, max_nd, level)
        if not int8:
            expect_dtype(cv, "out", a.dtype, None)
        elif cv.dtype != INT8_SUMS_DTYPE and cv.dtype != INT8_DTYPE:
            raise TypeError(f"out: int8 operands write an int32 out (exact sums) or an int8 one (scaled by "
                            f"alpha, rounded and saturated), got {dtype_name(cv.dtype)}")
        if cv.rows != M or cv.cols != N or cv.batch != batch:
            want = f"({batch}, {M}, {N})" if batched else f"({M}, {N})"
            raise ValueError(f"out: expected shape {want}, got {_shape_str(cv, batched)}")
    map_or_raise(a, b, cv, trans_a, trans_b, g, ("A", "B", "out"))
    cdef MapResult r
    if is_complex_type(a.dtype) and (conj_a or conj_b):
        r = conjugate_ops(cv, g, conj_a, conj_b)
        if r != MAP_OK:
            raise ConjugateLayoutError(str(layout_error(r, a, b, cv, ("A", "B", "out"), "")),
                                       "A" if r == MAP_CONJ_A else "B")
    if out is not None:
        check_batch_disjoint(g, "out")
    g.strided_batched = batched
    if int8:
        check_int8(a, b, cv, trans_a, trans_b, g, sc)
    return 0
