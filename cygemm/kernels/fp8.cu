// FP8 conversion kernels: quantize (x * scale, saturated to the format's finite range, cast;
// optionally max |x| on the way) and dequantize (q * scale_inv). Memory-bound: each thread
// moves 16 elements per step with 16-byte loads and stores where both pointers are 16-byte
// aligned, a scalar loop otherwise and for the tail; the grid is sized to the GPU and strides.
#include "cygemm/fp8_kernels.h"
#include "cygemm/convert.h"
#include "cygemm/sm_count.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 16;           // elements per thread per step: 16 bytes of FP8

using cygemm_convert::to_f;
using cygemm_convert::from_f;

__device__ __forceinline__ unsigned char quantize1(float v, __nv_fp8_interpretation_t fmt) {
    return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt);
}

__device__ __forceinline__ float dequantize1(unsigned char q, __nv_fp8_interpretation_t fmt) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(q, fmt);
    return __half2float(__half(h));
}

// Block-wide max of non-negative floats, then one atomicMax per block: non-negative floats
// order as their bit patterns do, so the int max is the float max (amax was zeroed first).
__device__ __forceinline__ void block_amax(float m, float* amax) {
    __shared__ float warp_max[kThreads / 32];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        m = threadIdx.x < kThreads / 32 ? warp_max[threadIdx.x] : 0.f;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        if (threadIdx.x == 0 && m > 0.f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
    }
}

// 16 elements of T from 16-byte aligned memory.
template <typename T>
__device__ __forceinline__ void load16(const T* p, float v[kChunk]) {
    constexpr int per = 16 / sizeof(T);             // elements per 16-byte load
#pragma unroll
    for (int j = 0; j < kChunk / per; ++j) {
        uint4 raw = reinterpret_cast<const uint4*>(p)[j];
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < per; ++i) v[j * per + i] = to_f(e[i]);
    }
}

template <typename T>
__device__ __forceinline__ void store16(T* p, const float v[kChunk]) {
    constexpr int per = 16 / sizeof(T);
#pragma unroll
    for (int j = 0; j < kChunk / per; ++j) {
        uint4 raw;
        T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
        for (int i = 0; i < per; ++i) e[i] = from_f<T>(v[j * per + i]);
        reinterpret_cast<uint4*>(p)[j] = raw;
    }
}

template <typename T, bool VEC, bool AMAX, bool WRITE>
__global__ void __launch_bounds__(kThreads) quantize_kernel(int64_t n, const T* __restrict__ x,
                                                            const float* __restrict__ scale,
                                                            unsigned char* __restrict__ q, float* amax,
                                                            __nv_fp8_interpretation_t fmt) {
    const float s = WRITE ? __ldg(scale) : 1.f;
    const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    float m = 0.f;
    int64_t done = 0;
    if (VEC) {
        const int64_t chunks = n / kChunk;
        for (int64_t c = tid; c < chunks; c += stride) {
            float v[kChunk];
            load16(x + c * kChunk, v);
            if (AMAX) {
#pragma unroll
                for (int i = 0; i < kChunk; ++i) m = fmaxf(m, fabsf(v[i]));
            }
            if (WRITE) {
                uint4 out;
                unsigned short* pairs = reinterpret_cast<unsigned short*>(&out);
#pragma unroll
                for (int i = 0; i < kChunk / 2; ++i)
                    pairs[i] = __nv_cvt_float2_to_fp8x2(make_float2(v[2 * i] * s, v[2 * i + 1] * s),
                                                        __NV_SATFINITE, fmt);
                reinterpret_cast<uint4*>(q)[c] = out;
            }
        }
        done = chunks * kChunk;
    }
    for (int64_t i = done + tid; i < n; i += stride) {
        const float v = to_f(x[i]);
        if (AMAX) m = fmaxf(m, fabsf(v));
        if (WRITE) q[i] = quantize1(v * s, fmt);
    }
    if (AMAX) block_amax(m, amax);
}

template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(int64_t n, const unsigned char* __restrict__ q,
                                                              const float* __restrict__ scale_inv,
                                                              T* __restrict__ y, __nv_fp8_interpretation_t fmt) {
    const float s = __ldg(scale_inv);
    const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    int64_t done = 0;
    if (VEC) {
        const int64_t chunks = n / kChunk;
        for (int64_t c = tid; c < chunks; c += stride) {
            uint4 raw = reinterpret_cast<const uint4*>(q)[c];
            const unsigned short* pairs = reinterpret_cast<const unsigned short*>(&raw);
            float v[kChunk];
#pragma unroll
            for (int i = 0; i < kChunk / 2; ++i) {
                __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pairs[i], fmt);
                float2 f = __half22float2(__half2(h));
                v[2 * i] = f.x * s;
                v[2 * i + 1] = f.y * s;
            }
            store16(y + c * kChunk, v);
        }
        done = chunks * kChunk;
    }
    for (int64_t i = done + tid; i < n; i += stride) y[i] = from_f<T>(dequantize1(q[i], fmt) * s);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Blocks for n elements: enough to fill every SM several times over, no more than the work.
