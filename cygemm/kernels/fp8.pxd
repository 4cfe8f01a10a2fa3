# cygemm's FP8 conversion kernels (include/cygemm/fp8_kernels.h, in cygemm/fp8_kernels.cu).
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaError_t, cudaStream_t, cudaDataType

cdef extern from "cygemm/fp8_kernels.h" nogil:
    cudaError_t cygemm_fp8_quantize(cudaDataType dtype, cudaDataType format, int64_t n, const void* x,
                                    const float* scale, void* q, float* amax, cudaStream_t stream)
    cudaError_t cygemm_fp8_dequantize(cudaDataType format, cudaDataType dtype, int64_t n, const void* q,
                                      const float* scale_inv, void* y, cudaStream_t stream)
    cudaError_t cygemm_amax(cudaDataType dtype, int64_t n, const void* x, float* amax, cudaStream_t stream)
