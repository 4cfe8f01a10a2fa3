# cython: language_level=3, boundscheck=False, wraparound=False
"""cuBLASLt's grouped matmul with the group sizes on the GPU: the route of the mixture-of-experts
GEMMs whose offsets are a device array (:func:`cygemm.moe_gemm`, :func:`cygemm.moe_gemm_wgrad`).

A kernel reads the offsets on the GPU and writes, per group, the A, B, C and D pointers and the
sizes and leading dimensions into the stream's table (cygemm/kernels/grouped.cu); one
``cublasLtMatmul`` in ``CUBLASLT_BATCH_MODE_GROUPED`` then reads them there. Nothing is read back
to the host, so the call never synchronizes, and a captured graph replays with whatever offsets
the array holds at replay.

The rules each part follows, and the note each answers:

- cuBLASLt 13.8.1 or newer and compute capability 9.0 or newer (cygemm.engine.lt_features: Hopper
  from 13.4.0; the defects of 13.4 to 13.8.0, among them host pointer mode past two waves and a
  reused workspace that could hang, fixed by 13.8.0.4);
- bfloat16 and float16 operands, float32 accumulation (13.4.0's note for Hopper: BF16, FP16 and
  FP8 in; FP8 is not offered here yet);
- one alpha and one beta for every group, in device memory (TransformerEngine's note: Hopper
  takes one scalar for the whole grouped call; per-group scalars are Blackwell's), so device
  pointer mode with alpha and beta in the table;
- every group's matrices 16-byte aligned (the pointer arrays and matrices cuBLAS reads in grouped
  mode), which holds for any offsets when the operands' starts and row strides are multiples of
  16 bytes: otherwise the route does not apply;
- sizes and leading dimensions as int32 arrays (the layouts' default integer width), the
  heuristic given the groups' average sizes as 8-byte hints (what 13.10 accepts), and the
  stream-aware heuristic for a call made inside a capture where the library has it (13.5.1's
  heuristic failed under capture);
- at most CYGEMM_LT_GROUPED_MAX_GROUPS (1024) groups: the table is the stream's (64 KiB).

The route rests on cuBLASLt behaviour no GPU of this project has run yet, so the first call on
each cuBLASLt version checks it exactly against the per-group path (cygemm.engine.promises,
"lt_grouped") and refuses with CygemmError where the check fails.
"""
import threading

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t, INT32_MAX

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
from cygemm.kernels.grouped cimport (cygemm_grouped_table, cygemm_grouped_table_layout, cygemm_write_grouped_table,
                                     cygemm_zero_empty_groups, CYGEMM_LT_GROUPED_MAX_GROUPS)
from cygemm.engine.context cimport stream_workspace, stream_table, STREAM_TABLE_BYTES
from cygemm.engine.errors cimport check_cuda, check_cublas
from cygemm.engine.streams cimport stream_is_capturing
from cygemm.engine.launch cimport grouped_lt_run
from cygemm.engine.lt_features cimport LtExtras, lt_extras
from cygemm.engine import lt_features as _lt_features
from cygemm.engine.dtypes import name_of

# The grouped matmul's alignment rule for every group's matrices (bytes).
cdef int64_t GROUPED_ALIGN = 16
# Plans kept per thread (descriptors and the heuristic's choice, per problem and table).
cdef int PLANS_KEPT = 64

_tls = threading.local()


cdef bint _aligned(int64_t x) noexcept nogil:
    return x % GROUPED_ALIGN == 0


