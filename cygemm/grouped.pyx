# cython: language_level=3, boundscheck=False, wraparound=False
"""Grouped GEMMs: G independent row-major GEMMs of any sizes in one call (:func:`grouped_gemm`),
and the mixture-of-experts form over one token matrix sorted by expert (:func:`moe_gemm`).

Every group is read, mapped to cuBLAS (rowmajor's one mapping) and checked before anything is
enqueued. The groups then run by one of four routes (``ROUTES``): one
``cublasGemmGroupedBatchedEx``, one strided-batched GEMM when the groups are uniform, a loop of
plain GEMMs, or that loop spread over the caller's stream and its side stream. Large problems
time the routes that apply once and keep the fastest (the tuning table, kind "grouped"); small
ones take a fixed rule. Nothing allocates device memory: the grouped route's pointer arrays are
written by a kernel into the stream's table (see ``_context.stream_table``), so every route can
be captured into a CUDA graph.
"""
import operator
import threading

from libc.stdint cimport int64_t, uint32_t, uintptr_t
from libc.stdlib cimport malloc, free, qsort

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.kernels.grouped cimport (cygemm_ptr_triples, cygemm_write_pointer_table,
                                     CYGEMM_GROUPED_PTRS_PER_LAUNCH)
from cygemm._types cimport MatrixView, ColMajorGemm, Math, compute_type, pointer_alignment
from cygemm._errors cimport check_cuda, check_cublas
from cygemm._arrays cimport view_from_object, views_overlap, check_no_overlap, dtype_name
from cygemm._args cimport (CallArgs, args_init, add_array, add_view, resolve_call, check_overlaps,
                           check_devices, expect_dtype, parse_math, ARG_READ, ARG_WRITE, MAX_ARGS)
from cygemm._context cimport (GemmContext, bind_stream, stream_table, fork_side, join_side,
                              known_device_count, STREAM_TABLE_BYTES)
from cygemm._streams cimport stream_is_capturing
from cygemm._launch cimport needs_64bit_api
from cygemm._layer cimport time_routes
from cygemm._settings cimport autotune_level, AUTOTUNE_OFF
from cygemm.plans cimport run_gemm
from cygemm.tuning cimport worth_tuning, tuned_route, forced_route, remember_route
from cygemm._mapping cimport map_rowmajor_gemm, map_or_raise, MAP_OK
from cygemm import tuning


# ---------------------------------------------------------------- route table

# In the order the fixed rule prefers them.
cdef enum Route:
    R_BATCHED = 0
    R_GROUPED = 1
    R_LOOP = 2
    R_STREAMS = 3
    N_ROUTES = 4

ROUTES = {
    "batched": "one strided-batched GEMM (the plan layer's choice): the groups share their sizes, "
               "leading dimensions and transposes, and their A, B and out advance by constant strides",
    "grouped": "cublasGemmGroupedBatchedEx, one group per GEMM; its pointer arrays written on the "
               "stream by cygemm's kernel (2730 GEMMs per cuBLAS call, larger G in several calls)",
    "loop": "each GEMM through the plan layer on the caller's stream, one after another",
    "streams": "the loop with the groups alternating between the caller's stream and its side "
               "stream (forked and joined back with events; a captured graph has two branches)",
}
_NAMES = ("batched", "grouped", "loop", "streams")
tuning.register_routes("grouped", _NAMES)

# cublasGemmGroupedBatchedEx reads A, B and C pointers from device memory: the stream's table
# holds, per cuBLAS call, `count` A pointers, then `count` B pointers, then `count` C pointers.
cdef int64_t PER_CALL = STREAM_TABLE_BYTES // (3 * sizeof(void*))       # 2730
# The fixed rule's threshold for the grouped route over the loop: below it the loop's few
# launches cost no more than the pointer kernels and the grouped call's setup.
cdef int64_t GROUPED_MIN_GROUPS = 8
# Problems of more groups are not timed (fixed rule): their keys, one entry per group, would
# bloat the tuning file, and the grouped route's one-call form is then the sensible choice.
cdef int64_t MAX_TUNED_GROUPS = 1024
# cuBLAS needs well-aligned pointers for half types and TF32 in its grouped and batched-pointer
# calls (misaligned ones fault); 16 bytes always suffices.
cdef uint32_t GROUPED_ALIGNMENT = 16

