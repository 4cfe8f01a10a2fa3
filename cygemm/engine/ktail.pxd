# The guard against split-K kernels that drop the end of K (cuBLAS 13.1 measured: bf16/fp16 GEMMs
# whose K is not a multiple of the kernel's block of K). Below _launch: what may run, not how
# it is chosen. See ktail.pyx for the rule and the measurements behind it.
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaDataType
from cygemm.bindings.cublas cimport cublasComputeType_t
from cygemm.bindings.cublaslt cimport (cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                       cublasLtMatmulAlgo_t)
from cygemm.engine.types cimport ColMajorGemm
from cygemm.engine.context cimport GemmContext

# K's largest multiple of this is safe from any kernel: every block of K cuBLASLt names
# (its stages, 8 to 256 deep) divides it.
cdef enum:
    KTAIL_GRAIN = 256

# Whether a kernel that splits K could drop part of a K this long (no split can where K is a
# multiple of KTAIL_GRAIN, or too short to split): the cheap test before any other.
cdef bint ktail_possible(int64_t k) noexcept nogil
# Whether `splits` splits of K may leave its tail to no split, for any block of K from 8 to 256.
cdef bint split_drops(int64_t k, int splits) noexcept nogil
# Make `algo` (checked for this problem) safe for K: 0 it was, 1 its split of K was changed to
# the nearest safe one cuBLASLt accepts (ws_needed receives its workspace), -1 none is. Raises
# CygemmError where the guard's first-use check failed on this cuBLAS.
cdef int make_safe(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                   cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                   cublasLtMatmulAlgo_t* algo, cudaDataType dtype, int64_t k, size_t ws_bytes,
                   size_t* ws_needed) except -2
# The storage types the guard acts on (bfloat16 and float16: where the defect was measured).
cdef bint guarded_type(cudaDataType dtype) noexcept nogil
# Whether cublasGemmEx would run a kernel that drops part of K for this problem: the kernel
# cuBLASLt's heuristic puts first for it (cublasGemmEx runs that kernel: measured). Cached per problem.
cdef bint gemmex_drops(GemmContext* ctx, const ColMajorGemm* g, cudaDataType dtype,
                       cublasComputeType_t compute) except -1 nogil
