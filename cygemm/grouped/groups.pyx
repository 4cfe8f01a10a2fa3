# cython: language_level=3, boundscheck=False, wraparound=False
"""The groups of one grouped call (:func:`cygemm.grouped_gemm`, :func:`cygemm.moe_gemm`): each
group's views read and checked (shapes, one dtype, no output sharing memory with an input or
another output), mapped to cuBLAS (rowmajor's one mapping), which routes can run them and why not,
their key in the tuning table, cublasGemmGroupedBatchedEx's host arrays. No GPU but the device check.
"""
import operator
import threading

from libc.stdint cimport int64_t, uint32_t, uintptr_t
from libc.stdlib cimport malloc, free, qsort

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.engine.types cimport MatrixView, ColMajorGemm, pointer_alignment
from cygemm.engine.arrays cimport view_from_object, DTYPES_FLOAT
from cygemm.engine.dtypes cimport dtype_name, has_tf32, compute_type, DTYPES_INDEX, MATH_TF32
from cygemm.engine.overlap cimport views_overlap, check_no_overlap, view_byte_range
from cygemm.engine.args cimport (CallArgs, args_init, add_array, add_view, check_devices, expect_dtype, ARG_READ,
                                 ARG_WRITE, MAX_ARGS)
from cygemm.engine.context cimport known_device_count
from cygemm.engine.streams cimport stream_is_capturing
from cygemm.engine.launch cimport needs_64bit_api
from cygemm.engine.mapping cimport map_rowmajor_gemm, map_or_raise, MAP_OK
from cygemm.engine.context import add_capture_keepalive

# cuBLAS needs well-aligned pointers for half types and TF32 in its grouped and batched-pointer
# calls (misaligned ones fault); 16 bytes always suffices.
cdef uint32_t GROUPED_ALIGNMENT = 16

# Groups whose host arrays a capture under way recorded: the next graph captured on this thread
# keeps them (cuBLAS may read its host size arrays when the graph replays, not only now).
_tls_captured = threading.local()


def _captured_groups():
    kept = getattr(_tls_captured, "groups", [])
    _tls_captured.groups = []
    return kept


add_capture_keepalive(_captured_groups)


# ---------------------------------------------------------------- the groups of one call

ctypedef struct _Span:
    int64_t lo
    int64_t hi
    int64_t index           # into Groups.views


cdef int _span_order(const void* x, const void* y) noexcept nogil:
    cdef const _Span* a = <const _Span*>x
    cdef const _Span* b = <const _Span*>y
    return -1 if a.lo < b.lo else (1 if a.lo > b.lo else 0)


cdef void _span_of(const MatrixView* v, int64_t i, _Span* s) noexcept nogil:
    view_byte_range(v, &s.lo, &s.hi)
    s.index = i


cdef int64_t _drop_ended(int64_t* views, int64_t* ends, int64_t n, int64_t lo) noexcept nogil:
    """Keep the views (indices, with where each ends) that end past `lo`; their new count."""
    cdef int64_t j, k = 0
    for j in range(n):
        if ends[j] > lo:
            views[k], ends[k] = views[j], ends[j]
            k += 1
    return k


cdef int64_t _first_overlap(const MatrixView* v, const MatrixView* views, const int64_t* idx,
                            int64_t n) noexcept nogil:
    """The first of views[idx[0..n)] that shares memory with v, else -1."""
    cdef int64_t j
    for j in range(n):
        if views_overlap(v, &views[idx[j]]):
            return idx[j]
    return -1


cdef bint _same_view(const MatrixView* x, const MatrixView* y) noexcept nogil:
    return (x.ptr == y.ptr and x.rows == y.rows and x.cols == y.cols and x.row_stride == y.row_stride
            and x.col_stride == y.col_stride)