_tls = threading.local()


def last_route():
    """The route the calling thread's last grouped call ran.

    Returns
    -------
    str or None
        A name of ``ROUTES``; None before any call, or when the last call launched nothing (no
        group, or only empty ones). A call whose only non-empty groups have K == 0 (out scaled
        by beta, each through the plan layer) reports "loop".

    Raises
    ------
    Nothing.
    """
    return getattr(_tls, "route", None)


# ---------------------------------------------------------------- the groups of one call

ctypedef struct _Span:
    int64_t lo
    int64_t hi
    int64_t index           # into _Groups.views


cdef int _span_order(const void* x, const void* y) noexcept nogil:
    cdef const _Span* a = <const _Span*>x
    cdef const _Span* b = <const _Span*>y
    return -1 if a.lo < b.lo else (1 if a.lo > b.lo else 0)


cdef void _span_of(const MatrixView* v, int64_t i, _Span* s) noexcept nogil:
    """The bytes a non-empty 2-D view can touch."""
    cdef int64_t lo = <int64_t><uintptr_t>v.ptr, hi = lo + v.itemsize, d
    d = (v.rows - 1) * v.row_stride * v.itemsize
    if d < 0:
        lo += d
    else:
        hi += d
    d = (v.cols - 1) * v.col_stride * v.itemsize
    if d < 0:
        lo += d
    else:
        hi += d
    s.lo, s.hi, s.index = lo, hi, i


cdef bint _same_view(const MatrixView* x, const MatrixView* y) noexcept nogil:
    return (x.ptr == y.ptr and x.rows == y.rows and x.cols == y.cols and x.row_stride == y.row_stride
            and x.col_stride == y.col_stride)


cdef class _Groups:
    """The groups of one call as read and mapped (no GPU state): three views per group (A, B,
    out, as given), each group's cuBLAS arguments, the non-empty ones split by K, and what
    decides the routes."""
    cdef MatrixView* views          # views[3 i + 0, 1, 2]: As[i], Bs[i], outs[i]
    cdef ColMajorGemm* act          # groups with M, N, K > 0, in order
    cdef int64_t* act_index         # their group numbers
    cdef ColMajorGemm* zero_k       # groups with M, N > 0 and K == 0: out = beta out
    cdef int64_t n, n_act, n_zero_k
    cdef cudaDataType dtype
    cdef int itemsize
    cdef bint trans_a, trans_b
    cdef object offsets             # moe_gemm: the group offsets (names), else None
    cdef double macs
    cdef uint32_t align             # the smallest alignment of any active group's pointer
    cdef ColMajorGemm batched       # the strided-batched GEMM, where that route applies
    cdef object why_batched         # None: the batched route applies; else why not
    # cublasGemmGroupedBatchedEx's host arrays, n_act each (filled when that route first runs)
    cdef int* dims                  # m, n, k, lda, ldb, ldc: six arrays one after another
    cdef cublasOperation_t* ops     # opa, then opb
    cdef float* scalars             # alpha, then beta
    cdef int* ones                  # group sizes: one GEMM per group
    cdef bint host_filled
    cdef float host_alpha, host_beta

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
        if role == 1:
            return f"w[{i}]"
        return f"{('x', '', 'out')[role]}[{self.offsets[i]}:{self.offsets[i + 1]}]"

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
        if ((self.dtype != CUDA_R_32F or compute == CUBLAS_COMPUTE_32F_FAST_TF32)
                and self.align < GROUPED_ALIGNMENT):
            return (f"a matrix is only {self.align}-byte aligned; cublasGemmGroupedBatchedEx needs "
                    f"{GROUPED_ALIGNMENT}-byte aligned pointers for {dtype_name(self.dtype)}"
                    + (" with TF32" if self.dtype == CUDA_R_32F else ""))
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
                    k = 0
                    for j in range(n_out):
                        if hi_out[j] > spans[i].lo:
                            outs[k], hi_out[k] = outs[j], hi_out[j]
                            k += 1
                    n_out = k
                    k = 0
                    for j in range(n_in):
                        if hi_in[j] > spans[i].lo:
                            ins[k], hi_in[k] = ins[j], hi_in[j]
                            k += 1
                    n_in = k
                    idx = spans[i].index
                    v = &self.views[idx]
                    for j in range(n_out):
                        if views_overlap(v, &self.views[outs[j]]):
                            other = outs[j]
                            break
                    if other >= 0:
                        break
                    if idx % 3 == 2:
                        for j in range(n_in):
                            if views_overlap(v, &self.views[ins[j]]):
                                other = ins[j]
                                break
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
            free(spans)
            free(outs)
            free(ins)
            free(hi_out)
            free(hi_in)
        return 0

    cdef int fill_host_arrays(self, float alpha, float beta) except -1:
        """cublasGemmGroupedBatchedEx's size, transpose and scalar arrays (the sizes fit int:
        why_not checked)."""
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

