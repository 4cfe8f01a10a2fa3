// Batched GEMMs of small matrices (include/cygemm/small_batched_kernels.h).
//
// A block takes a run of whole matrices (mpb of them): it stages their A and B in shared memory,
// converted to the accumulation type (conjugated where asked) and kept in their stored layout,
// then each thread computes a tile of one C (1x1, 2x2, 4x4 elements, or the vector tile) adding
// the K products in order, and writes alpha * sum + beta * C. Staging reads a run whose matrices
// lie one after another with 16-byte loads, any other layout element by element; a broadcast
// operand (batch stride 0) is staged once per block. benchmarks/small_batched_probe.cu measures the
// launch shapes.
//
// Candidates under measurement, compiled only with CYGEMM_SMALL_BATCHED_CANDIDATES (as the probe
// and the CPU tests build this file; the library's build has neither, and falls back as below):
// the vector tile unpadded, reading each operand as stored along its contiguous index (else the
// vector tile is always padded); two stages, where a block copies its next run of matrices into a
// second buffer (cp.async) while it computes on the first (else one stage); and for the 16-bit
// types the tensor cores (mma.sync m16n8k16, fp32 sums, sm_80 on), a warp a 16 x 8 tile of C.
#include "cygemm/small_batched_kernels.h"

#ifndef CYGEMM_SMALL_BATCHED_CANDIDATES
#define CYGEMM_SMALL_BATCHED_CANDIDATES 0
#endif
#include "cygemm/sm_count.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

// ---------------------------------------------------------------- numbers
// Storage type -> the type its products are added in (fp32 for the 16-bit types), and how a
// value enters and leaves it.
template <typename T> struct Num { using Acc = float; };
template <> struct Num<double> { using Acc = double; };
template <> struct Num<float2> { using Acc = float2; };
template <> struct Num<double2> { using Acc = double2; };

__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ double widen(double x) { return x; }
__device__ __forceinline__ float2 widen(float2 x) { return x; }
__device__ __forceinline__ double2 widen(double2 x) { return x; }

template <typename T> __device__ __forceinline__ T narrow(typename Num<T>::Acc x) { return x; }
template <> __device__ __forceinline__ __half narrow<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float conj_if(float x, bool) { return x; }
__device__ __forceinline__ double conj_if(double x, bool) { return x; }
__device__ __forceinline__ float2 conj_if(float2 x, bool c) { return c ? make_float2(x.x, -x.y) : x; }
__device__ __forceinline__ double2 conj_if(double2 x, bool c) { return c ? make_double2(x.x, -x.y) : x; }

// c + a * b
__device__ __forceinline__ float mad(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double mad(double a, double b, double c) { return fma(a, b, c); }
__device__ __forceinline__ float2 mad(float2 a, float2 b, float2 c) {
    return make_float2(fmaf(-a.y, b.y, fmaf(a.x, b.x, c.x)), fmaf(a.y, b.x, fmaf(a.x, b.y, c.y)));
}
__device__ __forceinline__ double2 mad(double2 a, double2 b, double2 c) {
    return make_double2(fma(-a.y, b.y, fma(a.x, b.x, c.x)), fma(a.y, b.x, fma(a.x, b.y, c.y)));
}
template <typename A> __host__ __device__ __forceinline__ A zero();
template <> __host__ __device__ __forceinline__ float zero<float>() { return 0.0f; }
template <> __host__ __device__ __forceinline__ double zero<double>() { return 0.0; }
template <> __host__ __device__ __forceinline__ float2 zero<float2>() { return make_float2(0.0f, 0.0f); }
template <> __host__ __device__ __forceinline__ double2 zero<double2>() { return make_double2(0.0, 0.0); }

template <typename A> A scalar(double re, double im);
template <> float scalar<float>(double re, double) { return float(re); }
template <> double scalar<double>(double re, double) { return re; }
template <> float2 scalar<float2>(double re, double im) { return make_float2(float(re), float(im)); }
template <> double2 scalar<double2>(double re, double im) { return make_double2(re, im); }

// ---------------------------------------------------------------- asynchronous copies to shared memory
// 16 bytes from global to shared memory without passing through registers (cp.async, sm_80 on;
// before it an ordinary load and store), in groups a thread commits and later waits for: all
// but the newest `newest_left` groups have landed after wait_copies (then a barrier shows them to
// the block).
[[maybe_unused]] __device__ __forceinline__ void copy16_async(void* dst, const void* src) {
#if defined(CYGEMM_CUDA_ON_CPU)
    cuda_on_cpu::async_copy(dst, src, 16);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(unsigned(__cvta_generic_to_shared(dst))),
                 "l"(__cvta_generic_to_global(src))
                 : "memory");
#else
    *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
#endif
}

[[maybe_unused]] __device__ __forceinline__ void commit_copies() {
#if defined(CYGEMM_CUDA_ON_CPU)
    cuda_on_cpu::async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int NEWEST_LEFT>
__device__ __forceinline__ void wait_copies() {
#if defined(CYGEMM_CUDA_ON_CPU)
    cuda_on_cpu::async_wait(NEWEST_LEFT);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(NEWEST_LEFT) : "memory");
#endif
}

// ---------------------------------------------------------------- division by a fixed divisor
// n / d for 0 <= n < 2**31 by a multiply and a shift (Granlund and Montgomery): the block's
// index arithmetic divides by runtime sizes on every element.
struct Divider {
    uint32_t mult, shift;
    Divider() = default;
    explicit Divider(uint32_t d) {
        shift = 0;
        while ((uint64_t(1) << shift) < d) ++shift;
        mult = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
    }
    __device__ __forceinline__ int div(int n) const {
        return int((uint64_t(__umulhi(uint32_t(n), mult)) + uint32_t(n)) >> shift);
    }
};

