# cython: language_level=3, boundscheck=False, wraparound=False
# kernels: small_batched
"""Batched GEMMs of small matrices: cuBLAS's strided-batched kernels, or cygemm's own
(cygemm/kernels/small_batched.cu), a route table the one chooser decides. Every strided batch
of at least two matrices comes here from cygemm.engine.execute.run_gemm, so gemm_strided_batched,
batched matmul and the grouped GEMM's batched calls all take the route (a GemmPlan runs its own
cuBLASLt plan).

The fixed rule is the measured one (benchmarks/small_batched_probe.cu on an H200): the kernel
where it beat cuBLAS on 384 MiB batches. Problems worth tuning (large batches) are timed
once, both routes on the call's operands, when the call does not read C: the "cublas" route
timed is the caller's (cygemm.engine.execute.run_cublas), what the call runs when it wins.
"""
from libc.stdint cimport int64_t, uintptr_t

from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasComputeType_t
from cygemm.kernels.small_batched cimport (cygemm_small_batched_args, cygemm_small_batched_shape,
                                           cygemm_small_batched_fits, cygemm_small_batched_vector_fits,
                                           cygemm_small_batched_rule, cygemm_small_batched_shaped,
                                           CYGEMM_SMALL_TILE_VECTOR)
from cygemm.engine.types cimport ColMajorGemm, Scalars, beta_is_zero, compute_type, type_size, MATH_FP32, MATH_TF32
from cygemm.engine.context cimport GemmContext
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.settings cimport Policy, DETERMINISM_BATCH_INVARIANT
from cygemm.engine.chooser cimport RouteTable, route_table, choose_route, describe_route

ROUTES = {
    "cublas": "cuBLAS, as a plain GEMM runs it: cublasGemmStridedBatchedEx, or for large problems a "
              "cuBLASLt plan (timed as it runs)",
    "kernel": "cygemm's kernel for small matrices: a block stages whole matrices of A and B in shared "
              "memory, each thread computes a tile of one C adding the K products in order",
}

cdef enum:
    ROUTE_CUBLAS = 0
    ROUTE_KERNEL = 1


ctypedef struct SmallCall:
    cygemm_small_batched_args args
    GemmContext* ctx
    cudaStream_t stream
    const ColMajorGemm* g
    cudaDataType dtype
    cublasComputeType_t compute
    const Scalars* sc
    Policy policy
    cublas_route_fn cublas


cdef bint _compute_fits(cudaDataType dtype, cublasComputeType_t compute) noexcept nogil:
    """The kernel adds in fp32 (fp64 for float64 and complex128), which honours the dtype's compute
    type under either math (strict fp32 or TF32; the 16-bit types have one). The dtypes it takes
    at all are the kernel's fit check's."""
    return compute == compute_type(dtype, MATH_FP32) or compute == compute_type(dtype, MATH_TF32)


cdef void _args(cygemm_small_batched_args* a, const ColMajorGemm* g, cudaDataType dtype,
                const Scalars* sc) noexcept nogil:
    a.dtype = dtype
    a.opa, a.opb = <int>g.opa, <int>g.opb
    a.m, a.n, a.k = g.m, g.n, g.k
    a.a, a.lda, a.stride_a = g.a, g.lda, g.stride_a
    a.b, a.ldb, a.stride_b = g.b, g.ldb, g.stride_b
    a.c, a.ldc, a.stride_c = g.c, g.ldc, g.stride_c
    a.batch = g.batch
    if sc != NULL:
        a.alpha_re, a.alpha_im, a.beta_re, a.beta_im = sc.alpha_re, sc.alpha_im, sc.beta_re, sc.beta_im
    else:
        a.alpha_re, a.alpha_im, a.beta_re, a.beta_im = 1.0, 0.0, 0.0, 0.0


cdef bint small_batched_fits(const ColMajorGemm* g, cudaDataType dtype, cublasComputeType_t compute,
                             Policy policy) noexcept nogil:
    if not g.strided_batched or g.batch < 2:
        return False
    if policy.determinism == DETERMINISM_BATCH_INVARIANT or not _compute_fits(dtype, compute):
        return False
    cdef cygemm_small_batched_args a
    _args(&a, g, dtype, NULL)
    return cygemm_small_batched_fits(&a) != 0


# ---------------------------------------------------------------- the measured rule

cdef bint kernel_rule(const cygemm_small_batched_args* a) noexcept nogil:
    """Whether the kernel beat cuBLAS on the H200 for these sizes at 384 MiB batches
    (benchmarks/results/small_batched_probe_run3.txt): up to 16^3 multiply-adds a matrix
    (complex128: 8^3), sides up to 32 (8 x 32 x 8 ran 1.5-3.8x cuBLAS, 16^3 1.5-2.5x; 24^3,
    32^3, 16 x 64 x 16 and complex128's 16^3 ran slower); a transposed A up to sides of 8, or
    with K of 16 and more (padded in shared memory: 16^3 ran 1.1x in float32, 1.8x in float16;
    12^3 was not measured)."""
    cdef long long big = max(a.m, a.n, a.k)
    if a.opa != 0 and big > 8 and a.k < 16:
        return False
    cdef long long most = 8 * 8 * 8 if type_size(<cudaDataType>a.dtype) == 16 else 16 * 16 * 16   # (complex128)
    return big <= 32 and a.m * a.n * a.k <= most


# ---------------------------------------------------------------- the table

cdef int _applies(void* call, int route) except -1:
    return 1                # (the kernel's fit was checked before the table is asked)


cdef int _rule(void* call) except -1:
    return ROUTE_KERNEL if kernel_rule(&(<SmallCall*>call).args) else ROUTE_CUBLAS


