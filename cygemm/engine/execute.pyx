# cython: language_level=3, boundscheck=False, wraparound=False
"""The one execute: running a plan, and what a call does when cuBLASLt refuses it.

A plan (cygemm.engine.plans) says how a problem runs; this module is the only code that runs
one. cuBLASLt may refuse an algorithm it offered (nothing is enqueued): eagerly, the plan is
marked unusable; inside a capture, uncapturable. What happens next is the call's
:c:type:`Refusal`: a plain GEMM runs cublasGemmEx instead, a route with another way out reports
the refusal, and a call that is one cuBLASLt call (FP8, int8, epilogue plans) raises.
"""
from libc.stdint cimport int64_t

from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport (cublasStatus_t, cublasComputeType_t, CUBLAS_STATUS_SUCCESS,
                                     CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_64F)
from cygemm.bindings.cublaslt cimport CUBLASLT_EPILOGUE_DEFAULT
from cygemm.engine.types cimport ColMajorGemm, Scalars, beta_is_zero, type_size, lt_batch_ok
from cygemm.engine.errors cimport check_cublas
from cygemm.engine.errors import CaptureError
from cygemm.engine.streams cimport stream_is_capturing, check_capture_alive
from cygemm.engine.context cimport GemmContext, stream_workspace
from cygemm.engine.launch cimport PLAN_GEMMEX, PLAN_LT, gemm_colmajor, needs_64bit_api, plan_run
from cygemm.engine.settings cimport Policy, DETERMINISM_BATCH_INVARIANT
from cygemm.engine.chooser cimport is_large
from cygemm.engine.ktail cimport gemmex_drops
from cygemm.engine.plans cimport Plan, get_plan, forced_gemm, raise_no_family
from cygemm.engine.small_batched cimport small_batched_fits, run_small_batched

# How many of the next cuBLASLt executes are answered as refused without running: the tests'
# way to reach each refusal policy (cuBLASLt refuses rarely, and not on demand).
cdef int _refuse_next = 0


cdef int execute_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                      const void* bias, void* aux, void* ws, size_t ws_bytes, const Scalars* sc,
                      int* refused_status=NULL) except -1:
    if not plan.d.usable:
        return 1
    if plan.d.route == PLAN_LT and not plan.d.capture_ok and stream_is_capturing(stream):
        return 1
    global _refuse_next
    cdef int st
    if _refuse_next > 0 and plan.d.route == PLAN_LT:
        _refuse_next -= 1
        st = CUBLAS_STATUS_NOT_SUPPORTED
    else:
        with nogil:
            st = plan_run(ctx, stream, &plan.d, g, bias, aux, ws, ws_bytes, sc)
    if st == CUBLAS_STATUS_SUCCESS:
        return 0
    if plan.d.route == PLAN_GEMMEX:         # cuBLAS's own choice failed: nothing to fall back to
        return check_cublas(<cublasStatus_t>st, "cublasGemmEx")
    # cuBLASLt refused the call (nothing enqueued). Inside a capture, remember that this
    # algorithm does not capture; outside, that it does not run.
    if refused_status != NULL:
        refused_status[0] = st
    if stream_is_capturing(stream):
        check_capture_alive(stream)
        plan.d.capture_ok = False
    else:
        plan.d.usable = False
    return 1


