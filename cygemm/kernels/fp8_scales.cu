// Quantizing to FP8 with per-tensor, per-row, 1 x 128 and 128 x 128 scales (cygemm/fp8_scale_kernels.h
// says what each computes and where its scales go). Memory-bound, so every kernel keeps several
// 16-byte loads in flight per thread (8 elements each; held in their storage type, which keeps
// registers few and occupancy high) and writes its codes 4 or 8 bytes a lane. Each element is read
// once where its group fits on chip (a 1 x 128 tile in half a warp, a row of up to 16384 elements
// in a block, a 128 x 128 block in a block's registers), twice where the group's amax needs all of
// it first (the tensor, x's columns for x^T's row scales, rows past 16384 elements: a pass for the
// amax, one for the codes). The transposed forms pack 4 codes of consecutive rows of x into a word
// in shared memory, so each warp writes 128 contiguous bytes of x^T.
#include "cygemm/fp8_scale_kernels.h"
#include "cygemm/convert.h"
#include "cygemm/sm_count.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kGroup = 128;            // elements a 1 x 128 scale covers; a 128 x 128 block's side
constexpr int kTileCols = 64;          // x's columns in a transposed tile (x^T's rows)
#ifndef CYGEMM_Q_MIN
#define CYGEMM_Q_MIN 4
#endif
#ifndef CYGEMM_Q_BLOCKS_MIN
#define CYGEMM_Q_BLOCKS_MIN 3
#endif
constexpr int kMinBlocks = CYGEMM_Q_MIN;         // blocks an SM holds at once (64 registers a thread), for bytes in flight;
                                       // fewer where a thread holds more (a long row, a 128 x 128 block)
constexpr float kMaxMult = 0x1p126f;   // the largest m: a tiny amax gives 2^126, not infinity

using cygemm_convert::from_f;
using cygemm_convert::to_f;

// m of a group (see the header): fmax / amax, 1 without a finite positive amax, at most 2^126,
// rounded down to a power of two when pow2.
__device__ __forceinline__ float quant_mult(float amax, float fmax, bool pow2) {
    if (!(amax > 0.f) || isinf(amax)) return 1.f;
    float m = fminf(__fdiv_rn(fmax, amax), kMaxMult);
    if (pow2) m = ldexpf(1.f, ilogbf(m));
    return m;
}

// The maximum over aligned groups of `lanes` lanes (a power of two up to 32), in each of them.
template <int LANES = 32>
__device__ __forceinline__ float lanes_max(float m) {
#pragma unroll
    for (int off = LANES / 2; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    return m;
}

// The block's maximum, in every thread (fmaxf: NaN ignored); any multiple of 32 threads.
__device__ __forceinline__ float block_max(float m) {
    __shared__ float warp_m[kWarps];
    m = lanes_max(m);
    if ((threadIdx.x & 31) == 0) warp_m[threadIdx.x >> 5] = m;
    __syncthreads();
    m = warp_m[0];
    for (int w = 1; w < int(blockDim.x >> 5); ++w) m = fmaxf(m, warp_m[w]);
    __syncthreads();                   // (warp_m is reused by the next call)
    return m;
}

// 8 consecutive elements of x in their storage type (one 16-byte load for 2-byte types).
template <typename T>
struct alignas(16) Pack8 {
    T e[8];
};

// x[c..c+7] of a row of n elements (0 beyond n); VEC: 16-byte loads (c % 8 == 0 and the row
// 16-byte aligned).
template <typename T, bool VEC>
__device__ __forceinline__ Pack8<T> load8(const T* row, int64_t c, int64_t n) {
    Pack8<T> p;
    if (VEC && c + 7 < n) {
        const uint4* src = reinterpret_cast<const uint4*>(row + c);
#pragma unroll
        for (int i = 0; i < int(sizeof(p) / 16); ++i) reinterpret_cast<uint4*>(&p)[i] = __ldg(src + i);
        return p;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) p.e[i] = c + i < n ? row[c + i] : from_f<T>(0.f);
    return p;
}

// Element i of p as a float. bfloat16 is the high half of a float: shifting its bits there keeps
// the pack in its 16-byte registers (converting each element kept 8 floats live per pack).
template <typename T>
__device__ __forceinline__ float elem(const Pack8<T>& p, int i) {
    if constexpr (sizeof(T) == 2 && !std::is_same<T, __half>::value) {
        const uint32_t w = reinterpret_cast<const uint32_t*>(&p)[i >> 1];
        return __uint_as_float(i & 1 ? w & 0xffff0000u : w << 16);
    } else {
        return to_f(p.e[i]);
    }
}

template <typename T>
__device__ __forceinline__ float amax8(const Pack8<T>& p) {
    float a = fabsf(elem(p, 0));
#pragma unroll
    for (int i = 1; i < 8; ++i) a = fmaxf(a, fabsf(elem(p, i)));
    return a;
}

__device__ __forceinline__ uint32_t code(float v, __nv_fp8_interpretation_t fmt) {
    return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt);
}

