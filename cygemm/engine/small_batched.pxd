# Batched GEMMs of small matrices: cuBLAS or cygemm's kernel, a route table (see small_batched.pyx).
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasComputeType_t
from cygemm.kernels.small_batched cimport cygemm_small_batched_args
from cygemm.engine.types cimport ColMajorGemm, Scalars
from cygemm.engine.context cimport GemmContext
from cygemm.engine.settings cimport Policy

# Whether the kernel route is open to this call: a strided batch of two or more, sizes up to 64
# that the kernel takes, a compute type it honours, not under batch_invariant (whose rows must
# not change kernel with M). No GPU state.
cdef bint small_batched_fits(const ColMajorGemm* g, cudaDataType dtype, cublasComputeType_t compute,
                             Policy policy) noexcept nogil
# The measured rule: whether the kernel beat cuBLAS for these sizes and dtype.
cdef bint kernel_rule(const cygemm_small_batched_args* a) noexcept nogil
# How the "cublas" route runs a call (cygemm.engine.execute.run_cublas): given here, so that the
# route is timed running exactly what it runs when chosen.
ctypedef int (*cublas_route_fn)(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                                cublasComputeType_t compute, const Scalars* sc, Policy policy) except -1 nogil
# Choose the route (forced, tuned, timed when worth it, or the rule) and, for the kernel, run
# it: 1 when it ran, 0 when the caller is to run `cublas`. Only for calls small_batched_fits takes.
cdef int run_small_batched(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                           cublasComputeType_t compute, const Scalars* sc, Policy policy,
                           cublas_route_fn cublas) except -1
# What the chooser would decide without running: "kernel", "cublas", "timed" (decided by timing
# on the first call), or None when the kernel does not take the call.
cdef str small_batched_route(const ColMajorGemm* g, cudaDataType dtype, cublasComputeType_t compute,
                             Policy policy, int device)
# describe_*'s entries for one call's GEMM: {"route": "kernel" / "cublas" / "timed"}, and for the
# kernel its "kernels" (the call's compute type and policy; device -1: the rule or forcing).
cdef dict describe_route_of(const ColMajorGemm* g, cudaDataType dtype, cublasComputeType_t compute, Policy policy)
