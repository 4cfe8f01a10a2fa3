# cython: language_level=3, boundscheck=False, wraparound=False
"""int8 x int8 GEMMs through cuBLASLt's integer tensor cores: out = alpha * op(A) @ op(B) + beta * out
with int32 accumulation, into an int32 out (alpha, beta integers: exact, as NumPy's int64 product
where it fits in int32) or an int8 out (alpha, beta real: round to nearest, saturated).

The rules are Hopper's, measured on an H200 with cuBLASLt 13.1 (benchmarks/int8_rules.cu): every
int8 kernel reads op(A) and op(B) along K ("TN" to cuBLAS), with leading dimensions that are
multiples of 4 elements and pointers aligned to 4 bytes (16 for the fastest); M and N are free.
cuBLASLt offers a few other orders for some sizes only, so cygemm takes the one that always runs
and says so before anything runs. An integer sum does not depend on its order, so every kernel
gives the same bits: determinism policies need nothing here.
"""
from libc.stdint cimport int64_t

from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType, CUDA_R_8I, CUDA_R_32I
from cygemm.bindings.cublas cimport cublasStatus_t, CUBLAS_STATUS_SUCCESS, CUBLAS_COMPUTE_32I, CUBLAS_OP_N
from cygemm.bindings.cublaslt cimport CUBLASLT_EPILOGUE_DEFAULT
from cygemm._types cimport (MatrixView, ColMajorGemm, GemmTypes, Scalars, beta_is_zero, pointer_alignment)
from cygemm._errors cimport check_cublas
from cygemm._settings cimport default_policy, AUTOTUNE_AUTO, POLICY_RUN_TO_RUN
from cygemm._context cimport GemmContext, call_workspace
from cygemm._streams cimport stream_is_capturing
from cygemm.plans cimport Plan, get_plan, execute_plan

from libc.string cimport memset

cdef double INT32_MIN_D = -2147483648.0, INT32_MAX_D = 2147483647.0


cdef str _strides(const MatrixView* v):
    return f"strides ({v.row_stride}, {v.col_stride}) elements"


cdef int check_int8(const MatrixView* a, const MatrixView* b, const MatrixView* out, bint trans_a,
                    bint trans_b, const ColMajorGemm* g, const Scalars* sc) except -1:
    # op(A) is (M, K): K runs along A's columns, or its rows when trans_a.
    cdef int64_t a_k_stride = a.row_stride if trans_a else a.col_stride
    cdef int64_t a_k = a.rows if trans_a else a.cols
    cdef int64_t b_k_stride = b.col_stride if trans_b else b.row_stride
    cdef int64_t b_k = b.cols if trans_b else b.rows
    if a_k == 0:
        raise ValueError("A: cuBLASLt's int8 GEMM needs K >= 1 (op(A) has no columns); the product is all zeros")
    if a_k > 1 and a_k_stride != 1:
        raise ValueError(f"A: cuBLASLt's int8 GEMM reads op(A) along K (stride 1 there: a C-ordered (M, K) array, "
                         f"or trans_a with an F-ordered (K, M) one), got {_strides(a)}"
                         f"{' with trans_a' if trans_a else ''}; pass cupy.ascontiguousarray(A)")
    if b_k > 1 and b_k_stride != 1:
        raise ValueError(f"B: cuBLASLt's int8 GEMM reads op(B) along K (stride 1 there: an F-ordered (K, N) array "
                         f"such as w.T of a C-ordered (N, K) weight, or trans_b=True with w itself), got "
                         f"{_strides(b)}{' with trans_b' if trans_b else ''}; pass w.T of a C-ordered (N, K) "
                         f"array, or cupy.asfortranarray(B)")
    # The operands' leading dimensions and pointers (out's are free: measured on the H200, an int32
    # out of any leading dimension runs); cuBLAS's A is the user's B when the call is swapped.
    cdef int i
    cdef int64_t ld
    cdef const void* ptr
    for i in range(2):
        ld = g.lda if i == 0 else g.ldb
        ptr = g.a if i == 0 else g.b
        who = "A" if ptr == <const void*>a.ptr else "B"
        if ld % 4:
            raise ValueError(f"{who}: cuBLASLt's int8 GEMM needs leading dimensions that are multiples of 4 "
                             f"elements (the stride from one run along K to the next), got {ld}; pad K to a "
                             f"multiple of 4")
        if ptr != NULL and pointer_alignment(ptr) < 4:
            raise ValueError(f"{who}: cuBLASLt's int8 GEMM needs data aligned to 4 bytes (16 for its fastest "
                             f"kernels), got an address {pointer_alignment(ptr)}-byte aligned; start views at "
                             "multiples of 4 (int8) elements")
    if out.dtype == CUDA_R_32I:
        for name, v in (("alpha", sc.alpha_re), ("beta", sc.beta_re)):
            if v != <double><int64_t>v or not (INT32_MIN_D <= v <= INT32_MAX_D):
                raise ValueError(f"{name}: an int32 out takes integer alpha and beta (int32 scale), got {v!r}; "
                                 "pass an int8 out for a real scale, or scale the int32 result")
    return 0