// ---------------------------------------------------------------- one operand's layout
struct Operand {
    long long ld, stride;       // elements
    int rows, span;             // stored rows; elements of one matrix
    int pitch, staged_span;     // relaid: shared-memory elements between its rows or columns; of one matrix
    Divider by_span, by_rows;
    bool conj, broadcast;       // conjugated; batch stride 0 (one matrix, staged once)
    bool run;                   // a run of matrices is one contiguous range
    bool vector;                // ... starting on 16 bytes: copied 16 bytes at a time
    bool relayout;              // staged at row*dst_row + col*dst_col, not packed as stored:
    int dst_row, dst_col;       //   transposed (pitch, 1) or with padded columns (1, pitch)
    int step_inner, step_k;     // shared-memory strides of op(X) along its other index and along K
    int raw_offset;             // two stages: where its matrices start in each stage's buffer (bytes)
};

template <typename T>
struct Params {
    using Acc = typename Num<T>::Acc;
    const T* a;
    const T* b;
    T* c;
    Operand oa, ob;
    long long ldc, stride_c, batch;
    int m, n, k;
    int mpb;                    // matrices a block takes at a time
    int b_offset;               // where B's matrices start in shared memory (elements, on 16 bytes)
    int raw_start, raw_bytes;   //   the first buffer's start and each buffer's size (bytes)
    int tiles_m, tiles;         // tiles along a column of C, tiles of one C
    Divider by_tiles, by_tiles_m;
    Acc alpha, beta;
    bool beta_zero;
};

// Stage `count` matrices of one operand from g (its first) into s, in their stored layout.
template <typename T, typename Acc>
__device__ __forceinline__ void stage(Acc* __restrict__ s, const T* __restrict__ g, const Operand& o, int count) {
    const int total = count * o.span;
    if (o.relayout) {
        // X stored K-contiguous (rows = K), which threads of different rows or columns of C read
        // pitch apart: transposed, or its columns padded to an odd pitch (K apart, they would
        // land on few banks).
        for (int e = threadIdx.x; e < total; e += blockDim.x) {
            const int q = o.by_span.div(e), r = e - q * o.span;
            const int col = o.by_rows.div(r), row = r - col * o.rows;
            const T x = o.run ? g[e] : g[q * o.stride + row + col * o.ld];
            s[q * o.staged_span + row * o.dst_row + col * o.dst_col] = conj_if(widen(x), o.conj);
        }
    } else if (o.vector) {
        // 16 bytes in, each value widened, stored 16 bytes at a time (scalar shared-memory
        // stores of consecutive values would conflict on banks: 4 to 8 ways).
        constexpr int V = 16 / sizeof(T), W = V * sizeof(Acc) / 16;
        const uint4* gv = reinterpret_cast<const uint4*>(g);
        const int nv = total / V;
        for (int v = threadIdx.x; v < nv; v += blockDim.x) {
            const uint4 raw = gv[v];
            const T* x = reinterpret_cast<const T*>(&raw);
            union { Acc w[V]; uint4 q[W]; } out;
#pragma unroll
            for (int u = 0; u < V; ++u) out.w[u] = conj_if(widen(x[u]), o.conj);
            uint4* d = reinterpret_cast<uint4*>(s + v * V);
#pragma unroll
            for (int u = 0; u < W; ++u) d[u] = out.q[u];
        }
        for (int e = nv * V + threadIdx.x; e < total; e += blockDim.x) s[e] = conj_if(widen(g[e]), o.conj);
    } else if (o.run) {
        for (int e = threadIdx.x; e < total; e += blockDim.x) s[e] = conj_if(widen(g[e]), o.conj);
    } else {
        for (int e = threadIdx.x; e < total; e += blockDim.x) {
            const int q = o.by_span.div(e), r = e - q * o.span;
            const int col = o.by_rows.div(r), row = r - col * o.rows;
            s[e] = conj_if(widen(g[q * o.stride + row + col * o.ld]), o.conj);
        }
    }
}

// A V x V tile of op(A) op(B) from 16-byte shared-memory reads (V = 16 / sizeof(Acc)): each
// operand is read along whichever of its indices is contiguous in shared memory. LAYOUT bit 0:
// op(A)(i, kk) at i*pa + kk (K contiguous: a transposed A as stored), else at kk*pa + i; bit 1:
// op(B)(kk, j) at j*pb + kk (an untransposed B as stored), else at kk*pb + j. Each step of V along
// K reads V vectors of each and adds V**3 products, in the same order k = 0, 1, ... as the scalar
// tile. m, n and k are multiples of V. S: the values as staged, widened (Acc: 16-byte reads) or as
// stored (a 16-bit type: 8-byte reads of V values, widened in registers).
template <int BYTES> struct Bits;
template <> struct Bits<16> { using type = uint4; };
template <> struct Bits<8> { using type = uint2; };

