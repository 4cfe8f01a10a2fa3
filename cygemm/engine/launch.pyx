# cython: language_level=3, boundscheck=False, wraparound=False
"""Enqueueing one GEMM: cublasGemmEx / cublasGemmStridedBatchedEx (their _64 forms past
2**31 - 1), or cublasLtMatmul by a plan's descriptors and algorithm. Below the plans: what
runs, not how it was chosen."""
from libc.stdint cimport int64_t

from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
from cygemm.engine.dtypes cimport cg_dtype_row, cg_dtype_row_of
from cygemm.engine.types cimport ColMajorGemm, GemmTypes, Scalars, scale_type, type_size
from cygemm.engine.errors cimport check_cublas
from cygemm.engine.context cimport GemmContext, bind_stream
from cygemm.engine.ktail cimport KTAIL_GRAIN, gemmex_drops, guarded_type, ktail_possible


cdef int64_t INT32_MAX = 2147483647


cdef int gemm_colmajor(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                       cudaDataType dtype, cublasComputeType_t compute, const Scalars* sc) except -1 nogil:
    return check_cublas(<cublasStatus_t>_gemmex(ctx, stream, g, dtype, compute, sc),
                        "cublasGemmEx" if not g.strided_batched else "cublasGemmStridedBatchedEx")


cdef bint needs_64bit_api(const ColMajorGemm* g) noexcept nogil:
    return (g.m > INT32_MAX or g.n > INT32_MAX or g.k > INT32_MAX or g.lda > INT32_MAX
            or g.ldb > INT32_MAX or g.ldc > INT32_MAX or g.batch > INT32_MAX)


cdef inline void _write_scalars(cudaDataType scale, const Scalars* sc, double* buf, const void** alpha,
                                const void** beta) noexcept nogil:
    """alpha and beta as cuBLAS and cuBLASLt read them for the scale type `scale` (see
    _types.scale_type), written into buf (32 bytes); alpha and beta point into it."""
    cdef float* f = <float*>buf
    cdef int* i = <int*>buf
    cdef const cg_dtype_row* r = cg_dtype_row_of(scale)       # (its kind and width, from the dtype table)
    if r.kind == b'c' and r.size == 16:
        buf[0], buf[1], buf[2], buf[3] = sc.alpha_re, sc.alpha_im, sc.beta_re, sc.beta_im
        alpha[0], beta[0] = &buf[0], &buf[2]
    elif r.kind == b'c':
        f[0], f[1], f[2], f[3] = <float>sc.alpha_re, <float>sc.alpha_im, <float>sc.beta_re, <float>sc.beta_im
        alpha[0], beta[0] = &f[0], &f[2]
    elif r.kind == b'i':
        i[0], i[1] = <int>sc.alpha_re, <int>sc.beta_re
        alpha[0], beta[0] = &i[0], &i[1]
    elif r.size == 8:
        buf[0], buf[1] = sc.alpha_re, sc.beta_re
        alpha[0], beta[0] = &buf[0], &buf[1]
    else:
        f[0], f[1] = <float>sc.alpha_re, <float>sc.beta_re
        alpha[0], beta[0] = &f[0], &f[1]


cdef int _gemmex(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                 cudaDataType dtype, cublasComputeType_t compute, const Scalars* sc) except -1 nogil:
    """The cuBLAS status of one GemmEx call (-1: binding the stream raised). Where the kernel
    cuBLAS would choose drops the end of K (cygemm.engine.ktail), K's largest multiple of 256 runs as
    cuBLAS chooses and the rest of K without a workspace (so unsplit), added with beta = 1."""
    cdef ColMajorGemm head, tail
    cdef Scalars sc_tail
    cdef int st
    cdef int64_t size
    if not gemmex_drops(ctx, g, dtype, compute):
        return _gemmex_one(ctx, stream, g, dtype, compute, sc)
    head = g[0]
    head.k = g.k - g.k % KTAIL_GRAIN
    if head.k > 0:
        st = _gemmex_one(ctx, stream, &head, dtype, compute, sc)
        if st != CUBLAS_STATUS_SUCCESS:
            return st
    tail = g[0]
    tail.k = g.k - head.k
    size = type_size(dtype)
    tail.a = <const char*>g.a + (head.k * g.lda if g.opa == CUBLAS_OP_N else head.k) * size
    tail.b = <const char*>g.b + (head.k if g.opb == CUBLAS_OP_N else head.k * g.ldb) * size
    sc_tail = sc[0]
    if head.k > 0:
        sc_tail.beta_re, sc_tail.beta_im = 1.0, 0.0
    bind_stream(ctx, stream)
    # cuBLAS splits K only into its workspace: none, and the tail runs in one piece.
    st = cublasSetWorkspace(ctx.blas, NULL, 0)
    ctx.bound = False               # the next call binds the workspace again
    if st != CUBLAS_STATUS_SUCCESS:
        return st
    return _gemmex_raw(ctx, &tail, dtype, compute, &sc_tail)


cdef int _gemmex_one(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                     cudaDataType dtype, cublasComputeType_t compute, const Scalars* sc) except -1 nogil:
    bind_stream(ctx, stream)
    return _gemmex_raw(ctx, g, dtype, compute, sc)