cdef object why_not(const LtGroupedCall* f, int device, bint capturing):
    why = _lt_features.feature_gate("grouped_gemm", device)
    if why is not None:
        return why
    if f.dtype != CUDA_R_16BF and f.dtype != CUDA_R_16F:
        return f"cuBLASLt's grouped matmul takes bfloat16 and float16 here, got {name_of(f.dtype)}"
    if f.groups < 1 or f.groups > CYGEMM_LT_GROUPED_MAX_GROUPS:
        return f"at most {CYGEMM_LT_GROUPED_MAX_GROUPS} groups (one stream table), got {f.groups}"
    if not (_aligned(<uintptr_t>f.p.a.base) and _aligned(f.p.a.group_stride) and _aligned(f.p.a.row_stride)
            and _aligned(<uintptr_t>f.p.b.base) and _aligned(f.p.b.group_stride) and _aligned(f.p.b.row_stride)
            and _aligned(<uintptr_t>f.p.d.base) and _aligned(f.p.d.group_stride) and _aligned(f.p.d.row_stride)):
        return ("every group's matrices must start on 16 bytes for any offsets: the operands' starts, "
                "row strides and matrix strides must be multiples of 16 bytes (8 elements of 2 bytes)")
    if f.p.m > INT32_MAX or f.p.n > INT32_MAX or f.p.k > INT32_MAX or f.p.rows > INT32_MAX:
        return "sizes past 2**31 - 1 (the grouped layouts' sizes are int32)"
    return None


cdef class _Plan:
    """The descriptors of one grouped problem on one table, and the heuristic's algorithm."""
    cdef cublasLtMatmulDesc_t desc
    cdef cublasLtMatrixLayout_t la, lb, lc, ld
    cdef cublasLtMatmulAlgo_t algo
    cdef size_t ws_needed

    def __dealloc__(self):
        if self.la != NULL:
            cublasLtMatrixLayoutDestroy(self.la)
        if self.lb != NULL:
            cublasLtMatrixLayoutDestroy(self.lb)
        if self.lc != NULL:
            cublasLtMatrixLayoutDestroy(self.lc)
        if self.ld != NULL:
            cublasLtMatrixLayoutDestroy(self.ld)
        if self.desc != NULL:
            cublasLtMatmulDescDestroy(self.desc)


cdef int _layout(const LtExtras* x, cublasLtMatrixLayout_t* out, cudaDataType dtype, int groups,
                 const char* table, long long rows_at, long long cols_at, long long ld_at) except -1:
    check_cublas(x.grouped_layout_create(out, dtype, groups, table + rows_at, table + cols_at, table + ld_at),
                 "cublasLtGroupedMatrixLayoutCreate")
    return 0


cdef int _hint(cublasLtMatmulPreference_t pref, int attr, int64_t value) except -1:
    check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, <cublasLtMatmulPreferenceAttributes_t>attr, &value,
                                                      sizeof(value)), "cublasLtMatmulPreferenceSetAttribute")
    return 0


