# cython: language_level=3, boundscheck=False, wraparound=False
"""matmul's batch layout: NumPy's broadcasting of two operands' batch axes, merged where their
strides chain in all three arrays, folded into M where b is broadcast, with one axis chosen as
cuBLAS's batch; checks that out's matrices do not overlap one another; the views of each
strided-batched call (one per index of the other axes); and which arrays a call must copy or
allocate for cuBLAS to read and write them in place (decide_copies)."""
from libc.stdint cimport int64_t, uintptr_t

from cygemm.engine.types cimport ArrayDesc, MatrixView, ColMajorGemm, type_size
from cygemm.engine.arrays cimport desc_shape
from cygemm.engine.dtypes cimport dtype_name
from cygemm.engine.overlap cimport views_overlap, desc_byte_range
from cygemm.bindings.cudart cimport cudaDataType
from cygemm.engine.mapping cimport MapResult, MAP_OK, MAP_BAD_A, MAP_BAD_B, MAP_BAD_OUT, map_rowmajor_gemm, check_batch_disjoint


cdef int _matrix_axes(const ArrayDesc* d, bint is_a, int64_t* rows, int64_t* cols, int64_t* rs,
                  int64_t* cs) noexcept:
    cdef int n = d.ndim
    if n == 1 and is_a:                 # (K,) -> (1, K)
        rows[0], cols[0], rs[0], cs[0] = 1, d.shape[0], d.shape[0] * d.strides[0], d.strides[0]
    elif n == 1:                        # (K,) -> (K, 1)
        rows[0], cols[0], rs[0], cs[0] = d.shape[0], 1, d.strides[0], 1
    else:
        rows[0], cols[0] = d.shape[n - 2], d.shape[n - 1]
        rs[0], cs[0] = d.strides[n - 2], d.strides[n - 1]
    return 0


cdef int read_layout(const ArrayDesc* a, const ArrayDesc* b, BatchLayout* L) except -1:
    """Check the shapes as NumPy does, fill the cores and the broadcast batch axes (not yet
    merged, c's strides unset) and the result's shape."""
    cdef int64_t ar, ac, br, bc, x, y
    _matrix_axes(a, True, &ar, &ac, &L.a_rs, &L.a_cs)
    _matrix_axes(b, False, &br, &bc, &L.b_rs, &L.b_cs)
    if ac != br:
        raise ValueError(f"b: matmul needs b's {'only' if b.ndim == 1 else 'second-to-last'} axis to "
                         f"match a's last axis ({ac}), got shapes {desc_shape(a)} and {desc_shape(b)}")
    L.M, L.K, L.N = ar, ac, bc
    L.base_a = L.base_b = L.base_c = 0
    cdef int na = a.ndim - 2 if a.ndim > 2 else 0
    cdef int nbt = b.ndim - 2 if b.ndim > 2 else 0
    cdef int n = na if na > nbt else nbt, i, ia, ib
    L.nb = n
    L.out_ndim = 0
    for i in range(n):
        ia, ib = i - (n - na), i - (n - nbt)
        x = a.shape[ia] if ia >= 0 else 1
        y = b.shape[ib] if ib >= 0 else 1
        if x != y and x != 1 and y != 1:
            raise ValueError(f"b: the batch axes of a {desc_shape(a)[:na]} and b {desc_shape(b)[:nbt]} "
                             "do not broadcast")
        L.size[i] = x if x != 1 else y
        L.sa[i] = a.strides[ia] if ia >= 0 and x != 1 else 0
        L.sb[i] = b.strides[ib] if ib >= 0 and y != 1 else 0
        L.out_shape[L.out_ndim] = L.size[i]
        L.out_ndim += 1
    if a.ndim > 1:
        L.out_shape[L.out_ndim] = L.M
        L.out_ndim += 1
    if b.ndim > 1:
        L.out_shape[L.out_ndim] = L.N
        L.out_ndim += 1
    return 0


cdef tuple result_shape(const BatchLayout* L):
    return tuple([L.out_shape[i] for i in range(L.out_ndim)])


cdef bint has_result_shape(const ArrayDesc* d, const BatchLayout* L) noexcept:
    cdef int i
    if d.ndim != L.out_ndim:
        return False
    for i in range(d.ndim):
        if d.shape[i] != L.out_shape[i]:
            return False
    return True


