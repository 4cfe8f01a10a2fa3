# cython: language_level=3, boundscheck=False, wraparound=False
# kernels: grouped
"""cuBLASLt's grouped matmul with the group sizes on the GPU: the route of the mixture-of-experts
GEMMs whose offsets are a device array (:func:`cygemm.moe_gemm`, :func:`cygemm.moe_gemm_wgrad`).

A kernel reads the offsets on the GPU and writes, per group, the A, B, C and D pointers and the
sizes and leading dimensions into the stream's table (cygemm/kernels/grouped.cu); one
``cublasLtMatmul`` in ``CUBLASLT_BATCH_MODE_GROUPED`` then reads them there. Nothing is read back
to the host, so the call never synchronizes, and a captured graph replays with whatever offsets
the array holds at replay.

The rules each part follows, and the note each answers:

- cuBLASLt 13.8.1 or newer and compute capability 9.0, 10.x or 11.0 (cygemm.engine.lt_features: Hopper
  from 13.4.0; the defects of 13.4 to 13.8.0, among them host pointer mode past two waves and a
  reused workspace that could hang, fixed by 13.8.0.4);
- bfloat16 and float16 operands, float32 accumulation (13.4.0's note for Hopper: BF16, FP16 and
  FP8 in; BF16, FP16 or FP32 out); FP8 (E4M3, or one E5M2 operand) with a float32 scale per
  group and operand: scale mode PER_BATCH_SCALAR_32F and the scale pointers as device arrays of
  per-group pointers (TransformerEngine's grouped GEMM; tensor-wide FP8 scales in grouped mode on
  Hopper from 13.5), "TN" operands only (cuBLAS's A transposed, B not: Hopper's FP8 kernels);
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
- at most CYGEMM_LT_GROUPED_MAX_GROUPS (896) groups: the table is the stream's (64 KiB).

The route rests on cuBLASLt behaviour this release has not yet verified on a GPU, so the first call on
each cuBLASLt version checks it exactly against the per-group path (cygemm.engine.promises,
"lt_grouped") and refuses with CygemmError where the check fails.
"""
import threading

from libc.stdint cimport int8_t, int32_t, int64_t, uint32_t, uint64_t, uintptr_t, INT32_MAX

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
from cygemm.kernels.grouped cimport (cygemm_grouped_operand, CYGEMM_RAGGED_N, CYGEMM_RAGGED_K, cygemm_grouped_table, cygemm_grouped_table_layout, cygemm_write_grouped_table,
                                     cygemm_zero_empty_groups, cygemm_group_row_scales, CYGEMM_LT_GROUPED_MAX_GROUPS)
from cygemm.engine.context cimport stream_workspace, stream_table, STREAM_TABLE_BYTES
from cygemm.engine.errors cimport check_cuda, check_cublas
from cygemm.engine.streams cimport stream_is_capturing
from cygemm.engine.launch cimport grouped_lt_run
from cygemm.engine.lt_features cimport LtExtras, lt_extras
from cygemm.engine import lt_features as _lt_features
from cygemm.engine.dtypes import name_of, expected
from cygemm.engine.dtypes cimport (type_size, dtype_level, is_fp8_type, is_half_type, fp8_pair_ok,
                                   DTYPES_FLOAT)

# The grouped matmul's alignment rule for every group's matrices (bytes).
cdef int64_t GROUPED_ALIGN = 16
# Plans kept per thread (descriptors and the heuristic's choice, per problem and table).
cdef int PLANS_KEPT = 64

_tls = threading.local()
# The arguments cuBLAS's A, B and D are, by LT_NAMES_*: messages name the caller's arguments.
_NAMES = {LT_NAMES_FORWARD: ("w", "x", "out"), LT_NAMES_WGRAD_KN: ("dy", "x", "dw"),
          LT_NAMES_WGRAD_NK: ("x", "dy", "dw")}


cdef bint _aligned(int64_t x) noexcept nogil:
    return x % GROUPED_ALIGN == 0


