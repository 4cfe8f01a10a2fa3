/* cygemm's kernels quantizing to FP8 with the scales of cuBLASLt's FP8 GEMMs on Hopper: one
 * for the tensor (current scaling), one per row, per 1 x 128 tile along a row, or per 128 x 128
 * block, each from the amax of the elements it scales. Shared by cygemm/kernels/fp8_scales.cu and its .pxd.
 *
 * For each group of elements:
 *   amax  = max |x| over the group (NaN ignored);
 *   m     = fmax / amax in float32 (fmax: 448 for E4M3, 57344 for E5M2), rounded down to a
 *           power of two when pow2; m = 1 where amax is 0 or not finite;
 *   q     = saturate(x * m), rounded to nearest even (NaN stays NaN);
 *   scale = 1 / m, the dequantizing scale cygemm.fp8.scaled_matmul takes (q * scale ~ x).
 *
 * x is rows x cols, C-contiguous, float32, float16 or bfloat16. q is rows x cols C-contiguous
 * FP8 bytes, or with `transpose` cols x rows (the quantized x^T: a backward pass's operand). The
 * groups lie along q's rows; the scales go where cuBLASLt reads them for q as scaled_matmul's
 * `a` (its `b` is q.T with the scale array transposed), q_rows x q_cols being q's shape:
 *  - CYGEMM_SCALE_TENSOR: scale[0], one for all of q;
 *  - CYGEMM_SCALE_ROWWISE: scale[r], one per row of q (q_rows floats);
 *  - CYGEMM_SCALE_1X128: 128 consecutive elements of a row of q; scale[g * q_rows + r]
 *    (q_rows-contiguous, ceil(q_cols / 128) groups);
 *  - CYGEMM_SCALE_128X128: 128 x 128 blocks of q; scale[br * ld + bc] with
 *    ld = round_up(ceil(q_cols / 128), 4) (the padding is not written).
 * Allocation-free and capturable (every launch on `stream`); returns the first launch's error. */
#ifndef CYGEMM_FP8_SCALE_KERNELS_H
#define CYGEMM_FP8_SCALE_KERNELS_H

#include <stdint.h>
#include <cuda_runtime_api.h>
#include <library_types.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { CYGEMM_SCALE_TENSOR = 0, CYGEMM_SCALE_ROWWISE = 3, CYGEMM_SCALE_1X128 = 4, CYGEMM_SCALE_128X128 = 5 };

cudaError_t cygemm_fp8_quantize_scaled(cudaDataType dtype, cudaDataType format, int mode, int transpose, int pow2,
                                       int64_t rows, int64_t cols, const void* x, void* q, float* scale,
                                       cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* CYGEMM_FP8_SCALE_KERNELS_H */
