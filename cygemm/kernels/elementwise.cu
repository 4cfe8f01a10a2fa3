// cygemm's own kernels: bias + activation forward for what cuBLASLt epilogues
// lack, and the backward's dZ = gY * act'(Z) fused with the bias-gradient column
// sum. Memory-bound: each element is read once and written once, 16-byte
// accesses where the layout allows (4 floats or 8 halves per access), float math
// for every storage type.
#include "cygemm/kernels.h"
#include "cygemm/convert.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

namespace {

constexpr int kColThreads = 32;      // threads across columns in a block
constexpr int kRowThreads = 8;       // threads across rows in a block

// Columns per thread for T: one 16-byte access (4 floats, 8 halves).
template <typename T> constexpr int cols_per_thread() { return 16 / int(sizeof(T)); }

using cygemm_convert::to_f;
using cygemm_convert::from_f;

// __fdividef: a division of a few instructions (IEEE division cost the GELU pass 16% of its
// bandwidth on the H200); for 1 + exp(-z) = inf it gives 0, the limit.
__device__ __forceinline__ float sigmoidf(float z) { return __fdividef(1.f, 1.f + __expf(-z)); }

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

__device__ __forceinline__ float act_f(cygemm_act_t act, float z, float slope) {
    switch (act) {
    case CYGEMM_ACT_RELU: return z > 0.f ? z : 0.f;
    case CYGEMM_ACT_LEAKY_RELU: return z > 0.f ? z : slope * z;
    // 0.5 (1 + tanh(u)) = sigmoid(2u): the tanh approximation without tanhf.
    case CYGEMM_ACT_GELU: return z * sigmoidf(2.f * kSqrt2OverPi * (z + kGeluC * z * z * z));
    case CYGEMM_ACT_GELU_ERF: return 0.5f * z * (1.f + erff(z * kInvSqrt2));
    case CYGEMM_ACT_SIGMOID: return sigmoidf(z);
    case CYGEMM_ACT_TANH: return tanhf(z);
    case CYGEMM_ACT_SILU: return z * sigmoidf(z);
    default: return z;
    }
}

__device__ __forceinline__ float act_grad(cygemm_act_t act, float z, float slope) {
    switch (act) {
    case CYGEMM_ACT_RELU: return z > 0.f ? 1.f : 0.f;
    case CYGEMM_ACT_LEAKY_RELU: return z > 0.f ? 1.f : slope;
    case CYGEMM_ACT_GELU: {
        // gelu = z s with s = sigmoid(2u), u = sqrt(2/pi) (z + c z^3): d/dz = s + z s (1 - s) 2 u'.
        float s = sigmoidf(2.f * kSqrt2OverPi * (z + kGeluC * z * z * z));
        return s + z * s * (1.f - s) * 2.f * kSqrt2OverPi * (1.f + 3.f * kGeluC * z * z);
    }
    case CYGEMM_ACT_GELU_ERF:
        return 0.5f * (1.f + erff(z * kInvSqrt2)) + z * kInvSqrt2Pi * __expf(-0.5f * z * z);
    case CYGEMM_ACT_SIGMOID: { float s = sigmoidf(z); return s * (1.f - s); }
    case CYGEMM_ACT_TANH: { float t = tanhf(z); return 1.f - t * t; }
    case CYGEMM_ACT_SILU: { float s = sigmoidf(z); return s * (1.f + z * (1.f - s)); }
    default: return 1.f;
    }
}

// act'(z) written in terms of y = act(z), for the activations where y determines it.
__device__ __forceinline__ float act_grad_from_output(cygemm_act_t act, float y, float slope) {
    switch (act) {
    case CYGEMM_ACT_RELU: return y > 0.f ? 1.f : 0.f;
    case CYGEMM_ACT_LEAKY_RELU: return y > 0.f ? 1.f : slope;
    case CYGEMM_ACT_SIGMOID: return y * (1.f - y);
    case CYGEMM_ACT_TANH: return 1.f - y * y;
    default: return 1.f;
    }
}

// Load / store CV = cols_per_thread<T>() consecutive elements; VEC: one 16-byte access.
template <typename T, bool VEC>
__device__ __forceinline__ void loadv(const T* p, int64_t col, int64_t n, float* v) {
    constexpr int CV = cols_per_thread<T>();
    if (VEC) {
        uint4 raw = *reinterpret_cast<const uint4*>(p);
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < CV; ++i) v[i] = to_f(e[i]);
    } else {
#pragma unroll
        for (int i = 0; i < CV; ++i) v[i] = col + i < n ? to_f(p[i]) : 0.f;
    }
}

