// Quantizing to FP8 with per-tensor, per-row, 1 x 128 and 128 x 128 scales (cygemm/fp8_scale_kernels.h
// says what each computes and where its scales go). Memory-bound; what reaches a copy's bandwidth
// on an H200 (measured with benchmarks/quantize_probe.cu) is 16 consecutive elements a thread, so
// that codes go out in 16-byte stores, and four 16-byte loads in flight per thread at 4 blocks per
// SM; the elements stay in their storage type in registers. Each element is read once where its
// group fits on chip (a 1 x 128 tile in 8 lanes, a row of up to 16384 elements in a block, a
// 128 x 128 block in a block's registers), twice where the group's amax needs all of it first (the
// tensor, x's columns for x^T's row scales, longer rows: a pass for the amax, one for the codes).
// The transposed forms pack the codes of 4 consecutive rows of x into words of shared memory (x^T's
// layout, swizzled against bank conflicts) and write x^T 16 bytes a lane.
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
constexpr int kMinBlocks = 4;          // blocks an SM holds at once (64 registers a thread)
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

// 16 consecutive elements: two packs.
template <typename T>
struct Pack16 {
    Pack8<T> lo, hi;
};

template <typename T, bool VEC>
__device__ __forceinline__ Pack16<T> load16(const T* row, int64_t c, int64_t n) {
    return {load8<T, VEC>(row, c, n), load8<T, VEC>(row, c + 8, n)};
}

template <typename T>
__device__ __forceinline__ float amax16(const Pack16<T>& p) {
    return fmaxf(amax8(p.lo), amax8(p.hi));
}

// q[c..c+15] = saturate(p * m) (those below n); WIDE: one 16-byte store where all 16 fit.
template <typename T, bool VEC>
__device__ __forceinline__ void store16(unsigned char* row, int64_t c, int64_t n, const Pack16<T>& p, float m,
                                        __nv_fp8_interpretation_t fmt, bool wide) {
    if (VEC && wide && c + 15 < n) {
        *reinterpret_cast<uint4*>(row + c) =
            make_uint4(codes4(p.lo, 0, m, fmt), codes4(p.lo, 4, m, fmt), codes4(p.hi, 0, m, fmt), codes4(p.hi, 4, m, fmt));
        return;
    }
    store8<T, VEC>(row, c, n, p.lo, m, fmt);
    store8<T, VEC>(row, c + 8, n, p.hi, m, fmt);
}

// The transposed forms' staging of x^T: codes[c][w] holds x^T's row c (x's column), columns
// 4w .. 4w + 3 (x's rows), at word (w ^ swizzle(c)) so that threads writing different columns'
// words and lanes reading 16 bytes of one column both spread over the banks. G: the columns a
// writing lane covers.
template <int G>
__device__ __forceinline__ int swizzled(int c, int w) {
    return w ^ (((c / G) & 7) << 2);
}

// x^T's row segments from `codes` (COLS of them, 128 columns each) to q, 16 bytes a lane: lanes
// 8s .. 8s + 7 of warp w write x^T's rows w * 4 + s, + 32, ...; those within q's shape.
template <int G, int COLS>
__device__ __forceinline__ void write_transposed(const uint32_t (*codes)[kGroup / 4], unsigned char* q, int64_t rows,
                                                 int64_t cols, int64_t r0, int64_t c0, bool wide) {
    const int lane = threadIdx.x & 31, ql = lane & 7;
    const int64_t qc = r0 + ql * 16;               // x^T's columns qc .. qc + 15 (x's rows)
    for (int tc = (threadIdx.x >> 5) * 4 + (lane >> 3); tc < COLS; tc += kWarps * 4) {
        if (c0 + tc >= cols || qc >= rows) continue;
        const uint4 v = *reinterpret_cast<const uint4*>(&codes[tc][swizzled<G>(tc, ql * 4)]);
        unsigned char* out = q + (c0 + tc) * rows + qc;
        if (wide && qc + 15 < rows) {
            *reinterpret_cast<uint4*>(out) = v;
        } else {
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
            for (int i = 0; i < 16 && qc + i < rows; ++i) out[i] = (w[i / 4] >> (8 * (i % 4))) & 0xff;
        }
    }
}

