/* The kernels of cygemm.nn: the losses (forward and backward in one launch) and the optimizers
 * (one launch for every parameter of a model, which lives in one flat buffer). Shared by
 * cygemm/kernels/nn.cu (definitions) and cygemm/kernels/nn.pxd (Cython).
 *
 * Every kernel that reduces to a scalar does so in one launch: each block writes its partial
 * sum to `partial` (`blocks` floats), and the last block to finish (counted in `done`, a zeroed
 * unsigned int that it resets) adds the partials in block order: deterministic, with no memset
 * and no second launch. The same counter lets the optimizers advance `step` once per launch.
 *
 * Each launcher enqueues one kernel of `blocks` blocks (>= 1) of CYGEMM_NN_THREADS threads on
 * `stream` and returns cudaGetLastError(): no allocation, no synchronisation, no host read, so
 * a launch can be captured into a CUDA graph. */
#ifndef CYGEMM_NN_KERNELS_H
#define CYGEMM_NN_KERNELS_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Threads per block of every launch (8 warps: the losses give each row one warp). */
#define CYGEMM_NN_THREADS 256

/* Softmax cross-entropy, mean over rows: *loss = loss_scale * sum(logsumexp(z) - z[y]);
 * grad = (softmax(z) - onehot(y)) * grad_scale. logits (B, C) with row stride ld, grad (B, C)
 * with row stride gld, labels B int32 (_i32) or int64 (_i64). A label outside [0, C) sets *bad
 * and adds nothing. With bias_grad (C floats; col_partial: blocks * C floats; else both NULL)
 * also the column sums of grad, in (CYGEMM_NN_THREADS / 32) * C floats of shared memory. */
cudaError_t cygemm_softmax_xent_i32(const float* logits, int64_t ld, const int32_t* labels, float* grad,
                                    int64_t gld, int B, int C, float grad_scale, float loss_scale,
                                    float* partial, unsigned int* done, float* loss, int* bad,
                                    float* col_partial, float* bias_grad, int blocks, cudaStream_t stream);
cudaError_t cygemm_softmax_xent_i64(const float* logits, int64_t ld, const int64_t* labels, float* grad,
                                    int64_t gld, int B, int C, float grad_scale, float loss_scale,
                                    float* partial, unsigned int* done, float* loss, int* bad,
                                    float* col_partial, float* bias_grad, int blocks, cudaStream_t stream);

/* Mean squared error: *loss = loss_scale * sum((y - t)^2); grad = grad_scale * (y - t), each
 * (B, C) with its row stride. */
cudaError_t cygemm_mse(const float* y, int64_t yld, const float* t, int64_t tld, float* grad, int64_t gld,
                       int B, int C, float grad_scale, float loss_scale, float* partial, unsigned int* done,
                       float* loss, int blocks, cudaStream_t stream);

/* The learning-rate schedules the optimizers read at step t (1-based): a linear warm-up over the
 * first `warmup` steps, then constant, or decaying to final_factor * lr at step `total`. */
#define CYGEMM_LR_CONSTANT 0
#define CYGEMM_LR_LINEAR 1
#define CYGEMM_LR_COSINE 2

/* SGD as torch.optim.SGD over n parameters p (float32) with gradients g and momentum buffer buf
 * (read only when momentum != 0); the base rate at *lr, the step count at *step (advanced once).
 * g holds float32 gradients, or bfloat16 ones when grad_bf16 is nonzero (bf16-mixed training,
 * whose GEMMs write them). p_bf16, unless NULL, receives the updated p rounded to bfloat16 (n
 * elements): the copy the GEMMs of bf16-mixed training read, refreshed in the same launch. */
cudaError_t cygemm_sgd(float* p, const void* g, int grad_bf16, void* p_bf16, float* buf, int64_t n,
                       const float* lr, int* step, float momentum, float dampening, float weight_decay,
                       int nesterov, int schedule, int warmup, int total, float final_factor,
                       unsigned int* done, int blocks, cudaStream_t stream);

/* Adam (decoupled 0) or AdamW (decoupled 1) as torch's, with moments m and v (float32); g,
 * grad_bf16 and p_bf16 as cygemm_sgd's. */
cudaError_t cygemm_adam(float* p, const void* g, int grad_bf16, void* p_bf16, float* m, float* v,
                        int64_t n, const float* lr, int* step, float beta1, float beta2, float eps,
                        float weight_decay, int decoupled, int schedule, int warmup, int total,
                        float final_factor, unsigned int* done, int blocks, cudaStream_t stream);

/* n elements converted between float32 and bfloat16 (round to nearest even; y may not overlap x):
 * bf16-mixed training's inputs, parameter copy, logits and loss gradient. */
cudaError_t cygemm_f32_to_bf16(const float* x, void* y, int64_t n, int blocks, cudaStream_t stream);
cudaError_t cygemm_bf16_to_f32(const void* x, float* y, int64_t n, int blocks, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* CYGEMM_NN_KERNELS_H */