cdef object why_not(const LtGroupedCall* f, int device, bint capturing):
    why = _lt_features.feature_gate("grouped_gemm", device)
    if why is not None:
        return why
    if is_fp8_type(f.a_type):
        if not is_fp8_type(f.b_type):
            return f"FP8 needs both operands FP8, got {name_of(f.a_type)} and {name_of(f.b_type)}"
        if not fp8_pair_ok(f.a_type, f.b_type):
            return "FP8 takes E4M3 with E4M3 or E5M2, not two E5M2 operands (cuBLASLt's FP8 types)"
        if dtype_level(f.dtype) != DTYPES_FLOAT:
            return f"FP8's grouped matmul writes {expected(DTYPES_FLOAT)} on Hopper, got {name_of(f.dtype)}"
        if f.opa != CUBLAS_OP_T or f.opb != CUBLAS_OP_N:
            return ("FP8 reads both operands along K (Hopper's FP8 kernels are 'TN'): the weights must be "
                    "(G, N, K) with K contiguous")
        if f.scale_rows_dst != NULL and _lt_features.major(device) != 9:
            # (TransformerEngine: FP8 block scaling in grouped GEMMs is Hopper's; Blackwell's is MXFP8)
            return "block-scaled FP8 in cuBLASLt's grouped matmul runs on Hopper (compute capability 9.0) only"
    elif not is_half_type(f.dtype):
        return f"cuBLASLt's grouped matmul takes bfloat16 and float16 here, got {name_of(f.dtype)}"
    elif f.a_type != f.dtype or f.b_type != f.dtype:
        return "the operands and the output must share one dtype (bfloat16 or float16)"
    if f.groups < 1:
        return "no experts (G = 0): nothing to compute"
    if f.groups > CYGEMM_LT_GROUPED_MAX_GROUPS or (
            cygemm_grouped_table_layout(f.groups).bytes > STREAM_TABLE_BYTES):
        return f"at most {CYGEMM_LT_GROUPED_MAX_GROUPS} groups (one stream table), got {f.groups}"
    # The ragged size is never a matrix's stored rows (the transposes keep it on the columns), so
    # the rules below hold for every group whatever the offsets.
    if f.p.ragged == CYGEMM_RAGGED_N and f.p.k == 0:
        return "K is 0 (every product empty: the routes of host offsets write the zeros)"
    for size in (f.p.m, f.p.n, f.p.k, f.p.lda, f.p.ldb, f.p.ldd, f.p.rows):     # (the ragged one is -1)
        if size > INT32_MAX:
            return "sizes or leading dimensions past 2**31 - 1 (the grouped layouts' are int32)"
    a_name, b_name, d_name = _NAMES[f.names]
    why = (_operand_rule(&f.p.a, f.a_type, f.p.m if f.opa == CUBLAS_OP_N else f.p.k, f.p.lda, a_name)
           or _operand_rule(&f.p.b, f.b_type, f.p.k if f.opb == CUBLAS_OP_N else f.p.n, f.p.ldb, b_name)
           or _operand_rule(&f.p.d, f.dtype, f.p.m, f.p.ldd, d_name))
    return why or None