// The word of codes of p[0..3].e[e] (4 consecutive rows of one column), scaled by m.
template <typename T>
__device__ __forceinline__ uint32_t column_word(const Pack8<T>* p0, const Pack8<T>* p1, const Pack8<T>* p2,
                                                const Pack8<T>* p3, int e, float m, __nv_fp8_interpretation_t fmt) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(elem(*p0, e) * m, elem(*p1, e) * m), __NV_SATFINITE, fmt);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(elem(*p2, e) * m, elem(*p3, e) * m), __NV_SATFINITE, fmt);
    return lo | (hi << 16);
}

// 1 x 128 along x's rows: 8 lanes a group (16 elements a lane), a warp over kSpan groups of a
// row, all its loads issued before the first reduction.
constexpr int kTileLoads = 2;
constexpr int kSpan = 4 * kTileLoads;

template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads, kMinBlocks) tiles_kernel(int64_t rows, int64_t cols, const T* __restrict__ x,
                                                                     unsigned char* __restrict__ q, float* __restrict__ scale,
                                                                     float fmax, bool pow2, __nv_fp8_interpretation_t fmt,
                                                                     bool wide) {
    const int lane = threadIdx.x & 31, quarter = lane >> 3, ql = lane & 7;
    const int64_t groups = (cols + kGroup - 1) / kGroup, runs = (groups + kSpan - 1) / kSpan;
    const int64_t stride = (int64_t(gridDim.x) * blockDim.x) >> 5;
    for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; w < rows * runs; w += stride) {
        const int64_t r = w / runs, g0 = (w - r * runs) * kSpan;
        Pack16<T> p[kTileLoads];
#pragma unroll
        for (int u = 0; u < kTileLoads; ++u) p[u] = load16<T, VEC>(x + r * cols, (g0 + 4 * u + quarter) * kGroup + ql * 16, cols);
#pragma unroll
        for (int u = 0; u < kTileLoads; ++u) {
            if (g0 + 4 * u >= groups) break;                // (uniform across the warp)
            const int64_t g = g0 + 4 * u + quarter;
            const float m = quant_mult(lanes_max<8>(amax16(p[u])), fmax, pow2);
            if (g < groups) {
                store16<T, VEC>(q + r * cols, g * kGroup + ql * 16, cols, p[u], m, fmt, wide);
                if (ql == 0) scale[g * rows + r] = __fdiv_rn(1.f, m);
            }
        }
    }
}

// One scale per row of x, the row read once: a block per row, 16 elements a thread in each of
// HELD chunks (blockDim.x * 16 * HELD >= cols).
template <typename T, bool VEC, int HELD>
__global__ void __launch_bounds__(kThreads, HELD > 2 ? 2 : kMinBlocks) rows_kernel(int64_t rows, int64_t cols, const T* __restrict__ x,
                                                                    unsigned char* __restrict__ q, float* __restrict__ scale,
                                                                    float fmax, bool pow2, __nv_fp8_interpretation_t fmt,
                                                                    bool wide) {
    const int64_t step = int64_t(blockDim.x) * 16, c0 = int64_t(threadIdx.x) * 16;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        Pack16<T> p[HELD];
#pragma unroll
        for (int u = 0; u < HELD; ++u) p[u] = load16<T, VEC>(x + r * cols, c0 + u * step, cols);
        float a = 0.f;
#pragma unroll
        for (int u = 0; u < HELD; ++u) a = fmaxf(a, amax16(p[u]));
        const float m = quant_mult(block_max(a), fmax, pow2);
#pragma unroll
        for (int u = 0; u < HELD; ++u) store16<T, VEC>(q + r * cols, c0 + u * step, cols, p[u], m, fmt, wide);
        if (threadIdx.x == 0) scale[r] = __fdiv_rn(1.f, m);
    }
}

