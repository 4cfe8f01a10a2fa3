// Batches of small GEMMs: cygemm's kernel (cygemm/kernels/small_batched.cu, compiled in here) in
// each of its launch shapes side by side with cuBLAS's strided-batched GEMM and a device-to-device
// copy. Column-major C = op(A) @ op(B), 384 MiB of A, B and C in all. Every result is checked
// against cuBLAS's (max difference relative to the largest |C|, NaN-poisoned C beforehand), then
// timed: CUDA events around 20 launches, median of 7 interleaved rounds. Bandwidth = bytes of A,
// B and C over the time, as a share of the copy's (2 x its bytes over its time).
//
// The first design study (one thread per matrix, one thread per element, matrices staged in
// shared memory; benchmarks/results/small_batched_probe_run1.txt) chose staging; this one
// measures the kernel's shapes: each thread's tile of C (1x1, 2x2, 4x4, the vector tile), threads a
// block, the shared memory a block stages in, padding (the vector tile padded stages both operands
// K-major; unpadded it reads them as stored) and stages (2: the next matrices copied with cp.async
// while the block computes; where two stages do not apply, a "/2st" row ran one), and prints the
// rule's choice (cygemm_small_batched_rule). The unpadded vector tile, two stages and the tensor-core
// tile ("mma": float16 and bfloat16, m, n, k multiples of 16, 8, 16) are candidates the library's
// build leaves out until measured (CYGEMM_SMALL_BATCHED_CANDIDATES).
//
// Build and run (scripts/small_batched_probe.sh does both, with the cuBLAS cygemm loads):
//   nvcc -O3 -std=c++17 -arch=sm_90 -Iinclude benchmarks/small_batched_probe.cu -lcublas
#define CYGEMM_SMALL_BATCHED_CANDIDATES 1       // (the launch options under measurement compiled in)
#include "../cygemm/kernels/small_batched.cu"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)
#define CHECK_BLAS(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    std::printf("%s: status %d\n", #x, int(s_)); std::exit(1); } } while (0)

static cublasHandle_t handle;
static void* copy_src;
static void* copy_dst;
static const size_t COPY_BYTES = size_t(256) << 20;     // 256 MiB each way: 512 MiB moved

struct Timed { std::string name; std::function<void()> run; std::vector<float> ms; double diff = 0; };

static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

struct Type { const char* name; cudaDataType dt; int size; bool complex; };
static const Type F32{"float32", CUDA_R_32F, 4, false}, F16{"float16", CUDA_R_16F, 2, false},
    BF16{"bfloat16", CUDA_R_16BF, 2, false}, F64{"float64", CUDA_R_64F, 8, false},
    C64{"complex64", CUDA_C_32F, 8, true}, C128{"complex128", CUDA_C_64F, 16, true};

// Inputs and the comparison on the GPU (the host would take seconds per 384 MiB).
template <typename T> __device__ T value_of(float v);
template <> __device__ float value_of<float>(float v) { return v; }
template <> __device__ double value_of<double>(float v) { return v; }
template <> __device__ __half value_of<__half>(float v) { return __float2half(v); }
template <> __device__ __nv_bfloat16 value_of<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ float2 value_of<float2>(float v) { return make_float2(v, -0.5f * v); }
template <> __device__ double2 value_of<double2>(float v) { return make_double2(v, -0.5 * v); }
__device__ double first(float x) { return x; }
__device__ double first(double x) { return x; }
__device__ double first(float2 x) { return x.x; }
__device__ double first(double2 x) { return x.x; }

template <typename T> __global__ void fill_kernel(T* x, long long count, unsigned seed) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count; i += (long long)gridDim.x * blockDim.x)
        x[i] = value_of<T>(float(int(((unsigned(i) + seed) * 2654435761u) >> 8 & 1023) - 512) / 512.0f);
}

