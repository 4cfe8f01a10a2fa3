# cython: language_level=3, boundscheck=False, wraparound=False
"""The geometry of views in memory: whether two (batch, rows, cols) views share an element,
exactly where both are column blocks of one buffer, conservatively (address ranges) otherwise."""
from libc.stdint cimport int64_t, uintptr_t

from cygemm.engine.types cimport MatrixView, ArrayDesc, view_is_empty
from cygemm.engine.arrays cimport view_from_object


cdef void view_byte_range(const MatrixView* v, int64_t* lo, int64_t* hi) noexcept nogil:
    """[lo, hi): the bytes a non-empty view can touch."""
    cdef int64_t start = <int64_t><uintptr_t>v.ptr, span
    lo[0] = start
    hi[0] = start + v.itemsize
    cdef int64_t sizes[3]
    cdef int64_t strides[3]
    sizes[0], sizes[1], sizes[2] = v.batch, v.rows, v.cols
    strides[0], strides[1], strides[2] = v.batch_stride, v.row_stride, v.col_stride
    for i in range(3):
        span = (sizes[i] - 1) * strides[i] * v.itemsize
        if span < 0:
            lo[0] += span
        else:
            hi[0] += span


cdef void desc_byte_range(const ArrayDesc* d, int64_t* lo, int64_t* hi) noexcept nogil:
    """[lo, hi): the bytes an n-D array spans (hi == lo when it is empty)."""
    cdef int i
    cdef int64_t low = 0, high = 0
    for i in range(d.ndim):
        if d.shape[i] == 0:
            lo[0] = hi[0] = <int64_t><uintptr_t>d.ptr
            return
        if d.strides[i] < 0:
            low += (d.shape[i] - 1) * d.strides[i]
        else:
            high += (d.shape[i] - 1) * d.strides[i]
    lo[0] = <int64_t><uintptr_t>d.ptr + low * d.itemsize
    hi[0] = <int64_t><uintptr_t>d.ptr + (high + 1) * d.itemsize


cdef bint _as_lines(const MatrixView* v, int64_t* n, int64_t* length, int64_t* ld) noexcept nogil:
    """The memory of 2-D view v as n segments of `length` contiguous elements, ld apart
    (ld 0: one segment). False when v is not such a view (no unit-stride axis, batches)."""
    if v.batch != 1:
        return False
    cdef int64_t count, stride
    if v.rows == 1 or v.cols == 1:          # a vector: one segment, or segments of one
        count = v.rows * v.cols
        stride = v.col_stride if v.cols > 1 else v.row_stride
        if count == 1 or stride == 1:
            n[0], length[0], ld[0] = 1, count, 0
        elif stride > 0:
            n[0], length[0], ld[0] = count, 1, stride
        else:
            return False
    elif v.col_stride == 1:                 # rows are the segments
        n[0], length[0], ld[0] = v.rows, v.cols, v.row_stride
    elif v.row_stride == 1:                 # columns are the segments
        n[0], length[0], ld[0] = v.cols, v.rows, v.col_stride
    else:
        return False
    return True


cdef bint _blocks_overlap(const MatrixView* x, const MatrixView* y) noexcept nogil:
    """Whether two views with overlapping byte ranges share an element. Exact when both
    are blocks of one matrix (segments of contiguous elements, one distance ld apart);
    True (conservative) otherwise."""
    if x.itemsize != y.itemsize:
        return True
    cdef int64_t xn, xl, xld, yn, yl, yld, ld, base, ox, oy
    if not (_as_lines(x, &xn, &xl, &xld) and _as_lines(y, &yn, &yl, &yld)):
        return True
    if xld and yld and xld != yld:
        return True
    ld = xld if xld else yld
    if ld == 0:
        return True          # two contiguous segments: their byte ranges are exact
    if xl > ld or yl > ld:
        return True
    base = min(<int64_t><uintptr_t>x.ptr, <int64_t><uintptr_t>y.ptr)
    ox = <int64_t><uintptr_t>x.ptr - base
    oy = <int64_t><uintptr_t>y.ptr - base
    if ox % x.itemsize or oy % x.itemsize:
        return True
    ox //= x.itemsize
    oy //= x.itemsize
    if ox % ld + xl > ld or oy % ld + yl > ld:     # a block that wraps past the line's end
        return True
    return (ox // ld < oy // ld + yn and oy // ld < ox // ld + xn and
            ox % ld < oy % ld + yl and oy % ld < ox % ld + xl)


cdef bint views_overlap(const MatrixView* x, const MatrixView* y) noexcept nogil:
    if view_is_empty(x) or view_is_empty(y):
        return False
    cdef int64_t lo1, hi1, lo2, hi2
    view_byte_range(x, &lo1, &hi1)
    view_byte_range(y, &lo2, &hi2)
    return not (hi1 <= lo2 or hi2 <= lo1) and _blocks_overlap(x, y)


cdef int check_no_overlap(const MatrixView* out, str out_name, const MatrixView* other,
                          str other_name) except -1:
    if not views_overlap(out, other):
        return 0
    cdef int64_t lo1, hi1, lo2, hi2
    view_byte_range(out, &lo1, &hi1)
    view_byte_range(other, &lo2, &hi2)
    raise ValueError(f"{out_name}: its memory overlaps {other_name} (bytes "
                     f"[{lo1:#x}, {hi1:#x}) and [{lo2:#x}, {hi2:#x})); cuBLAS and cygemm's kernels "
                     f"need outputs that share no memory with the other arguments")


def arrays_overlap(x, y):
    """Whether cygemm would treat device arrays x and y as sharing memory (the check every
    output goes through). Exact for two 2-D views of one leading dimension; otherwise by
    address ranges, so it may say True for interleaved views that share no element."""
    cdef MatrixView a, b
    view_from_object(x, &a, "x", 1, 3)
    view_from_object(y, &b, "y", 1, 3)
    return views_overlap(&a, &b)