cdef _Groups _read_lists(object As, object Bs, object outs, bint trans_a, bint trans_b):
    """grouped_gemm's groups: 2-D matrices of one dtype whose shapes multiply, group by group."""
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
    cdef _Groups grp = _Groups()
    grp.alloc(n)
    grp.trans_a, grp.trans_b = trans_a, trans_b
    cdef int64_t i, M, K, K2, N
    cdef MatrixView* a
    cdef MatrixView* b
    cdef MatrixView* c
    for i in range(n):
        a, b, c = &grp.views[3 * i], &grp.views[3 * i + 1], &grp.views[3 * i + 2]
        na, nb, nc = f"As[{i}]", f"Bs[{i}]", f"outs[{i}]"
        view_from_object(As[i], a, na, 2, 2)
        view_from_object(Bs[i], b, nb, 2, 2)
        view_from_object(outs[i], c, nc, 2, 2)
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


cdef list _read_offsets(object group_offsets, int64_t G, int64_t T):
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


cdef _Groups _read_moe(CallArgs* c, object x, object w, object group_offsets, object out, str w_layout):
    """moe_gemm's groups as views of x, w and out (x and out row blocks, w's matrices), read
    into c too (x, w, out: their overlaps and devices are checked as a whole)."""
    if w_layout != "kn" and w_layout != "nk":
        raise ValueError(f"w_layout: expected 'kn' (w is (G, K, N)) or 'nk' (w is (G, N, K)), got {w_layout!r}")
    cdef bint nk = w_layout == "nk"
    args_init(c)
    cdef MatrixView* xv = add_array(c, x, "x", ARG_READ, 2, 2)
    cdef MatrixView* wv = add_array(c, w, "w", ARG_READ, 3, 3)
    cdef MatrixView* ov = add_array(c, out, "out", ARG_WRITE, 2, 2)
    expect_dtype(wv, "w", xv.dtype, "x")
    expect_dtype(ov, "out", xv.dtype, "x")
    cdef int64_t T = xv.rows, K = xv.cols, G = wv.batch
    cdef int64_t N = wv.rows if nk else wv.cols
    cdef int64_t Kw = wv.cols if nk else wv.rows
    if Kw != K:
        want = f"(G, N, {K})" if nk else f"(G, {K}, N)"
        raise ValueError(f"w: x is ({T}, {K}) so w must be {want} for w_layout={w_layout!r}, got "
                         f"({G}, {wv.rows}, {wv.cols})")
    offs = _read_offsets(group_offsets, G, T)
    if ov.rows != T or ov.cols != N:
        raise ValueError(f"out: expected shape ({T}, {N}), got ({ov.rows}, {ov.cols})")
    cdef _Groups grp = _Groups()
    grp.alloc(G)
    grp.trans_a, grp.trans_b, grp.offsets = False, nk, offs
    grp.dtype, grp.itemsize = xv.dtype, xv.itemsize
    cdef int64_t g, r0, r1, w_bytes = wv.itemsize
    cdef MatrixView* v
    for g in range(G):
        r0, r1 = offs[g], offs[g + 1]
        v = &grp.views[3 * g]
        v[0] = xv[0]
        v[0].ptr = xv.ptr + r0 * xv.row_stride * w_bytes
        v[0].rows = r1 - r0
        v[1] = wv[0]
        v[1].ptr = wv.ptr + g * wv.batch_stride * w_bytes
        v[1].batch, v[1].batch_stride = 1, 0
        v[2] = ov[0]
        v[2].ptr = ov.ptr + r0 * ov.row_stride * w_bytes
        v[2].rows = r1 - r0
    grp.finish()
    return grp