cdef int _out_strides(const ArrayDesc* c, bint a_vec, bint b_vec, BatchLayout* L) noexcept:
    cdef int n = c.ndim, i
    for i in range(L.nb):
        L.sc[i] = c.strides[i]
    if a_vec and b_vec:                 # a 0-D result
        L.c_rs, L.c_cs = 1, 1
    elif a_vec:                         # (.., N): one row
        L.c_rs, L.c_cs = L.N * c.strides[n - 1], c.strides[n - 1]
    elif b_vec:                         # (.., M): one column
        L.c_rs, L.c_cs = c.strides[n - 1], 1
    else:
        L.c_rs, L.c_cs = c.strides[n - 2], c.strides[n - 1]
    return 0


cdef void _swap_axes(BatchLayout* L, int i, int j) noexcept:
    L.size[i], L.size[j] = L.size[j], L.size[i]
    L.sa[i], L.sa[j] = L.sa[j], L.sa[i]
    L.sb[i], L.sb[j] = L.sb[j], L.sb[i]
    L.sc[i], L.sc[j] = L.sc[j], L.sc[i]


cdef inline bint _row_major(int64_t rows, int64_t cols, int64_t rs, int64_t cs) noexcept:
    return (cs == 1 or cols <= 1) and (rows <= 1 or cols == 0 or rs >= cols)


cdef int _merge_batch(BatchLayout* L) noexcept:
    """Drop length-1 batch axes and merge neighbours whose strides chain in all three arrays
    (an outer stride = inner stride x inner length, 0 with 0 included); fold inner axes that
    broadcast b into M; then choose cuBLAS's batch axis (moved last), or add a length-1 one
    when no axis qualifies."""
    cdef int i, n = 0, big = -1
    for i in range(L.nb):
        if L.size[i] == 1:
            continue
        if n > 0 and L.sa[n - 1] == L.sa[i] * L.size[i] and L.sb[n - 1] == L.sb[i] * L.size[i] \
                and L.sc[n - 1] == L.sc[i] * L.size[i]:
            L.size[n - 1] *= L.size[i]
            L.sa[n - 1], L.sb[n - 1], L.sc[n - 1] = L.sa[i], L.sb[i], L.sc[i]
            continue
        L.size[n], L.sa[n], L.sb[n], L.sc[n] = L.size[i], L.sa[i], L.sb[i], L.sc[i]
        n += 1
    # An inner axis that broadcasts b, along which a's and out's matrices follow one another
    # row after row, folds into M: (s, M, K) @ (K, N) is one (s*M, K) @ (K, N) GEMM, as
    # torch does, instead of s small ones.
    cdef int64_t a_rs, c_rs, rows
    while n > 0 and L.sb[n - 1] == 0:
        i = n - 1
        a_rs = L.sa[i] if L.M == 1 else L.a_rs
        c_rs = L.sc[i] if L.M == 1 else L.c_rs
        rows = L.M * L.size[i]
        if L.sa[i] != L.M * a_rs or L.sc[i] != L.M * c_rs or not _row_major(rows, L.K, a_rs, L.a_cs) \
                or not _row_major(rows, L.N, c_rs, L.c_cs):
            break
        L.M, L.a_rs, L.c_rs = rows, a_rs, c_rs
        n -= 1
    L.nb = n
    # Any axis can be cuBLAS's batch (each has one stride per array): the longest, so that
    # the loop over the others launches fewest calls; but cuBLAS documents no negative batch
    # strides, so only an axis whose three strides share a sign (run backwards if negative:
    # out's products are disjoint, any order will do).
    for i in range(n):
        if ((L.sa[i] >= 0 and L.sb[i] >= 0 and L.sc[i] >= 0) or (L.sa[i] <= 0 and L.sb[i] <= 0 and L.sc[i] <= 0)) \
                and (big < 0 or L.size[i] > L.size[big]):
            big = i
    if big < 0:             # none: each call is one matrix, every batch axis a loop
        L.size[n], L.sa[n], L.sb[n], L.sc[n] = 1, 0, 0, 0
        L.nb = n + 1
        return 0
    if L.sa[big] < 0 or L.sb[big] < 0 or L.sc[big] < 0:
        L.base_a += (L.size[big] - 1) * L.sa[big]
        L.base_b += (L.size[big] - 1) * L.sb[big]
        L.base_c += (L.size[big] - 1) * L.sc[big]
        L.sa[big], L.sb[big], L.sc[big] = -L.sa[big], -L.sb[big], -L.sc[big]
    if big != n - 1:
        _swap_axes(L, big, n - 1)
    return 0