// out[0] = max |x - ref|, out[1] = max |ref| (as the bits of non-negative doubles), out[2] = NaNs seen.
template <typename T> __global__ void compare_kernel(const T* x, const T* ref, long long count,
                                                     unsigned long long* out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count; i += (long long)gridDim.x * blockDim.x) {
        const double a = first(widen(x[i])), r = first(widen(ref[i]));
        const double d = fabs(a - r);
        if (!(d <= 1e300)) { atomicAdd(out + 2, 1ULL); continue; }
        atomicMax(out, __double_as_longlong(d));
        atomicMax(out + 1, __double_as_longlong(fabs(r)));
    }
}

template <typename T> static void fill_t(void* dev, long long count, unsigned seed) {
    fill_kernel<T><<<1024, 256>>>(static_cast<T*>(dev), count, seed);
    CHECK(cudaGetLastError());
}

static void fill(const Type& t, void* dev, long long count, unsigned seed) {
    switch (t.dt) {
        case CUDA_R_32F: fill_t<float>(dev, count, seed); break;
        case CUDA_R_16F: fill_t<__half>(dev, count, seed); break;
        case CUDA_R_16BF: fill_t<__nv_bfloat16>(dev, count, seed); break;
        case CUDA_R_64F: fill_t<double>(dev, count, seed); break;
        case CUDA_C_32F: fill_t<float2>(dev, count, seed); break;
        default: fill_t<double2>(dev, count, seed); break;
    }
}

template <typename T> static double compare_t(const void* x, const void* ref, long long count) {
    unsigned long long* d;
    CHECK(cudaMalloc(&d, 3 * sizeof(unsigned long long)));
    CHECK(cudaMemset(d, 0, 3 * sizeof(unsigned long long)));
    compare_kernel<T><<<1024, 256>>>(static_cast<const T*>(x), static_cast<const T*>(ref), count, d);
    CHECK(cudaGetLastError());
    unsigned long long h[3];
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d));
    if (h[2]) return INFINITY;
    double worst, scale;
    std::memcpy(&worst, &h[0], 8);
    std::memcpy(&scale, &h[1], 8);
    return worst / (scale > 0 ? scale : 1);
}

static double max_rel_diff(const Type& t, const void* x, const void* ref, long long count) {
    switch (t.dt) {
        case CUDA_R_32F: return compare_t<float>(x, ref, count);
        case CUDA_R_16F: return compare_t<__half>(x, ref, count);
        case CUDA_R_16BF: return compare_t<__nv_bfloat16>(x, ref, count);
        case CUDA_R_64F: return compare_t<double>(x, ref, count);
        case CUDA_C_32F: return compare_t<float2>(x, ref, count);
        default: return compare_t<double2>(x, ref, count);
    }
}

