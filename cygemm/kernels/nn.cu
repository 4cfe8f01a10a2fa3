// The kernels of cygemm.nn (include/cygemm/nn_kernels.h): the losses and the optimizers,
// one launch each.
#include "cygemm/nn_kernels.h"
#include "cygemm/warp_reduce.cuh"

#include <cuda_bf16.h>

namespace {
// The last block to finish (its partial already written) adds the partials in block order.
__device__ bool last_block_done(unsigned int* done) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int prev = atomicAdd(done, 1u);
        last = (prev == gridDim.x - 1);
    }
    __syncthreads();
    return last;
}

__device__ float block_sum(float v) {
    __shared__ float warp_sums[32];
    v = cygemm::warp_sum(v);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    float t = 0.f;
    if (threadIdx.x == 0)
        for (int w = 0; w < (blockDim.x + 31) / 32; ++w) t += warp_sums[w];
    return t;        // valid in thread 0
}

__device__ void finish_sum(float mine, float* partial, unsigned int* done, float* out, float scale) {
    float t = block_sum(mine);
    if (threadIdx.x == 0) partial[blockIdx.x] = t;
    if (last_block_done(done) && threadIdx.x == 0) {
        float total = 0.f;
        for (unsigned int b = 0; b < gridDim.x; ++b) total += ((volatile float*)partial)[b];
        *out = total * scale;
        *done = 0u;
    }
}

// Softmax cross-entropy, mean over rows: loss = mean(logsumexp(z) - z[y]);
// grad = (softmax(z) - onehot(y)) * grad_scale. One warp per row; max-subtracted, so logits
// of any finite size give finite results. A label outside [0, C) sets *bad and adds nothing.
// With bias_grad (C floats; dynamic shared memory of warps * C floats, col_partial of
// gridDim.x * C), also the column sums of grad: the gradient of the bias of the layer that
// made the logits, which then needs no pass of its own.
template <typename L>
__global__ void softmax_xent(const float* logits, long long ld, const L* labels, float* grad,
                             long long gld, int B, int C, float grad_scale, float loss_scale,
                             float* partial, unsigned int* done, float* loss, int* bad,
                             float* col_partial, float* bias_grad) {
    extern __shared__ float col_sums[];
    int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (bias_grad) {
        for (int i = threadIdx.x; i < warps * C; i += blockDim.x) col_sums[i] = 0.f;
        __syncthreads();
    }
    float mine = 0.f;
    for (long long row = (long long)blockIdx.x * warps + warp; row < B; row += (long long)gridDim.x * warps) {
        const float* z = logits + row * ld;
        float m, s;
        cygemm::warp_row_max_sumexp(z, C, m, s);
        float lse = m + logf(s);
        long long y = (long long)labels[row];
        bool ok = y >= 0 && y < C;
        if (!ok && lane == 0) atomicOr(bad, 1);
        float* g = grad + row * gld;
        for (int j = lane; j < C; j += 32) {
            float p = expf(z[j] - lse);
            float gj = (p - (j == y ? 1.f : 0.f)) * grad_scale;
            g[j] = gj;
            if (bias_grad) col_sums[warp * C + j] += gj;       // this warp's own row of sums
        }
        if (lane == 0 && ok) mine += lse - z[y];
    }
    float t = block_sum(mine);
    if (threadIdx.x == 0) partial[blockIdx.x] = t;
    if (bias_grad) {
        __syncthreads();
        for (int j = threadIdx.x; j < C; j += blockDim.x) {
            float s = 0.f;
            for (int w = 0; w < warps; ++w) s += col_sums[w * C + j];
            col_partial[(long long)blockIdx.x * C + j] = s;
        }
    }
    if (last_block_done(done)) {          // every block's partials are written: add them in order
        if (threadIdx.x == 0) {
            float total = 0.f;
            for (unsigned int b = 0; b < gridDim.x; ++b) total += ((volatile float*)partial)[b];
            *loss = total * loss_scale;
        }
        if (bias_grad)
            for (int j = threadIdx.x; j < C; j += blockDim.x) {
                float s = 0.f;
                for (unsigned int b = 0; b < gridDim.x; ++b) s += ((volatile float*)col_partial)[(long long)b * C + j];
                bias_grad[j] = s;
            }
        __syncthreads();
        if (threadIdx.x == 0) *done = 0u;
    }
}

// Mean squared error: loss = mean((y - t)^2); grad = 2 (y - t) / n.
__global__ void mse(const float* y, long long yld, const float* t, long long tld, float* grad,
        long long gld, int B, int C, float grad_scale, float loss_scale,
        float* partial, unsigned int* done, float* loss) {
    long long n = (long long)B * C;
    float mine = 0.f;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        long long r = i / C, c = i % C;
        float d = y[r * yld + c] - t[r * tld + c];
        grad[r * gld + c] = grad_scale * d;
        mine += d * d;
    }
    finish_sum(mine, partial, done, loss, loss_scale);
}

