# The kernels of cygemm.nn (include/cygemm/nn_kernels.h, defined in cygemm/kernels/nn.cu).
from libc.stdint cimport int32_t, int64_t
from cygemm.bindings.cudart cimport cudaError_t, cudaStream_t

cdef extern from "cygemm/nn_kernels.h" nogil:
    enum: CYGEMM_NN_THREADS
    enum: CYGEMM_LR_CONSTANT
    enum: CYGEMM_LR_LINEAR
    enum: CYGEMM_LR_COSINE

    cudaError_t cygemm_softmax_xent_i32(const float* logits, int64_t ld, const int32_t* labels, float* grad,
                                        int64_t gld, int B, int C, float grad_scale, float loss_scale,
                                        float* partial, unsigned int* done, float* loss, int* bad,
                                        float* col_partial, float* bias_grad, int blocks, cudaStream_t stream)
    cudaError_t cygemm_softmax_xent_i64(const float* logits, int64_t ld, const int64_t* labels, float* grad,
                                        int64_t gld, int B, int C, float grad_scale, float loss_scale,
                                        float* partial, unsigned int* done, float* loss, int* bad,
                                        float* col_partial, float* bias_grad, int blocks, cudaStream_t stream)
    cudaError_t cygemm_mse(const float* y, int64_t yld, const float* t, int64_t tld, float* grad, int64_t gld,
                           int B, int C, float grad_scale, float loss_scale, float* partial, unsigned int* done,
                           float* loss, int blocks, cudaStream_t stream)
    cudaError_t cygemm_sgd(float* p, const void* g, int grad_bf16, void* p_bf16, float* buf, int64_t n,
                           const float* lr, int* step, float momentum, float dampening, float weight_decay,
                           int nesterov, int schedule, int warmup, int total, float final_factor,
                           unsigned int* done, int blocks, cudaStream_t stream)
    cudaError_t cygemm_adam(float* p, const void* g, int grad_bf16, void* p_bf16, float* m, float* v,
                            int64_t n, const float* lr, int* step, float beta1, float beta2, float eps,
                            float weight_decay, int decoupled, int schedule, int warmup, int total,
                            float final_factor, unsigned int* done, int blocks, cudaStream_t stream)
    cudaError_t cygemm_f32_to_bf16(const float* x, void* y, int64_t n, int blocks, cudaStream_t stream)
    cudaError_t cygemm_bf16_to_f32(const void* x, float* y, int64_t n, int blocks, cudaStream_t stream)