template <typename Acc, int V, int LAYOUT, typename S>
__device__ __forceinline__ void vector_tile(const S* __restrict__ a, const S* __restrict__ b, int pa, int pb, int k,
                                            int i0, int j0, Acc (&acc)[V][V]) {
    constexpr bool A_KC = LAYOUT & 1, B_KC = LAYOUT & 2;
    using Q = typename Bits<V * sizeof(S)>::type;
    union Vec { Q q; S w[V]; };
    a += A_KC ? i0 * pa : i0;
    b += B_KC ? j0 * pb : j0;
    for (int kk = 0; kk < k; kk += V) {
        Acc av[V][V], bv[V][V];                        // av[i][q] = op(A)(i0+i, kk+q), bv[q][j] = op(B)(kk+q, j0+j)
#pragma unroll
        for (int u = 0; u < V; ++u) {
            Vec x, y;
            x.q = *reinterpret_cast<const Q*>(a + u * pa);     // row i0+u (K contiguous), else k = kk+u
            y.q = *reinterpret_cast<const Q*>(b + u * pb);     // column j0+u (K contiguous), else k = kk+u
#pragma unroll
            for (int w = 0; w < V; ++w) {
                if constexpr (A_KC) av[u][w] = widen(x.w[w]); else av[w][u] = widen(x.w[w]);
                if constexpr (B_KC) bv[w][u] = widen(y.w[w]); else bv[u][w] = widen(y.w[w]);
            }
        }
        a += A_KC ? V : V * pa;
        b += B_KC ? V : V * pb;
#pragma unroll
        for (int q = 0; q < V; ++q)
#pragma unroll
            for (int i = 0; i < V; ++i)
#pragma unroll
                for (int j = 0; j < V; ++j) acc[i][j] = mad(av[i][q], bv[q][j], acc[i][j]);
    }
}

// The C of `count` matrices from `first` on, A's and B's staged at sa and sb (a broadcast
// operand's one matrix there), as S: widened (the accumulation type) or as stored.
template <typename T, int RM, int RN, int SIZE, bool VEC, int LAYOUT, typename S>
__device__ __forceinline__ void compute(const Params<T>& p, const S* sa, const S* sb, long long first, int count) {
    using Acc = typename Num<T>::Acc;
    constexpr bool SIZED = SIZE > 0;
    constexpr int TILES_M = SIZED ? (SIZE + RM - 1) / RM : 0, TILES = TILES_M * (SIZED ? (SIZE + RN - 1) / RN : 0);
    const int m = SIZED ? SIZE : p.m, n = SIZED ? SIZE : p.n, k = SIZED ? SIZE : p.k;
    const int tiles_m = SIZED ? TILES_M : p.tiles_m, tiles = SIZED ? TILES : p.tiles;
    const int span_a = p.oa.staged_span, span_b = p.ob.staged_span;
    const int work = count * tiles;
    for (int t = threadIdx.x; t < work; t += blockDim.x) {
        const int q = SIZED ? t / TILES : p.by_tiles.div(t), tt = t - q * tiles;
        const int tj = SIZED ? tt / TILES_M : p.by_tiles_m.div(tt), ti = tt - tj * tiles_m;
        const int i0 = ti * RM, j0 = tj * RN;
        const S* a = sa + (p.oa.broadcast ? 0 : q * span_a);
        const S* b = sb + (p.ob.broadcast ? 0 : q * span_b);
        Acc acc[RM][RN];
#pragma unroll
        for (int ii = 0; ii < RM; ++ii)
#pragma unroll
            for (int jj = 0; jj < RN; ++jj) acc[ii][jj] = zero<Acc>();
        if constexpr (VEC) {
            vector_tile<Acc, RM, LAYOUT>(a, b, p.oa.pitch, p.ob.pitch, k, i0, j0, acc);
        } else {
            int ao[RM], bo[RN];
#pragma unroll
            for (int ii = 0; ii < RM; ++ii) ao[ii] = min(i0 + ii, m - 1) * p.oa.step_inner;   // (clamped: rows
#pragma unroll
            for (int jj = 0; jj < RN; ++jj) bo[jj] = min(j0 + jj, n - 1) * p.ob.step_inner;   //  past the end unused)
#pragma unroll
            for (int kk = 0; kk < k; ++kk) {
                Acc av[RM], bv[RN];
#pragma unroll
                for (int ii = 0; ii < RM; ++ii) av[ii] = widen(a[ao[ii]]);
#pragma unroll
                for (int jj = 0; jj < RN; ++jj) bv[jj] = widen(b[bo[jj]]);
#pragma unroll
                for (int ii = 0; ii < RM; ++ii)
#pragma unroll
                    for (int jj = 0; jj < RN; ++jj) acc[ii][jj] = mad(av[ii], bv[jj], acc[ii][jj]);
                a += p.oa.step_k;
                b += p.ob.step_k;
            }
        }
        T* c = p.c + (first + q) * p.stride_c;
#pragma unroll
        for (int jj = 0; jj < RN; ++jj)
#pragma unroll
            for (int ii = 0; ii < RM; ++ii) {
                const int i = i0 + ii, j = j0 + jj;
                if (i < m && j < n) {
                    T* ce = c + i + j * p.ldc;
                    Acc v = mad(p.alpha, acc[ii][jj], zero<Acc>());
                    if (!p.beta_zero) v = mad(p.beta, widen(*ce), v);
                    *ce = narrow<T>(v);
                }
            }
    }
}

// Two stages: copy `count` matrices of one operand, a run from g on, as they are into s (16 bytes
// at a time, asynchronously; the last run's odd end element by element, at once).
template <typename T>
__device__ __forceinline__ void copy_run(unsigned char* s, const T* __restrict__ g, const Operand& o, int count) {
    const int bytes = count * o.span * int(sizeof(T)), nv = bytes / 16;
    for (int v = threadIdx.x; v < nv; v += blockDim.x) copy16_async(s + 16 * v, reinterpret_cast<const uint4*>(g) + v);
    T* st = reinterpret_cast<T*>(s);
    for (int e = nv * (16 / int(sizeof(T))) + threadIdx.x; e < count * o.span; e += blockDim.x) st[e] = g[e];
}