// The codes of elements i .. i + 3 of p, scaled by m, in a word (element i in its low byte).
template <typename T>
__device__ __forceinline__ uint32_t codes4(const Pack8<T>& p, int i, float m, __nv_fp8_interpretation_t fmt) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(elem(p, i) * m, elem(p, i + 1) * m), __NV_SATFINITE, fmt);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(elem(p, i + 2) * m, elem(p, i + 3) * m), __NV_SATFINITE, fmt);
    return lo | (hi << 16);
}

// q[c..c+7] = saturate(p * m) (those below n); VEC: one 8-byte store.
template <typename T, bool VEC>
__device__ __forceinline__ void store8(unsigned char* row, int64_t c, int64_t n, const Pack8<T>& p, float m,
                                       __nv_fp8_interpretation_t fmt) {
    if (VEC && c + 7 < n) {
        *reinterpret_cast<uint2*>(row + c) = make_uint2(codes4(p, 0, m, fmt), codes4(p, 4, m, fmt));
        return;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
        if (c + i < n) row[c + i] = code(elem(p, i) * m, fmt);
}

// 4 codes of x^T (4 consecutive rows of x in one column) to q at x^T's row `qr`, column `qc`: a
// word where the rows are word-aligned, else byte by byte (those below `rows`).
__device__ __forceinline__ void store_word_t(unsigned char* q, int64_t qr, int64_t qc, int64_t rows, uint32_t w,
                                             bool words) {
    unsigned char* out = q + qr * rows + qc;
    if (words && qc + 3 < rows) {
        *reinterpret_cast<uint32_t*>(out) = w;
        return;
    }
    for (int i = 0; i < 4; ++i)
        if (qc + i < rows) out[i] = (w >> (8 * i)) & 0xff;
}

// Runs process(u, data) for u = first, first + stride, ... below total, where data = load(u):
// the next unit's loads are issued before the current unit is processed, so that a thread has
// loads in flight while it reduces, synchronizes and stores (CYGEMM_Q_PIPE 0: one unit at a time).
#ifndef CYGEMM_Q_PIPE
#define CYGEMM_Q_PIPE 1
#endif
template <typename Load, typename Process>
__device__ __forceinline__ void pipelined(int64_t first, int64_t stride, int64_t total, Load load, Process process) {
    if (first >= total) return;
    auto cur = load(first);
    for (int64_t u = first; u < total; u += stride) {
        const bool more = u + stride < total;
        if (CYGEMM_Q_PIPE) {
            decltype(cur) next;
            if (more) next = load(u + stride);
            process(u, cur);
            if (more) cur = next;
        } else {
            process(u, cur);
            if (more) cur = load(u + stride);
        }
    }
}

template <typename T, int N>
struct Packs {
    Pack8<T> p[N];
};

// 1 x 128 along x's rows: a half-warp per group (8 elements a lane), a warp over kSpan groups of
// a row, all its loads issued before the first reduction.
#ifndef CYGEMM_Q_TILE_LOADS
#define CYGEMM_Q_TILE_LOADS 4
#endif
constexpr int kTileLoads = CYGEMM_Q_TILE_LOADS;
constexpr int kSpan = 2 * kTileLoads;

template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads, kMinBlocks) tiles_kernel(int64_t rows, int64_t cols, const T* __restrict__ x,
                                                         unsigned char* __restrict__ q, float* __restrict__ scale,
                                                         float fmax, bool pow2, __nv_fp8_interpretation_t fmt) {
    const int lane = threadIdx.x & 31, half = lane >> 4, hl = lane & 15;
    const int64_t groups = (cols + kGroup - 1) / kGroup, runs = (groups + kSpan - 1) / kSpan;
    const int64_t stride = (int64_t(gridDim.x) * blockDim.x) >> 5;
    auto load = [&](int64_t w) {
        const int64_t r = w / runs, g0 = (w - r * runs) * kSpan;
        Packs<T, kTileLoads> d;
#pragma unroll
        for (int u = 0; u < kTileLoads; ++u) d.p[u] = load8<T, VEC>(x + r * cols, (g0 + 2 * u + half) * kGroup + hl * 8, cols);
        return d;
    };
    pipelined((int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5, stride, rows * runs, load,
              [&](int64_t w, const Packs<T, kTileLoads>& d) {
        const int64_t r = w / runs, g0 = (w - r * runs) * kSpan;
#pragma unroll
        for (int u = 0; u < kTileLoads; ++u) {
            if (g0 + 2 * u >= groups) break;                // (uniform across the warp)
            const int64_t g = g0 + 2 * u + half;
            const float m = quant_mult(lanes_max<16>(amax8(d.p[u])), fmax, pow2);
            if (g < groups) {
                store8<T, VEC>(q + r * cols, g * kGroup + hl * 8, cols, d.p[u], m, fmt);
                if (hl == 0) scale[g * rows + r] = __fdiv_rn(1.f, m);
            }
        }
    });
}

// One scale per row of x: a block per row. HOLD > 0: the row (at most blockDim.x * 8 * HOLD
// elements) read once into registers; HOLD == 0: read twice (its amax, then its codes).
template <typename T, bool VEC, int HOLD>
__global__ void __launch_bounds__(kThreads, HOLD == 8 ? (kMinBlocks + 1) / 2 : kMinBlocks) rows_kernel(int64_t rows, int64_t cols, const T* __restrict__ x,
                                                        unsigned char* __restrict__ q, float* __restrict__ scale,
                                                        float fmax, bool pow2, __nv_fp8_interpretation_t fmt) {
    const int64_t step = int64_t(blockDim.x) * 8, c0 = int64_t(threadIdx.x) * 8;
    if constexpr (HOLD > 0) {
        pipelined(blockIdx.x, gridDim.x, rows, [&](int64_t r) {
            Packs<T, HOLD> d;
#pragma unroll
            for (int u = 0; u < HOLD; ++u) d.p[u] = load8<T, VEC>(x + r * cols, c0 + u * step, cols);
            return d;
        }, [&](int64_t r, const Packs<T, HOLD>& d) {
            float a = 0.f;
#pragma unroll
            for (int u = 0; u < HOLD; ++u) a = fmaxf(a, amax8(d.p[u]));
            const float m = quant_mult(block_max(a), fmax, pow2);
#pragma unroll
            for (int u = 0; u < HOLD; ++u) store8<T, VEC>(q + r * cols, c0 + u * step, cols, d.p[u], m, fmt);
            if (threadIdx.x == 0) scale[r] = __fdiv_rn(1.f, m);
        });
    } else {
        for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
            const T* xr = x + r * cols;
            unsigned char* qr = q + r * cols;
            constexpr int kLoads = 4;
            float a = 0.f;
            for (int64_t c = c0; c < cols; c += kLoads * step) {
                Pack8<T> p[kLoads];
#pragma unroll
                for (int u = 0; u < kLoads; ++u) p[u] = load8<T, VEC>(xr, c + u * step, cols);
#pragma unroll
                for (int u = 0; u < kLoads; ++u) a = fmaxf(a, amax8(p[u]));
            }
            const float m = quant_mult(block_max(a), fmax, pow2);
            for (int64_t c = c0; c < cols; c += kLoads * step) {
                Pack8<T> p[kLoads];
#pragma unroll
                for (int u = 0; u < kLoads; ++u) p[u] = load8<T, VEC>(xr, c + u * step, cols);
#pragma unroll
                for (int u = 0; u < kLoads; ++u) store8<T, VEC>(qr, c + u * step, cols, p[u], m, fmt);
            }
            if (threadIdx.x == 0) scale[r] = __fdiv_rn(1.f, m);
        }
    }
}