cdef _Plan _make_plan(GemmContext* ctx, cudaStream_t stream, const LtGroupedCall* f, const char* table,
                      bint capturing):
    cdef const LtExtras* x = lt_extras()
    cdef cygemm_grouped_table t = cygemm_grouped_table_layout(f.groups)
    cdef _Plan plan = _Plan.__new__(_Plan)
    cdef int32_t opa = f.opa, opb = f.opb, pointer_mode = CUBLASLT_POINTER_MODE_DEVICE
    check_cublas(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate")
    check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)),
                 "cublasLtMatmulDescSetAttribute")
    check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)),
                 "cublasLtMatmulDescSetAttribute")
    check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pointer_mode,
                                                sizeof(pointer_mode)), "cublasLtMatmulDescSetAttribute")
    # A is (m x k) as op(A): stored (m x k) for N, (k x m) for T; B likewise with (k x n).
    if f.opa == CUBLAS_OP_N:
        _layout(x, &plan.la, f.dtype, f.groups, table, t.m, t.k, t.lda)
    else:
        _layout(x, &plan.la, f.dtype, f.groups, table, t.k, t.m, t.lda)
    if f.opb == CUBLAS_OP_N:
        _layout(x, &plan.lb, f.dtype, f.groups, table, t.k, t.n, t.ldb)
    else:
        _layout(x, &plan.lb, f.dtype, f.groups, table, t.n, t.k, t.ldb)
    _layout(x, &plan.lc, f.dtype, f.groups, table, t.m, t.n, t.ldd)
    _layout(x, &plan.ld, f.dtype, f.groups, table, t.m, t.n, t.ldd)
    cdef cublasLtMatmulPreference_t pref = NULL
    cdef cublasLtMatmulHeuristicResult_t first
    cdef int found = 0
    cdef uint64_t ws = ctx.workspace_bytes
    cdef cublasStatus_t st
    try:
        check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate")
        check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                          sizeof(ws)), "cublasLtMatmulPreferenceSetAttribute")
        _hint(pref, LT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_ROWS, max(f.avg_m, 1))
        _hint(pref, LT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_COLS, max(f.avg_n, 1))
        _hint(pref, LT_MATMUL_PREF_GROUPED_AVERAGE_REDUCTION_DIM, max(f.avg_k, 1))
        with nogil:
            if capturing and x.heuristic_for_stream != NULL:
                st = x.heuristic_for_stream(ctx.lt, plan.desc, plan.la, plan.lb, plan.lc, plan.ld, pref, 1, &first,
                                            &found, stream)
            else:
                st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, plan.desc, plan.la, plan.lb, plan.lc, plan.ld, pref, 1,
                                                    &first, &found)
        check_cublas(st, "cublasLtMatmulAlgoGetHeuristic (grouped)")
        if found < 1:
            check_cublas(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulAlgoGetHeuristic (grouped: no algorithm)")
    finally:
        if pref != NULL:
            cublasLtMatmulPreferenceDestroy(pref)
    plan.algo = first.algo
    plan.ws_needed = first.workspaceSize
    return plan


cdef tuple _key(GemmContext* ctx, const LtGroupedCall* f, const char* table):
    # Everything the descriptors and the heuristic's choice depend on: the table's address (the
    # layouts point into it), the problem's fixed sizes, types, transposes and hints.
    return (ctx.device, <uintptr_t>table, f.dtype, f.groups, <int>f.opa, <int>f.opb, f.p.m, f.p.n, f.p.k,
            f.p.lda, f.p.ldb, f.p.ldd, f.p.ragged, f.avg_m, f.avg_n, f.avg_k, ctx.workspace_bytes)


cdef _Plan _plan(GemmContext* ctx, cudaStream_t stream, const LtGroupedCall* f, const char* table, bint capturing):
    plans = getattr(_tls, "plans", None)
    if plans is None:
        plans = _tls.plans = {}
    key = _key(ctx, f, table)
    plan = plans.get(key)
    if plan is None:
        plan = _make_plan(ctx, stream, f, table, capturing)
        if len(plans) >= PLANS_KEPT:
            del plans[next(iter(plans))]
        plans[key] = plan
    return <_Plan>plan


def clear_plans():
    """Forget the calling thread's grouped plans (descriptors and chosen algorithms)."""
    _tls.plans = {}


cdef int run_lt_grouped(GemmContext* ctx, cudaStream_t stream, const LtGroupedCall* f) except -1:
    cdef bint capturing = stream_is_capturing(stream)
    cdef cygemm_grouped_table t = cygemm_grouped_table_layout(f.groups)
    cdef char* table
    cdef void* ws
    with nogil:
        table = <char*>stream_table(ctx, stream)
    if t.bytes > STREAM_TABLE_BYTES:
        raise ValueError(f"{f.groups} groups do not fit the stream's table")
    cdef _Plan plan = _plan(ctx, stream, f, table, capturing)
    with nogil:
        ws = stream_workspace(ctx, stream)
        check_cuda(cygemm_write_grouped_table(f.offsets, f.offsets_64bit, f.groups, &f.p, table, stream),
                   "cygemm_write_grouped_table")
        if f.zero_out != NULL:
            check_cuda(cygemm_zero_empty_groups(f.offsets, f.offsets_64bit, f.groups, f.zero_out, f.zero_group_stride,
                                                f.zero_rows, f.zero_cols, f.zero_row_stride, f.elem_bytes, stream),
                       "cygemm_zero_empty_groups")
        check_cublas(<cublasStatus_t>grouped_lt_run(ctx, stream, plan.desc, plan.la, plan.lb, plan.lc, plan.ld,
                                                    &plan.algo, table + t.alpha, table + t.a, table + t.b,
                                                    table + t.beta, table + t.c, table + t.d, ws,
                                                    ctx.workspace_bytes), "cublasLtMatmul (grouped)")
    return 0