// One scale per row of x for rows too long to hold: a block per row, read twice (its amax, then
// its codes, from L2 where it still is).
template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads, kMinBlocks) long_rows_kernel(int64_t rows, int64_t cols, const T* __restrict__ x,
                                                                         unsigned char* __restrict__ q,
                                                                         float* __restrict__ scale, float fmax, bool pow2,
                                                                         __nv_fp8_interpretation_t fmt, bool wide) {
    constexpr int kLoads = 2;
    const int64_t step = int64_t(blockDim.x) * 16, c0 = int64_t(threadIdx.x) * 16;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * cols;
        float a = 0.f;
        for (int64_t c = c0; c < cols; c += kLoads * step) {
            Pack16<T> p[kLoads];
#pragma unroll
            for (int u = 0; u < kLoads; ++u) p[u] = load16<T, VEC>(xr, c + u * step, cols);
#pragma unroll
            for (int u = 0; u < kLoads; ++u) a = fmaxf(a, amax16(p[u]));
        }
        const float m = quant_mult(block_max(a), fmax, pow2);
        for (int64_t c = c0; c < cols; c += kLoads * step) {
            Pack16<T> p[kLoads];
#pragma unroll
            for (int u = 0; u < kLoads; ++u) p[u] = load16<T, VEC>(xr, c + u * step, cols);
#pragma unroll
            for (int u = 0; u < kLoads; ++u) store16<T, VEC>(q + r * cols, c + u * step, cols, p[u], m, fmt, wide);
        }
        if (threadIdx.x == 0) scale[r] = __fdiv_rn(1.f, m);
    }
}

// Per tensor: max |x| over all of x into amax[0] (zeroed first; non-negative floats order as their
// bits do), for tensor_kernel / T_TENSOR to read.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads) amax_kernel(int64_t n, const T* __restrict__ x, float* amax) {
    float a = 0.f;
    const int64_t step = int64_t(gridDim.x) * blockDim.x * 16;
    for (int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 16; c < n; c += 2 * step) {
        const Pack16<T> p0 = load16<T, VEC>(x, c, n), p1 = load16<T, VEC>(x, c + step, n);
        a = fmaxf(a, fmaxf(amax16(p0), amax16(p1)));
    }
    a = block_max(a);
    if (threadIdx.x == 0 && a > 0.f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(a));
}

// Per tensor: every element with the m of amax[0], 16 a thread per step.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads) tensor_kernel(int64_t n, const T* __restrict__ x, unsigned char* __restrict__ q,
                                                          const float* amax, float fmax, bool pow2,
                                                          __nv_fp8_interpretation_t fmt, bool wide) {
    const float m = quant_mult(*amax, fmax, pow2);
    const int64_t step = int64_t(gridDim.x) * blockDim.x * 16;
    for (int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 16; c < n; c += 2 * step) {
        const Pack16<T> p0 = load16<T, VEC>(x, c, n), p1 = load16<T, VEC>(x, c + step, n);
        store16<T, VEC>(q, c, n, p0, m, fmt, wide);
        store16<T, VEC>(q, c + step, n, p1, m, fmt, wide);
    }
}

enum TransposedPass { T_AMAX, T_TILES, T_ROWS, T_TENSOR };

// x^T's rows are x's columns: a block per 128 x 64 tile of x (128 of x^T's columns: one 1 x 128
// group). Lane l of warp w holds x's rows 4 (4w + l / 8) .. + 3, columns 8 (l % 8) .. + 7 of the
// tile (each warp load: 4 rows of 64 contiguous elements). A column's amax: over the thread's
// rows, across the lanes holding the same columns, then across warps in shared memory. Each
// thread packs, per column, its 4 rows' codes into a word of `codes`, which write_transposed
// then writes out as x^T. T_AMAX: atomicMax of each column's amax into amax[c] (zeroed first;
// non-negative floats order as their bits do). T_TILES: 1 x 128 scales. T_ROWS: one scale per row
// of x^T, its amax read from amax[c] (the T_AMAX pass's). T_TENSOR: one scale, its amax read from
// amax[0].
template <typename T, TransposedPass PASS, bool VEC>
__global__ void __launch_bounds__(kThreads, kMinBlocks) transposed_kernel(int64_t rows, int64_t cols, const T* __restrict__ x,
                                                                          unsigned char* __restrict__ q, float* scale,
                                                                          float fmax, bool pow2,
                                                                          __nv_fp8_interpretation_t fmt, bool wide) {
    __shared__ float warp_amax[kWarps][kTileCols];
    __shared__ float col_mult[kTileCols];
    __shared__ __align__(16) uint32_t codes[kTileCols][kGroup / 4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane >> 3, cl = (lane & 7) * 8;
    const int word = warp * 4 + sub;                          // this thread's rows: 4 word .. + 3
    const int64_t row_tiles = (rows + kGroup - 1) / kGroup, col_tiles = (cols + kTileCols - 1) / kTileCols;
    for (int64_t t = blockIdx.x; t < row_tiles * col_tiles; t += gridDim.x) {
        const int64_t r0 = (t / col_tiles) * kGroup, c0 = (t % col_tiles) * kTileCols;
        Pack8<T> p[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t r = r0 + 4 * word + j;
            p[j] = load8<T, VEC>(x + (r < rows ? r : 0) * cols, c0 + cl, r < rows ? cols : 0);
        }
        float m[8];
        if (PASS == T_AMAX || PASS == T_TILES) {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                float a = fabsf(elem(p[0], e));
#pragma unroll
                for (int j = 1; j < 4; ++j) a = fmaxf(a, fabsf(elem(p[j], e)));
                a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 8));
                m[e] = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 16));
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
            __syncthreads();               // (T_AMAX: warp_amax is refilled next)