// Per tensor: max |x| over all of x into amax[0] (zeroed first; non-negative floats order as their
// bits do), for tensor_kernel / T_TENSOR to read.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads) amax_kernel(int64_t n, const T* __restrict__ x, float* amax) {
    float a = 0.f;
    const int64_t step = int64_t(gridDim.x) * blockDim.x * 8;
    for (int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8; c < n; c += 2 * step) {
        const Pack8<T> p0 = load8<T, VEC>(x, c, n), p1 = load8<T, VEC>(x, c + step, n);
        a = fmaxf(a, fmaxf(amax8(p0), amax8(p1)));
    }
    a = block_max(a);
    if (threadIdx.x == 0 && a > 0.f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(a));
}

// Per tensor: every element with the m of amax[0], 8 a thread per step.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads) tensor_kernel(int64_t n, const T* __restrict__ x, unsigned char* __restrict__ q,
                                                          const float* amax, float fmax, bool pow2,
                                                          __nv_fp8_interpretation_t fmt) {
    const float m = quant_mult(*amax, fmax, pow2);
    const int64_t step = int64_t(gridDim.x) * blockDim.x * 8;
    for (int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8; c < n; c += 2 * step) {
        const Pack8<T> p0 = load8<T, VEC>(x, c, n), p1 = load8<T, VEC>(x, c + step, n);
        store8<T, VEC>(q, c, n, p0, m, fmt);
        store8<T, VEC>(q, c + step, n, p1, m, fmt);
    }
}

