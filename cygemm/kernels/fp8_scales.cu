// Quantizing to FP8 with per-tensor, per-row, 1 x 128 and 128 x 128 scales (cygemm/fp8_scale_kernels.h
// says what each computes and where its scales go). Memory-bound: every load is a coalesced
// 4-element access, several in flight per thread. Each element is read once where its group is
// at hand (a 1 x 128 tile in a warp, a 128 x 128 block in a block's registers), twice where the
// group's amax needs all of it first (a row: the second read from L2; the tensor, and x^T's rows,
// x's columns: a pass for the amax, one for the codes). The transposed forms stage a 128 x 64
// tile of x in shared memory so that both the reads of x and the writes of x^T are coalesced.
#include "cygemm/fp8_scale_kernels.h"
#include "cygemm/convert.h"
#include "cygemm/sm_count.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kGroup = 128;            // elements a 1 x 128 scale covers; a 128 x 128 block's side
constexpr int kTileCols = 64;          // x's columns in a transposed tile (x^T's rows)
constexpr float kMaxMult = 0x1p126f;   // the largest m: a tiny amax gives 2^126, not infinity

using cygemm_convert::to_f;

// m of a group (see the header): fmax / amax, 1 without a finite positive amax, at most 2^126,
// rounded down to a power of two when pow2.
__device__ __forceinline__ float quant_mult(float amax, float fmax, bool pow2) {
    if (!(amax > 0.f) || isinf(amax)) return 1.f;
    float m = fminf(__fdiv_rn(fmax, amax), kMaxMult);
    if (pow2) m = ldexpf(1.f, ilogbf(m));
    return m;
}

__device__ __forceinline__ float warp_max(float m) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    return m;
}

// The block's maximum, in every thread (fmaxf: NaN ignored).
__device__ __forceinline__ float block_max(float m) {
    __shared__ float warp_m[kWarps];
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) warp_m[threadIdx.x >> 5] = m;
    __syncthreads();
    m = warp_m[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, warp_m[w]);
    __syncthreads();                   // (warp_m is reused by the next call)
    return m;
}

__device__ __forceinline__ float max4(const float v[4]) {
    return fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
}

// x[c..c+3] of a row of n elements as floats (0 beyond n); VEC: one 4-element load (c % 4 == 0
// and the row 4-element aligned).
template <typename T, bool VEC>
__device__ __forceinline__ void load4(const T* row, int64_t c, int64_t n, float v[4]) {
    if (VEC && c + 3 < n) {
        if (sizeof(T) == 4) {
            float4 f = *reinterpret_cast<const float4*>(row + c);
            v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
        } else {
            uint2 raw = *reinterpret_cast<const uint2*>(row + c);
            const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] = to_f(e[i]);
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = c + i < n ? to_f(row[c + i]) : 0.f;
}

// q[c..c+3] = saturate(v * m) (those below n); VEC: one 4-byte store.
template <bool VEC>
__device__ __forceinline__ void store4(unsigned char* row, int64_t c, int64_t n, const float v[4], float m,
                                       __nv_fp8_interpretation_t fmt) {
    if (VEC && c + 3 < n) {
        uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[0] * m, v[1] * m), __NV_SATFINITE, fmt);
        uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[2] * m, v[3] * m), __NV_SATFINITE, fmt);
        *reinterpret_cast<uint32_t*>(row + c) = lo | (hi << 16);
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
        if (c + i < n) row[c + i] = __nv_cvt_float_to_fp8(v[i] * m, __NV_SATFINITE, fmt);
}

// 1 x 128 along x's rows: a warp per UNROLL consecutive tiles of a row, 4 elements a lane in
// each, every load issued before the first reduction (several in flight per lane).
constexpr int kUnroll = 4;

template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads) tiles_kernel(int64_t rows, int64_t cols, const T* __restrict__ x,
                                                         unsigned char* __restrict__ q, float* __restrict__ scale,
                                                         float fmax, bool pow2, __nv_fp8_interpretation_t fmt) {
    const int lane = threadIdx.x & 31;
    const int64_t groups = (cols + kGroup - 1) / kGroup, runs = (groups + kUnroll - 1) / kUnroll;
    const int64_t stride = (int64_t(gridDim.x) * blockDim.x) >> 5;
    for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; w < rows * runs; w += stride) {
        const int64_t r = w / runs, g0 = (w - r * runs) * kUnroll;
        float v[kUnroll][4];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) load4<T, VEC>(x + r * cols, (g0 + u) * kGroup + lane * 4, cols, v[u]);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            if (g0 + u >= groups) break;                    // (uniform across the warp)
            const float m = quant_mult(warp_max(max4(v[u])), fmax, pow2);
            store4<VEC>(q + r * cols, (g0 + u) * kGroup + lane * 4, cols, v[u], m, fmt);
            if (lane == 0) scale[(g0 + u) * rows + r] = __fdiv_rn(1.f, m);
        }
    }
}