// One problem: sizes, operations, broadcast B, and whether to sweep every launch shape.
static void probe(const Type& t, int m, int n, int k, int opa = 0, int opb = 0, bool broadcast_b = false,
                  bool sweep = true) {
    const long long per = (long long)m * k + (broadcast_b ? 0 : (long long)k * n) + (long long)m * n;
    const long long batch = (384LL << 20) / (per * t.size);
    const long long sa = (long long)m * k, sb = broadcast_b ? 0 : (long long)k * n, sc = (long long)m * n;
    void *A, *B, *C, *R;
    CHECK(cudaMalloc(&A, batch * sa * t.size));
    CHECK(cudaMalloc(&B, (broadcast_b ? 1 : batch) * (long long)k * n * t.size));
    CHECK(cudaMalloc(&C, batch * sc * t.size));
    CHECK(cudaMalloc(&R, batch * sc * t.size));
    fill(t, A, batch * sa, 0);
    fill(t, B, (broadcast_b ? 1 : batch) * (long long)k * n, 7);
    cygemm_small_batched_args g{};
    g.dtype = t.dt;
    g.opa = opa; g.opb = opb; g.m = m; g.n = n; g.k = k;
    g.a = A; g.lda = opa ? k : m; g.stride_a = sa;
    g.b = B; g.ldb = opb ? n : k; g.stride_b = sb;
    g.c = C; g.ldc = m; g.stride_c = sc;
    g.batch = batch;
    g.alpha_re = 1; g.beta_re = 0;
    const bool wide = t.dt == CUDA_R_64F || t.dt == CUDA_C_64F;
    const cublasComputeType_t ct = wide ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;   // (no TF32)
    const double one_d[2] = {1, 0}, zero_d[2] = {0, 0};
    const float one_f[2] = {1, 0}, zero_f[2] = {0, 0};
    const void* one = wide ? (const void*)one_d : (const void*)one_f;
    const void* zero = wide ? (const void*)zero_d : (const void*)zero_f;
    auto cublas = [&](void* out) {
        CHECK_BLAS(cublasGemmStridedBatchedEx(handle, cublasOperation_t(opa), cublasOperation_t(opb), m, n, k, one, A,
                                              t.dt, int(g.lda), sa, B, t.dt, int(g.ldb), sb, zero, out, t.dt, m, sc,
                                              int(batch), ct, CUBLAS_GEMM_DEFAULT));
    };
    std::vector<Timed> runs;
    runs.push_back({"cublas", [&] { cublas(C); }});
    runs.push_back({"copy", [&] { CHECK(cudaMemcpyAsync(copy_dst, copy_src, COPY_BYTES, cudaMemcpyDeviceToDevice, 0)); }});
    const cygemm_small_batched_shape rule = cygemm_small_batched_rule(&g);
    auto label = [](cygemm_small_batched_shape s) {
        const char* tiles[] = {"1x1", "2x2", "4x4", "vec", "mma"};
        return std::string(tiles[s.tile]) + "/" + std::to_string(s.threads) + "/" + std::to_string(s.smem_bytes >> 10) + "K"
               + (s.pad ? "/pad" : "") + (s.stages == 2 ? "/2st" : "");
    };
    runs.push_back({"rule " + label(rule), [&, rule] { CHECK(cygemm_small_batched_shaped(&g, rule, 0)); }});
    const bool fits = cygemm_small_batched_fits(&g);
    if (!fits) runs.pop_back();                  // (one matrix pair past the shared memory: cuBLAS only)
    if (sweep && fits)
        for (int tile = 0; tile < CYGEMM_SMALL_TILES; ++tile)
            for (int threads : {128, 256})
                for (int smem : {8 << 10, 16 << 10, 32 << 10})
                for (int pad : {0, 1})
                for (int stages : {1, 2}) {
                    const cygemm_small_batched_shape s{tile, threads, smem, pad, stages};
                    if (tile == rule.tile && threads == rule.threads && smem == rule.smem_bytes && pad == rule.pad
                        && stages == rule.stages)
                        continue;
                    // (padding relays operands: one stage; scalar tiles pad only K-contiguous operands, even K)
                    if (pad && (stages == 2 || (tile != CYGEMM_SMALL_TILE_VECTOR && (k % 2 || (opa == 0 && opb != 0)))))
                        continue;
                    if ((tile == 2 && m * n < 16) || (tile == 1 && m * n < 4)) continue;     // tiles past C
                    if (tile == CYGEMM_SMALL_TILE_VECTOR && !cygemm_small_batched_vector_fits(&g)) continue;
                    if (tile == CYGEMM_SMALL_TILE_MMA && !cygemm_small_batched_mma_fits(&g)) continue;
                    runs.push_back({label(s), [&, s] { CHECK(cygemm_small_batched_shaped(&g, s, 0)); }});
                }
    cublas(R);
    CHECK(cudaDeviceSynchronize());
    for (auto& r : runs) {
        if (r.name == "copy") continue;
        CHECK(cudaMemset(C, 0xFF, batch * sc * t.size));      // NaN
        r.run();
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        r.diff = r.name == "cublas" ? 0 : max_rel_diff(t, C, R, batch * sc);
    }
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int round = 0; round < 7; ++round)
        for (size_t i = 0; i < runs.size(); ++i) {
            auto& r = runs[(i + round) % runs.size()];
            for (int w = 0; w < 3; ++w) r.run();
            CHECK(cudaEventRecord(a, 0));
            for (int rep = 0; rep < 20; ++rep) r.run();
            CHECK(cudaEventRecord(b, 0));
            CHECK(cudaEventSynchronize(b));
            float ms;
            CHECK(cudaEventElapsedTime(&ms, a, b));
            r.ms.push_back(ms / 20);
        }
    const double copy_bw = 2.0 * COPY_BYTES / (median(runs[1].ms) * 1e-3);
    const double bytes = double(per) * batch * t.size + (broadcast_b ? double(k) * n * t.size : 0);
    const double cublas_ms = median(runs[0].ms);
    char shape[64];
    std::snprintf(shape, sizeof shape, "%dx%dx%d %c%c%s", m, n, k, "NTC"[opa], "NTC"[opb], broadcast_b ? " bcastB" : "");
    size_t best = 2;
    for (size_t i = 2; i < runs.size(); ++i)
        if (median(runs[i].ms) < median(runs[best].ms)) best = i;
    for (size_t i = 0; i < runs.size(); ++i) {
        auto& r = runs[i];
        if (r.name == "copy") continue;
        const double ms = median(r.ms), bw = bytes / (ms * 1e-3);
        std::printf("%-10s %-18s batch %9lld %-16s %8.4f ms %7.1f GB/s %5.1f%% of copy %7.2fx cuBLAS diff %.1e%s\n",
                    t.name, shape, batch, r.name.c_str(), ms, bw / 1e9, 100 * bw / copy_bw, cublas_ms / ms, r.diff,
                    i == best ? "  best" : "");
    }
    std::printf("%-10s %-18s copy %.1f GB/s\n", t.name, shape, copy_bw / 1e9);
    CHECK(cudaFree(A)); CHECK(cudaFree(B)); CHECK(cudaFree(C)); CHECK(cudaFree(R));
    CHECK(cudaEventDestroy(a)); CHECK(cudaEventDestroy(b));
}

