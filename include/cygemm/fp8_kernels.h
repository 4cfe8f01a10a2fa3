/* cygemm's FP8 conversion kernels: quantize (scale, saturate, cast; optionally the amax of the
 * input) and dequantize. Shared by cygemm/fp8_kernels.cu and cygemm/fp8_kernels.pxd.
 * Arrays are contiguous, `n` elements; scales are device float32 scalars, read by the kernel
 * (a captured graph replays with whatever scale the buffer holds then). Every launcher
 * enqueues on `stream` and returns the launch's cudaError_t. */
#ifndef CYGEMM_FP8_KERNELS_H
#define CYGEMM_FP8_KERNELS_H

#include <stdint.h>
#include <cuda_runtime_api.h>
#include <library_types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* q[i] = saturate(x[i] * scale[0]) in `format` (CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2): values
 * beyond the format's largest finite value become that value, NaN stays NaN. amax, when not
 * NULL, receives max |x[i]| (NaN ignored; 0 for n == 0). dtype: CUDA_R_32F, CUDA_R_16F or
 * CUDA_R_16BF. */
cudaError_t cygemm_fp8_quantize(cudaDataType dtype, cudaDataType format, int64_t n, const void* x,
                                const float* scale, void* q, float* amax, cudaStream_t stream);

/* y[i] = float(q[i]) * scale_inv[0], stored in dtype (CUDA_R_32F, CUDA_R_16F or CUDA_R_16BF). */
cudaError_t cygemm_fp8_dequantize(cudaDataType format, cudaDataType dtype, int64_t n, const void* q,
                                  const float* scale_inv, void* y, cudaStream_t stream);

/* amax[0] = max |x[i]| (NaN ignored) without writing anything else: the amax pass alone. */
cudaError_t cygemm_amax(cudaDataType dtype, int64_t n, const void* x, float* amax, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* CYGEMM_FP8_KERNELS_H */
