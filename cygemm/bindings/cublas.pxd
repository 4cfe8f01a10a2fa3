# cuBLAS (cublas_v2.h) as cygemm uses it: handles, streams, workspace, GemmEx, grouped GEMMs.
# Every function is nogil and returns cublasStatus_t; check it with
# cygemm._core.check_cublas.
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType

cdef extern from "cublas_v2.h" nogil:
    ctypedef void* cublasHandle_t 'cublasHandle_t'

    ctypedef enum cublasStatus_t:
        CUBLAS_STATUS_SUCCESS
        CUBLAS_STATUS_NOT_INITIALIZED
        CUBLAS_STATUS_ALLOC_FAILED
        CUBLAS_STATUS_INVALID_VALUE
        CUBLAS_STATUS_ARCH_MISMATCH
        CUBLAS_STATUS_MAPPING_ERROR
        CUBLAS_STATUS_EXECUTION_FAILED
        CUBLAS_STATUS_INTERNAL_ERROR
        CUBLAS_STATUS_NOT_SUPPORTED
        CUBLAS_STATUS_LICENSE_ERROR

    ctypedef enum cublasOperation_t:
        CUBLAS_OP_N
        CUBLAS_OP_T
        CUBLAS_OP_C

    ctypedef enum cublasComputeType_t:
        CUBLAS_COMPUTE_16F
        CUBLAS_COMPUTE_32F
        CUBLAS_COMPUTE_32F_PEDANTIC
        CUBLAS_COMPUTE_32F_FAST_16F
        CUBLAS_COMPUTE_32F_FAST_16BF
        CUBLAS_COMPUTE_32F_FAST_TF32
        CUBLAS_COMPUTE_64F
        CUBLAS_COMPUTE_32I

    ctypedef enum cublasGemmAlgo_t:
        CUBLAS_GEMM_DEFAULT

    ctypedef enum cublasMath_t:
        CUBLAS_DEFAULT_MATH
        CUBLAS_TF32_TENSOR_OP_MATH

    cublasStatus_t cublasCreate(cublasHandle_t* handle)
    cublasStatus_t cublasDestroy(cublasHandle_t handle)
    cublasStatus_t cublasGetVersion(cublasHandle_t handle, int* version)
    cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
    cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes)
    cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
    const char* cublasGetStatusName(cublasStatus_t status)
    const char* cublasGetStatusString(cublasStatus_t status)

    cublasStatus_t cublasGemmEx(
        cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
        int m, int n, int k, const void* alpha,
        const void* A, cudaDataType Atype, int lda,
        const void* B, cudaDataType Btype, int ldb,
        const void* beta, void* C, cudaDataType Ctype, int ldc,
        cublasComputeType_t computeType, cublasGemmAlgo_t algo)

    cublasStatus_t cublasGemmStridedBatchedEx(
        cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
        int m, int n, int k, const void* alpha,
        const void* A, cudaDataType Atype, int lda, long long strideA,
        const void* B, cudaDataType Btype, int ldb, long long strideB,
        const void* beta, void* C, cudaDataType Ctype, int ldc, long long strideC,
        int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo)

    # The 64-bit integer API (cuBLAS >= 12): used when a size or stride passes 2**31 - 1.
    cublasStatus_t cublasGemmEx_64(
        cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
        int64_t m, int64_t n, int64_t k, const void* alpha,
        const void* A, cudaDataType Atype, int64_t lda,
        const void* B, cudaDataType Btype, int64_t ldb,
        const void* beta, void* C, cudaDataType Ctype, int64_t ldc,
        cublasComputeType_t computeType, cublasGemmAlgo_t algo)

    cublasStatus_t cublasGemmStridedBatchedEx_64(
        cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
        int64_t m, int64_t n, int64_t k, const void* alpha,
        const void* A, cudaDataType Atype, int64_t lda, long long strideA,
        const void* B, cudaDataType Btype, int64_t ldb, long long strideB,
        const void* beta, void* C, cudaDataType Ctype, int64_t ldc, long long strideC,
        int64_t batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo)

    # Groups of GEMMs in one call (cuBLAS >= 12.5): the size arrays live on the host, the
    # pointer arrays (one entry per matrix, groups one after another) in device memory.
    cublasStatus_t cublasGemmGroupedBatchedEx(
        cublasHandle_t handle, const cublasOperation_t* transa_array, const cublasOperation_t* transb_array,
        const int* m_array, const int* n_array, const int* k_array, const void* alpha_array,
        const void* const* Aarray, cudaDataType Atype, const int* lda_array,
        const void* const* Barray, cudaDataType Btype, const int* ldb_array,
        const void* beta_array, void* const* Carray, cudaDataType Ctype, const int* ldc_array,
        int group_count, const int* group_size, cublasComputeType_t computeType)