cdef int run_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                  const void* bias, void* aux, void* ws, size_t ws_bytes, const Scalars* sc,
                  Refusal refusal, str what="cuBLASLt") except -1:
    cdef int st = CUBLAS_STATUS_SUCCESS
    if not execute_plan(plan, ctx, stream, g, bias, aux, ws, ws_bytes, sc, &st):
        return 0
    if refusal == REFUSAL_REPORT:
        return 1
    if refusal == REFUSAL_GEMMEX:
        if plan.d.determinism == DETERMINISM_BATCH_INVARIANT:
            raise_no_family(plan)               # (no other kernel gives the family's rows)
        with nogil:
            gemm_colmajor(ctx, stream, g, plan.d.dtype, plan.d.compute, sc)
        return 0
    if st != CUBLAS_STATUS_SUCCESS:             # refused now (in a capture: not in graphs from now on)
        call = f"cublasLtMatmul ({what})".encode()
        return check_cublas(<cublasStatus_t>st, call)
    if not plan.d.usable:
        raise ValueError(f"{what}: cuBLASLt refused this plan's algorithm on an earlier execute; make a new "
                         f"{what}")
    raise CaptureError(f"{what}: cuBLASLt refused this plan's algorithm inside a capture before; execute it "
                       "eagerly")


cdef int check_runnable(Plan plan, cudaStream_t stream, str label) except -1:
    if not plan.d.usable or plan.d.n_candidates == 0:
        return 1
    if not plan.d.capture_ok and stream_is_capturing(stream):
        raise ValueError(f"cublasLtMatmul refused this {label} inside a capture; run it once eagerly first")
    return 0


# ---------------------------------------------------------------- a plain GEMM

cdef int run_gemm(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                  cublasComputeType_t compute, const Scalars* sc,
                  Policy policy) except -1 nogil:
    # A batch of small matrices: cygemm's kernel or cuBLAS, as its route table decides (its
    # "cublas" route is run_cublas, timed as it runs).
    if small_batched_fits(g, dtype, compute, policy):
        with gil:
            if run_small_batched(ctx, stream, g, dtype, compute, sc, policy, run_cublas):
                return 0
    return run_cublas(ctx, stream, g, dtype, compute, sc, policy)


cdef int run_cublas(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                    cublasComputeType_t compute, const Scalars* sc, Policy policy) except -1 nogil:
    """A plain GEMM by cuBLAS: cublasGemmEx or a cuBLASLt plan (decided by the plan's chooser)."""
    cdef int64_t batch = g.batch if g.strided_batched else 1
    cdef int forced = forced_gemm()
    cdef bint invariant = policy.determinism == DETERMINISM_BATCH_INVARIANT
    # cublasGemmEx (its own kernel choice, guarded in launch) for no batch-invariant call but k = 0;
    # small problems too, unless its kernel would drop part of K (then their guarded plan).
    if g.k == 0 or (not invariant and (
            needs_64bit_api(g) or forced == 1 or compute == CUBLAS_COMPUTE_64F or (
            forced == 0 and not is_large(<double>g.m * g.n * g.k * batch)
            and not gemmex_drops(ctx, g, dtype, compute)))):
        return gemm_colmajor(ctx, stream, g, dtype, compute, sc)
    cdef void* ws = stream_workspace(ctx, stream)       # may allocate: without the GIL
    with gil:
        if invariant and batch > 1 and not lt_batch_ok(g):
            _each_matrix(ctx, stream, g, dtype, compute, sc, ws, policy)
        else:
            _run_planned(ctx, stream, g, dtype, compute, sc, ws, policy)
    return 0


cdef int _each_matrix(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                      cublasComputeType_t compute, const Scalars* sc, void* ws,
                      Policy policy) except -1:
    """A batch cuBLASLt is not asked about (broadcast or interleaved), one matrix at a time:
    each by the plan of one matrix, as it would run alone."""
    cdef ColMajorGemm one
    cdef int64_t i
    cdef int size = type_size(dtype)
    for i in range(g.batch):
        nth_matrix(g, i, size, size, &one)
        _run_planned(ctx, stream, &one, dtype, compute, sc, ws, policy)
    return 0


cdef void nth_matrix(const ColMajorGemm* g, int64_t i, int in_size, int out_size, ColMajorGemm* one) noexcept nogil:
    """Matrix i of a strided batch as one GEMM (inputs of in_size bytes, output of out_size): the
    one place a batch is taken apart, for the batches run a matrix at a time."""
    one[0] = g[0]
    one.batch, one.strided_batched = 1, False
    one.a = <const char*>g.a + i * g.stride_a * in_size
    one.b = <const char*>g.b + i * g.stride_b * in_size
    one.c = <char*>g.c + i * g.stride_c * out_size