// ---------------------------------------------------------------- the tensor-core tile (a candidate)
constexpr int LAYOUT_MMA = 4;                   // (the LAYOUT of the tensor-core tile's kernels)

template <typename T>
__device__ __forceinline__ unsigned short bits16(T x) {
    unsigned short b;
    memcpy(&b, &x, 2);
    return b;
}

// Two values of op(X) as one register of 16-bit values (the first in the low half); staged widened
// or as stored (16-bit values, exact either way).
template <typename T, typename S>
__device__ __forceinline__ uint32_t pack2(S lo, S hi) {
    if constexpr (std::is_same<S, T>::value) return uint32_t(bits16(lo)) | (uint32_t(bits16(hi)) << 16);
    else return uint32_t(bits16(narrow<T>(lo))) | (uint32_t(bits16(narrow<T>(hi))) << 16);
}

// d += a b, one m16n8k16 product of the warp (fragments in the PTX ISA's layout), fp32 sums.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
#if defined(CYGEMM_CUDA_ON_CPU)
    cuda_on_cpu::mma_m16n8k16<BF16>(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();                                   // (the host never launches it before sm_80)
#endif
}

// The C of `count` matrices by the tensor cores: each warp takes 16 x 8 tiles of C in turn (the
// same number of times across its threads, as mma.sync needs), K in steps of 16, fragments read
// from op(A)(i, kk) at i*step_inner + kk*step_k and op(B)(kk, j) at kk*step_k + j*step_inner.
// m, n, k multiples of 16, 8, 16. Its sums are fp32 in the tensor cores' order, not k = 0, 1, ...
template <typename T, typename S>
__device__ __forceinline__ void compute_mma(const Params<T>& p, const S* sa, const S* sb, long long first, int count) {
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int g = lane >> 2, t2 = (lane & 3) * 2;
    const int tiles_m = p.m / 16, tiles = tiles_m * (p.n / 8), work = count * tiles;
    const Operand &oa = p.oa, &ob = p.ob;
    for (int w = threadIdx.x >> 5; w < work; w += warps) {
        const int q = w / tiles, tt = w - q * tiles, tj = tt / tiles_m, ti = tt - tj * tiles_m;
        const S* a = sa + (oa.broadcast ? 0 : q * oa.staged_span) + ti * 16 * oa.step_inner;
        const S* b = sb + (ob.broadcast ? 0 : q * ob.staged_span) + tj * 8 * ob.step_inner;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int kk = 0; kk < p.k; kk += 16) {
            auto A = [&](int i, int c) { return a[i * oa.step_inner + (kk + c) * oa.step_k]; };
            auto B = [&](int r, int j) { return b[(kk + r) * ob.step_k + j * ob.step_inner]; };
            const uint32_t af[4] = {pack2<T>(A(g, t2), A(g, t2 + 1)), pack2<T>(A(g + 8, t2), A(g + 8, t2 + 1)),
                                    pack2<T>(A(g, t2 + 8), A(g, t2 + 9)), pack2<T>(A(g + 8, t2 + 8), A(g + 8, t2 + 9))};
            const uint32_t bf[2] = {pack2<T>(B(t2, g), B(t2 + 1, g)), pack2<T>(B(t2 + 8, g), B(t2 + 9, g))};
            mma16816<T>(d, af, bf);
        }
        T* c = p.c + (first + q) * p.stride_c;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            T* ce = c + (ti * 16 + g + (r >= 2 ? 8 : 0)) + (tj * 8 + t2 + (r & 1)) * p.ldc;
            float v = p.alpha * d[r];
            if (!p.beta_zero) v = fmaf(p.beta, widen(*ce), v);
            *ce = narrow<T>(v);
        }
    }
}

// SIZE: the side of a square problem when known at compile time (0: read from p), whose index
// arithmetic and K loop then fold away. VEC: the vector tile (RM = RN = V, LAYOUT its operands'
// layouts), else the scalar tile RM x RN. STAGES: 1, or 2 (a template parameter: the second
// stage's registers would cost the one-stage kernels occupancy).
template <typename T, int RM, int RN, int SIZE, bool VEC, int LAYOUT, int STAGES>
__global__ void __launch_bounds__(256) small_batched(const Params<T> p) {
    using Acc = typename Num<T>::Acc;
    extern __shared__ __align__(16) unsigned char smem[];
    const long long step = gridDim.x * (long long)p.mpb;
    long long first = blockIdx.x * (long long)p.mpb;
    if constexpr (STAGES == 1) {
        // Staged widened: A's matrices, then B's from b_offset (a broadcast operand's one).
        Acc* sa = reinterpret_cast<Acc*>(smem);
        Acc* sb = sa + p.b_offset;
        if (p.oa.broadcast) stage(sa, p.a, p.oa, 1);
        if (p.ob.broadcast) stage(sb, p.b, p.ob, 1);
        for (; first < p.batch; first += step) {
            const int count = int(p.batch - first < p.mpb ? p.batch - first : p.mpb);
            if (!p.oa.broadcast) stage(sa, p.a + first * p.oa.stride, p.oa, count);
            if (!p.ob.broadcast) stage(sb, p.b + first * p.ob.stride, p.ob, count);
            __syncthreads();
            if constexpr (LAYOUT == LAYOUT_MMA) compute_mma<T>(p, sa, sb, first, count);
            else compute<T, RM, RN, SIZE, VEC, LAYOUT>(p, sa, sb, first, count);
            __syncthreads();
        }
    } else {
        // Two stages, everything as stored (the 16-bit types widened as they are read): a broadcast
        // operand's matrix at the start; runs copied into buffer s ^ 1 while the block computes on
        // buffer s.
        T* fa = reinterpret_cast<T*>(smem);
        T* fb = fa + p.b_offset;
        if (p.oa.broadcast) stage(fa, p.a, p.oa, 1);
        if (p.ob.broadcast) stage(fb, p.b, p.ob, 1);
        auto copy = [&](int buffer, long long from) {
            if (from < p.batch) {
                const int count = int(p.batch - from < p.mpb ? p.batch - from : p.mpb);
                unsigned char* raw = smem + p.raw_start + buffer * p.raw_bytes;
                if (!p.oa.broadcast) copy_run(raw + p.oa.raw_offset, p.a + from * p.oa.stride, p.oa, count);
                if (!p.ob.broadcast) copy_run(raw + p.ob.raw_offset, p.b + from * p.ob.stride, p.ob, count);
            }
            commit_copies();
        };
        copy(0, first);
        for (int buffer = 0; first < p.batch; first += step, buffer ^= 1) {
            const int count = int(p.batch - first < p.mpb ? p.batch - first : p.mpb);
            copy(buffer ^ 1, first + step);            // (the next run: in flight while this one is computed)
            wait_copies<1>();
            __syncthreads();
            const unsigned char* raw = smem + p.raw_start + buffer * p.raw_bytes;
            const T* a = p.oa.broadcast ? fa : reinterpret_cast<const T*>(raw + p.oa.raw_offset);
            const T* b = p.ob.broadcast ? fb : reinterpret_cast<const T*>(raw + p.ob.raw_offset);
            if constexpr (LAYOUT == LAYOUT_MMA) compute_mma<T>(p, a, b, first, count);
            else compute<T, RM, RN, SIZE, VEC, LAYOUT>(p, a, b, first, count);
            __syncthreads();
        }
    }
}