static void probe_type(const Type& t, bool sweep) {
    for (int s : {2, 3, 4, 5, 6, 8, 12, 16, 24, 32}) probe(t, s, s, s, 0, 0, false, sweep);
    for (int s : {48, 64}) probe(t, s, s, s, 0, 0, false, false);
    probe(t, 4, 4, 16, 0, 0, false, sweep);
    probe(t, 16, 64, 16, 0, 0, false, sweep);
    probe(t, 3, 3, 1, 0, 0, false, sweep);
    probe(t, 8, 32, 8, 0, 0, false, sweep);
    probe(t, 32, 8, 32, 0, 0, false, sweep);
}

static void probe_complex(const Type& t) {
    for (int s : {2, 4, 8, 16, 32}) probe(t, s, s, s);
}

static void probe_layouts(const Type& t) {
    for (int s : {4, 8, 16}) {
        probe(t, s, s, s, 1, 0, false, true);
        probe(t, s, s, s, 0, 1, false, true);
        probe(t, s, s, s, 1, 1, false, true);
        probe(t, s, s, s, 0, 0, true, true);
    }
}

int main(int argc, char** argv) {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK_BLAS(cublasCreate(&handle));
    CHECK(cudaMalloc(&copy_src, COPY_BYTES));
    CHECK(cudaMalloc(&copy_dst, COPY_BYTES));
    CHECK(cudaMemset(copy_src, 1, COPY_BYTES));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int version = 0;
    CHECK_BLAS(cublasGetVersion(handle, &version));
    std::printf("GPU %s, %d SMs, cuBLAS %d\n", prop.name, sms, version);
    char when[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::printf("started %s\n", when);
    const std::string which = argc > 1 ? argv[1] : "all";
    if (which == "all" || which == "float32") probe_type(F32, true);
    if (which == "all" || which == "float16") probe_type(F16, true);
    if (which == "all" || which == "bfloat16") probe_type(BF16, false);     // (float16's shapes)
    if (which == "all" || which == "float64") probe_type(F64, true);
    if (which == "all" || which == "complex") { probe_complex(C64); probe_complex(C128); }
    if (which == "all" || which == "layouts") { probe_layouts(F32); probe_layouts(F16); }
    CHECK_BLAS(cublasDestroy(handle));
    return 0;
}