// The learning rate at step t (1-based) of a schedule: 0 constant, 1 linear decay to
// final_factor at total, 2 cosine to final_factor at total; a linear warm-up over the first
// `warmup` steps in each.
__device__ float scheduled_lr(float lr, int t, int kind, int warmup, int total, float final_factor) {
    float f = 1.f;
    if (warmup > 0 && t <= warmup) return lr * (float)t / (float)warmup;
    if (kind != 0 && total > warmup) {
        float p = fminf(1.f, (float)(t - warmup) / (float)(total - warmup));
        float shape = kind == 1 ? 1.f - p : 0.5f * (1.f + cospif(p));
        f = final_factor + (1.f - final_factor) * shape;
    }
    return lr * f;
}

__device__ void advance_step(int* step, unsigned int* done) {
    if (last_block_done(done) && threadIdx.x == 0) {
        *step += 1;
        *done = 0u;
    }
}

// A gradient as float: the optimizers read float32 gradients, or the bfloat16 ones that the
// GEMMs of bf16-mixed training write.
__device__ __forceinline__ float as_float(float g) { return g; }
__device__ __forceinline__ float as_float(__nv_bfloat16 g) { return __bfloat162float(g); }

// SGD as torch.optim.SGD: d = g + wd p; buf = momentum buf + (1 - dampening) d (buf = d at the
// first step); d = nesterov ? d + momentum buf : buf; p -= lr d. With p_copy (bf16-mixed), the
// updated p is also written there, rounded to bfloat16: the copy the GEMMs read.
template <typename G>
__global__ void sgd(float* p, const G* g, float* buf, long long n, const float* lr_ptr,
        int* step, float momentum, float dampening, float weight_decay, int nesterov,
        int kind, int warmup, int total, float final_factor, unsigned int* done, __nv_bfloat16* p_copy) {
    int t = *step + 1;
    float lr = scheduled_lr(*lr_ptr, t, kind, warmup, total, final_factor);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float d = as_float(g[i]);
        if (weight_decay != 0.f) d += weight_decay * p[i];
        if (momentum != 0.f) {
            float b = t == 1 ? d : momentum * buf[i] + (1.f - dampening) * d;
            buf[i] = b;
            d = nesterov ? d + momentum * b : b;
        }
        float pi = p[i] - lr * d;
        p[i] = pi;
        if (p_copy) p_copy[i] = __float2bfloat16_rn(pi);
    }
    advance_step(step, done);
}

// Adam and AdamW as torch.optim.Adam / AdamW (decoupled=1: p *= 1 - lr wd first; else the
// decay joins the gradient); p_copy as sgd's.
template <typename G>
__global__ void adam(float* p, const G* g, float* m, float* v, long long n,
        const float* lr_ptr, int* step, float beta1, float beta2, float eps, float weight_decay,
        int decoupled, int kind, int warmup, int total, float final_factor, unsigned int* done,
        __nv_bfloat16* p_copy) {
    int t = *step + 1;
    float lr = scheduled_lr(*lr_ptr, t, kind, warmup, total, final_factor);
    float bc1 = 1.f - powf(beta1, (float)t), bc2_sqrt = sqrtf(1.f - powf(beta2, (float)t));
    float step_size = lr / bc1;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float gi = as_float(g[i]), pi = p[i];
        if (weight_decay != 0.f) {
            if (decoupled) pi *= 1.f - lr * weight_decay;
            else gi += weight_decay * pi;
        }
        float mi = beta1 * m[i] + (1.f - beta1) * gi;
        float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        pi = pi - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        p[i] = pi;
        if (p_copy) p_copy[i] = __float2bfloat16_rn(pi);
    }
    advance_step(step, done);
}

// Element-wise conversions between float32 and bfloat16 (round to nearest even), for
// bf16-mixed training: its inputs, the bf16 copy of the parameters, the logits and the loss's
// gradient.
__global__ void f32_to_bf16(const float* x, __nv_bfloat16* y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void bf16_to_f32(const __nv_bfloat16* x, float* y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(x[i]);
}
}  // namespace

// Each warp keeps its own row of column sums (bias_grad): warps * C floats of shared memory.
template <typename L>
cudaError_t launch_softmax_xent(const float* logits, int64_t ld, const L* labels, float* grad, int64_t gld,
                                int B, int C, float grad_scale, float loss_scale, float* partial,
                                unsigned int* done, float* loss, int* bad, float* col_partial, float* bias_grad,
                                int blocks, cudaStream_t stream) {
    size_t shared = bias_grad ? (size_t)(CYGEMM_NN_THREADS / 32) * (size_t)C * sizeof(float) : 0;
    softmax_xent<L><<<blocks, CYGEMM_NN_THREADS, shared, stream>>>(
        logits, ld, labels, grad, gld, B, C, grad_scale, loss_scale, partial, done, loss, bad, col_partial, bias_grad);
    return cudaGetLastError();
}