cdef long long _batch_bucket(long long batch) noexcept nogil:
    """The batch as the tuning table keys it: rounded up to a power of two."""
    cdef long long bucket = 1
    while bucket < batch:
        bucket <<= 1
    return bucket


cdef object _key(void* call):
    cdef const cygemm_small_batched_args* a = &(<SmallCall*>call).args
    return ("small_batched", <int>a.dtype, a.opa, a.opb, a.m, a.n, a.k, a.lda, a.ldb, a.ldc,
            a.stride_a == 0, a.stride_b == 0, _batch_bucket(a.batch))


cdef int _forced_tile = -1          # the tests' tile (force_tile), else the kernel's rule


cdef int _enqueue(void* call, int route) except -1:
    cdef SmallCall* s = <SmallCall*>call
    cdef cygemm_small_batched_shape shape
    if route == ROUTE_KERNEL:
        with nogil:
            shape = cygemm_small_batched_rule(&s.args)
            if _forced_tile >= 0 and (_forced_tile != CYGEMM_SMALL_TILE_VECTOR
                                      or cygemm_small_batched_vector_fits(&s.args)):
                shape.tile = _forced_tile
            check_cuda(cygemm_small_batched_shaped(&s.args, shape, s.stream), "cygemm_small_batched")
    else:
        with nogil:
            s.cublas(s.ctx, s.stream, s.g, s.dtype, s.compute, s.sc, s.policy)
    return 0


cdef void _ckey(void* call, int64_t* k) noexcept nogil:
    cdef const SmallCall* s = <const SmallCall*>call
    cdef const cygemm_small_batched_args* a = &s.args
    k[0], k[1], k[2], k[3], k[4] = s.ctx.device, <int>a.dtype, a.opa | (a.opb << 8), a.m, a.n
    k[5], k[6], k[7], k[8] = a.k, a.lda, a.ldb, a.ldc
    k[9] = (a.stride_a == 0) | ((a.stride_b == 0) << 1)
    k[10] = _batch_bucket(a.batch)


cdef long long _launches = 0        # kernel launches by the route, for the tests


cdef RouteTable _SMALL = route_table("small_batched", ("cublas", "kernel"), _applies, _rule, _key, _enqueue, _ckey)


cdef int run_small_batched(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                           cublasComputeType_t compute, const Scalars* sc, Policy policy,
                           cublas_route_fn cublas) except -1:
    cdef SmallCall s
    _args(&s.args, g, dtype, sc)
    s.ctx, s.stream, s.g, s.dtype, s.compute, s.sc = ctx, stream, g, dtype, compute, sc
    s.policy, s.cublas = policy, cublas
    cdef double macs = <double>g.m * g.n * g.k * g.batch
    # Timed only where the call does not read C (timing runs write it).
    cdef int route = choose_route(_SMALL, &s, ctx, stream, policy, macs, beta_is_zero(sc), -1, NULL)
    if route != ROUTE_KERNEL:
        return 0
    _enqueue(&s, ROUTE_KERNEL)
    global _launches
    _launches += 1
    return 1


cdef dict describe_route_of(const ColMajorGemm* g, cudaDataType dtype, cublasComputeType_t compute, Policy policy):
    cdef str route = small_batched_route(g, dtype, compute, policy, -1)
    if route is None:
        return {"route": "cublas"}
    if route == "kernel":
        return {"route": "kernel", "kernels": ROUTES["kernel"]}
    return {"route": route}


cdef str small_batched_route(const ColMajorGemm* g, cudaDataType dtype, cublasComputeType_t compute,
                             Policy policy, int device):
    if not small_batched_fits(g, dtype, compute, policy):
        return None
    cdef SmallCall s
    _args(&s.args, g, dtype, NULL)
    s.g = g
    name, why = describe_route(_SMALL, &s, device, policy, <double>g.m * g.n * g.k * g.batch)
    return name if name is not None else "timed"


def kernel_launches():
    """How many times the kernel route has run in this process (for the tests)."""
    return _launches


TILES = ("1x1", "2x2", "4x4", "vector")


def force_tile(tile=None):
    """Run the kernel with one of its TILES (the vector tile only where it fits), or by its rule
    (None): every tile on every layout, for the tests."""
    global _forced_tile
    if tile is not None and tile not in TILES:
        raise ValueError(f"tile: expected one of {TILES} or None, got {tile!r}")
    _forced_tile = -1 if tile is None else TILES.index(tile)


def kernel_fits(dtype, int opa, int opb, long long m, long long n, long long k, long long batch,
                long long lda=0, long long ldb=0, long long ldc=0, bint broadcast_a=False,
                bint broadcast_b=False):
    """Whether the kernel takes a problem (no GPU needed), and whether the fixed rule picks it:
    ``(fits, rule)``. dtype: a cudaDataType number; ops 0 N, 1 T, 2 C; leading dimensions 0:
    packed. For the tests."""
    cdef cygemm_small_batched_args a
    a.dtype = <cudaDataType><int>dtype
    a.opa, a.opb, a.m, a.n, a.k, a.batch = opa, opb, m, n, k, batch
    a.lda = lda or (k if opa else m)
    a.ldb = ldb or (n if opb else k)
    a.ldc = ldc or m
    a.stride_a = 0 if broadcast_a else a.lda * (m if opa else k)
    a.stride_b = 0 if broadcast_b else a.ldb * (k if opb else n)
    a.stride_c = a.ldc * n
    a.a = a.b = a.c = <void*><uintptr_t>256
    a.alpha_re, a.alpha_im, a.beta_re, a.beta_im = 1.0, 0.0, 0.0, 0.0
    return bool(cygemm_small_batched_fits(&a)), bool(kernel_rule(&a))