#pragma unroll
            for (int e = 0; e < 8; ++e) m[e] = col_mult[cl + e];
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const int64_t c = c0 + cl + e;
                m[e] = quant_mult(scale[PASS == T_TENSOR ? 0 : (c < cols ? c : 0)], fmax, pow2);
            }
        }
        if constexpr (PASS != T_AMAX) {
#pragma unroll
            for (int e = 0; e < 8; ++e)
                codes[cl + e][swizzled<8>(cl + e, word)] = column_word(&p[0], &p[1], &p[2], &p[3], e, m[e], fmt);
            __syncthreads();
            write_transposed<8, kTileCols>(codes, q, rows, cols, r0, c0, wide);
            __syncthreads();           // (codes is refilled next)
        }
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

// 128 x 128 blocks: a block of threads per block of x, read once into registers: lane l of warp w
// holds rows 4 (4w + l / 8) .. + 3, columns 16 (l % 8) .. + 15 (each warp load: 4 rows of 128
// contiguous elements). TRANSPOSE: each thread packs, per column, its 4 rows' codes into a word
// of `codes`, which write_transposed then writes out as x^T.
template <typename T, bool VEC, bool TRANSPOSE>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 4 ? 2 : 3) blocks_kernel(int64_t rows, int64_t cols, const T* __restrict__ x,
                                                                                 unsigned char* __restrict__ q,
                                                                                 float* __restrict__ scale, float fmax, bool pow2,
                                                                                 __nv_fp8_interpretation_t fmt, bool wide) {
    __shared__ __align__(16) uint32_t codes[TRANSPOSE ? kGroup : 1][kGroup / 4];
    const int64_t row_blocks = (rows + kGroup - 1) / kGroup, col_blocks = (cols + kGroup - 1) / kGroup;
    // Scale rows are round_up(blocks along q's columns, 4) apart.
    const int64_t ld = TRANSPOSE ? (row_blocks + 3) / 4 * 4 : (col_blocks + 3) / 4 * 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, cl = (lane & 7) * 16;
    const int word = warp * 4 + (lane >> 3);                  // this thread's rows: 4 word .. + 3
    for (int64_t b = blockIdx.x; b < row_blocks * col_blocks; b += gridDim.x) {
        const int64_t br = b / col_blocks, bc = b % col_blocks, r0 = br * kGroup + 4 * word;
        const int64_t c = bc * kGroup + cl, c_end = (bc + 1) * kGroup < cols ? (bc + 1) * kGroup : cols;
        Pack16<T> p[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t r = r0 + j;
            p[j] = load16<T, VEC>(x + (r < rows ? r : 0) * cols, c, r < rows ? c_end : 0);
        }
        float a = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) a = fmaxf(a, amax16(p[j]));
        const float m = quant_mult(block_max(a), fmax, pow2);
        if constexpr (!TRANSPOSE) {
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (r0 + j < rows) store16<T, VEC>(q + (r0 + j) * cols, c, c_end, p[j], m, fmt, wide);
            if (threadIdx.x == 0) scale[br * ld + bc] = __fdiv_rn(1.f, m);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                codes[cl + e][swizzled<16>(cl + e, word)] = column_word(&p[0].lo, &p[1].lo, &p[2].lo, &p[3].lo, e, m, fmt);
                codes[cl + 8 + e][swizzled<16>(cl + 8 + e, word)] = column_word(&p[0].hi, &p[1].hi, &p[2].hi, &p[3].hi, e, m, fmt);
            }
            __syncthreads();
            write_transposed<16, kGroup>(codes, q, rows, cols, br * kGroup, bc * kGroup, wide);
            if (threadIdx.x == 0) scale[bc * ld + br] = __fdiv_rn(1.f, m);
            __syncthreads();               // (codes is refilled next)
        }
    }
}

