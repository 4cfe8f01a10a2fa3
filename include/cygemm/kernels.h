/* cygemm's own CUDA kernels: what cuBLASLt epilogues do not cover.
 * Shared by cygemm/kernels.cu (definitions) and cygemm/kernels.pxd (Cython).
 * All matrices are row-major with a leading dimension (elements between rows).
 * Every launcher enqueues on `stream` and returns the launch's cudaError_t. */
#ifndef CYGEMM_KERNELS_H
#define CYGEMM_KERNELS_H

#include <stdint.h>
#include <cuda_runtime_api.h>
#include <library_types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Activation codes; the Python layer's parse_activation maps names to these. */
typedef enum {
    CYGEMM_ACT_NONE = 0,
    CYGEMM_ACT_RELU = 1,
    CYGEMM_ACT_LEAKY_RELU = 2,
    CYGEMM_ACT_GELU = 3,        /* tanh approximation, as cuBLASLt's GELU */
    CYGEMM_ACT_GELU_ERF = 4,
    CYGEMM_ACT_SIGMOID = 5,
    CYGEMM_ACT_TANH = 6,
    CYGEMM_ACT_SILU = 7
} cygemm_act_t;

/* Every activation but NONE, once: the kernels' launchers instantiate one kernel per entry
 * (X(name) for each CYGEMM_ACT_<name>; a contract test holds it equal to the enum above). */
#define CYGEMM_ACTIVATIONS(X) X(RELU) X(LEAKY_RELU) X(GELU) X(GELU_ERF) X(SIGMOID) X(TANH) X(SILU)

/* y = act(x + bias); z = x + bias when z != NULL. x may alias y or z.
 * bias: length n, or NULL. dtype: CUDA_R_32F, CUDA_R_16F or CUDA_R_16BF. */
cudaError_t cygemm_bias_act_forward(
    cudaDataType dtype, int64_t m, int64_t n,
    const void* x, int64_t ldx, const void* bias,
    void* y, int64_t ldy, void* z, int64_t ldz,
    cygemm_act_t act, float slope, cudaStream_t stream);

/* Floats of scratch cygemm_act_backward needs for an m x n problem's bias gradient. */
int64_t cygemm_act_backward_scratch_floats(int64_t m, int64_t n);

/* One pass: dz = gy * act'(z) (dz may be NULL when only the bias gradient is
 * wanted) and, when dbias != NULL, dbias[j] = sum_i dz[i, j] (or, with beta_bias
 * = 1, added to dbias). Deterministic: partial column sums go to `scratch`
 * (cygemm_act_backward_scratch_floats floats) and are reduced in a fixed order.
 * z_is_output: `z` holds the forward's output y = act(z) instead, which fixes
 * act'(z) for none, relu, leaky_relu (slope > 0), sigmoid and tanh. */
cudaError_t cygemm_act_backward(
    cudaDataType dtype, int64_t m, int64_t n,
    const void* gy, int64_t ldgy, const void* z, int64_t ldz,
    void* dz, int64_t lddz, void* dbias, float beta_bias,
    float* scratch, cygemm_act_t act, float slope, int z_is_output, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* CYGEMM_KERNELS_H */