# ---------------------------------------------------------------- running the routes

ctypedef struct GroupedCall:
    GemmContext* ctx
    cudaStream_t s
    cudaDataType dtype
    cublasComputeType_t compute
    float alpha
    float beta
    int autotune
    const ColMajorGemm* gs          # the active groups
    int64_t n
    const ColMajorGemm* batched     # where that route applies
    # cublasGemmGroupedBatchedEx's host arrays (see _Groups)
    const int* dims
    const cublasOperation_t* ops
    const float* scalars
    const int* ones


cdef int _run_grouped(const GroupedCall* f) except -1 nogil:
    """cublasGemmGroupedBatchedEx over the groups, PER_CALL at a time. Each chunk's pointers go
    into the stream's table by kernel (by value: no host memory is read later, so a graph
    replays them), then cuBLAS reads them there; work on one stream is serial, so the next
    chunk's table rewrite waits for the previous GEMMs."""
    cdef cygemm_ptr_triples t
    cdef const void** table = <const void**>stream_table(f.ctx, f.s)
    cdef const void** ta
    cdef const void** tb
    cdef void** tc
    cdef int64_t start = 0, count, base, j, step, n = f.n
    cdef const ColMajorGemm* g
    cdef const int* d = f.dims
    while start < n:
        count = min(PER_CALL, n - start)
        ta, tb, tc = table, table + count, <void**>(table + 2 * count)
        base = 0
        while base < count:
            step = min(<int64_t>CYGEMM_GROUPED_PTRS_PER_LAUNCH, count - base)
            for j in range(step):
                g = &f.gs[start + base + j]
                t.a[j], t.b[j], t.c[j] = g.a, g.b, g.c
            check_cuda(cygemm_write_pointer_table(&t, <int>step, ta + base, tb + base, tc + base, f.s),
                       "cygemm_write_pointer_table")
            base += step
        bind_stream(f.ctx, f.s)
        check_cublas(cublasGemmGroupedBatchedEx(
            f.ctx.blas, f.ops + start, f.ops + n + start, d + start, d + n + start, d + 2 * n + start,
            f.scalars + start, <const void* const*>ta, f.dtype, d + 3 * n + start,
            <const void* const*>tb, f.dtype, d + 4 * n + start, f.scalars + n + start,
            <void* const*>tc, f.dtype, d + 5 * n + start, <int>count, f.ones, f.compute),
            "cublasGemmGroupedBatchedEx")
        start += count
    return 0


# Groups whose host arrays a capture under way recorded: the next graph captured on this thread
# keeps them (cuBLAS may read its host size arrays when the graph replays, not only now).
_tls_captured = threading.local()


def _captured_groups():
    kept = getattr(_tls_captured, "groups", [])
    _tls_captured.groups = []
    return kept


from cygemm._context import add_capture_keepalive
add_capture_keepalive(_captured_groups)


cdef int _bind_host_arrays(_Groups grp, GroupedCall* f) except -1:
    grp.fill_host_arrays(f.alpha, f.beta)
    f.dims, f.ops, f.scalars, f.ones = grp.dims, grp.ops, grp.scalars, grp.ones
    if stream_is_capturing(f.s):
        if not hasattr(_tls_captured, "groups"):
            _tls_captured.groups = []
        _tls_captured.groups.append(grp)
    return 0