// ---------------------------------------------------------------- the host side

constexpr int SMEM_LIMIT = 48 << 10;           // bytes a block may take without opting in

int type_size(cudaDataType t) {
    switch (t) {
        case CUDA_R_16F: case CUDA_R_16BF: return 2;
        case CUDA_R_32F: return 4;
        case CUDA_R_64F: case CUDA_C_32F: return 8;
        case CUDA_C_64F: return 16;
        default: return 0;
    }
}

int acc_size(cudaDataType t) { return t == CUDA_R_16F || t == CUDA_R_16BF ? 4 : type_size(t); }

bool is_complex(cudaDataType t) { return t == CUDA_C_32F || t == CUDA_C_64F; }

long long gcd(long long a, long long b) { while (b) { long long t = a % b; a = b; b = t; } return a; }

Operand operand(const void* ptr, int op, long long rows_op, long long cols_op, long long ld, long long stride,
                bool complex) {
    // op(X) is rows_op x cols_op; X as stored is its transpose under a transposing op.
    Operand o{};
    const bool t = op != 0;
    const long long rows = t ? cols_op : rows_op, cols = t ? rows_op : cols_op;
    o.ld = ld;
    o.stride = stride;
    o.rows = int(rows);
    o.span = int(rows * cols);
    o.pitch = int(rows);
    o.staged_span = o.span;
    o.relayout = false;
    o.by_span = Divider(uint32_t(o.span));
    o.by_rows = Divider(uint32_t(rows));
    o.conj = complex && op == 2;
    o.broadcast = stride == 0;
    const bool contiguous = ld == rows || cols == 1;
    o.run = contiguous && (o.broadcast || stride == o.span);
    o.vector = o.run && (reinterpret_cast<uintptr_t>(ptr) % 16 == 0);
    // Shared memory holds X as stored (packed): op(X)(r, kk) is at r*step_inner + kk*step_k for
    // A (r a row of op(A)) and kk*step_k + r*step_inner for B (r a column of op(B)).
    return o;
}

long long round_up(long long x, long long to) { return (x + to - 1) / to * to; }

// How many matrices a block takes at a time (p.mpb) and where they go in shared memory, with one
// stage (values widened) or two (as stored): as many as the shared memory given holds, a multiple
// of what keeps every run on 16 bytes, and few enough that every SM gets two blocks. The shared
// memory this takes (bytes), or -1 where two stages do not apply: each operand not broadcast must
// be a run copied as it is (16-byte aligned, not relaid, not conjugated), a matrix of each twice.
template <typename T>
long long plan_groups(Params<T>& p, const cygemm_small_batched_shape& shape, int stages) {
    using Acc = typename Num<T>::Acc;
    const long long size = sizeof(T);
    const long long elem = stages == 2 ? size : sizeof(Acc);  // a staged value: as stored, or widened
    Operand* const ops[2] = {&p.oa, &p.ob};
    if (stages == 2) {
        if (p.oa.broadcast && p.ob.broadcast) return -1;
        for (const Operand* o : ops)
            if (!o->broadcast && (!o->vector || o->relayout || o->conj)) return -1;
    }
    // Bytes: fixed (a broadcast operand's matrix) and per matrix (staged; or as stored, twice).
    long long fixed = 0, per = 0;
    for (const Operand* o : ops) {
        if (o->broadcast) fixed += o->staged_span * elem;
        else per += stages == 1 ? o->staged_span * elem : 2 * o->span * size;
    }
    // (Two stages' regions rounded up to 16 bytes: b_offset, raw_start and B's raw run add at most
    // 3 x 12; one stage's budget is the measured one, its only rounding B's start, checked below.)
    const long long slack = stages == 2 ? 64 : 0;
    long long mpb = per == 0 ? 256 : (shape.smem_bytes - slack - fixed) / per;
    if (mpb < 1 && stages == 2) return -1;             // (not one matrix in the shared memory given)
    if (mpb < 1) mpb = 1;
    long long granule = 1;
    for (const Operand* o : ops)
        if (o->vector && !o->broadcast) {
            const long long gq = 16 / gcd(16, (long long)o->span * size);
            granule = granule / gcd(granule, gq) * gq;
        }
    const long long blocks_wanted = 2LL * cygemm_grid::sm_count();
    if ((p.batch + mpb - 1) / mpb < blocks_wanted) mpb = (p.batch + blocks_wanted - 1) / blocks_wanted;
    if (mpb >= granule) mpb -= mpb % granule;
    for (Operand* o : ops)                             // a run that would start off 16 bytes
        if (o->vector && !o->broadcast && (mpb * o->span * size) % 16 != 0) {
            if (stages == 2) return -1;
            o->vector = false;
        }
    p.mpb = int(mpb);
    auto staged = [&](const Operand& o) {              // values of it before b_offset / after
        return o.broadcast ? o.staged_span : (stages == 1 ? mpb * o.staged_span : 0);
    };
    p.b_offset = int(round_up(staged(p.oa), 16 / elem > 1 ? 16 / elem : 1));
    long long bytes = (p.b_offset + staged(p.ob)) * elem;
    if (stages == 2) {
        p.raw_start = int(round_up(bytes, 16));
        p.oa.raw_offset = 0;
        p.ob.raw_offset = int(p.oa.broadcast ? 0 : round_up(mpb * p.oa.span * size, 16));
        p.raw_bytes = int(p.ob.raw_offset + (p.ob.broadcast ? 0 : round_up(mpb * p.ob.span * size, 16)));
        bytes = p.raw_start + 2LL * p.raw_bytes;
    }
    return bytes;
}