cdef str _no_kernel(const ColMajorGemm* g, cudaDataType out_type):
    return (f"A/B/out: cuBLASLt has no int8 kernel for this problem on this GPU (M={g.n} N={g.m} K={g.k}, "
            f"batch {g.batch if g.strided_batched else 1}, out {'int32' if out_type == CUDA_R_32I else 'int8'}, "
            f"addresses aligned to {pointer_alignment(g.a)}/{pointer_alignment(g.b)}/{pointer_alignment(g.c)} "
            f"bytes): int8 GEMMs need compute capability >= 7.5, operands contiguous along K, leading "
            f"dimensions that are multiples of 4 and 16-byte aligned data for some sizes")


cdef bint _batch_in_order(const ColMajorGemm* g) noexcept nogil:
    """Every operand's matrices one after another: the batches cuBLASLt takes (else each
    matrix runs alone)."""
    cdef int64_t a_cols = g.k if g.opa == CUBLAS_OP_N else g.m
    cdef int64_t b_cols = g.n if g.opb == CUBLAS_OP_N else g.k
    return g.stride_a >= g.lda * a_cols and g.stride_b >= g.ldb * b_cols and g.stride_c >= g.ldc * g.n


cdef int _run_one(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, GemmTypes* types,
                  const Scalars* sc, int autotune) except -1:
    cdef void* ws = call_workspace(ctx, stream)
    cdef size_t ws_bytes = ctx.workspace_bytes
    cdef Plan plan = get_plan(ctx, stream, g, types.d, CUBLAS_COMPUTE_32I, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL,
                              0, ws, ws_bytes, autotune, not beta_is_zero(sc), types)
    if not plan.d.usable or plan.d.n_candidates == 0:
        raise ValueError(_no_kernel(g, types.d))
    if not plan.d.capture_ok and stream_is_capturing(stream):
        raise ValueError("cublasLtMatmul refused this int8 GEMM inside a capture; run it once eagerly first")
    cdef int st = CUBLAS_STATUS_SUCCESS
    if execute_plan(plan, ctx, stream, g, NULL, NULL, ws, ws_bytes, sc, &st):
        check_cublas(<cublasStatus_t>st, "cublasLtMatmul (int8)")      # refused: nothing ran
    return 0


cdef int run_int8(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType out_type,
                  const Scalars* sc, int autotune) except -1:
    cdef GemmTypes types
    memset(&types, 0, sizeof(types))
    types.a = types.b = CUDA_R_8I
    types.c = types.d = out_type
    types.bias = out_type
    if autotune < 0:
        autotune = default_policy()
    if autotune >= POLICY_RUN_TO_RUN:       # exact sums: every kernel gives these bits
        autotune = AUTOTUNE_AUTO
    if g.m == 0 or g.n == 0 or (g.strided_batched and g.batch == 0):
        return 0
    cdef ColMajorGemm one
    cdef int64_t i
    cdef int out_size = 4 if out_type == CUDA_R_32I else 1
    if g.strided_batched and g.batch > 1 and not _batch_in_order(g):
        one = g[0]
        one.batch, one.strided_batched = 1, False
        for i in range(g.batch):
            one.a = <const char*>g.a + i * g.stride_a
            one.b = <const char*>g.b + i * g.stride_b
            one.c = <char*>g.c + i * g.stride_c * out_size
            _run_one(ctx, stream, &one, &types, sc, autotune)
        return 0
    return _run_one(ctx, stream, g, &types, sc, autotune)