cdef int _run_planned(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                      cublasComputeType_t compute, const Scalars* sc, void* ws,
                      Policy policy) except -1:
    cdef size_t ws_bytes = ctx.workspace_bytes
    cdef Plan plan = get_plan(ctx, stream, g, dtype, compute, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0,
                              ws, ws_bytes, policy, not beta_is_zero(sc))
    return run_plan(plan, ctx, stream, g, NULL, NULL, ws, ws_bytes, sc, REFUSAL_GEMMEX)


# ---------------------------------------------------------------- for the tests

def refuse_next(int count=1):
    """Answer the next ``count`` cuBLASLt executes as cuBLASLt's refusal (CUBLAS_STATUS_NOT_SUPPORTED,
    nothing enqueued), so that tests reach each call's refusal policy; 0 stops it. Returns how many
    were still pending. Not thread-safe: for tests only."""
    global _refuse_next
    if count < 0:
        raise ValueError(f"count: expected 0 or more, got {count}")
    left, _refuse_next = _refuse_next, count
    return left


# -------------------- int8 (merged into execute)
# int8 x int8 GEMMs through cuBLASLt's integer tensor cores: out = alpha * op(A) @ op(B) + beta * out
# with int32 accumulation, into an int32 out (alpha, beta integers: exact, as NumPy's int64 product
# where it fits in int32) or an int8 out (alpha, beta real: round to nearest, saturated).
#
# The rules are Hopper's, measured on an H200 with cuBLASLt 13.1 (benchmarks/int8_rules.cu): every
# int8 kernel reads op(A) and op(B) along K ("TN" to cuBLAS), with leading dimensions that are
# multiples of 4 elements and pointers aligned to 4 bytes (16 for the fastest); M, N and an int32
# out's layout are free. cuBLASLt offers a few other orders for some sizes only, so cygemm takes the
# one that always runs and says so before anything runs. An integer sum does not depend on its
# order, so every kernel gives the same int32 bits: determinism policies need nothing there (an int8
# out, rounded by each kernel's float epilogue, is refused under them).
from libc.math cimport floor
from libc.stdint cimport int64_t

from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport (cublasStatus_t, CUBLAS_STATUS_SUCCESS, CUBLAS_COMPUTE_32I, CUBLAS_OP_N,
                                     CUBLAS_OP_T)
from cygemm.bindings.cublaslt cimport CUBLASLT_EPILOGUE_DEFAULT
from cygemm.engine.types cimport (MatrixView, ColMajorGemm, GemmTypes, Scalars, beta_is_zero, pointer_alignment)
from cygemm.engine.settings cimport Policy, AUTOTUNE_AUTO, DETERMINISM_OFF
from cygemm.engine.context cimport GemmContext, call_workspace
from cygemm.engine.mapping cimport is_rowmajor
from cygemm.engine.dtypes cimport dtype_name, INT8_DTYPE, INT8_SUMS_DTYPE
from cygemm.engine.plans cimport Plan, get_plan
from cygemm.engine.types cimport lt_batch_ok

from libc.string cimport memset

cdef double INT32_MIN_D = -2147483648.0, INT32_MAX_D = 2147483647.0


cdef str _strides(const MatrixView* v):
    return f"strides ({v.row_stride}, {v.col_stride}) elements"