template <typename T, int RM, int RN, int SIZE, bool VEC, int LAYOUT>
cudaError_t launch(const cygemm_small_batched_args* g, const cygemm_small_batched_shape& shape, cudaStream_t stream) {
    using Acc = typename Num<T>::Acc;
    const int acc = sizeof(Acc);
    const bool complex = is_complex(g->dtype);
    Params<T> p{};
    p.a = static_cast<const T*>(g->a);
    p.b = static_cast<const T*>(g->b);
    p.c = static_cast<T*>(g->c);
    p.m = int(g->m);
    p.n = int(g->n);
    p.k = int(g->k);
    p.batch = g->batch;
    p.oa = operand(g->a, g->opa, g->m, g->k, g->lda, g->stride_a, complex);
    p.ob = operand(g->b, g->opb, g->k, g->n, g->ldb, g->stride_b, complex);
    // op(A)(i, kk): stored (i, kk) at i + kk*m, or (kk, i) at kk + i*k.
    p.oa.step_inner = g->opa == 0 ? 1 : p.k;
    p.oa.step_k = g->opa == 0 ? p.m : 1;
    // op(B)(kk, j): stored (kk, j) at kk + j*k, or (j, kk) at j + kk*n.
    p.ob.step_inner = g->opb == 0 ? p.k : 1;
    p.ob.step_k = g->opb == 0 ? 1 : p.n;
    if (VEC && shape.pad) {
        // Both K-major (LAYOUT 0): a transposed A and an untransposed B relaid, padded by V.
        constexpr int V = RM;
        for (Operand* o : {&p.oa, &p.ob}) {
            const bool is_a = o == &p.oa;
            const int inner = is_a ? p.m : p.n;
            o->relayout = is_a ? g->opa != 0 : g->opb == 0;
            o->pitch = o->relayout ? inner + V : inner;
            o->dst_row = o->pitch;
            o->dst_col = 1;
            o->staged_span = p.k * o->pitch;
        }
    } else if (!VEC && shape.pad && p.k % 2 == 0) {
        // The K-contiguous operands (a transposed A, an untransposed B) with their columns
        // padded to the odd pitch K + 1, where a whole matrix of each still fits.
        const bool pad_a = g->opa != 0, pad_b = g->opb == 0;
        if ((p.m * (p.k + pad_a) + (p.k + pad_b) * p.n + 4) * acc <= SMEM_LIMIT)
            for (Operand* o : {&p.oa, &p.ob})
                if (o == &p.oa ? pad_a : pad_b) {
                    o->relayout = true;
                    o->pitch = p.k + 1;
                    o->dst_row = 1;
                    o->dst_col = o->pitch;
                    o->staged_span = (o == &p.oa ? p.m : p.n) * o->pitch;
                    o->step_inner = o->pitch;
                }
    }
    // (The vector tile unpadded reads both as stored, pitch = their stored rows: LAYOUT.)
    for (Operand* o : {&p.oa, &p.ob})
        if (o->relayout) o->vector = false;
    p.ldc = g->ldc;
    p.stride_c = g->stride_c;
    p.alpha = scalar<Acc>(g->alpha_re, g->alpha_im);
    p.beta = scalar<Acc>(g->beta_re, g->beta_im);
    p.beta_zero = g->beta_re == 0.0 && g->beta_im == 0.0;

    long long smem = -1;
#if CYGEMM_SMALL_BATCHED_CANDIDATES
    if (shape.stages == 2) {                           // (planned on a copy: kept only where it applies)
        Params<T> two = p;
        smem = plan_groups(two, shape, 2);
        if (smem >= 0 && smem <= SMEM_LIMIT) p = two;
        else smem = -1;
    }
#endif
    const int stages = smem < 0 ? 1 : 2;
    if (smem < 0) smem = plan_groups(p, shape, 1);     // (two stages do not apply: one)
    if (smem > SMEM_LIMIT) return cudaErrorInvalidValue;

    p.tiles_m = (p.m + RM - 1) / RM;
    p.tiles = p.tiles_m * ((p.n + RN - 1) / RN);
    p.by_tiles = Divider(uint32_t(p.tiles));
    p.by_tiles_m = Divider(uint32_t(p.tiles_m));
    long long grid = (g->batch + p.mpb - 1) / p.mpb;
    // At most 32 blocks an SM; with two stages, no more than fit on the SMs at once (about: by
    // threads and shared memory), so that each block takes run after run and its copies overlap.
    long long most = 32LL * cygemm_grid::sm_count();
    if (stages == 2) {
        long long resident = std::min<long long>(2048 / shape.threads, (227LL << 10) / (smem + 1024));
        most = std::max<long long>(1, std::min<long long>(resident, 32)) * cygemm_grid::sm_count();
    }
    if (grid > most) grid = most;
#if CYGEMM_SMALL_BATCHED_CANDIDATES
    if (stages == 2) {
        small_batched<T, RM, RN, SIZE, VEC, LAYOUT, 2><<<unsigned(grid), shape.threads, size_t(smem), stream>>>(p);
        return cudaGetLastError();
    }
#endif
    small_batched<T, RM, RN, SIZE, VEC, LAYOUT, 1><<<unsigned(grid), shape.threads, size_t(smem), stream>>>(p);
    return cudaGetLastError();
}