cdef int _run_route(GroupedCall* f, int route) except -1:
    cdef int64_t i
    cdef cudaStream_t side
    cdef cudaEvent_t join
    if route == R_GROUPED:
        with nogil:
            _run_grouped(f)
        return 0
    if route == R_BATCHED:
        with nogil:
            run_gemm(f.ctx, f.s, f.batched, f.dtype, f.compute, &f.alpha, &f.beta, f.autotune)
        return 0
    if route == R_LOOP:
        with nogil:
            for i in range(f.n):
                run_gemm(f.ctx, f.s, &f.gs[i], f.dtype, f.compute, &f.alpha, &f.beta, f.autotune)
        return 0
    # R_STREAMS: every other group on the side stream (its own workspace), joined back after.
    with nogil:             # the first fork creates the stream and allocates its workspace
        fork_side(f.ctx, f.s, &side, &join)
    try:
        with nogil:
            for i in range(f.n):
                run_gemm(f.ctx, side if i & 1 else f.s, &f.gs[i], f.dtype, f.compute, &f.alpha, &f.beta,
                         f.autotune)
    except BaseException:
        join_side(f.ctx, f.s, side, join, True)      # the original error matters more
        raise
    join_side(f.ctx, f.s, side, join, False)
    return 0


cdef int _enqueue(void* arg, int route) except -1:
    return _run_route(<GroupedCall*>arg, route)


cdef int _fixed_rule(_Groups grp, cublasComputeType_t compute) except -1:
    """Small problems, capture before any eager call, beta != 0 untimed: one strided-batched
    GEMM where the groups allow; else one grouped call for many groups; else the loop."""
    if grp.why_not(R_BATCHED, compute) is None:
        return R_BATCHED
    if grp.n_act >= GROUPED_MIN_GROUPS and grp.why_not(R_GROUPED, compute) is None:
        return R_GROUPED
    return R_LOOP


cdef int _route_index(object route) except -1:
    if route in _NAMES:
        return _NAMES.index(route)
    raise ValueError(f"route: expected None or one of {', '.join(repr(n) for n in _NAMES)}, got {route!r}")


cdef int _asked_route(_Groups grp, object route, cublasComputeType_t compute) except -2:
    """route=: its index (ValueError when unknown or when it cannot run these groups), -1: none."""
    if route is None:
        return -1
    cdef int r = _route_index(route)
    why = grp.why_not(r, compute)
    if why is not None:
        raise ValueError(f"route: {route!r} does not apply: {why}")
    return r


cdef int _choose(_Groups grp, GroupedCall* f) except -1:
    """Forced (cygemm.tuning.force_routes), tuned (timed now when new, large, eager and beta
    0: timing runs write the outputs), else the fixed rule."""
    cdef int r
    forced = forced_route("grouped")
    if forced is not None and forced in _NAMES:
        r = _NAMES.index(forced)
        return r if grp.why_not(r, f.compute) is None else _fixed_rule(grp, f.compute)
    if (f.autotune == AUTOTUNE_OFF or not worth_tuning(grp.macs) or grp.n_act > MAX_TUNED_GROUPS):
        return _fixed_rule(grp, f.compute)
    key = grp.key(f.compute)
    name = tuned_route(f.ctx.device, key)
    if name is not None and name in _NAMES:
        r = _NAMES.index(name)
        return r if grp.why_not(r, f.compute) is None else _fixed_rule(grp, f.compute)
    if f.beta != 0 or stream_is_capturing(f.s):
        return _fixed_rule(grp, f.compute)
    cdef int choices[N_ROUTES]
    cdef float ms[N_ROUTES]
    cdef int n = 0, i, best = -1
    for i in range(<int>N_ROUTES):
        if grp.why_not(i, f.compute) is None:
            if i == R_GROUPED:
                _bind_host_arrays(grp, f)
            choices[n] = i
            n += 1
    time_routes(f.ctx, f.s, _enqueue, f, choices, n, ms, f.autotune)
    for i in range(n):
        if ms[i] >= 0 and (best < 0 or ms[i] < ms[best]):
            best = i
    if best < 0:
        return _fixed_rule(grp, f.compute)
    remember_route(f.ctx.device, key, _NAMES[choices[best]], {_NAMES[choices[i]]: ms[i] for i in range(n)})
    return choices[best]


cdef int _check_group_devices(CallArgs* c, _Groups grp) except -1:
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
        add_view(c, &grp.views[i], name, ARG_READ)
    check_devices(c)
    c.n = 0
    return 0