cdef class Groups:
    """The groups of one call as read and mapped (no GPU state): three views per group (A, B,
    out, as given), each group's cuBLAS arguments, the non-empty ones split by K, and what
    decides the routes."""
    def __dealloc__(self):
        free(self.views)
        free(self.act)
        free(self.act_index)
        free(self.zero_k)
        free(self.dims)
        free(self.ops)
        free(self.scalars)
        free(self.ones)

    cdef int alloc(self, int64_t n) except -1:
        cdef size_t k = <size_t>(n if n > 0 else 1)
        self.n = n
        self.views = <MatrixView*>malloc(3 * k * sizeof(MatrixView))
        self.act = <ColMajorGemm*>malloc(k * sizeof(ColMajorGemm))
        self.act_index = <int64_t*>malloc(k * sizeof(int64_t))
        self.zero_k = <ColMajorGemm*>malloc(k * sizeof(ColMajorGemm))
        if self.views == NULL or self.act == NULL or self.act_index == NULL or self.zero_k == NULL:
            raise MemoryError()
        return 0

    cdef str name(self, int64_t i, int role):
        """The argument that group i's A (role 0), B (1) or out (2) came from."""
        if self.offsets is None:
            return f"{('As', 'Bs', 'outs')[role]}[{i}]"
        arg, ragged = self.roles[role]
        return f"{arg}[{self.offsets[i]}:{self.offsets[i + 1]}]" if ragged else f"{arg}[{i}]"

    cdef int finish(self) except -1:
        """Map every group (rowmajor's mapping, its message on failure), split the non-empty
        groups by K and decide what the routes need. The views are read and their shapes,
        dtypes and overlaps checked by then."""
        cdef int64_t i, M, N, K
        cdef MatrixView* a
        cdef ColMajorGemm g
        self.n_act = self.n_zero_k = 0
        self.macs = 0
        for i in range(self.n):
            a = &self.views[3 * i]
            M = a.cols if self.trans_a else a.rows
            K = a.rows if self.trans_a else a.cols
            N = self.views[3 * i + 2].cols
            if M == 0 or N == 0:
                continue                # nothing to write: its layout does not matter
            if map_rowmajor_gemm(a, a + 1, a + 2, self.trans_a, self.trans_b, &g) != MAP_OK:
                map_or_raise(a, a + 1, a + 2, self.trans_a, self.trans_b, &g,
                             (self.name(i, 0), self.name(i, 1), self.name(i, 2)))
            g.strided_batched = False
            g.batch, g.stride_a, g.stride_b, g.stride_c = 1, 0, 0, 0
            if K == 0:
                self.zero_k[self.n_zero_k] = g
                self.n_zero_k += 1
            else:
                self.act[self.n_act] = g
                self.act_index[self.n_act] = i
                self.n_act += 1
                self.macs += <double>M * N * K
        self.align = 256
        for i in range(self.n_act):
            self.align = min(self.align, pointer_alignment(self.act[i].a), pointer_alignment(self.act[i].b),
                             pointer_alignment(self.act[i].c))
        self.why_batched = self._batched()
        return 0

    cdef object _batched(self):
        """None when the active groups are one strided-batched GEMM (filling self.batched),
        else why they are not."""
        if self.n_act == 0:
            return None
        cdef const ColMajorGemm* g0 = &self.act[0]
        cdef const ColMajorGemm* g
        cdef int64_t i, d_a = 0, d_b = 0, d_c = 0, w = self.itemsize
        if self.n_act > 1:
            d_a = <int64_t><uintptr_t>self.act[1].a - <int64_t><uintptr_t>g0.a
            d_b = <int64_t><uintptr_t>self.act[1].b - <int64_t><uintptr_t>g0.b
            d_c = <int64_t><uintptr_t>self.act[1].c - <int64_t><uintptr_t>g0.c
        for i in range(1, self.n_act):
            g = &self.act[i]
            if (g.opa != g0.opa or g.opb != g0.opb or g.m != g0.m or g.n != g0.n or g.k != g0.k
                    or g.lda != g0.lda or g.ldb != g0.ldb or g.ldc != g0.ldc):
                j, j0 = self.act_index[i], self.act_index[0]
                return (f"groups differ in size, leading dimension or layout (group {j0}: "
                        f"{_describe_g(g0)}; group {j}: {_describe_g(g)})")
            if (<int64_t><uintptr_t>g.a - <int64_t><uintptr_t>g0.a != i * d_a
                    or <int64_t><uintptr_t>g.b - <int64_t><uintptr_t>g0.b != i * d_b
                    or <int64_t><uintptr_t>g.c - <int64_t><uintptr_t>g0.c != i * d_c):
                return (f"the groups' matrices are not at constant strides (group "
                        f"{self.act_index[i]} breaks the stride of the first two)")
        if d_a < 0 or d_b < 0 or d_c < 0 or d_a % w or d_b % w or d_c % w:
            return "the groups' matrices are not at non-negative strides of whole elements"
        self.batched = g0[0]
        self.batched.strided_batched = True
        self.batched.batch = self.n_act
        self.batched.stride_a, self.batched.stride_b, self.batched.stride_c = d_a // w, d_b // w, d_c // w
        return None

    cdef object why_not(self, int route, cublasComputeType_t compute):
        """None when `route` can run these groups, else why it cannot (nothing to run: any)."""
        cdef int64_t i
        if self.n_act == 0 or route == R_LOOP:
            return None
        if route == R_BATCHED:
            return self.why_batched
        if route == R_STREAMS:
            return None if self.n_act >= 2 else "needs two or more non-empty groups"
        for i in range(self.n_act):
            if needs_64bit_api(&self.act[i]):
                return (f"group {self.act_index[i]} has a size or leading dimension past 2**31 - 1 "
                        "(cublasGemmGroupedBatchedEx takes int)")
        if ((not has_tf32(self.dtype) or compute == compute_type(self.dtype, MATH_TF32))    # (strict fp32: any)
                and self.align < GROUPED_ALIGNMENT):
            return (f"a matrix is only {self.align}-byte aligned; cublasGemmGroupedBatchedEx needs "
                    f"{GROUPED_ALIGNMENT}-byte aligned pointers for {dtype_name(self.dtype)}"
                    + (" with TF32" if has_tf32(self.dtype) else ""))
        return None

    cdef int check_disjoint(self) except -1:
        """ValueError unless every output shares memory with no input and no other output.
        A sweep over the views' byte ranges, exact tests (views_overlap) only where ranges
        meet: a weight shared by every group is one input, not G."""
        cdef int64_t nv = 3 * self.n, m = 0, i, j, k, n_out = 0, n_in = 0, idx, other
        cdef _Span* spans = <_Span*>malloc(<size_t>(nv if nv > 0 else 1) * sizeof(_Span))
        cdef int64_t* outs = <int64_t*>malloc(<size_t>(nv if nv > 0 else 1) * sizeof(int64_t))
        cdef int64_t* ins = <int64_t*>malloc(<size_t>(nv if nv > 0 else 1) * sizeof(int64_t))
        cdef int64_t* hi_out = <int64_t*>malloc(<size_t>(nv if nv > 0 else 1) * sizeof(int64_t))
        cdef int64_t* hi_in = <int64_t*>malloc(<size_t>(nv if nv > 0 else 1) * sizeof(int64_t))
        cdef const MatrixView* v
        cdef bint dup
        other = -1
        idx = -1
        try:
            if spans == NULL or outs == NULL or ins == NULL or hi_out == NULL or hi_in == NULL:
                raise MemoryError()
            with nogil:
                for i in range(nv):
                    v = &self.views[i]
                    if v.rows > 0 and v.cols > 0:
                        _span_of(v, i, &spans[m])
                        m += 1
                qsort(spans, m, sizeof(_Span), _span_order)
                for i in range(m):
                    # Drop what ends before this view begins: it meets nothing further on.
                    n_out = _drop_ended(outs, hi_out, n_out, spans[i].lo)
                    n_in = _drop_ended(ins, hi_in, n_in, spans[i].lo)
                    idx = spans[i].index
                    v = &self.views[idx]
                    other = _first_overlap(v, self.views, outs, n_out)
                    if other >= 0:
                        break
                    if idx % 3 == 2:
                        other = _first_overlap(v, self.views, ins, n_in)
                        if other >= 0:
                            break
                        outs[n_out], hi_out[n_out] = idx, spans[i].hi
                        n_out += 1
                    else:
                        dup = False
                        for j in range(n_in):
                            if _same_view(v, &self.views[ins[j]]):
                                dup = True
                                break
                        if not dup:
                            ins[n_in], hi_in[n_in] = idx, spans[i].hi
                            n_in += 1
            if other >= 0:
                if idx % 3 != 2 or (other % 3 == 2 and other > idx):
                    idx, other = other, idx         # name an output first, the later group's
                check_no_overlap(&self.views[idx], self.name(idx // 3, idx % 3), &self.views[other],
                                 self.name(other // 3, other % 3))
        finally:
            free(spans); free(outs); free(ins); free(hi_out); free(hi_in)
        return 0

    cdef int host_arrays(self, float alpha, float beta, cudaStream_t stream) except -1:
        """cublasGemmGroupedBatchedEx's size, transpose and scalar arrays (the sizes fit int:
        why_not checked). During a capture the graph keeps self (cuBLAS may read these arrays
        when the graph replays, not only now)."""
        if stream_is_capturing(stream):
            if not hasattr(_tls_captured, "groups"):
                _tls_captured.groups = []
            _tls_captured.groups.append(self)
        cdef int64_t i, n = self.n_act
        cdef size_t k = <size_t>(n if n > 0 else 1)
        cdef const ColMajorGemm* g
        if not self.host_filled:
            self.dims = <int*>malloc(6 * k * sizeof(int))
            self.ops = <cublasOperation_t*>malloc(2 * k * sizeof(cublasOperation_t))
            self.scalars = <float*>malloc(2 * k * sizeof(float))
            self.ones = <int*>malloc(k * sizeof(int))
            if self.dims == NULL or self.ops == NULL or self.scalars == NULL or self.ones == NULL:
                raise MemoryError()
            for i in range(n):
                g = &self.act[i]
                self.dims[i], self.dims[n + i], self.dims[2 * n + i] = <int>g.m, <int>g.n, <int>g.k
                self.dims[3 * n + i], self.dims[4 * n + i], self.dims[5 * n + i] = <int>g.lda, <int>g.ldb, <int>g.ldc
                self.ops[i], self.ops[n + i] = g.opa, g.opb
                self.ones[i] = 1
            self.host_filled = True
        elif self.host_alpha == alpha and self.host_beta == beta:
            return 0
        for i in range(n):
            self.scalars[i], self.scalars[n + i] = alpha, beta
        self.host_alpha, self.host_beta = alpha, beta
        return 0

    cdef tuple key(self, cublasComputeType_t compute):
        """The problem's key in the tuning table: what changes which route is fastest (not the
        scalars: beta != 0 calls take what beta 0 timed)."""
        parts = ["grouped", <int>self.dtype, <int>compute, bool(self.trans_a), bool(self.trans_b),
                 self.why_batched is None, <int>self.align, self.n_act]
        cdef int64_t i
        cdef const ColMajorGemm* g
        for i in range(self.n_act):
            g = &self.act[i]
            parts += [<int>g.opa, <int>g.opb, g.m, g.n, g.k, g.lda, g.ldb, g.ldc]
        return tuple(parts)


cdef str _describe_g(const ColMajorGemm* g):
    opa = "T" if g.opa == CUBLAS_OP_T else "N"
    opb = "T" if g.opb == CUBLAS_OP_T else "N"
    return f"cuBLAS {opa}{opb} m={g.m} n={g.n} k={g.k} lda={g.lda} ldb={g.ldb} ldc={g.ldc}"


# ---------------------------------------------------------------- reading the arguments

cdef Groups read_lists(object As, object Bs, object outs, bint trans_a, bint trans_b):
    """grouped_gemm's groups: 2-D matrices of one dtype whose shapes multiply, group by group."""
    for arg, name in ((As, "As"), (Bs, "Bs"), (outs, "outs")):
        if any(hasattr(arg, a) for a in ("shape", "__cuda_array_interface__", "__dlpack__")):   # (its rows)
            raise TypeError(f"{name}: expected a list of matrices, one per group, got one array of "
                            f"{type(arg).__name__} (one group: [{name[:-1]}])")
    try:
        n = len(As)
    except TypeError:
        raise TypeError(f"As: expected a sequence of device arrays, got {type(As).__name__}") from None
    for arg, name in ((Bs, "Bs"), (outs, "outs")):
        try:
            k = len(arg)
        except TypeError:
            raise TypeError(f"{name}: expected a sequence of device arrays, got {type(arg).__name__}") from None
        if k != n:
            raise ValueError(f"{name}: expected one matrix per group, as As has ({n}), got {k}")
    cdef Groups grp = Groups()
    grp.alloc(n)
    grp.trans_a, grp.trans_b = trans_a, trans_b
    cdef int64_t i, M, K, K2, N
    cdef MatrixView* a
    cdef MatrixView* b
    cdef MatrixView* c
    for i in range(n):
        a, b, c = &grp.views[3 * i], &grp.views[3 * i + 1], &grp.views[3 * i + 2]
        na, nb, nc = f"As[{i}]", f"Bs[{i}]", f"outs[{i}]"
        view_from_object(As[i], a, na, 2, 2, DTYPES_FLOAT, &grp.torch)
        view_from_object(Bs[i], b, nb, 2, 2, DTYPES_FLOAT, &grp.torch)
        view_from_object(outs[i], c, nc, 2, 2, DTYPES_FLOAT, &grp.torch)
        if i == 0:
            grp.dtype, grp.itemsize = a.dtype, a.itemsize
        else:
            expect_dtype(a, na, grp.dtype, "As[0]")
        expect_dtype(b, nb, grp.dtype, "As[0]")
        expect_dtype(c, nc, grp.dtype, "As[0]")
        M = a.cols if trans_a else a.rows
        K = a.rows if trans_a else a.cols
        K2 = b.cols if trans_b else b.rows
        N = b.rows if trans_b else b.cols
        if K != K2:
            raise ValueError(f"{nb}: op({na}) is {M}x{K} (trans_a={bool(trans_a)}) so op({nb}) must have "
                             f"{K} rows, got {K2}x{N} (trans_b={bool(trans_b)})")
        if c.rows != M or c.cols != N:
            raise ValueError(f"{nc}: expected shape ({M}, {N}), got ({c.rows}, {c.cols})")
    if n == 0:
        grp.dtype, grp.itemsize = CUDA_R_32F, 4
    grp.check_disjoint()
    grp.finish()
    return grp


cdef list read_offsets(object group_offsets, int64_t G, int64_t T):
    try:
        offs = [operator.index(o) for o in group_offsets]
    except TypeError:
        raise TypeError(f"group_offsets: expected a host sequence of ints, got {group_offsets!r:.80}") from None
    if len(offs) != G + 1:
        raise ValueError(f"group_offsets: expected G + 1 = {G + 1} offsets (w holds {G} experts), "
                         f"got {len(offs)}")
    if offs[0] != 0:
        raise ValueError(f"group_offsets: expected group_offsets[0] == 0, got {offs[0]}")
    for g in range(G):
        if offs[g + 1] < offs[g]:
            raise ValueError(f"group_offsets: expected non-decreasing offsets, got group_offsets[{g + 1}] "
                             f"= {offs[g + 1]} < group_offsets[{g}] = {offs[g]}")
    if offs[G] != T:
        raise ValueError(f"group_offsets: expected the last offset to be T = {T} (the rows of x), got {offs[G]}")
    return offs


cdef int64_t read_moe_args(CallArgs* c, object x, object b, object offsets, object out, str layout,
                           bint wgrad) except -1:
    """A mixture-of-experts call's x, b (w; dy for wgrad) and out (dw) read into c, device offsets
    (not None: length and values the caller's to check) between b and out. Returns G."""
    bname, oname, lname = ("dy", "dw", "dw_layout") if wgrad else ("w", "out", "w_layout")
    if layout != "kn" and layout != "nk":
        raise ValueError(f"{lname}: expected 'kn' ({oname if wgrad else bname} is (G, K, N)) or 'nk' "
                         f"({oname if wgrad else bname} is (G, N, K)), got {layout!r}")
    cdef bint nk = layout == "nk"
    cdef int bdims = 2 if wgrad else 3          # (out: 5 - bdims)
    args_init(c)
    cdef MatrixView* xv = add_array(c, x, "x", ARG_READ, 2, 2)
    cdef MatrixView* bv = add_array(c, b, bname, ARG_READ, bdims, bdims)
    if offsets is not None:
        add_array(c, offsets, "group_offsets", ARG_READ, 1, 1, DTYPES_INDEX)
    cdef MatrixView* ov = add_array(c, out, oname, ARG_WRITE, 5 - bdims, 5 - bdims)
    expect_dtype(bv, bname, xv.dtype, "x")
    expect_dtype(ov, oname, xv.dtype, "x")
    cdef int64_t T = xv.rows, K = xv.cols, G, N
    if wgrad:
        N, G = bv.cols, ov.batch
        if bv.rows != T:
            raise ValueError(f"dy: expected {T} rows (the rows of x), got shape ({bv.rows}, {bv.cols})")
        if (ov.rows, ov.cols) != ((N, K) if nk else (K, N)):
            raise ValueError(f"dw: expected shape (G, {N if nk else K}, {K if nk else N}) for dw_layout={layout!r}, "
                             f"got ({G}, {ov.rows}, {ov.cols})")
        return G
    G, N = bv.batch, (bv.rows if nk else bv.cols)
    if (bv.cols if nk else bv.rows) != K:
        want = f"(G, N, {K})" if nk else f"(G, {K}, N)"
        raise ValueError(f"w: x is ({T}, {K}) so w must be {want} for w_layout={layout!r}, got "
                         f"({G}, {bv.rows}, {bv.cols})")
    if ov.rows != T or ov.cols != N:
        raise ValueError(f"out: expected shape ({T}, {N}), got ({ov.rows}, {ov.cols})")
    return G


cdef Groups _moe_groups(const MatrixView* av, const MatrixView* bv, const MatrixView* ov, list offs, int ragged,
                        bint trans_a, bint trans_b, tuple roles):
    """The G groups of a mixture-of-experts call as views: the operands whose bit in `ragged`
    is set (1: A, 2: B, 4: out) give each expert its rows offs[g]:offs[g+1], the others their
    g-th matrix."""
    cdef int64_t G = len(offs) - 1
    cdef Groups grp = Groups()
    grp.alloc(G)
    grp.trans_a, grp.trans_b, grp.offsets, grp.roles = trans_a, trans_b, offs, roles
    grp.dtype, grp.itemsize = av.dtype, av.itemsize
    cdef int64_t g, r0, r1, i, isz = av.itemsize
    cdef const MatrixView* src[3]
    src[0], src[1], src[2] = av, bv, ov
    cdef MatrixView* v
    for g in range(G):
        r0, r1 = offs[g], offs[g + 1]
        for i in range(3):
            v = &grp.views[3 * g + i]
            v[0] = src[i][0]
            if ragged >> i & 1:
                v.ptr = src[i].ptr + r0 * src[i].row_stride * isz
                v.rows = r1 - r0
            else:
                v.ptr = src[i].ptr + g * src[i].batch_stride * isz
                v.batch, v.batch_stride = 1, 0
    grp.finish()
    return grp


cdef int check_experts_disjoint(const MatrixView* ov, str name) except -1:
    # The experts' matrices are one batch stride apart: a regular stride that keeps the first two
    # apart keeps every pair apart.
    cdef MatrixView first = ov[0], second = ov[0]
    first.batch = second.batch = 1
    second.ptr = ov.ptr + ov.batch_stride * ov.itemsize
    if ov.batch >= 2 and views_overlap(&first, &second):
        raise ValueError(f"{name}: its experts' matrices overlap (a batch stride of {ov.batch_stride} elements for "
                         f"{ov.rows} x {ov.cols} matrices): each expert needs its own")
    return 0


cdef Groups read_moe(CallArgs* c, object x, object b, object group_offsets, object out, str layout, bint wgrad):
    """moe_gemm's groups (b: w) or moe_gemm_wgrad's (b: dy; an expert without rows gets dw[g] = 0,
    a K == 0 GEMM) as views of x, b and out, read into c too (checked as a whole)."""
    cdef int64_t G = read_moe_args(c, x, b, None, out, layout, wgrad)
    cdef bint nk = layout == "nk"
    offs = read_offsets(group_offsets, G, c.views[0].rows)
    if not wgrad:
        return _moe_groups(&c.views[0], &c.views[1], &c.views[2], offs, 0b101, False, nk,
                           (("x", True), ("w", False), ("out", True)))
    check_experts_disjoint(&c.views[2], "dw")
    # kn: dw[g] (K, N) = x[a:b].T @ dy[a:b]; nk: dw[g] (N, K) = dy[a:b].T @ x[a:b]
    return _moe_groups(&c.views[1] if nk else &c.views[0], &c.views[0] if nk else &c.views[1], &c.views[2], offs,
                       0b011, True, False, (("dy" if nk else "x", True), ("x" if nk else "dy", True), ("dw", False)))


cdef int check_group_devices(CallArgs* c, Groups grp) except -1:
    """Every view's device against the call's (several GPUs only), MAX_ARGS views at a time
    through the one argument path's check."""
    if known_device_count() < 2:
        return 0
    cdef int64_t i
    names = []          # alive while c borrows them
    for i in range(3 * grp.n):
        if c.n == MAX_ARGS:
            check_devices(c)
            c.n = 0
            names = []
        name = grp.name(i // 3, i % 3)
        names.append(name)
        add_view(c, &grp.views[i], name, ARG_READ, grp.torch)
    check_devices(c)
    c.n = 0
    return 0