// Blocks for `units` of work (a block each, strided past the grid): every SM filled several times over.
unsigned grid_for(int64_t units, int per_sm = 16) {
    const int count = cygemm_grid::sm_count();
    return unsigned(std::max<int64_t>(1, std::min<int64_t>(units, int64_t(count) * per_sm)));
}

// One quantize_scaled call's arguments, and how its arrays allow them to be accessed.
template <typename T>
struct Job {
    int64_t rows, cols;
    const T* x;
    unsigned char* q;
    float* scale;
    float fmax;
    bool pow2;
    __nv_fp8_interpretation_t fmt;
    cudaStream_t stream;
    bool vec;      // 16-byte loads and 8-byte stores along x's rows
    bool wide;     // 16-byte stores along q's rows
};

template <typename T, TransposedPass PASS>
void launch_transposed(const Job<T>& j) {
    const unsigned grid = grid_for(((j.rows + kGroup - 1) / kGroup) * ((j.cols + kTileCols - 1) / kTileCols));
    if (j.vec)
        transposed_kernel<T, PASS, true><<<grid, kThreads, 0, j.stream>>>(j.rows, j.cols, j.x, j.q, j.scale, j.fmax,
                                                                          j.pow2, j.fmt, j.wide);
    else
        transposed_kernel<T, PASS, false><<<grid, kThreads, 0, j.stream>>>(j.rows, j.cols, j.x, j.q, j.scale, j.fmax,
                                                                           j.pow2, j.fmt, j.wide);
}

// One scale per row of x: rows of up to 16384 elements held in registers (32 or 64 a thread; the
// block as narrow as that allows, down to a warp), longer rows read twice.
template <typename T, bool VEC>
void launch_rows(const Job<T>& j) {
    constexpr int64_t kHeld2 = int64_t(kThreads) * 16 * 2;
    if (j.cols <= kHeld2) {
        const int threads = int(std::min<int64_t>(kThreads, ((j.cols + 31) / 32 + 31) / 32 * 32));
        rows_kernel<T, VEC, 2><<<grid_for(j.rows, 2048 / threads), threads, 0, j.stream>>>(
            j.rows, j.cols, j.x, j.q, j.scale, j.fmax, j.pow2, j.fmt, j.wide);
    } else if (j.cols <= 2 * kHeld2) {
        rows_kernel<T, VEC, 4><<<grid_for(j.rows), kThreads, 0, j.stream>>>(j.rows, j.cols, j.x, j.q, j.scale, j.fmax,
                                                                            j.pow2, j.fmt, j.wide);
    } else {
        long_rows_kernel<T, VEC><<<grid_for(j.rows), kThreads, 0, j.stream>>>(j.rows, j.cols, j.x, j.q, j.scale, j.fmax,
                                                                              j.pow2, j.fmt, j.wide);
    }
}

template <typename T, bool VEC>
void launch_tiles(const Job<T>& j) {
    const int64_t runs = ((j.cols + kGroup - 1) / kGroup + kSpan - 1) / kSpan;
    tiles_kernel<T, VEC><<<grid_for((j.rows * runs + kWarps - 1) / kWarps), kThreads, 0, j.stream>>>(
        j.rows, j.cols, j.x, j.q, j.scale, j.fmax, j.pow2, j.fmt, j.wide);
}

template <typename T, bool VEC, bool TRANSPOSE>
void launch_blocks(const Job<T>& j) {
    const int64_t blocks = ((j.rows + kGroup - 1) / kGroup) * ((j.cols + kGroup - 1) / kGroup);
    blocks_kernel<T, VEC, TRANSPOSE><<<grid_for(blocks), kThreads, 0, j.stream>>>(j.rows, j.cols, j.x, j.q, j.scale, j.fmax,
                                                                                 j.pow2, j.fmt, j.wide);
}