unsigned grid_for(int64_t n) {
    const int count = cygemm_grid::sm_count();
    const int64_t per_block = int64_t(kThreads) * kChunk;
    return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + per_block - 1) / per_block, int64_t(count) * 8)));
}

__nv_fp8_interpretation_t interp(cudaDataType format) { return format == CUDA_R_8F_E5M2 ? __NV_E5M2 : __NV_E4M3; }

template <typename T, bool AMAX, bool WRITE>
void launch_quantize(int64_t n, const void* x, const float* scale, void* q, float* amax,
                     __nv_fp8_interpretation_t fmt, cudaStream_t stream) {
    const bool vec = aligned16(x) && (!WRITE || aligned16(q));
    auto xs = static_cast<const T*>(x);
    auto qs = static_cast<unsigned char*>(q);
    if (vec)
        quantize_kernel<T, true, AMAX, WRITE><<<grid_for(n), kThreads, 0, stream>>>(n, xs, scale, qs, amax, fmt);
    else
        quantize_kernel<T, false, AMAX, WRITE><<<grid_for(n), kThreads, 0, stream>>>(n, xs, scale, qs, amax, fmt);
}

template <typename T>
cudaError_t quantize(int64_t n, const void* x, const float* scale, void* q, float* amax,
                     __nv_fp8_interpretation_t fmt, cudaStream_t stream) {
    if (amax) {
        cudaError_t err = cudaMemsetAsync(amax, 0, sizeof(float), stream);
        if (err != cudaSuccess) return err;
    }
    if (n == 0) return cudaSuccess;
    if (q && amax) launch_quantize<T, true, true>(n, x, scale, q, amax, fmt, stream);
    else if (q) launch_quantize<T, false, true>(n, x, scale, q, amax, fmt, stream);
    else if (amax) launch_quantize<T, true, false>(n, x, scale, q, amax, fmt, stream);
    return cudaGetLastError();
}

template <typename T>
cudaError_t dequantize(int64_t n, const void* q, const float* scale_inv, void* y, __nv_fp8_interpretation_t fmt,
                       cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    auto qs = static_cast<const unsigned char*>(q);
    auto ys = static_cast<T*>(y);
    if (aligned16(q) && aligned16(y))
        dequantize_kernel<T, true><<<grid_for(n), kThreads, 0, stream>>>(n, qs, scale_inv, ys, fmt);
    else
        dequantize_kernel<T, false><<<grid_for(n), kThreads, 0, stream>>>(n, qs, scale_inv, ys, fmt);
    return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t cygemm_fp8_quantize(cudaDataType dtype, cudaDataType format, int64_t n, const void* x,
                                           const float* scale, void* q, float* amax, cudaStream_t stream) {
    if (q == nullptr || (format != CUDA_R_8F_E4M3 && format != CUDA_R_8F_E5M2)) return cudaErrorInvalidValue;
    switch (dtype) {
    case CUDA_R_32F: return quantize<float>(n, x, scale, q, amax, interp(format), stream);
    case CUDA_R_16F: return quantize<__half>(n, x, scale, q, amax, interp(format), stream);
    case CUDA_R_16BF: return quantize<__nv_bfloat16>(n, x, scale, q, amax, interp(format), stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t cygemm_amax(cudaDataType dtype, int64_t n, const void* x, float* amax, cudaStream_t stream) {
    if (amax == nullptr) return cudaErrorInvalidValue;
    switch (dtype) {
    case CUDA_R_32F: return quantize<float>(n, x, nullptr, nullptr, amax, __NV_E4M3, stream);
    case CUDA_R_16F: return quantize<__half>(n, x, nullptr, nullptr, amax, __NV_E4M3, stream);
    case CUDA_R_16BF: return quantize<__nv_bfloat16>(n, x, nullptr, nullptr, amax, __NV_E4M3, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t cygemm_fp8_dequantize(cudaDataType format, cudaDataType dtype, int64_t n, const void* q,
                                             const float* scale_inv, void* y, cudaStream_t stream) {
    if (format != CUDA_R_8F_E4M3 && format != CUDA_R_8F_E5M2) return cudaErrorInvalidValue;
    switch (dtype) {
    case CUDA_R_32F: return dequantize<float>(n, q, scale_inv, y, interp(format), stream);
    case CUDA_R_16F: return dequantize<__half>(n, q, scale_inv, y, interp(format), stream);
    case CUDA_R_16BF: return dequantize<__nv_bfloat16>(n, q, scale_inv, y, interp(format), stream);
    default: return cudaErrorInvalidValue;
    }
}