template <typename T, bool VEC>
__device__ __forceinline__ void storev(T* p, int64_t col, int64_t n, const float* v) {
    constexpr int CV = cols_per_thread<T>();
    if (VEC) {
        uint4 raw;
        T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
        for (int i = 0; i < CV; ++i) e[i] = from_f<T>(v[i]);
        *reinterpret_cast<uint4*>(p) = raw;
    } else {
#pragma unroll
        for (int i = 0; i < CV; ++i) if (col + i < n) p[i] = from_f<T>(v[i]);
    }
}

constexpr int kFwdRows = 4;          // rows per thread in the forward: their loads go out together

// ACT is a template argument: the activation's switch folds away at compile time instead of
// branching on every element.
template <typename T, bool VEC, int ACT>
__global__ void bias_act_forward_kernel(int64_t m, int64_t n, const T* x, int64_t ldx, const T* __restrict__ bias,
                                        T* y, int64_t ldy, T* z, int64_t ldz, float slope) {
    constexpr cygemm_act_t act = static_cast<cygemm_act_t>(ACT);
    constexpr int CV = cols_per_thread<T>();
    const int64_t col = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * CV;
    if (col >= n) return;
    float b[CV];
#pragma unroll
    for (int i = 0; i < CV; ++i) b[i] = 0.f;
    if (bias) loadv<T, VEC>(bias + col, col, n, b);
    // x may alias y or z: each thread loads its rows before it stores them.
    for (int64_t row0 = int64_t(blockIdx.y) * kFwdRows; row0 < m; row0 += int64_t(gridDim.y) * kFwdRows) {
        float v[kFwdRows][CV];
#pragma unroll
        for (int r = 0; r < kFwdRows; ++r)
            if (row0 + r < m) loadv<T, VEC>(x + (row0 + r) * ldx + col, col, n, v[r]);
#pragma unroll
        for (int r = 0; r < kFwdRows; ++r) {
            if (row0 + r >= m) break;
#pragma unroll
            for (int i = 0; i < CV; ++i) v[r][i] += b[i];
            if (z) storev<T, VEC>(z + (row0 + r) * ldz + col, col, n, v[r]);
#pragma unroll
            for (int i = 0; i < CV; ++i) v[r][i] = act_f(act, v[r][i], slope);
            storev<T, VEC>(y + (row0 + r) * ldy + col, col, n, v[r]);
        }
    }
}

// Block (kColThreads x kRowThreads) covers kColThreads * cols_per_thread<T>() columns of one chunk of rows.
// ACT is a template argument, as in the forward: a switch per element cost the bfloat16 pass a
// third of its bandwidth on the H200.
template <typename T, bool VEC, int ACT>
__global__ void act_backward_kernel(int64_t m, int64_t n, int64_t rows_per_chunk,
                                    const T* gy, int64_t ldgy, const T* __restrict__ z, int64_t ldz,
                                    T* dz, int64_t lddz,      // dz may be gy (in place): not restrict
                                    float* partial, float slope, bool from_output) {
    constexpr cygemm_act_t act = static_cast<cygemm_act_t>(ACT);
    constexpr int CV = cols_per_thread<T>();
    constexpr int kBlockCols = kColThreads * CV;
    __shared__ float sums[kRowThreads][kBlockCols];
    const int64_t col = int64_t(blockIdx.x) * kBlockCols + threadIdx.x * CV;
    const int64_t row0 = int64_t(blockIdx.y) * rows_per_chunk;
    const int64_t row1 = min(m, row0 + rows_per_chunk);
    float acc[CV];
#pragma unroll
    for (int i = 0; i < CV; ++i) acc[i] = 0.f;
    if (col < n) {
        // Unrolled so that several rows' loads are in flight at once (memory-bound).
#pragma unroll 4
        for (int64_t row = row0 + threadIdx.y; row < row1; row += kRowThreads) {
            float g[CV], zz[CV];
            loadv<T, VEC>(gy + row * ldgy + col, col, n, g);
            if (act != CYGEMM_ACT_NONE) {
                loadv<T, VEC>(z + row * ldz + col, col, n, zz);
#pragma unroll
                for (int i = 0; i < CV; ++i)
                    g[i] *= from_output ? act_grad_from_output(act, zz[i], slope) : act_grad(act, zz[i], slope);
            }
            if (dz) storev<T, VEC>(dz + row * lddz + col, col, n, g);
#pragma unroll
            for (int i = 0; i < CV; ++i) acc[i] += g[i];
        }
    }
    if (!partial) return;
#pragma unroll
    for (int i = 0; i < CV; ++i) sums[threadIdx.y][threadIdx.x * CV + i] = acc[i];
    __syncthreads();
    // Fixed-order sum over the block's rows: the result does not depend on timing.
    for (int c = threadIdx.y * kColThreads + threadIdx.x; c < kBlockCols; c += kColThreads * kRowThreads) {
        const int64_t gc = int64_t(blockIdx.x) * kBlockCols + c;
        if (gc >= n) continue;
        float s = 0.f;
#pragma unroll
        for (int r = 0; r < kRowThreads; ++r) s += sums[r][c];
        partial[int64_t(blockIdx.y) * n + gc] = s;
    }
}