template <typename T>
cudaError_t quantize_scaled(int mode, bool transpose, Job<T> j) {
    if (j.rows == 0 || j.cols == 0) {   // amax 0: m = 1 for the tensor's scale and each (empty) row's
        const int64_t n = mode == CYGEMM_SCALE_TENSOR ? 1 : mode == CYGEMM_SCALE_ROWWISE ? (transpose ? j.cols : j.rows) : 0;
        if (n == 0) return cudaSuccess;
        fill_kernel<<<grid_for((n + kThreads - 1) / kThreads), kThreads, 0, j.stream>>>(n, j.scale, 1.f);
        return cudaGetLastError();
    }
    const auto aligned = [](const void* p, int bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; };
    // Along x's rows: rows that start 8 elements apart on 16-byte aligned x and 8-byte aligned q.
    j.vec = j.cols % 8 == 0 && aligned(j.x, 16) && aligned(j.q, 8);
    // 16-byte stores: q's rows (x's, or x^T's with transpose) 16 bytes apart on 16-byte aligned q.
    j.wide = (transpose ? j.rows : j.cols) % 16 == 0 && aligned(j.q, 16);
    cudaError_t err = cudaSuccess;
    if (mode == CYGEMM_SCALE_TENSOR) {
        const int64_t n = j.rows * j.cols;
        const bool flat_vec = aligned(j.x, 16) && aligned(j.q, 16);
        const unsigned grid = grid_for((n + 32 * kThreads - 1) / (32 * kThreads));
        if ((err = cudaMemsetAsync(j.scale, 0, sizeof(float), j.stream)) != cudaSuccess) return err;
        if (flat_vec) amax_kernel<T, true><<<grid, kThreads, 0, j.stream>>>(n, j.x, j.scale);
        else amax_kernel<T, false><<<grid, kThreads, 0, j.stream>>>(n, j.x, j.scale);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        if (transpose)
            launch_transposed<T, T_TENSOR>(j);
        else if (flat_vec)
            tensor_kernel<T, true><<<grid, kThreads, 0, j.stream>>>(n, j.x, j.q, j.scale, j.fmax, j.pow2, j.fmt, true);
        else
            tensor_kernel<T, false><<<grid, kThreads, 0, j.stream>>>(n, j.x, j.q, j.scale, j.fmax, j.pow2, j.fmt, false);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        amax_to_scale_kernel<<<1, 32, 0, j.stream>>>(1, j.scale, j.fmax, j.pow2);
    } else if (mode == CYGEMM_SCALE_ROWWISE && transpose) {
        if ((err = cudaMemsetAsync(j.scale, 0, size_t(j.cols) * sizeof(float), j.stream)) != cudaSuccess) return err;
        launch_transposed<T, T_AMAX>(j);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        launch_transposed<T, T_ROWS>(j);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        amax_to_scale_kernel<<<grid_for((j.cols + kThreads - 1) / kThreads), kThreads, 0, j.stream>>>(j.cols, j.scale,
                                                                                                      j.fmax, j.pow2);
    } else if (mode == CYGEMM_SCALE_ROWWISE) {
        if (j.vec) launch_rows<T, true>(j);
        else launch_rows<T, false>(j);
    } else if (mode == CYGEMM_SCALE_1X128 && transpose) {
        launch_transposed<T, T_TILES>(j);
    } else if (mode == CYGEMM_SCALE_1X128) {
        if (j.vec) launch_tiles<T, true>(j);
        else launch_tiles<T, false>(j);
    } else if (transpose) {
        if (j.vec) launch_blocks<T, true, true>(j);
        else launch_blocks<T, false, true>(j);
    } else {
        if (j.vec) launch_blocks<T, true, false>(j);
        else launch_blocks<T, false, false>(j);
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
        return quantize_scaled<float>(mode, transpose, {rows, cols, static_cast<const float*>(x), qs, scale, fmax,
                                                        bool(pow2), fmt, stream, false, false});
    case CUDA_R_16F:
        return quantize_scaled<__half>(mode, transpose, {rows, cols, static_cast<const __half*>(x), qs, scale, fmax,
                                                         bool(pow2), fmt, stream, false, false});
    case CUDA_R_16BF:
        return quantize_scaled<__nv_bfloat16>(mode, transpose, {rows, cols, static_cast<const __nv_bfloat16*>(x), qs,
                                                                scale, fmax, bool(pow2), fmt, stream, false, false});
    default:
        return cudaErrorInvalidValue;
    }
}