enum TransposedPass { T_AMAX, T_TILES, T_ROWS, T_TENSOR };

// x^T's rows are x's columns: a block per 128 x 64 tile of x (128 of x^T's columns: one 1 x 128
// group). Lane l of warp w holds x's rows 4 (4w + l / 8) .. + 3, columns 8 (l % 8) .. + 7 of the
// tile (each warp load: 4 rows of 64 contiguous elements). A column's amax: over the thread's
// rows, across the lanes holding the same columns, then across warps in shared memory. Each
// thread packs, per column, its 4 rows' codes into a word of `codes` (x^T's layout); warp w then
// writes x^T's rows w, w + 8, ..., a word a lane (128 contiguous bytes a warp).
// T_AMAX: atomicMax of each column's amax into amax[c] (zeroed first; non-negative floats order
// as their bits do). T_TILES: 1 x 128 scales. T_ROWS: one scale per row of x^T, its amax read
// from amax[c] (the T_AMAX pass's). T_TENSOR: one scale, its amax read from amax[0].
template <typename T, TransposedPass PASS, bool VEC>
__global__ void __launch_bounds__(kThreads, kMinBlocks) transposed_kernel(int64_t rows, int64_t cols, const T* __restrict__ x,
                                                              unsigned char* __restrict__ q, float* scale,
                                                              float fmax, bool pow2,
                                                              __nv_fp8_interpretation_t fmt) {
    __shared__ float warp_amax[kWarps][kTileCols];
    __shared__ float col_mult[kTileCols];
    __shared__ uint32_t codes[kTileCols][kGroup / 4 + 1];   // (the odd pitch spreads banks)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane >> 3, cl = (lane & 7) * 8;
    const int word = warp * 4 + sub;                          // this thread's rows: 4 word .. + 3
    const bool words = rows % 4 == 0 && (reinterpret_cast<uintptr_t>(q) & 3) == 0;
    const int64_t row_tiles = (rows + kGroup - 1) / kGroup, col_tiles = (cols + kTileCols - 1) / kTileCols;
    pipelined(blockIdx.x, gridDim.x, row_tiles * col_tiles, [&](int64_t t) {
        const int64_t r0 = (t / col_tiles) * kGroup, c0 = (t % col_tiles) * kTileCols;
        Packs<T, 4> d;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t r = r0 + 4 * word + j;
            d.p[j] = load8<T, VEC>(x + (r < rows ? r : 0) * cols, c0 + cl, r < rows ? cols : 0);
        }
        return d;
    }, [&](int64_t t, const Packs<T, 4>& d) {
        const int64_t r0 = (t / col_tiles) * kGroup, c0 = (t % col_tiles) * kTileCols;
        const Pack8<T>* p = d.p;
        float m[8];
        if (PASS == T_AMAX || PASS == T_TILES) {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                float a = fabsf(elem(p[0], e));
#pragma unroll
                for (int j = 1; j < 4; ++j) a = fmaxf(a, fabsf(elem(p[j], e)));
                a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 8));
                a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 16));
                m[e] = a;
            }
            if (sub == 0) {
#pragma unroll
                for (int e = 0; e < 8; ++e) warp_amax[warp][cl + e] = m[e];
            }
            __syncthreads();
            if (threadIdx.x < kTileCols) {
                float a = warp_amax[0][threadIdx.x];
#pragma unroll
                for (int w = 1; w < kWarps; ++w) a = fmaxf(a, warp_amax[w][threadIdx.x]);
                const int64_t c = c0 + threadIdx.x;
                if (PASS == T_AMAX) {
                    if (c < cols && a > 0.f) atomicMax(reinterpret_cast<int*>(scale + c), __float_as_int(a));
                } else {
                    const float mc = quant_mult(a, fmax, pow2);
                    col_mult[threadIdx.x] = mc;
                    if (c < cols) scale[(r0 / kGroup) * cols + c] = __fdiv_rn(1.f, mc);
                }
            }
            if (PASS == T_AMAX) {
                __syncthreads();           // (warp_amax is refilled next)
                return;
            }
            __syncthreads();
