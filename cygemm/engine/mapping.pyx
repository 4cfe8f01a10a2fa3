# cython: language_level=3, boundscheck=False, wraparound=False
"""The one mapping from row-major array views to column-major cuBLAS arguments, by operand
swap (no copies), and the checks that go with it. Pure: no GPU state, no allocation; every
GEMM entry point (gemm, matmul, the dense layer, FP8, grouped) maps through here."""
from libc.stdint cimport int64_t

from cygemm.bindings.cublas cimport cublasOperation_t, CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C
from cygemm.engine.types cimport MatrixView, ColMajorGemm


cdef int _colmajor_operand(const MatrixView* v, bint want_t, cublasOperation_t* op,
                           int64_t* ld) noexcept nogil:
    """How cuBLAS reads X (want_t False) or X^T (want_t True) from view X.

    A row-major view (unit column stride) is, to column-major cuBLAS, X^T with
    ld = row stride; a column-major view is X itself with ld = column stride.
    Returns 1 for the first, 0 for the second, -1 if neither fits. Axes of
    length <= 1 have no meaningful stride, so they fit either way.
    """
    cdef int64_t r = v.rows, c = v.cols, s0 = v.row_stride, s1 = v.col_stride
    cdef bint view_t
    if (s1 == 1 or c <= 1) and (r <= 1 or c == 0 or s0 >= c):
        view_t = True
        ld[0] = s0 if (r > 1 and c > 0) else (c if c > 1 else 1)
    elif (s0 == 1 or r <= 1) and (c <= 1 or r == 0 or s1 >= r):
        view_t = False
        ld[0] = s1 if (c > 1 and r > 0) else (r if r > 1 else 1)
    else:
        return -1
    op[0] = CUBLAS_OP_T if want_t != view_t else CUBLAS_OP_N
    return 1 if view_t else 0


cdef MapResult map_rowmajor_gemm(const MatrixView* a, const MatrixView* b, const MatrixView* c,
                                 bint trans_a, bint trans_b, ColMajorGemm* g) noexcept nogil:
    # A row-major out is, to cuBLAS, D = C^T = op(B)^T op(A)^T (the swap);
    # a column-major out is D = C = op(A) op(B). Either way no operand moves.
    cdef cublasOperation_t unused
    cdef int out_t = _colmajor_operand(c, False, &unused, &g.ldc)
    if out_t < 0:
        return MAP_BAD_OUT
    cdef const MatrixView* first
    cdef const MatrixView* second
    cdef bint first_t, second_t
    if out_t:
        first, first_t, second, second_t = b, not trans_b, a, not trans_a
        g.m, g.n = c.cols, c.rows
    else:
        first, first_t, second, second_t = a, trans_a, b, trans_b
        g.m, g.n = c.rows, c.cols
    if _colmajor_operand(first, first_t, &g.opa, &g.lda) < 0:
        return MAP_BAD_B if out_t else MAP_BAD_A
    if _colmajor_operand(second, second_t, &g.opb, &g.ldb) < 0:
        return MAP_BAD_A if out_t else MAP_BAD_B
    g.k = a.rows if trans_a else a.cols
    g.a, g.stride_a = first.ptr, first.batch_stride
    g.b, g.stride_b = second.ptr, second.batch_stride
    g.c, g.stride_c = c.ptr, c.batch_stride
    g.batch = c.batch
    return MAP_OK


cdef MapResult conjugate_ops(const MatrixView* c, ColMajorGemm* g, bint conj_a, bint conj_b) noexcept nogil:
    # The swap (a row-major out) puts the user's A second: cuBLAS computes op(B)^T op(A)^T, and
    # conj(op(X)^T) = conj(op(X))^T, so conjugating an operand is conjugating its cuBLAS op.
    cdef cublasOperation_t unused
    cdef int64_t ld
    cdef bint swapped = _colmajor_operand(c, False, &unused, &ld) == 1
    cdef cublasOperation_t* op_a = &g.opb if swapped else &g.opa
    cdef cublasOperation_t* op_b = &g.opa if swapped else &g.opb
    if conj_a and op_a[0] == CUBLAS_OP_N:
        return MAP_CONJ_A
    if conj_b and op_b[0] == CUBLAS_OP_N:
        return MAP_CONJ_B
    if conj_a:
        op_a[0] = CUBLAS_OP_C
    if conj_b:
        op_b[0] = CUBLAS_OP_C
    return MAP_OK