// One scale per row of x: a block per row, the row read twice (its amax, then its codes: from
// L2), kUnroll loads in flight per thread.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads) rows_kernel(int64_t rows, int64_t cols, const T* __restrict__ x,
                                                        unsigned char* __restrict__ q, float* __restrict__ scale,
                                                        float fmax, bool pow2, __nv_fp8_interpretation_t fmt) {
    constexpr int64_t step = kThreads * 4 * kUnroll;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * cols;
        float a = 0.f, v[kUnroll][4];
        for (int64_t c0 = int64_t(threadIdx.x) * 4; c0 < cols; c0 += step) {
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) load4<T, VEC>(xr, c0 + u * kThreads * 4, cols, v[u]);
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) a = fmaxf(a, max4(v[u]));
        }
        const float m = quant_mult(block_max(a), fmax, pow2);
        for (int64_t c0 = int64_t(threadIdx.x) * 4; c0 < cols; c0 += step) {
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) load4<T, VEC>(xr, c0 + u * kThreads * 4, cols, v[u]);
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) store4<VEC>(q + r * cols, c0 + u * kThreads * 4, cols, v[u], m, fmt);
        }
        if (threadIdx.x == 0) scale[r] = __fdiv_rn(1.f, m);
    }
}

// Per tensor: max |x| over all of x into amax[0] (zeroed first; non-negative floats order as their
// bits do), for tensor_kernel / T_TENSOR to read.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads) amax_kernel(int64_t n, const T* __restrict__ x, float* amax) {
    float a = 0.f, v[4];
    for (int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4; c < n; c += int64_t(gridDim.x) * blockDim.x * 4) {
        load4<T, VEC>(x, c, n, v);
        a = fmaxf(a, max4(v));
    }
    a = block_max(a);
    if (threadIdx.x == 0 && a > 0.f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(a));
}

// Per tensor: every element with the m of amax[0], 4 a thread.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads) tensor_kernel(int64_t n, const T* __restrict__ x, unsigned char* __restrict__ q,
                                                          const float* amax, float fmax, bool pow2,
                                                          __nv_fp8_interpretation_t fmt) {
    const float m = quant_mult(*amax, fmax, pow2);
    float v[4];
    for (int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4; c < n; c += int64_t(gridDim.x) * blockDim.x * 4) {
        load4<T, VEC>(x, c, n, v);
        store4<VEC>(q, c, n, v, m, fmt);
    }
}

enum TransposedPass { T_AMAX, T_TILES, T_ROWS, T_TENSOR };