#pragma unroll
            for (int e = 0; e < 8; ++e) m[e] = col_mult[cl + e];
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const int64_t c = c0 + cl + e;
                m[e] = quant_mult(scale[PASS == T_TENSOR ? 0 : (c < cols ? c : 0)], fmax, pow2);
            }
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            uint32_t w = 0;
#pragma unroll
            for (int j = 0; j < 4; ++j) w |= code(elem(p[j], e) * m[e], fmt) << (8 * j);
            codes[cl + e][word] = w;
        }
        __syncthreads();
        for (int tc = warp; tc < kTileCols && c0 + tc < cols; tc += kWarps)
            if (r0 + 4 * lane < rows) store_word_t(q, c0 + tc, r0 + 4 * lane, rows, codes[tc][lane], words);
        __syncthreads();               // (codes is refilled next)
    });
}

__global__ void fill_kernel(int64_t n, float* x, float v) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) x[i] = v;
}

// T_ROWS's last step: amax[c] -> 1 / m, in place.
__global__ void amax_to_scale_kernel(int64_t n, float* scale, float fmax, bool pow2) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        scale[i] = __fdiv_rn(1.f, quant_mult(scale[i], fmax, pow2));
}

// 128 x 128 blocks: a block of threads per block of x, read once into registers: half-warp h of
// warp w holds rows 16w + 8h .. + 7, lane l % 16 columns 8 (l % 16) .. + 7 (each warp load: 2
// rows of 128 contiguous elements). TRANSPOSE: each thread packs, per column, the codes of its
// rows 4 at a time into words of `codes` (x^T's layout); warp w then writes x^T's rows w, w + 8,
// ..., a word a lane (128 contiguous bytes a warp).
template <typename T, bool VEC, bool TRANSPOSE>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 4 ? 2 : CYGEMM_Q_BLOCKS_MIN) blocks_kernel(int64_t rows, int64_t cols, const T* __restrict__ x,
                                                          unsigned char* __restrict__ q, float* __restrict__ scale,
                                                          float fmax, bool pow2, __nv_fp8_interpretation_t fmt) {
    constexpr int kRows = 8;
    __shared__ uint32_t codes[TRANSPOSE ? kGroup : 1][kGroup / 4 + 1];   // (the odd pitch spreads banks)
    const int64_t row_blocks = (rows + kGroup - 1) / kGroup, col_blocks = (cols + kGroup - 1) / kGroup;
    // Scale rows are round_up(blocks along q's columns, 4) apart.
    const int64_t ld = TRANSPOSE ? (row_blocks + 3) / 4 * 4 : (col_blocks + 3) / 4 * 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hl = (lane & 15) * 8;
    const int first = warp * 16 + (lane >> 4) * kRows;       // this thread's first row in the block
    const bool words = rows % 4 == 0 && (reinterpret_cast<uintptr_t>(q) & 3) == 0;   // (x^T's rows)
    pipelined(blockIdx.x, gridDim.x, row_blocks * col_blocks, [&](int64_t b) {
        const int64_t br = b / col_blocks, bc = b % col_blocks, r0 = br * kGroup + first;
        const int64_t c = bc * kGroup + hl, c_end = (bc + 1) * kGroup < cols ? (bc + 1) * kGroup : cols;
        Packs<T, kRows> d;
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
            const int64_t r = r0 + i;
            d.p[i] = load8<T, VEC>(x + (r < rows ? r : 0) * cols, c, r < rows ? c_end : 0);
        }
        return d;
    }, [&](int64_t b, const Packs<T, kRows>& d) {
        const int64_t br = b / col_blocks, bc = b % col_blocks, r0 = br * kGroup + first;
        const int64_t c = bc * kGroup + hl, c_end = (bc + 1) * kGroup < cols ? (bc + 1) * kGroup : cols;
        const Pack8<T>* p = d.p;
        float a = 0.f;
#pragma unroll
        for (int i = 0; i < kRows; ++i) a = fmaxf(a, amax8(p[i]));
        const float m = quant_mult(block_max(a), fmax, pow2);
        if constexpr (!TRANSPOSE) {
#pragma unroll
            for (int i = 0; i < kRows; ++i)
                if (r0 + i < rows) store8<T, VEC>(q + (r0 + i) * cols, c, c_end, p[i], m, fmt);
            if (threadIdx.x == 0) scale[br * ld + bc] = __fdiv_rn(1.f, m);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e)
#pragma unroll
                for (int k = 0; k < kRows / 4; ++k) {
                    uint32_t w = 0;
#pragma unroll
                    for (int j = 0; j < 4; ++j) w |= code(elem(p[4 * k + j], e) * m, fmt) << (8 * j);
                    codes[hl + e][first / 4 + k] = w;
                }
            __syncthreads();
            for (int tc = warp; tc < kGroup && bc * kGroup + tc < cols; tc += kWarps)
                if (br * kGroup + 4 * lane < rows)
                    store_word_t(q, bc * kGroup + tc, br * kGroup + 4 * lane, rows, codes[tc][lane], words);
            if (threadIdx.x == 0) scale[bc * ld + br] = __fdiv_rn(1.f, m);
            __syncthreads();               // (codes is refilled next)
        }
    });
}