cdef object _operand_rule(const cygemm_grouped_operand* o, cudaDataType t, int64_t rows, int64_t ld, str name):
    """cuBLASLt's rules for a grouped matrix, for every group whatever the offsets: its start, the
    step between groups' starts (a matrix stride and rows of the ragged size), its stored rows
    (a fixed size: the ragged one is never stored rows here) and its leading dimension all
    multiples of 16 bytes, and the leading dimension at least the stored rows."""
    cdef int64_t isz = type_size(t)
    if rows < 0:
        return f"{name}: its stored rows are the ragged size (an internal mapping error)"
    if not (_aligned(<uintptr_t>o.base) and _aligned(o.group_stride) and _aligned(o.row_stride)):
        return (f"{name}: every group's matrix must start on 16 bytes for any offsets: the start, row stride "
                f"and matrix stride must be multiples of 16 bytes")
    if not _aligned(rows * isz) or not _aligned(ld * isz):
        return (f"{name}: its matrices' {rows} elements along the contiguous axis and their stride of {ld} must be "
                f"multiples of 16 bytes ({16 // isz} elements of {isz} bytes: cuBLASLt's rule for grouped matrices)")
    if ld < rows:
        return (f"{name}: a stride of {ld} between its lines of {rows} elements (a broadcast or overlapping layout; "
                f"cuBLASLt's grouped matrices need at least {rows})")
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
    cdef int32_t scale_modes[2]
    scale_modes[0], scale_modes[1] = f.scale_mode_a, f.scale_mode_b
    cdef int8_t fast = f.fast_accum
    cdef const void* scales
    check_cublas(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate")
    check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)),
                 "cublasLtMatmulDescSetAttribute")
    check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)),
                 "cublasLtMatmulDescSetAttribute")
    check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pointer_mode,
                                                sizeof(pointer_mode)), "cublasLtMatmulDescSetAttribute")
    if f.scaled:
        # Each group's scale: device arrays of per-group pointers to float32 scalars.
        for i, (mode_attr, ptr_attr, at) in enumerate(((CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                          CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, t.scale_a),
                                                         (CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                          CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, t.scale_b))):
            scales = table + <long long>at
            check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, <cublasLtMatmulDescAttributes_t><int>mode_attr,
                                                        &scale_modes[i], sizeof(int32_t)),
                         "cublasLtMatmulDescSetAttribute")
            check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, <cublasLtMatmulDescAttributes_t><int>ptr_attr,
                                                        &scales, sizeof(scales)), "cublasLtMatmulDescSetAttribute")
        check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)),
                     "cublasLtMatmulDescSetAttribute")
    # A is (m x k) as op(A): stored (m x k) for N, (k x m) for T; B likewise with (k x n).
    if f.opa == CUBLAS_OP_N:
        _layout(x, &plan.la, f.a_type, f.groups, table, t.m, t.k, t.lda)
    else:
        _layout(x, &plan.la, f.a_type, f.groups, table, t.k, t.m, t.lda)
    if f.opb == CUBLAS_OP_N:
        _layout(x, &plan.lb, f.b_type, f.groups, table, t.k, t.n, t.ldb)
    else:
        _layout(x, &plan.lb, f.b_type, f.groups, table, t.n, t.k, t.ldb)
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
        _hint(pref, LT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_ROWS, _bucket(max(f.avg_m, 1)))
        _hint(pref, LT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_COLS, _bucket(max(f.avg_n, 1)))
        _hint(pref, LT_MATMUL_PREF_GROUPED_AVERAGE_REDUCTION_DIM, _bucket(max(f.avg_k, 1)))
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
    return (ctx.device, <uintptr_t>table, f.dtype, f.a_type, f.b_type, f.scaled, f.scale_mode_a, f.scale_mode_b,
            f.fast_accum, f.groups, <int>f.opa,
            <int>f.opb, f.p.m, f.p.n, f.p.k, f.p.lda, f.p.ldb, f.p.ldd, f.p.ragged, _bucket(f.avg_m), _bucket(f.avg_n),
            _bucket(f.avg_k), ctx.workspace_bytes)


cdef int64_t _bucket(int64_t x) noexcept:
    # The heuristic's hints (averages of sizes on the GPU) rounded up to a power of two: a server
    # meets every token count, and a plan per count would ask the heuristic each time.
    cdef int64_t b = 1
    while b < x:
        b <<= 1
    return b


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
        if f.scale_rows_dst != NULL:
            check_cuda(cygemm_group_row_scales(f.scale_rows_src, f.p.rows, f.scale_kblocks, f.offsets, f.offsets_64bit,
                                               f.groups, f.scale_rows_dst, stream), "cygemm_group_row_scales")
        check_cuda(cygemm_write_grouped_table(f.offsets, f.offsets_64bit, f.groups, &f.p, table, stream),
                   "cygemm_write_grouped_table")
        if f.zero_out != NULL:
            check_cuda(cygemm_zero_empty_groups(f.offsets, f.offsets_64bit, f.groups, f.p.rows, f.zero_out,
                                                f.zero_group_stride, f.zero_rows, f.zero_cols, f.zero_row_stride,
                                                f.elem_bytes, stream),
                       "cygemm_zero_empty_groups")
        check_cublas(<cublasStatus_t>grouped_lt_run(ctx, stream, plan.desc, plan.la, plan.lb, plan.lc, plan.ld,
                                                    &plan.algo, table + t.alpha, table + t.a, table + t.b,
                                                    table + t.beta, table + t.c, table + t.d, ws,
                                                    ctx.workspace_bytes), "cublasLtMatmul (grouped)")
    return 0