cdef int _run(_Groups grp, CallArgs* c, object alpha, object beta, object math, object stream,
              object route) except -1:
    """The engine of grouped_gemm and moe_gemm: grp read and checked, c holding the buffers
    whose devices resolve_call checks (moe_gemm's x, w, out, their overlaps checked by moe_gemm; none for
    grouped_gemm)."""
    cdef GroupedCall f
    f.alpha, f.beta = alpha, beta
    cdef Math m = parse_math(math)
    f.dtype = grp.dtype
    f.compute = compute_type(grp.dtype, m)
    cdef int asked = _asked_route(grp, route, f.compute)
    if grp.n == 0:
        _tls.route = None
        return 0
    f.autotune = autotune_level(None)
    resolve_call(c, math, grp.dtype, stream)    # overlaps checked before: the groups' sweep, moe's x/w/out
    _check_group_devices(c, grp)
    f.ctx, f.s = c.ctx, c.stream
    f.gs, f.n = grp.act, grp.n_act
    f.batched = &grp.batched
    cdef int64_t i
    if grp.n_zero_k:
        # K == 0: out = beta out, which cublasGemmEx does (the plan layer sends k == 0 there).
        with nogil:
            for i in range(grp.n_zero_k):
                run_gemm(f.ctx, f.s, &grp.zero_k[i], f.dtype, f.compute, &f.alpha, &f.beta, f.autotune)
    if grp.n_act == 0:
        _tls.route = "loop" if grp.n_zero_k else None
        return 0
    f.dims, f.ops, f.scalars, f.ones = NULL, NULL, NULL, NULL
    cdef int r = asked if asked >= 0 else _choose(grp, &f)
    if r == R_GROUPED:
        _bind_host_arrays(grp, &f)
    _run_route(&f, r)
    _tls.route = _NAMES[r]
    return 0


# ---------------------------------------------------------------- Python surface

def grouped_gemm(As, Bs, outs, *, bint trans_a=False, bint trans_b=False, alpha=1.0, beta=0.0,
                 str math="tf32", stream=None, route=None):
    """outs[g] = alpha * op(As[g]) @ op(Bs[g]) + beta * outs[g] for every group g, in one call.

    Parameters
    ----------
    As, Bs, outs : sequences of device arrays, 2-D
        One matrix each per group (G >= 0 groups), all of one dtype (float32, float16 or
        bfloat16); sizes may differ from group to group. Each is read in place as
        :func:`cygemm.gemm` reads its operands (C or F order, slices, ``.T``). A group whose
        out is empty is skipped; one with K == 0 gets ``outs[g] = beta * outs[g]``.
    trans_a, trans_b : bool
        Use As[g].T / Bs[g].T (no copy), alike for every group.
    alpha, beta : float
        Scalars shared by every group.
    math : {"tf32", "fp32"}
        As :func:`cygemm.gemm`.
    stream : optional
        As :func:`cygemm.gemm`; everything is enqueued there (the "streams" route also on the
        stream's side stream, joined back before the call returns).
    route : {None, "batched", "grouped", "loop", "streams"}
        Run this route (see ``ROUTES``); None: the forced route of ``cygemm.tuning``, the
        tuned one, or the fixed rule.

    Returns
    -------
    sequence
        ``outs``.

    Raises
    ------
    ValueError
        Lists of different lengths, shapes that do not multiply, a layout cuBLAS cannot read in
        place, an output sharing memory with an input or another output (each named, e.g.
        ``outs[3]``), a ``route`` that is unknown or does not apply to these groups, arrays or
        stream of another device.
    TypeError
        Not a sequence of device arrays, an unsupported dtype, or dtypes that differ between
        groups.
    CublasError, CudaError
        A failed cuBLAS/CUDA call, naming the status and the call.

    Notes
    -----
    Every group is read and checked before anything is enqueued. Allocates no device memory
    and can be captured into a CUDA graph. Large problems (``autotune_min_macs`` multiply-adds
    in all, at most 1024 groups, beta 0) time the routes that apply once and keep the fastest;
    others take the fixed rule: "batched" where it applies, else "grouped" for 8 or more
    groups, else "loop". :func:`last_route` names what ran.
    """
    cdef CallArgs c
    args_init(&c)
    cdef _Groups grp = _read_lists(As, Bs, outs, trans_a, trans_b)
    _run(grp, &c, alpha, beta, math, stream, route)
    return outs