// x^T's rows are x's columns: a 128 x 64 tile of x (128 of x^T's columns: one 1 x 128 group)
// staged in shared memory; warp w then makes x^T's rows w, w + 8, ..., lane l holding tile rows
// l, l + 32, l + 64, l + 96 (the odd row pitch keeps those reads free of bank conflicts).
// T_AMAX: atomicMax of each column's amax into amax[c] (zeroed first; non-negative floats order
// as their bits do). T_TILES: 1 x 128 scales. T_ROWS: one scale per row of x^T, its amax read
// from amax[c] (the T_AMAX pass's). T_TENSOR: one scale, its amax read from amax[0].
template <typename T, TransposedPass PASS, bool VEC>
__global__ void __launch_bounds__(kThreads) transposed_kernel(int64_t rows, int64_t cols, const T* __restrict__ x,
                                                              unsigned char* __restrict__ q, float* scale,
                                                              float fmax, bool pow2,
                                                              __nv_fp8_interpretation_t fmt) {
    __shared__ float tile[kGroup][kTileCols + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t row_tiles = (rows + kGroup - 1) / kGroup, col_tiles = (cols + kTileCols - 1) / kTileCols;
    for (int64_t t = blockIdx.x; t < row_tiles * col_tiles; t += gridDim.x) {
        const int64_t r0 = (t / col_tiles) * kGroup, c0 = (t % col_tiles) * kTileCols;
        // 4 consecutive elements a thread (16 threads a tile row), every load before the stores.
        constexpr int kLoads = kGroup * kTileCols / 4 / kThreads;
        float v4[kLoads][4];
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
            const int i = threadIdx.x + j * kThreads, tr = i / (kTileCols / 4), tc = (i % (kTileCols / 4)) * 4;
            if (r0 + tr < rows) load4<T, VEC>(x + (r0 + tr) * cols, c0 + tc, cols, v4[j]);
            else v4[j][0] = v4[j][1] = v4[j][2] = v4[j][3] = 0.f;
        }
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
            const int i = threadIdx.x + j * kThreads, tr = i / (kTileCols / 4), tc = (i % (kTileCols / 4)) * 4;
#pragma unroll
            for (int e = 0; e < 4; ++e) tile[tr][tc + e] = v4[j][e];
        }
        __syncthreads();
        for (int tc = warp; tc < kTileCols && c0 + tc < cols; tc += kWarps) {
            const int64_t c = c0 + tc;
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = tile[lane + 32 * j][tc];
            if (PASS == T_AMAX) {
                const float a = warp_max(max4(v));
                if (lane == 0 && a > 0.f) atomicMax(reinterpret_cast<int*>(scale + c), __float_as_int(a));
                continue;
            }
            const float m = quant_mult(PASS == T_TILES ? warp_max(max4(v)) : scale[PASS == T_TENSOR ? 0 : c], fmax, pow2);
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (r0 + lane + 32 * j < rows)
                    q[c * rows + r0 + lane + 32 * j] = __nv_cvt_float_to_fp8(v[j] * m, __NV_SATFINITE, fmt);
            if (PASS == T_TILES && lane == 0) scale[(r0 / kGroup) * cols + c] = __fdiv_rn(1.f, m);
        }
        __syncthreads();               // (the tile is refilled next)
    }
}

__global__ void fill_kernel(int64_t n, float* x, float v) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) x[i] = v;
}

// T_ROWS's last step: amax[c] -> 1 / m, in place.
__global__ void amax_to_scale_kernel(int64_t n, float* scale, float fmax, bool pow2) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        scale[i] = __fdiv_rn(1.f, quant_mult(scale[i], fmax, pow2));
}