cdef bint is_rowmajor(const MatrixView* v) noexcept nogil:
    cdef cublasOperation_t op
    cdef int64_t ld
    return _colmajor_operand(v, False, &op, &ld) == 1


cdef int64_t rowmajor_ld(const MatrixView* v) noexcept nogil:
    cdef cublasOperation_t op
    cdef int64_t ld = 1
    _colmajor_operand(v, False, &op, &ld)
    return ld


cdef object layout_error(MapResult r, const MatrixView* a, const MatrixView* b, const MatrixView* c,
                         tuple names, str note):
    if r == MAP_CONJ_A or r == MAP_CONJ_B:
        x = names[0] if r == MAP_CONJ_A else names[1]
        return ValueError(f"{x}: its conjugate transpose ('H') in this memory order needs conj({x}) without a "
                          f"transpose, which cuBLAS has no op for{note}; pass {x} in the other order "
                          f"(cupy.asfortranarray({x}) or cupy.ascontiguousarray({x})) or {x}.conj() with 'T' "
                          f"(torch: {x}.conj().resolve_conj(); a lazy conjugate is refused)")
    cdef const MatrixView* v = a if r == MAP_BAD_A else (b if r == MAP_BAD_B else c)
    cdef str name = names[0 if r == MAP_BAD_A else (1 if r == MAP_BAD_B else 2)]
    return ValueError(f"{name}: a layout cuBLAS cannot {'write' if r == MAP_BAD_OUT else 'read'} in place: "
                      f"element strides ({v.row_stride}, {v.col_stride}) for shape ({v.rows}, {v.cols}); one "
                      "of the last two axes must have unit stride and the other a stride >= its length"
                      f"{note}; make it contiguous with cupy.ascontiguousarray({name})")


cdef int map_or_raise(const MatrixView* a, const MatrixView* b, const MatrixView* c, bint trans_a,
                      bint trans_b, ColMajorGemm* g, tuple names) except -1:
    cdef MapResult r = map_rowmajor_gemm(a, b, c, trans_a, trans_b, g)
    if r != MAP_OK:
        raise layout_error(r, a, b, c, names, "")
    g.strided_batched = False
    return 0


cdef bint _shifted_block_overlaps(int64_t d, int64_t ld, int64_t m, int64_t n) noexcept nogil:
    """Whether an m x n column-major block with leading dimension ld overlaps its copy d
    elements further (d > 0): the copy starts in column q = d // ld at row r = d % ld and,
    when r + m > ld, wraps into the next column."""
    cdef int64_t q = d // ld, r = d % ld
    if q < n and r < m:
        return True
    return r + m > ld and q + 1 < n


cdef int check_batch_disjoint(const ColMajorGemm* g, str name) except -1:
    if g.batch <= 1 or g.m == 0 or g.n == 0:
        return 0
    if g.stride_c < 0:
        raise ValueError(f"{name}: expected a batch stride >= 0, got {g.stride_c} elements")
    cdef int64_t bs = g.stride_c
    cdef int64_t ld = g.ldc if g.n > 1 else (g.m if g.m > 0 else 1)
    cdef int64_t i
    if bs >= ld * (g.n - 1) + g.m:          # the usual case: one matrix after another
        return 0
    if bs == 0:
        raise ValueError(f"{name}: batch stride 0 writes every matrix of the batch to the same memory")
    for i in range(1, g.batch):             # interleaved: check each distance between matrices
        if i * bs >= ld * (g.n - 1) + g.m:  # this one and all further ones lie beyond
            break
        if _shifted_block_overlaps(i * bs, ld, g.m, g.n):
            raise ValueError(f"{name}: batch stride {g.stride_c} elements makes the batch's matrices "
                             f"overlap (matrix 0 and matrix {i} share memory)")
    return 0


cdef void rowmajor_view(MatrixView* v, const void* ptr, int64_t rows, int64_t cols, int64_t ld,
                        int64_t stride, int64_t batch) noexcept nogil:
    v.ptr = <char*>ptr
    v.device = -1
    v.rows, v.cols = rows, cols
    v.row_stride, v.col_stride = ld, 1
    v.batch, v.batch_stride = batch, stride