cdef int _check_out_disjoint(const BatchLayout* L, const ArrayDesc* c) except -1:
    """ValueError unless out's elements are disjoint by nested strides: sorted by stride, each
    axis steps past everything the smaller ones reach (sufficient, not necessary)."""
    cdef int i, j, n = 0
    cdef int order[66]
    cdef int64_t size[66]
    cdef int64_t stride[66]
    cdef int64_t reach = 0
    for i in range(L.nb):
        size[n], stride[n] = L.size[i], L.sc[i] if L.sc[i] >= 0 else -L.sc[i]
        n += 1
    size[n], stride[n] = L.M, L.c_rs if L.c_rs >= 0 else -L.c_rs
    n += 1
    size[n], stride[n] = L.N, L.c_cs if L.c_cs >= 0 else -L.c_cs
    n += 1
    for i in range(n):
        order[i] = i
    for i in range(1, n):                   # insertion sort by stride
        j = i
        while j > 0 and stride[order[j - 1]] > stride[order[j]]:
            order[j - 1], order[j] = order[j], order[j - 1]
            j -= 1
    for i in range(n):
        j = order[i]
        if size[j] <= 1:
            continue
        if stride[j] <= reach:
            raise ValueError(f"out: its matrices may overlap one another (strides {desc_strides(c)} elements "
                             f"for shape {desc_shape(c)}); pass an out whose batch axes do not overlap")
        reach += (size[j] - 1) * stride[j]
    return 0


cdef tuple desc_strides(const ArrayDesc* d):
    return tuple([d.strides[i] for i in range(d.ndim)])


cdef void _view(MatrixView* v, char* ptr, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                int64_t batch, int64_t bs, const ArrayDesc* d) noexcept:
    v.ptr, v.rows, v.cols, v.row_stride, v.col_stride = ptr, rows, cols, rs, cs
    v.batch, v.batch_stride, v.dtype, v.itemsize, v.device = batch, bs, d.dtype, d.itemsize, d.device


cdef void call_views(const BatchLayout* L, const ArrayDesc* a, const ArrayDesc* b, const ArrayDesc* c,
                 int64_t off_a, int64_t off_b, int64_t off_c,
                 MatrixView* va, MatrixView* vb, MatrixView* vc) noexcept:
    """The views of one call: the innermost merged batch axis is cuBLAS's batch."""
    cdef int64_t batch = L.size[L.nb - 1] if L.nb > 0 else 1
    cdef int last = L.nb - 1
    off_a += L.base_a
    off_b += L.base_b
    off_c += L.base_c
    _view(va, a.ptr + off_a * a.itemsize, L.M, L.K, L.a_rs, L.a_cs, batch, L.sa[last] if last >= 0 else 0, a)
    _view(vb, b.ptr + off_b * b.itemsize, L.K, L.N, L.b_rs, L.b_cs, batch, L.sb[last] if last >= 0 else 0, b)
    _view(vc, c.ptr + off_c * c.itemsize, L.M, L.N, L.c_rs, L.c_cs, batch, L.sc[last] if last >= 0 else 0, c)


cdef bint _may_overlap(const BatchLayout* L, const ArrayDesc* c, const ArrayDesc* x, bint x_is_a,
                       const ArrayDesc* a, const ArrayDesc* b) noexcept:
    cdef int64_t lo1, hi1, lo2, hi2
    desc_byte_range(c, &lo1, &hi1)
    desc_byte_range(x, &lo2, &hi2)
    if hi1 <= lo1 or hi2 <= lo2 or hi1 <= lo2 or hi2 <= lo1:
        return False
    cdef MatrixView va, vb, vc
    if L.nb <= 1:                       # one call: the exact test of two matrix views
        call_views(L, a, b, c, 0, 0, 0, &va, &vb, &vc)
        return views_overlap(&vc, &va if x_is_a else &vb)
    return True                         # several calls: by address range