// 128 x 128 blocks: a block of threads per block of x, read once: warp w holds its rows
// 16w .. 16w + 15 in registers, lane l columns 4l .. 4l + 3 (each row a coalesced 128-element
// load, 16 loads in flight per thread). TRANSPOSE: the codes go through shared memory, 4 bytes a
// store; warp w then writes x^T's rows w, w + 8, ..., 4 bytes a lane.
template <typename T, bool VEC, bool TRANSPOSE>
__global__ void __launch_bounds__(kThreads) blocks_kernel(int64_t rows, int64_t cols, const T* __restrict__ x,
                                                          unsigned char* __restrict__ q, float* __restrict__ scale,
                                                          float fmax, bool pow2, __nv_fp8_interpretation_t fmt) {
    constexpr int kRows = kGroup / kWarps;
    __shared__ __align__(4) unsigned char codes[TRANSPOSE ? kGroup : 1][kGroup + 4];
    const int64_t row_blocks = (rows + kGroup - 1) / kGroup, col_blocks = (cols + kGroup - 1) / kGroup;
    // Scale rows are round_up(blocks along q's columns, 4) apart.
    const int64_t ld = TRANSPOSE ? (row_blocks + 3) / 4 * 4 : (col_blocks + 3) / 4 * 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool store_words = rows % 4 == 0 && (reinterpret_cast<uintptr_t>(q) & 3) == 0;   // (x^T's rows)
    for (int64_t b = blockIdx.x; b < row_blocks * col_blocks; b += gridDim.x) {
        const int64_t br = b / col_blocks, bc = b % col_blocks, r0 = br * kGroup + warp * kRows;
        const int64_t c = bc * kGroup + lane * 4, c_end = (bc + 1) * kGroup < cols ? (bc + 1) * kGroup : cols;
        float v[kRows][4];
#pragma unroll
        for (int i = 0; i < kRows; ++i) load4<T, VEC>(x + (r0 + i) * cols, c, r0 + i < rows ? c_end : 0, v[i]);
        float a = 0.f;
#pragma unroll
        for (int i = 0; i < kRows; ++i) a = fmaxf(a, max4(v[i]));
        const float m = quant_mult(block_max(a), fmax, pow2);
        if constexpr (!TRANSPOSE) {
#pragma unroll
            for (int i = 0; i < kRows; ++i)
                if (r0 + i < rows) store4<VEC>(q + (r0 + i) * cols, c, c_end, v[i], m, fmt);
            if (threadIdx.x == 0) scale[br * ld + bc] = __fdiv_rn(1.f, m);
        } else {
#pragma unroll
            for (int i = 0; i < kRows; ++i) {
                const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[i][0] * m, v[i][1] * m), __NV_SATFINITE, fmt);
                const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[i][2] * m, v[i][3] * m), __NV_SATFINITE, fmt);
                *reinterpret_cast<uint32_t*>(&codes[warp * kRows + i][lane * 4]) = lo | (hi << 16);
            }
            __syncthreads();
            // x^T's row c = bc * 128 + tc; lane l writes its columns (x's rows) br * 128 + 4l .. + 3.
            const int64_t r4 = br * kGroup + 4 * lane;
            for (int tc = warp; tc < kGroup && bc * kGroup + tc < cols; tc += kWarps) {
                unsigned char* out = q + (bc * kGroup + tc) * rows + r4;
                if (store_words && r4 + 3 < rows) {
                    *reinterpret_cast<uint32_t*>(out) = uint32_t(codes[4 * lane][tc]) | uint32_t(codes[4 * lane + 1][tc]) << 8 |
                                                        uint32_t(codes[4 * lane + 2][tc]) << 16 |
                                                        uint32_t(codes[4 * lane + 3][tc]) << 24;
                } else {
                    for (int i = 0; i < 4; ++i)
                        if (r4 + i < rows) out[i] = codes[4 * lane + i][tc];
                }
            }
            if (threadIdx.x == 0) scale[bc * ld + br] = __fdiv_rn(1.f, m);
            __syncthreads();               // (codes is refilled next)
        }
    }
}

template <typename T, TransposedPass PASS>
void launch_transposed(bool vec, unsigned grid, cudaStream_t stream, int64_t rows, int64_t cols, const T* x,
                       unsigned char* q, float* scale, float fmax, bool pow2, __nv_fp8_interpretation_t fmt) {
    if (vec) transposed_kernel<T, PASS, true><<<grid, kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
    else transposed_kernel<T, PASS, false><<<grid, kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
}

// Blocks for `units` of work (a block each, strided past the grid): every SM filled several times over.
unsigned grid_for(int64_t units) {
    const int count = cygemm_grid::sm_count();
    return unsigned(std::max<int64_t>(1, std::min<int64_t>(units, int64_t(count) * 16)));
}