template <typename T, TransposedPass PASS>
void launch_transposed(bool vec, unsigned grid, cudaStream_t stream, int64_t rows, int64_t cols, const T* x,
                       unsigned char* q, float* scale, float fmax, bool pow2, __nv_fp8_interpretation_t fmt) {
    if (vec) transposed_kernel<T, PASS, true><<<grid, kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
    else transposed_kernel<T, PASS, false><<<grid, kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
}

// Blocks for `units` of work (a block each, strided past the grid): every SM filled several times over.
unsigned grid_for(int64_t units, int per_sm = 16) {
    const int count = cygemm_grid::sm_count();
    return unsigned(std::max<int64_t>(1, std::min<int64_t>(units, int64_t(count) * per_sm)));
}

// One scale per row of x: rows of up to 16384 elements are held in registers (8 or 16 a thread
// in 16-byte loads; the block as narrow as that allows, down to a warp), longer rows read twice.
template <typename T, bool VEC>
void launch_rows(cudaStream_t stream, int64_t rows, int64_t cols, const T* x, unsigned char* q, float* scale,
                 float fmax, bool pow2, __nv_fp8_interpretation_t fmt) {
    constexpr int64_t kHeld4 = int64_t(kThreads) * 8 * 4;
    if (cols <= kHeld4) {
        const int threads = int(std::min<int64_t>(kThreads, ((cols + 8 * 4 - 1) / (8 * 4) + 31) / 32 * 32));
        rows_kernel<T, VEC, 4><<<grid_for(rows, 2048 / threads), threads, 0, stream>>>(rows, cols, x, q, scale, fmax,
                                                                                      pow2, fmt);
    } else if (cols <= 2 * kHeld4) {
        rows_kernel<T, VEC, 8><<<grid_for(rows), kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
    } else {
        rows_kernel<T, VEC, 0><<<grid_for(rows), kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
    }
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
    // 16-byte loads and 8-byte stores: rows that start 8 elements apart on 16-byte aligned x, 8-byte aligned q.
    const bool vec = cols % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
                     (reinterpret_cast<uintptr_t>(q) & 7) == 0;
    const int64_t groups = (cols + kGroup - 1) / kGroup;
    const int64_t tiles = ((rows + kGroup - 1) / kGroup) * ((cols + kTileCols - 1) / kTileCols);
    const int64_t blocks = ((rows + kGroup - 1) / kGroup) * groups;
    if (mode == CYGEMM_SCALE_TENSOR) {
        const int64_t n = rows * cols;
        const bool flat_vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0 && (reinterpret_cast<uintptr_t>(q) & 7) == 0;
        const unsigned grid = grid_for((n + 16 * kThreads - 1) / (16 * kThreads));
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
        const unsigned grid = grid_for((rows * ((groups + kSpan - 1) / kSpan) + kWarps - 1) / kWarps);
        if (vec) tiles_kernel<T, true><<<grid, kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
        else tiles_kernel<T, false><<<grid, kThreads, 0, stream>>>(rows, cols, x, q, scale, fmax, pow2, fmt);
    } else if (mode == CYGEMM_SCALE_ROWWISE && !transpose) {
        if (vec) launch_rows<T, true>(stream, rows, cols, x, q, scale, fmax, pow2, fmt);
        else launch_rows<T, false>(stream, rows, cols, x, q, scale, fmax, pow2, fmt);
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