cdef void merge_out(const BatchLayout* L0, const ArrayDesc* c, const ArrayDesc* a, const ArrayDesc* b,
                  BatchLayout* L) noexcept:
    """L0 with out's strides (from c) filled in and its batch axes merged, into L (may be L0)."""
    if L != L0:
        L[0] = L0[0]
    _out_strides(c, a.ndim == 1, b.ndim == 1, L)
    _merge_batch(L)


cdef int check_out(const BatchLayout* L0, const ArrayDesc* c, const ArrayDesc* a, const ArrayDesc* b) except -1:
    """ValueError unless the caller's out can take the products without two of them sharing
    memory: exact (check_batch_disjoint) for one batch axis cuBLAS can write, by nested
    strides otherwise. Checked before anything runs, whether or not a temporary is used."""
    cdef int i
    cdef BatchLayout L
    merge_out(L0, c, a, b, &L)
    if L.M == 0 or L.N == 0 or empty_batch(&L):
        return 0                        # nothing is written (an empty out's strides may be 0)
    cdef MatrixView va, vb, vc
    cdef ColMajorGemm g
    cdef int64_t batch = L.size[L.nb - 1] if L.nb > 0 else 1
    # Row-major stand-ins for a and b: only out's side of the mapping matters here.
    _view(&va, NULL, L.M, L.K, L.K, 1, batch, L.M * L.K, c)
    _view(&vb, NULL, L.K, L.N, L.N, 1, batch, L.K * L.N, c)
    _view(&vc, c.ptr, L.M, L.N, L.c_rs, L.c_cs, batch, L.sc[L.nb - 1] if L.nb > 0 else 0, c)
    for i in range(L.nb):
        if L.size[i] > 1 and L.sc[i] == 0:
            raise ValueError("out: a batch axis of stride 0 would write several products to the same memory")
    if L.nb <= 1 and map_rowmajor_gemm(&va, &vb, &vc, False, False, &g) == MAP_OK:
        if g.batch > 1:
            check_batch_disjoint(&g, "out")
        return 0
    return _check_out_disjoint(&L, c)


cdef bint empty_batch(const BatchLayout* L) noexcept:
    cdef int i
    for i in range(L.nb):
        if L.size[i] == 0:
            return True
    return False


cdef bint _apart(const ArrayDesc* x, const ArrayDesc* y) noexcept:
    cdef int64_t lo1, hi1, lo2, hi2
    desc_byte_range(x, &lo1, &hi1)
    desc_byte_range(y, &lo2, &hi2)
    return hi1 <= lo1 or hi2 <= lo2 or hi1 <= lo2 or hi2 <= lo1


cdef bint may_overlap_inputs(const BatchLayout* L, const ArrayDesc* c, const ArrayDesc* a, const ArrayDesc* b,
                             bint fresh_a=False, bint fresh_b=False):
    if (fresh_a or _apart(c, a)) and (fresh_b or _apart(c, b)):     # the common case: no shared bytes
        return False
    cdef BatchLayout M
    merge_out(L, c, a, b, &M)
    return (not fresh_a and _may_overlap(&M, c, a, True, a, b)) or (not fresh_b and _may_overlap(&M, c, b, False, a, b))


cdef void span_view(const ArrayDesc* d, MatrixView* v) noexcept:
    cdef int64_t lo, hi
    desc_byte_range(d, &lo, &hi)
    v.ptr, v.device, v.dtype, v.itemsize = <char*>lo, d.device, d.dtype, d.itemsize
    v.rows, v.cols = 1, (hi - lo) // d.itemsize
    v.row_stride, v.col_stride, v.batch_stride = v.cols, 1, 0
    v.batch = 1 if hi > lo else 0


# ------------------------------------------------------------ the copies of one call

cdef const ArrayDesc* _c_order(ArrayDesc* d, int ndim, const int64_t* shape, cudaDataType t) noexcept:
    """d as a new C-ordered array of dtype t (its address not known yet: NULL); returns d.
    shape may be d's own."""
    cdef int i
    cdef int64_t stride = 1
    d.ndim, d.ptr, d.dtype, d.itemsize, d.device, d.torch = ndim, NULL, t, type_size(t), -1, False
    for i in range(ndim - 1, -1, -1):
        d.shape[i], d.strides[i] = shape[i], stride
        stride *= shape[i]
    return d