template <typename T>
cudaError_t quantize_scaled(int mode, bool transpose, bool pow2, int64_t rows, int64_t cols, const T* x,
                            unsigned char* q, float* scale, float fmax, __nv_fp8_interpretation_t fmt,
                            cudaStream_t stream) {
    if (rows == 0 || cols == 0) {       // amax 0: m = 1 for the tensor's scale and each (empty) row's
        const int64_t n = mode == CYGEMM_SCALE_TENSOR ? 1 : mode == CYGEMM_SCALE_ROWWISE ? (transpose ? cols : rows) : 0;
        if (n == 0) return cudaSuccess;
        fill_kernel<<<grid_for((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(n, scale, 1.f);
        return cudaGetLastError();
    }
    // 4-element accesses: rows that start 4 elements apart on 16-byte aligned arrays.
    const bool vec = cols % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
                     (reinterpret_cast<uintptr_t>(q) & 3) == 0;
    const int64_t groups = (cols + kGroup - 1) / kGroup;
    const int64_t tiles = ((rows + kGroup - 1) / kGroup) * ((cols + kTileCols - 1) / kTileCols);
    const int64_t blocks = ((rows + kGroup - 1) / kGroup) * groups;
    if (mode == CYGEMM_SCALE_TENSOR) {
        const int64_t n = rows * cols;
        const bool flat_vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0 && (reinterpret_cast<uintptr_t>(q) & 3) == 0;
        const unsigned grid = grid_for((n + 4 * kThreads - 1) / (4 * kThreads));
        cudaError_t err = cudaMemsetAsync(scale, 0, sizeof(float), stream);
        if (err != cudaSuccess) return err;
        if (flat_vec) amax_kernel<T, true><<<grid, kThreads, 0, stream>>>(n, x, scale);
        else amax_kernel<T, false><<<grid, kThreads, 0, stream>>>(n, x, scale);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        if (transpose)
            launch_transposed<T, T_TENSOR>(vec, grid_for(tiles), stream, rows, cols, x, q, scale, fmax, pow2, fmt);
        else if (flat_vec)
            tensor_kernel<T, true><<<grid, kThreads, 0, stream>>>(n, x, q, scale, fmax, pow2, fmt);
        else
            tensor_kernel<T, false><<<grid, kThreads, 0, stream>>>(n, x, q, scale, fmax, pow2, fmt);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        amax_to_scale_kernel<<<1, 32, 0, stream>>>(1, scale, fmax, pow2);
    } else if (mode == CYGEMM_SCALE_1X128 && !transpose) {
        const unsigned grid = grid_for((rows * ((groups + kUnroll - 1) / kUnroll) + kWarps - 1) / kWarps);
        if (vec) tiles_kernel<T, true><<<grid, kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
        else tiles_kernel<T, false><<<grid, kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
    } else if (mode == CYGEMM_SCALE_ROWWISE && !transpose) {
        if (vec) rows_kernel<T, true><<<grid_for(rows), kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
        else rows_kernel<T, false><<<grid_for(rows), kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
    } else if (mode == CYGEMM_SCALE_1X128) {
        launch_transposed<T, T_TILES>(vec, grid_for(tiles), stream, rows, cols, x, q, scale, fmax, pow2, fmt);
    } else if (mode == CYGEMM_SCALE_ROWWISE) {
        cudaError_t err = cudaMemsetAsync(scale, 0, size_t(cols) * sizeof(float), stream);
        if (err != cudaSuccess) return err;
        launch_transposed<T, T_AMAX>(vec, grid_for(tiles), stream, rows, cols, x, q, scale, fmax, pow2, fmt);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        launch_transposed<T, T_ROWS>(vec, grid_for(tiles), stream, rows, cols, x, q, scale, fmax, pow2, fmt);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        amax_to_scale_kernel<<<grid_for((cols + kThreads - 1) / kThreads), kThreads, 0, stream>>>(cols, scale, fmax, pow2);
    } else if (transpose) {
        if (vec) blocks_kernel<T, true, true><<<grid_for(blocks), kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
        else blocks_kernel<T, false, true><<<grid_for(blocks), kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
    } else {
        if (vec) blocks_kernel<T, true, false><<<grid_for(blocks), kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
        else blocks_kernel<T, false, false><<<grid_for(blocks), kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
    }
    return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t cygemm_fp8_quantize_scaled(cudaDataType dtype, cudaDataType format, int mode, int transpose,
                                                  int pow2, int64_t rows, int64_t cols, const void* x, void* q,
                                                  float* scale, cudaStream_t stream) {
    if ((format != CUDA_R_8F_E4M3 && format != CUDA_R_8F_E5M2) || rows < 0 || cols < 0 ||
        (mode != CYGEMM_SCALE_TENSOR && mode != CYGEMM_SCALE_ROWWISE && mode != CYGEMM_SCALE_1X128 &&
         mode != CYGEMM_SCALE_128X128))
        return cudaErrorInvalidValue;
    const __nv_fp8_interpretation_t fmt = format == CUDA_R_8F_E5M2 ? __NV_E5M2 : __NV_E4M3;
    const float fmax = format == CUDA_R_8F_E5M2 ? 57344.f : 448.f;
    auto qs = static_cast<unsigned char*>(q);
    switch (dtype) {
    case CUDA_R_32F:
        return quantize_scaled(mode, transpose, pow2, rows, cols, static_cast<const float*>(x), qs, scale, fmax, fmt, stream);
    case CUDA_R_16F:
        return quantize_scaled(mode, transpose, pow2, rows, cols, static_cast<const __half*>(x), qs, scale, fmax, fmt, stream);
    case CUDA_R_16BF:
        return quantize_scaled(mode, transpose, pow2, rows, cols, static_cast<const __nv_bfloat16*>(x), qs, scale, fmax,
                               fmt, stream);
    default:
        return cudaErrorInvalidValue;
    }
}