cdef void _read_along_k(ColMajorGemm* g) noexcept nogil:
    """A single row or column of cuBLAS's A or B is contiguous along K either way: read it "TN",
    as every int8 kernel reads (the mapping may have given it the other op, with ld 1)."""
    cdef int64_t ld_k = ((g.k + 3) // 4) * 4        # one column: ld only has to be >= K
    if g.opa == CUBLAS_OP_N and g.m == 1 and g.lda == 1:
        g.opa, g.lda = CUBLAS_OP_T, ld_k
    if g.opb == CUBLAS_OP_T and g.n == 1 and g.ldb == 1:
        g.opb, g.ldb = CUBLAS_OP_N, ld_k


cdef int _check_integral(str name, double v) except -1:
    if not (INT32_MIN_D <= v <= INT32_MAX_D) or v != floor(v):     # (NaN fails the range test)
        raise ValueError(f"{name}: an int32 out takes integer alpha and beta (an int32 scale), got {v!r}; pass "
                         "an int8 out for a real scale, or scale the int32 result")
    return 0


cdef int check_int8(const MatrixView* a, const MatrixView* b, const MatrixView* out, bint trans_a,
                    bint trans_b, ColMajorGemm* g, const Scalars* sc) except -1:
    if out.rows == 0 or out.cols == 0 or out.batch == 0:
        return 0                                        # nothing runs
    # op(A) is (M, K): K runs along A's columns, or its rows when trans_a.
    cdef int64_t a_k_stride = a.row_stride if trans_a else a.col_stride
    cdef int64_t a_k = a.rows if trans_a else a.cols
    cdef int64_t b_k_stride = b.col_stride if trans_b else b.row_stride
    cdef int64_t b_k = b.cols if trans_b else b.rows
    if a_k == 0:
        raise ValueError("A: cuBLASLt's int8 GEMM needs K >= 1, got op(A) with no columns (the product "
                         "would be all zeros)")
    if a_k > 1 and a_k_stride != 1:
        raise ValueError(f"A: cuBLASLt's int8 GEMM reads op(A) along K (stride 1 there: a C-ordered (M, K) A, or "
                         f"an F-ordered (K, M) A with trans_a), got {_strides(a)}"
                         f"{' with trans_a' if trans_a else ''}; pass "
                         f"{'cupy.asfortranarray(A)' if trans_a else 'cupy.ascontiguousarray(A)'}")
    if b_k > 1 and b_k_stride != 1:
        raise ValueError(f"B: cuBLASLt's int8 GEMM reads op(B) along K (stride 1 there: an F-ordered (K, N) B such "
                         f"as w.T of a C-ordered (N, K) weight w, or a C-ordered (N, K) B with trans_b), got "
                         f"{_strides(b)}{' with trans_b' if trans_b else ''}; pass "
                         f"{'cupy.ascontiguousarray(B)' if trans_b else 'w.T of a C-ordered (N, K) w, or cupy.asfortranarray(B)'}")
    _read_along_k(g)
    # The operands' leading dimensions, pointers and batch strides (out's are free: measured on the
    # H200, an int32 out of any leading dimension runs). A row-major out swaps the operands
    # (cuBLAS's A is the user's B), as _mapping does.
    cdef bint swapped = is_rowmajor(out)
    cdef bint batched = g.strided_batched and g.batch > 1
    cdef int i
    cdef int64_t ld, stride
    cdef const void* ptr
    for i in range(2):
        ld = g.lda if i == 0 else g.ldb
        ptr = g.a if i == 0 else g.b
        stride = g.stride_a if i == 0 else g.stride_b
        who = ("B" if i == 0 else "A") if swapped else ("A" if i == 0 else "B")
        if ld % 4:
            raise ValueError(f"{who}: cuBLASLt's int8 GEMM needs leading dimensions that are multiples of 4 "
                             f"elements (the stride from one run along K to the next), got {ld}; copy it into "
                             f"an array whose K is padded to a multiple of 4")
        if ptr != NULL and pointer_alignment(ptr) < 4:
            raise ValueError(f"{who}: cuBLASLt's int8 GEMM needs data aligned to 4 bytes (16 for its fastest "
                             f"kernels), got an address {pointer_alignment(ptr)}-byte aligned; start views at "
                             "multiples of 4 (int8) elements")
        if batched and stride % 4:
            raise ValueError(f"{who}: cuBLASLt's int8 GEMM needs each matrix of a batch aligned to 4 bytes, got "
                             f"a batch stride of {stride} elements; use a batch stride that is a multiple of 4")
    if out.dtype == INT8_SUMS_DTYPE:
        _check_integral("alpha", sc.alpha_re)
        _check_integral("beta", sc.beta_re)
    return 0


cdef str _no_kernel(const ColMajorGemm* g, const MatrixView* out, cudaDataType out_type):
    cdef bint swapped = is_rowmajor(out)
    cdef const void* pa = g.b if swapped else g.a
    cdef const void* pb = g.a if swapped else g.b
    return (f"A/B/out: cuBLASLt has no int8 kernel for this problem on this GPU (M={out.rows} N={out.cols} "
            f"K={g.k}, batch {g.batch if g.strided_batched else 1}, out {dtype_name(out_type)}, A, B and out "
            f"aligned to {pointer_alignment(pa)}/{pointer_alignment(pb)}/{pointer_alignment(g.c)} bytes): int8 "
            f"GEMMs need compute capability >= 7.5, operands contiguous along K, leading dimensions that are "
            f"multiples of 4 and 16-byte aligned data for some sizes")


cdef Plan _plan(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, GemmTypes* types, const Scalars* sc,
               Policy policy, const MatrixView* out, void* ws):
    cdef Plan plan = get_plan(ctx, stream, g, types.d, CUBLAS_COMPUTE_32I, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL,
                              0, ws, ctx.workspace_bytes, policy, not beta_is_zero(sc), types)
    if check_runnable(plan, stream, "int8 GEMM"):
        raise ValueError(_no_kernel(g, out, types.d))
    return plan


cdef int _run_one(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, GemmTypes* types,
                  const Scalars* sc, Policy policy, const MatrixView* out) except -1:
    cdef void* ws = call_workspace(ctx, stream)
    cdef Plan plan = _plan(ctx, stream, g, types, sc, policy, out, ws)
    return run_plan(plan, ctx, stream, g, NULL, NULL, ws, ctx.workspace_bytes, sc, REFUSAL_RAISE, dtype_name(INT8_DTYPE))


cdef int run_int8(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, const MatrixView* out,
                  cudaDataType out_type, const Scalars* sc, Policy policy) except -1:
    cdef GemmTypes types
    memset(&types, 0, sizeof(types))
    types.a = types.b = INT8_DTYPE
    types.c = types.d = out_type
    types.bias = out_type
    if policy.determinism != DETERMINISM_OFF:
        if out_type != INT8_SUMS_DTYPE:
            raise ValueError("determinism: an int8 out is rounded by each kernel's own float epilogue, which "
                             "cygemm does not pin; use an int32 out (exact sums: the same bits from every kernel) "
                             "and scale it, or determinism='off'")
        policy.determinism = DETERMINISM_OFF        # exact sums: every kernel gives these bits
        policy.autotune = AUTOTUNE_AUTO
    if g.m == 0 or g.n == 0 or (g.strided_batched and g.batch == 0):
        return 0
    cdef ColMajorGemm one
    cdef int64_t i
    cdef int out_size = type_size(out_type)
    cdef int phase
    if g.strided_batched and g.batch > 1 and not lt_batch_ok(g):
        for phase in range(2):          # every matrix's plan first: nothing runs unless all have a kernel
            for i in range(g.batch):
                nth_matrix(g, i, 1, out_size, &one)
                if phase == 0:
                    _plan(ctx, stream, &one, &types, sc, policy, out, call_workspace(ctx, stream))
                else:
                    _run_one(ctx, stream, &one, &types, sc, policy, out)
        return 0
    return _run_one(ctx, stream, g, &types, sc, policy, out)