cdef int _gemmex_raw(GemmContext* ctx, const ColMajorGemm* g, cudaDataType dtype, cublasComputeType_t compute,
                     const Scalars* sc) noexcept nogil:
    cdef double buf[4]
    cdef const void* alpha
    cdef const void* beta
    _write_scalars(scale_type(compute, dtype), sc, buf, &alpha, &beta)
    # Past 2**31 - 1 in any size or leading dimension take cuBLAS's 64-bit API;
    # below it the 32-bit one, whose kernels and heuristics are the tuned ones.
    if g.strided_batched and needs_64bit_api(g):
        return cublasGemmStridedBatchedEx_64(
            ctx.blas, g.opa, g.opb, g.m, g.n, g.k, alpha,
            g.a, dtype, g.lda, g.stride_a, g.b, dtype, g.ldb, g.stride_b,
            beta, g.c, dtype, g.ldc, g.stride_c, g.batch, compute, CUBLAS_GEMM_DEFAULT)
    if g.strided_batched:
        return cublasGemmStridedBatchedEx(
            ctx.blas, g.opa, g.opb, <int>g.m, <int>g.n, <int>g.k, alpha,
            g.a, dtype, <int>g.lda, g.stride_a, g.b, dtype, <int>g.ldb, g.stride_b,
            beta, g.c, dtype, <int>g.ldc, g.stride_c, <int>g.batch, compute, CUBLAS_GEMM_DEFAULT)
    if needs_64bit_api(g):
        return cublasGemmEx_64(
            ctx.blas, g.opa, g.opb, g.m, g.n, g.k, alpha, g.a, dtype, g.lda, g.b, dtype, g.ldb,
            beta, g.c, dtype, g.ldc, compute, CUBLAS_GEMM_DEFAULT)
    return cublasGemmEx(
        ctx.blas, g.opa, g.opb, <int>g.m, <int>g.n, <int>g.k, alpha,
        g.a, dtype, <int>g.lda, g.b, dtype, <int>g.ldb,
        beta, g.c, dtype, <int>g.ldc, compute, CUBLAS_GEMM_DEFAULT)


cdef int plan_run(GemmContext* ctx, cudaStream_t stream, PlanData* d, const ColMajorGemm* g,
                  const void* bias, void* aux, void* ws, size_t ws_bytes, const Scalars* sc) except -1 nogil:
    cdef cublasStatus_t st
    if d.route == PLAN_GEMMEX:
        return _gemmex(ctx, stream, g, d.dtype, d.compute, sc)
    cdef double buf[4]
    cdef const void* alpha
    cdef const void* beta
    _write_scalars(scale_type(d.compute, d.dtype), sc, buf, &alpha, &beta)
    # Pointers change between calls that share a plan; setting them is a host-side copy.
    if bias != NULL:
        st = cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias))
        if st != CUBLAS_STATUS_SUCCESS:
            return st
    if aux != NULL:
        st = cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux))
        if st != CUBLAS_STATUS_SUCCESS:
            return st
    if d.ld != NULL:        # an FP8 D: C (not read, beta is 0) has a type of its own
        return cublasLtMatmul(ctx.lt, d.desc, alpha, g.a, d.la, g.b, d.lb, beta, NULL, d.lc, g.c, d.ld,
                              &d.algo, ws, ws_bytes, stream)
    return cublasLtMatmul(ctx.lt, d.desc, alpha, g.a, d.la, g.b, d.lb, beta, g.c, d.lc, g.c, d.lc,
                          &d.algo, ws, ws_bytes, stream)


cdef int set_scale_pointers(PlanData* d, const GemmTypes* t) noexcept nogil:
    cdef cublasStatus_t st = CUBLAS_STATUS_SUCCESS
    if t.a_scale != NULL:
        st = cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &t.a_scale, sizeof(void*))
    if st == CUBLAS_STATUS_SUCCESS and t.b_scale != NULL:
        st = cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &t.b_scale, sizeof(void*))
    if st == CUBLAS_STATUS_SUCCESS and t.d_scale != NULL:
        st = cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &t.d_scale, sizeof(void*))
    if st == CUBLAS_STATUS_SUCCESS and t.amax_d != NULL:
        st = cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &t.amax_d, sizeof(void*))
    return st


cdef int grouped_lt_run(GemmContext* ctx, cudaStream_t stream, cublasLtMatmulDesc_t desc,
                        cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                        cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t* algo, const void* alpha,
                        const void* a, const void* b, const void* beta, const void* c, void* d, void* ws,
                        size_t ws_bytes) noexcept nogil:
    # The K-tail guard does not act here: the grouped matmul runs only on cuBLASLt 13.8.1 or
    # newer, whose notes name the split-K fix (13.8.0.4), and its first-use check (promise
    # "lt_grouped") runs the K-tail detector through a ragged-K group of 32776 rows.
    return cublasLtMatmul(ctx.lt, desc, alpha, a, la, b, lb, beta, c, lc, d, ld, algo, ws, ws_bytes, stream)


cdef int grouped_batched_run(GemmContext* ctx, cudaStream_t stream, const cublasOperation_t* ops, const int* dims,
                             const float* scalars, int64_t part, const void* const* a, const void* const* b,
                             void* const* c, cudaDataType dtype, int count, const int* ones,
                             cublasComputeType_t compute) except -1 nogil:
    # The K-tail guard: which kernels this call runs is cuBLAS's choice, out of sight; where a
    # group of a guarded type has a K a split could cut short, it runs with no workspace (cuBLAS
    # splits K only into its workspace), so unsplit.
    cdef int i
    cdef bint unsplit = False
    for i in range(count if guarded_type(dtype) else 0):
        if ktail_possible(dims[2 * part + i]):
            unsplit = True
            break
    bind_stream(ctx, stream)
    if unsplit:
        check_cublas(cublasSetWorkspace(ctx.blas, NULL, 0), "cublasSetWorkspace")
        ctx.bound = False           # the next call binds the workspace again
    check_cublas(cublasGemmGroupedBatchedEx(
        ctx.blas, ops, ops + part, dims, dims + part, dims + 2 * part, scalars, a, dtype, dims + 3 * part,
        b, dtype, dims + 4 * part, scalars + part, c, dtype, dims + 5 * part, count, ones, compute),
        "cublasGemmGroupedBatchedEx")
    return 0