template <typename T>
__global__ void column_sum_kernel(int64_t n, int64_t chunks, const float* partial, T* dbias, float beta) {
    const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (col >= n) return;
    float s = 0.f;
    for (int64_t c = 0; c < chunks; ++c) s += partial[c * n + col];
    dbias[col] = from_f<T>(beta != 0.f ? s + beta * to_f(dbias[col]) : s);
}

bool aligned16(const void* p) { return p == nullptr || (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

int64_t chunk_rows(int64_t m, int64_t n, int64_t block_cols) {
    // Enough blocks to keep the chip's loads in flight (~2k: 1k left the bfloat16 pass at 65%
    // of copy bandwidth on the H200), chunks a multiple of the block's rows.
    const int64_t col_blocks = (n + block_cols - 1) / block_cols;
    int64_t chunks = std::max<int64_t>(1, std::min<int64_t>((2048 + col_blocks - 1) / col_blocks,
                                                            (m + kRowThreads - 1) / kRowThreads));
    int64_t rows = (m + chunks - 1) / chunks;
    rows = (rows + kRowThreads - 1) / kRowThreads * kRowThreads;
    return std::max<int64_t>(rows, kRowThreads);
}

template <typename T>
cudaError_t forward(int64_t m, int64_t n, const void* x, int64_t ldx, const void* bias, void* y, int64_t ldy,
                    void* z, int64_t ldz, cygemm_act_t act, float slope, cudaStream_t stream) {
    if (m == 0 || n == 0) return cudaSuccess;
    constexpr int CV = cols_per_thread<T>();
    dim3 block(256);
    dim3 grid(unsigned((n + 256 * CV - 1) / (256 * CV)),
              unsigned(std::min<int64_t>((m + kFwdRows - 1) / kFwdRows, 65535)));
    const bool vec = n % CV == 0 && ldx % CV == 0 && ldy % CV == 0 &&
                     (z == nullptr || ldz % CV == 0) && aligned16(x) && aligned16(y) && aligned16(z) &&
                     aligned16(bias);
    auto args = [&](auto kernel) {
        kernel<<<grid, block, 0, stream>>>(m, n, static_cast<const T*>(x), ldx, static_cast<const T*>(bias),
                                           static_cast<T*>(y), ldy, static_cast<T*>(z), ldz, slope);
    };
    auto by_act = [&](auto vec_tag) {
        constexpr bool V = decltype(vec_tag)::value;
        switch (act) {
#define CYGEMM_FORWARD_CASE(A) case CYGEMM_ACT_##A: args(bias_act_forward_kernel<T, V, CYGEMM_ACT_##A>); break;
        CYGEMM_ACTIVATIONS(CYGEMM_FORWARD_CASE)
#undef CYGEMM_FORWARD_CASE
        default: args(bias_act_forward_kernel<T, V, CYGEMM_ACT_NONE>); break;
        }
    };
    if (vec) by_act(std::true_type{}); else by_act(std::false_type{});
    return cudaGetLastError();
}

template <typename T>
cudaError_t backward(int64_t m, int64_t n, const void* gy, int64_t ldgy, const void* z, int64_t ldz,
                     void* dz, int64_t lddz, void* dbias, float beta, float* scratch, cygemm_act_t act,
                     float slope, bool from_output, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    const int64_t rows = chunk_rows(m, n, kColThreads * cols_per_thread<T>());
    const int64_t chunks = m == 0 ? 0 : (m + rows - 1) / rows;
    if (chunks > 0) {
        constexpr int CV = cols_per_thread<T>();
        dim3 block(kColThreads, kRowThreads);
        dim3 grid(unsigned((n + kColThreads * CV - 1) / (kColThreads * CV)), unsigned(chunks));
        const bool vec = n % CV == 0 && ldgy % CV == 0 && ldz % CV == 0 &&
                         lddz % CV == 0 && aligned16(gy) && aligned16(z) && aligned16(dz);
        float* partial = dbias ? scratch : nullptr;
        auto args = [&](auto kernel) {
            kernel<<<grid, block, 0, stream>>>(m, n, rows, static_cast<const T*>(gy), ldgy, static_cast<const T*>(z),
                                               ldz, static_cast<T*>(dz), lddz, partial, slope, from_output);
        };
        auto by_act = [&](auto vec_tag) {
            constexpr bool V = decltype(vec_tag)::value;
            switch (act) {
#define CYGEMM_BACKWARD_CASE(A) case CYGEMM_ACT_##A: args(act_backward_kernel<T, V, CYGEMM_ACT_##A>); break;
            CYGEMM_ACTIVATIONS(CYGEMM_BACKWARD_CASE)
#undef CYGEMM_BACKWARD_CASE
            default: args(act_backward_kernel<T, V, CYGEMM_ACT_NONE>); break;
            }
        };
        if (vec) by_act(std::true_type{}); else by_act(std::false_type{});
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    if (dbias) {
        column_sum_kernel<T><<<unsigned((n + 255) / 256), 256, 0, stream>>>(n, chunks, scratch,
                                                                            static_cast<T*>(dbias), beta);
        return cudaGetLastError();
    }
    return cudaSuccess;
}

}  // namespace

extern "C" cudaError_t cygemm_bias_act_forward(cudaDataType dtype, int64_t m, int64_t n, const void* x, int64_t ldx,
                                               const void* bias, void* y, int64_t ldy, void* z, int64_t ldz,
                                               cygemm_act_t act, float slope, cudaStream_t stream) {
    switch (dtype) {
    case CUDA_R_32F: return forward<float>(m, n, x, ldx, bias, y, ldy, z, ldz, act, slope, stream);
    case CUDA_R_16F: return forward<__half>(m, n, x, ldx, bias, y, ldy, z, ldz, act, slope, stream);
    case CUDA_R_16BF: return forward<__nv_bfloat16>(m, n, x, ldx, bias, y, ldy, z, ldz, act, slope, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" int64_t cygemm_act_backward_scratch_floats(int64_t m, int64_t n) {
    if (m == 0 || n == 0) return 0;
    // The halves' wider blocks make the most chunks: enough scratch for every dtype.
    const int64_t rows = chunk_rows(m, n, kColThreads * cols_per_thread<__half>());
    return (m + rows - 1) / rows * n;
}

extern "C" cudaError_t cygemm_act_backward(cudaDataType dtype, int64_t m, int64_t n, const void* gy, int64_t ldgy,
                                           const void* z, int64_t ldz, void* dz, int64_t lddz, void* dbias,
                                           float beta_bias, float* scratch, cygemm_act_t act, float slope,
                                           int z_is_output, cudaStream_t stream) {
    switch (dtype) {
    case CUDA_R_32F:
        return backward<float>(m, n, gy, ldgy, z, ldz, dz, lddz, dbias, beta_bias, scratch, act, slope, z_is_output != 0, stream);
    case CUDA_R_16F:
        return backward<__half>(m, n, gy, ldgy, z, ldz, dz, lddz, dbias, beta_bias, scratch, act, slope, z_is_output != 0, stream);
    case CUDA_R_16BF:
        return backward<__nv_bfloat16>(m, n, gy, ldgy, z, ldz, dz, lddz, dbias, beta_bias, scratch, act, slope,
                                       z_is_output != 0, stream);
    default: return cudaErrorInvalidValue;
    }
}