// The scalar tiles, with kernels of their own sizes for the smallest squares.
template <typename T, int RM, int RN>
cudaError_t launch_scalar(const cygemm_small_batched_args* g, const cygemm_small_batched_shape& s, cudaStream_t st) {
    if (g->m == g->n && g->n == g->k) switch (g->m) {
        case 2: return launch<T, RM, RN, 2, false, 0>(g, s, st);
        case 3: return launch<T, RM, RN, 3, false, 0>(g, s, st);
        case 4: return launch<T, RM, RN, 4, false, 0>(g, s, st);
        case 8: return launch<T, RM, RN, 8, false, 0>(g, s, st);
        default: break;
    }
    return launch<T, RM, RN, 0, false, 0>(g, s, st);
}

// The vector tile: padded, both operands K-major (LAYOUT 0); unpadded, each read as stored (its
// LAYOUT from the operations). Kernels of their own sizes for squares of 8 and 16 where neither
// operand is transposed (row-major batches reach cuBLAS's column-major call that way).
template <typename T, int LAYOUT>
cudaError_t launch_vector_layout(const cygemm_small_batched_args* g, const cygemm_small_batched_shape& s,
                                 cudaStream_t st) {
    constexpr int V = 16 / sizeof(typename Num<T>::Acc);
    if (g->opa == 0 && g->opb == 0 && g->m == g->n && g->n == g->k) switch (g->m) {
        case 8: return launch<T, V, V, 8, true, LAYOUT>(g, s, st);
        case 16: return launch<T, V, V, 16, true, LAYOUT>(g, s, st);
        default: break;
    }
    return launch<T, V, V, 0, true, LAYOUT>(g, s, st);
}

template <typename T>
cudaError_t launch_vector(const cygemm_small_batched_args* g, const cygemm_small_batched_shape& s, cudaStream_t st) {
    if (!cygemm_small_batched_vector_fits(g)) return cudaErrorInvalidValue;
#if CYGEMM_SMALL_BATCHED_CANDIDATES
    constexpr int V = 16 / sizeof(typename Num<T>::Acc);
    if (!s.pad) switch ((g->opa != 0 ? 1 : 0) | (g->opb == 0 ? 2 : 0)) {
        case 0: return launch<T, V, V, 0, true, 0>(g, s, st);
        case 1: return launch<T, V, V, 0, true, 1>(g, s, st);
        case 2: return launch_vector_layout<T, 2>(g, s, st);
        default: return launch<T, V, V, 0, true, 3>(g, s, st);
    }
#endif
    cygemm_small_batched_shape padded = s;
    padded.pad = 1;
    return launch_vector_layout<T, 0>(g, padded, st);
}

template <typename T>
cudaError_t launch_tile(const cygemm_small_batched_args* g, const cygemm_small_batched_shape& s, cudaStream_t st) {
    switch (s.tile) {
        case CYGEMM_SMALL_TILE_1X1: return launch_scalar<T, 1, 1>(g, s, st);
        case CYGEMM_SMALL_TILE_2X2: return launch_scalar<T, 2, 2>(g, s, st);
        case CYGEMM_SMALL_TILE_4X4: return launch<T, 4, 4, 0, false, 0>(g, s, st);
        case CYGEMM_SMALL_TILE_VECTOR: return launch_vector<T>(g, s, st);
        default:
#if CYGEMM_SMALL_BATCHED_CANDIDATES
            if constexpr (sizeof(T) == 2)
                if (cygemm_small_batched_mma_fits(g)) return launch<T, 16, 8, 0, false, LAYOUT_MMA>(g, s, st);
#endif
            return cudaErrorInvalidValue;
    }
}

}  // namespace

extern "C" int cygemm_small_batched_fits(const cygemm_small_batched_args* g) {
    const int acc = acc_size(g->dtype);
    if (acc == 0 || g->opa < 0 || g->opa > 2 || g->opb < 0 || g->opb > 2) return 0;
    if (g->m < 1 || g->n < 1 || g->k < 1 || g->m > 64 || g->n > 64 || g->k > 64 || g->batch < 1) return 0;
    if ((g->m * g->k + g->k * g->n + 4) * acc > SMEM_LIMIT) return 0;     // (+ B's alignment)
    const uintptr_t size = uintptr_t(type_size(g->dtype));      // whole elements (complex128: 16 bytes)
    if (uintptr_t(g->a) % size || uintptr_t(g->b) % size || uintptr_t(g->c) % size) return 0;
    // Batch strides and leading dimensions of 32-bit products within a block (offsets are 64-bit).
    return g->lda < (1LL << 31) && g->ldb < (1LL << 31) && g->ldc < (1LL << 31) && g->stride_a >= 0
           && g->stride_b >= 0 && g->stride_c >= 0;
}