cdef object decide_copies(const ArrayDesc* da, const ArrayDesc* db, const ArrayDesc* dc, bint has_out,
                    cudaDataType t, const BatchLayout* L0, BatchLayout* L, MatmulPlan* p):
    """Decide the copies, casts and temporaries of matmul(a, b, out), in the order the checks
    below meet them (L0: read_layout's of a and b; L receives the layout merged with the final
    target, which is the call's own when nothing is copied or allocated). Returns the reason
    for the first of them, as a capture refuses it (None: nothing is copied or allocated)."""
    p.empty = L0.M == 0 or L0.N == 0 or empty_batch(L0)
    p.new_result = not has_out
    p.copy_a = p.copy_b = p.via_temp = p.temp_like_out = False
    if p.empty:
        return None
    reason = None
    # The arrays as the GEMMs will see them: the caller's, or new C-ordered ones (ca, cb, ct).
    cdef const ArrayDesc* a = da
    cdef const ArrayDesc* b = db
    cdef const ArrayDesc* target = dc
    cdef const BatchLayout* cores = L0
    cdef ArrayDesc ca, cb, ct
    cdef BatchLayout recast
    if has_out and dc.dtype != t:       # computed in the promoted dtype, then cast into out as NumPy does
        reason = (f"out: its dtype {dtype_name(dc.dtype)} is not the result's ({dtype_name(t)}), so the "
                  "product goes to a new array first")
        p.via_temp = True
    if da.dtype != t or db.dtype != t:  # the narrower operand becomes a copy of the promoted dtype
        reason = reason or "a/b: mixing dtypes casts an operand into a new array"
        if da.dtype != t:
            p.copy_a = True
            a = _c_order(&ca, da.ndim, da.shape, t)
        if db.dtype != t:
            p.copy_b = True
            b = _c_order(&cb, db.ndim, db.shape, t)
        read_layout(a, b, &recast)
        cores = &recast
    if not has_out:
        reason = reason or "out: out=None allocates the result; pass out="
    cdef bint target_is_out = has_out and not p.via_temp
    if not target_is_out:
        target = _c_order(&ct, L0.out_ndim, L0.out_shape, t)
    cdef MatrixView va, vb, vc
    cdef ColMajorGemm g
    cdef MapResult r
    cdef int step
    for step in range(5):               # each step changes one array to a new C-ordered one
        if target_is_out and may_overlap_inputs(cores, target, a, b, p.copy_a, p.copy_b):
            reason = reason or "out: it shares memory with a or b, so the product goes to a new array first"
            p.via_temp, p.temp_like_out, target_is_out = True, True, False
            target = _c_order(&ct, L0.out_ndim, L0.out_shape, t)
        merge_out(cores, target, a, b, L)
        # A matrix cuBLAS cannot read in place (no unit-stride axis) is copied; one it cannot
        # write goes through a temporary.
        call_views(L, a, b, target, 0, 0, 0, &va, &vb, &vc)
        r = map_rowmajor_gemm(&va, &vb, &vc, False, False, &g)
        if r == MAP_OK:
            return reason
        if r == MAP_BAD_OUT and target_is_out:
            reason = reason or "out: cuBLAS cannot write its layout, so the product goes to a new array first"
            p.via_temp, p.temp_like_out, target_is_out = True, True, False
            target = _c_order(&ct, L0.out_ndim, L0.out_shape, t)
        elif r == MAP_BAD_A and a != &ca:
            reason = reason or "a: its matrices have no unit-stride axis, so it is copied"
            p.copy_a = True
            a = _c_order(&ca, a.ndim, a.shape, t)
        elif r == MAP_BAD_B and b != &cb:
            reason = reason or "b: its matrices have no unit-stride axis, so it is copied"
            p.copy_b = True
            b = _c_order(&cb, b.ndim, b.shape, t)
        else:
            break
        read_layout(a, b, &recast)
        cores = &recast
    raise RuntimeError("cygemm.matmul: no layout of new arrays maps to cuBLAS (internal error)")