extern "C" cudaError_t cygemm_softmax_xent_i32(const float* logits, int64_t ld, const int32_t* labels, float* grad,
                                               int64_t gld, int B, int C, float grad_scale, float loss_scale,
                                               float* partial, unsigned int* done, float* loss, int* bad,
                                               float* col_partial, float* bias_grad, int blocks, cudaStream_t stream) {
    return launch_softmax_xent<int>(logits, ld, labels, grad, gld, B, C, grad_scale, loss_scale, partial, done,
                                    loss, bad, col_partial, bias_grad, blocks, stream);
}

extern "C" cudaError_t cygemm_softmax_xent_i64(const float* logits, int64_t ld, const int64_t* labels, float* grad,
                                               int64_t gld, int B, int C, float grad_scale, float loss_scale,
                                               float* partial, unsigned int* done, float* loss, int* bad,
                                               float* col_partial, float* bias_grad, int blocks, cudaStream_t stream) {
    // (int64_t is long here, the kernel's labels long long: the same 8 bytes.)
    return launch_softmax_xent<long long>(logits, ld, reinterpret_cast<const long long*>(labels), grad, gld, B, C,
                                          grad_scale, loss_scale, partial, done, loss, bad, col_partial, bias_grad,
                                          blocks, stream);
}

extern "C" cudaError_t cygemm_mse(const float* y, int64_t yld, const float* t, int64_t tld, float* grad, int64_t gld,
                                  int B, int C, float grad_scale, float loss_scale, float* partial, unsigned int* done,
                                  float* loss, int blocks, cudaStream_t stream) {
    mse<<<blocks, CYGEMM_NN_THREADS, 0, stream>>>(y, yld, t, tld, grad, gld, B, C, grad_scale, loss_scale,
                                                  partial, done, loss);
    return cudaGetLastError();
}

extern "C" cudaError_t cygemm_sgd(float* p, const void* g, int grad_bf16, void* p_bf16, float* buf, int64_t n,
                                  const float* lr, int* step, float momentum, float dampening, float weight_decay,
                                  int nesterov, int schedule, int warmup, int total, float final_factor,
                                  unsigned int* done, int blocks, cudaStream_t stream) {
    __nv_bfloat16* copy = static_cast<__nv_bfloat16*>(p_bf16);
    if (grad_bf16)
        sgd<__nv_bfloat16><<<blocks, CYGEMM_NN_THREADS, 0, stream>>>(
            p, static_cast<const __nv_bfloat16*>(g), buf, n, lr, step, momentum, dampening, weight_decay, nesterov,
            schedule, warmup, total, final_factor, done, copy);
    else
        sgd<float><<<blocks, CYGEMM_NN_THREADS, 0, stream>>>(
            p, static_cast<const float*>(g), buf, n, lr, step, momentum, dampening, weight_decay, nesterov,
            schedule, warmup, total, final_factor, done, copy);
    return cudaGetLastError();
}

extern "C" cudaError_t cygemm_adam(float* p, const void* g, int grad_bf16, void* p_bf16, float* m, float* v,
                                   int64_t n, const float* lr, int* step, float beta1, float beta2, float eps,
                                   float weight_decay, int decoupled, int schedule, int warmup, int total,
                                   float final_factor, unsigned int* done, int blocks, cudaStream_t stream) {
    __nv_bfloat16* copy = static_cast<__nv_bfloat16*>(p_bf16);
    if (grad_bf16)
        adam<__nv_bfloat16><<<blocks, CYGEMM_NN_THREADS, 0, stream>>>(
            p, static_cast<const __nv_bfloat16*>(g), m, v, n, lr, step, beta1, beta2, eps, weight_decay, decoupled,
            schedule, warmup, total, final_factor, done, copy);
    else
        adam<float><<<blocks, CYGEMM_NN_THREADS, 0, stream>>>(
            p, static_cast<const float*>(g), m, v, n, lr, step, beta1, beta2, eps, weight_decay, decoupled,
            schedule, warmup, total, final_factor, done, copy);
    return cudaGetLastError();
}

extern "C" cudaError_t cygemm_f32_to_bf16(const float* x, void* y, int64_t n, int blocks, cudaStream_t stream) {
    f32_to_bf16<<<blocks, CYGEMM_NN_THREADS, 0, stream>>>(x, static_cast<__nv_bfloat16*>(y), n);
    return cudaGetLastError();
}

extern "C" cudaError_t cygemm_bf16_to_f32(const void* x, float* y, int64_t n, int blocks, cudaStream_t stream) {
    bf16_to_f32<<<blocks, CYGEMM_NN_THREADS, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), y, n);
    return cudaGetLastError();
}