def moe_gemm(x, w, group_offsets, out, *, str w_layout="kn", str math="tf32", stream=None, route=None):
    """Mixture-of-experts GEMM: out[a:b] = x[a:b] @ w[g] for expert g's rows a:b of sorted tokens.

    Parameters
    ----------
    x : device array (T, K)
        Every token, sorted by expert: expert g's are rows ``group_offsets[g]:group_offsets[g+1]``.
    w : device array (G, K, N) or (G, N, K)
        The experts' weights, as ``w_layout`` says; any batch stride.
    group_offsets : sequence of int
        G + 1 non-decreasing host ints from 0 to T (a list, tuple or NumPy array); an expert
        may have no rows.
    out : device array (T, N)
        The result, the dtype of x; shares memory with neither x nor w.
    w_layout : {"kn", "nk"}
        "kn": ``w[g]`` is (K, N); "nk": ``w[g]`` is (N, K), the layout of a linear layer's
        weight, and ``out[a:b] = x[a:b] @ w[g].T``.
    math, stream, route
        As :func:`grouped_gemm`.

    Returns
    -------
    device array
        ``out``.

    Raises
    ------
    ValueError
        Shapes that do not fit, offsets that do not start at 0, decrease, or do not end at T,
        an unknown ``w_layout``, an ``out`` sharing memory with x or w, a ``route`` that is
        unknown or does not apply.
    TypeError
        Offsets that are not ints, dtypes that differ, not device arrays.
    CublasError, CudaError
        As :func:`grouped_gemm`.

    Notes
    -----
    The G groups are views of x, w and out (no copy), run by the engine of
    :func:`grouped_gemm`. Equal group sizes make one strided-batched GEMM ("batched").
    """
    cdef CallArgs c
    cdef _Groups grp = _read_moe(&c, x, w, group_offsets, out, w_layout)
    check_overlaps(&c)
    _run(grp, &c, 1.0, 0.0, math, stream, route)
    return out


def describe_grouped(As, Bs, outs, *, bint trans_a=False, bint trans_b=False, str math="tf32"):
    """Which routes :func:`grouped_gemm` could take for these groups, and the one it would.

    Parameters
    ----------
    As, Bs, outs, trans_a, trans_b, math
        As :func:`grouped_gemm` takes them; device arrays or objects with
        ``__cuda_array_interface__`` (read for their layout only: nothing is launched).

    Returns
    -------
    dict
        ``groups`` (G), ``active`` (groups with M, N, K > 0), ``zero_k`` (groups with K == 0),
        ``macs``, ``routes`` (the names that apply, in the fixed rule's order),
        ``not_applicable`` ({name: why}), ``chosen`` (the route a call would run when that is
        decided already: forced, tuned on this GPU, or the fixed rule for a problem too small
        to time; else None) and ``decided_by`` ("forced", "tuned", "rule" or None).

    Raises
    ------
    ValueError, TypeError
        As :func:`grouped_gemm` raises them for these arguments.
    """
    cdef _Groups grp = _read_lists(As, Bs, outs, trans_a, trans_b)
    cdef cublasComputeType_t compute = compute_type(grp.dtype, parse_math(math))
    cdef int r
    why = {n: grp.why_not(i, compute) for i, n in enumerate(_NAMES)}
    info = dict(groups=grp.n, active=grp.n_act, zero_k=grp.n_zero_k, macs=grp.macs,
                routes=[n for n in _NAMES if why[n] is None],
                not_applicable={n: w for n, w in why.items() if w is not None}, chosen=None, decided_by=None)
    if grp.n_act == 0:
        return info
    forced = forced_route("grouped")
    if forced is not None and forced in _NAMES and why[forced] is None:
        info.update(chosen=forced, decided_by="forced")
    elif autotune_level(None) == AUTOTUNE_OFF or not worth_tuning(grp.macs) or grp.n_act > MAX_TUNED_GROUPS:
        info.update(chosen=_NAMES[_fixed_rule(grp, compute)], decided_by="rule")
    else:
        from cygemm import _context
        if _context.gpu_unavailable_reason() is None:       # the table is per GPU model
            name = tuned_route(_context.current_device(), grp.key(compute))
            if name is not None and name in _NAMES and why[name] is None:
                info.update(chosen=name, decided_by="tuned")
    return info
