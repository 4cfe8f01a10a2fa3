# cygemm's FP8 quantization with finer scales (include/cygemm/fp8_scale_kernels.h, in
# cygemm/kernels/fp8_scales.cu).
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaError_t, cudaStream_t, cudaDataType

cdef extern from "cygemm/fp8_scale_kernels.h" nogil:
    cudaError_t cygemm_fp8_quantize_scaled(cudaDataType dtype, cudaDataType format, int mode, int transpose, int pow2,
                                           int64_t rows, int64_t cols, const void* x, void* q, float* scale,
                                           cudaStream_t stream)