extern "C" int cygemm_small_batched_vector_fits(const cygemm_small_batched_args* g) {
    const int acc = acc_size(g->dtype), v = acc ? 16 / acc : 0;
    // (the transposed operands padded by V in shared memory, and B's start aligned)
    return cygemm_small_batched_fits(g) && g->m % v == 0 && g->n % v == 0 && g->k % v == 0
           && (g->k * (g->m + v) + g->k * (g->n + v) + 4) * acc <= SMEM_LIMIT;
}

extern "C" int cygemm_small_batched_mma_fits(const cygemm_small_batched_args* g) {
    // (sm_80 on: the tensor cores' mma.sync of 16-bit values)
    int major = 0, device = 0;
    const bool tensor_cores = cudaGetDevice(&device) == cudaSuccess
                              && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess
                              && major >= 8;
    cudaGetLastError();
    return CYGEMM_SMALL_BATCHED_CANDIDATES && tensor_cores && cygemm_small_batched_fits(g)
           && (g->dtype == CUDA_R_16F || g->dtype == CUDA_R_16BF) && g->m % 16 == 0 && g->n % 8 == 0
           && g->k % 16 == 0;
}

extern "C" cygemm_small_batched_shape cygemm_small_batched_rule(const cygemm_small_batched_args* g) {
    // The fastest shapes of benchmarks/small_batched_probe.cu on an H200 (384 MiB batches; its
    // third run, whose output was not kept). The vector tile as it was measured: padded, both
    // operands K-major; one stage.
    // Padding paid where staging was cheap beside the bank conflicts it saved: a transposed A
    // (16^3: 1.6x unpadded in float32) or a broadcast B; elsewhere it cost B's 16-byte copies.
    const int pad = g->k >= 16 && (g->opa != 0 || (g->opb == 0 && g->stride_b == 0));
    cygemm_small_batched_shape s{CYGEMM_SMALL_TILE_2X2, 128, 16 << 10, pad, 1};
    const long long mn = g->m * g->n;
    const bool vector = cygemm_small_batched_vector_fits(g) && g->m >= 16 && g->n >= 16;
    switch (g->dtype) {
        case CUDA_R_32F:                    // one element a thread to 8 x 8, then 2 x 2
            if (mn <= 8 * 8) s.tile = CYGEMM_SMALL_TILE_1X1;
            if (mn <= 4 * 4) s.smem_bytes = 8 << 10;
            break;
        case CUDA_R_16F: case CUDA_R_16BF:  // fp32 sums of 16-bit values
            if ((mn > 2 * 2 && mn <= 4 * 4) || mn == 8 * 8) s.tile = CYGEMM_SMALL_TILE_1X1;
            if (mn <= 2 * 2) s.threads = 256;
            if (vector && mn >= 16 * 16) { s.tile = CYGEMM_SMALL_TILE_VECTOR; s.threads = 256; s.smem_bytes = 32 << 10; }
            break;
        case CUDA_R_64F: case CUDA_C_32F:   // 16-byte reads of two values: the vector tile from 16 x 16
            if (mn <= 12 * 12 || g->m < 16 || g->n < 16) s.tile = CYGEMM_SMALL_TILE_1X1;
            if (mn <= 8 * 8 && g->dtype == CUDA_R_64F) s.smem_bytes = 8 << 10;
            if (vector && mn >= 16 * 16) s.tile = CYGEMM_SMALL_TILE_VECTOR;
            break;
        default:                            // complex128: one element a thread
            s.tile = CYGEMM_SMALL_TILE_1X1;
            s.smem_bytes = 8 << 10;
            break;
    }
    if (s.tile == CYGEMM_SMALL_TILE_VECTOR) s.pad = 1;
    return s;
}

extern "C" cudaError_t cygemm_small_batched_shaped(const cygemm_small_batched_args* g, cygemm_small_batched_shape s,
                                                   cudaStream_t stream) {
    if (!cygemm_small_batched_fits(g) || s.tile < 0 || s.tile >= CYGEMM_SMALL_TILES || s.threads < 32
        || s.threads > 256 || s.threads % 32 != 0 || s.smem_bytes < 1 || s.smem_bytes > SMEM_LIMIT
        || s.pad < 0 || s.pad > 1 || s.stages < 1 || s.stages > 2 || (s.tile == CYGEMM_SMALL_TILE_MMA && s.threads < 32))
        return cudaErrorInvalidValue;
    switch (g->dtype) {
        case CUDA_R_32F: return launch_tile<float>(g, s, stream);
        case CUDA_R_16F: return launch_tile<__half>(g, s, stream);
        case CUDA_R_16BF: return launch_tile<__nv_bfloat16>(g, s, stream);
        case CUDA_R_64F: return launch_tile<double>(g, s, stream);
        case CUDA_C_32F: return launch_tile<float2>(g, s, stream);
        case CUDA_C_64F: return launch_tile<double2>(g, s, stream);
        default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t cygemm_small_batched(const cygemm_small_batched_args* g, cudaStream_t stream) {
    return cygemm_small_batched_shaped(g, cygemm_small_batched_rule(g), stream);
}
