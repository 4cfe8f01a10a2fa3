// Batches of small GEMMs: kernel designs side by side against cuBLAS's strided-batched GEMM and
// a device-to-device copy, before any of them enters cygemm. Square n x n (n = 2..32) and a few
// non-square shapes, column-major C = A @ B with contiguous batches (stride = the matrix size),
// 384 MiB of A, B and C in all. Each variant's result is checked against cuBLAS's (max relative
// difference printed), then timed: CUDA events around 20 launches, median of 7 interleaved
// rounds. Bandwidth = bytes of A, B and C over the time, as a share of the copy's (2 x its bytes
// over its time).
//
// Variants:
//   thread   one thread per matrix, A and B in registers (n*n <= 64 elements)
//   elem     one thread per element of C, A and B read through L1 (no shared memory)
//   staged   a block stages a run of whole matrices of A and B in shared memory with 16-byte
//            coalesced loads, then one thread per element of C (MPB matrices per block)
//
// Build and run (scripts/small_batched_probe.sh does both, with the cuBLAS cygemm loads):
//   nvcc -O3 -std=c++17 -arch=sm_90 small_batched_probe.cu -lcublas -o probe && ./probe
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)
#define CHECK_BLAS(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    std::printf("%s: status %d\n", #x, int(s_)); std::exit(1); } } while (0)

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };
template <typename T> __device__ __forceinline__ typename Acc<T>::type widen(T x) { return x; }
template <> __device__ __forceinline__ float widen<__half>(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T narrow(typename Acc<T>::type x) { return T(x); }
template <> __device__ __forceinline__ __half narrow<__half>(float x) { return __float2half_rn(x); }

// ---------------------------------------------------------------- thread: one matrix a thread
template <typename T, int M, int N, int K>
__global__ void thread_per_matrix(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                                  int64_t batch) {
    using F = typename Acc<T>::type;
    for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < batch; b += int64_t(gridDim.x) * blockDim.x) {
        const T* a = A + b * (M * K);
        const T* bb = B + b * (K * N);
        F ra[M * K], rb[K * N];
#pragma unroll
        for (int i = 0; i < M * K; ++i) ra[i] = widen(a[i]);
#pragma unroll
        for (int i = 0; i < K * N; ++i) rb[i] = widen(bb[i]);
        T* c = C + b * (M * N);
#pragma unroll
        for (int j = 0; j < N; ++j)
#pragma unroll
            for (int i = 0; i < M; ++i) {
                F s = 0;
#pragma unroll
                for (int k = 0; k < K; ++k) s += ra[i + k * M] * rb[k + j * K];      // column-major
                c[i + j * M] = narrow<T>(s);
            }
    }
}

// ---------------------------------------------------------------- elem: one element of C a thread
template <typename T, int M, int N, int K>
__global__ void elem_per_thread(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                                int64_t batch) {
    using F = typename Acc<T>::type;
    const int64_t total = batch * (M * N);
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t b = e / (M * N);
        const int r = int(e - b * (M * N));
        const int i = r % M, j = r / M;
        const T* a = A + b * (M * K) + i;
        const T* bb = B + b * (K * N) + j * K;
        F s = 0;
#pragma unroll
        for (int k = 0; k < K; ++k) s += widen(__ldg(a + k * M)) * widen(__ldg(bb + k));
        C[e] = narrow<T>(s);
    }
}

// ---------------------------------------------------------------- staged: matrices in shared memory
template <typename T, int M, int N, int K, int MPB>
__global__ void staged(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int64_t batch) {
    using F = typename Acc<T>::type;
    constexpr int SA = M * K * MPB, SB = K * N * MPB;
    __shared__ __align__(16) T sa[SA];
    __shared__ __align__(16) T sb[SB];
    constexpr int VA = SA * sizeof(T) / 16, VB = SB * sizeof(T) / 16;   // 16-byte chunks (sizes are multiples)
    for (int64_t first = blockIdx.x * int64_t(MPB); first < batch; first += int64_t(gridDim.x) * MPB) {
        const int count = int(min(int64_t(MPB), batch - first));
        const uint4* ga = reinterpret_cast<const uint4*>(A + first * (M * K));
        const uint4* gb = reinterpret_cast<const uint4*>(B + first * (K * N));
        const int va = count == MPB ? VA : int(count * (M * K) * sizeof(T) / 16);
        const int vb = count == MPB ? VB : int(count * (K * N) * sizeof(T) / 16);
        for (int v = threadIdx.x; v < va; v += blockDim.x) reinterpret_cast<uint4*>(sa)[v] = __ldg(ga + v);
        for (int v = threadIdx.x; v < vb; v += blockDim.x) reinterpret_cast<uint4*>(sb)[v] = __ldg(gb + v);
        __syncthreads();
        T* c = C + first * (M * N);
        for (int e = threadIdx.x; e < count * (M * N); e += blockDim.x) {
            const int m = e / (M * N), r = e - m * (M * N);
            const int i = r % M, j = r / M;
            const T* a = sa + m * (M * K) + i;
            const T* bb = sb + m * (K * N) + j * K;
            F s = 0;
#pragma unroll
            for (int k = 0; k < K; ++k) s += widen(a[k * M]) * widen(bb[k]);
            c[e] = narrow<T>(s);
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------- the harness
template <typename T> cudaDataType cuda_type();
template <> cudaDataType cuda_type<float>() { return CUDA_R_32F; }
template <> cudaDataType cuda_type<double>() { return CUDA_R_64F; }
template <> cudaDataType cuda_type<__half>() { return CUDA_R_16F; }
template <typename T> const char* type_name();
template <> const char* type_name<float>() { return "float32"; }
template <> const char* type_name<double>() { return "float64"; }
template <> const char* type_name<__half>() { return "float16"; }

static cublasHandle_t handle;
static int sms = 0;
static void* copy_src;
static void* copy_dst;
static const size_t COPY_BYTES = size_t(256) << 20;     // 256 MiB each way: 512 MiB moved

struct Timed { std::string name; std::function<void()> run; std::vector<float> ms; double diff = 0; };

static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

template <typename T>
static double max_rel_diff(const T* x, const T* ref, size_t n) {
    std::vector<T> hx(n), hr(n);
    CHECK(cudaMemcpy(hx.data(), x, n * sizeof(T), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hr.data(), ref, n * sizeof(T), cudaMemcpyDeviceToHost));
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(double(float(hr[i]))));
    for (size_t i = 0; i < n; ++i) {
        double d = std::fabs(double(float(hx[i])) - double(float(hr[i])));
        if (!(d <= 1e300)) return INFINITY;      // NaN
        worst = std::max(worst, d);
    }
    return worst / (scale > 0 ? scale : 1);
}

template <typename T, int M, int N, int K>
static void probe() {
    const size_t per = size_t(M * K + K * N + M * N) * sizeof(T);
    const int64_t batch = int64_t((size_t(384) << 20) / per);
    T *A, *B, *C, *R;
    CHECK(cudaMalloc(&A, batch * M * K * sizeof(T)));
    CHECK(cudaMalloc(&B, batch * K * N * sizeof(T)));
    CHECK(cudaMalloc(&C, batch * M * N * sizeof(T)));
    CHECK(cudaMalloc(&R, batch * M * N * sizeof(T)));
    {   // varied values in [-1, 1)
        std::vector<T> h(std::max(batch * M * K, batch * K * N) + 7);
        for (size_t i = 0; i < h.size(); ++i) h[i] = T(float(int((i * 2654435761u) >> 8 & 1023) - 512) / 512.0f);
        CHECK(cudaMemcpy(A, h.data(), batch * M * K * sizeof(T), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(B, h.data() + 7, batch * K * N * sizeof(T), cudaMemcpyHostToDevice));
    }
    const cudaDataType dt = cuda_type<T>();
    const cublasComputeType_t ct = dt == CUDA_R_64F ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;   // (no TF32: default math)
    const double one_d = 1, zero_d = 0;
    const float one_f = 1, zero_f = 0;
    const void* one = dt == CUDA_R_64F ? (const void*)&one_d : (const void*)&one_f;
    const void* zero = dt == CUDA_R_64F ? (const void*)&zero_d : (const void*)&zero_f;
    auto cublas = [&](T* out) {
        CHECK_BLAS(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, one, A, dt, M, int64_t(M) * K,
                                              B, dt, K, int64_t(K) * N, zero, out, dt, M, int64_t(M) * N, int(batch), ct,
                                              CUBLAS_GEMM_DEFAULT));
    };
    const int grid = sms * 8;
    std::vector<Timed> runs;
    runs.push_back({"cublas", [&] { cublas(C); }});
    runs.push_back({"copy", [&] { CHECK(cudaMemcpyAsync(copy_dst, copy_src, COPY_BYTES, cudaMemcpyDeviceToDevice, 0)); }});
    if constexpr (M * K <= 64 && K * N <= 64)
        for (int threads : {64, 128, 256})
            runs.push_back({"thread/" + std::to_string(threads), [&, threads] {
                thread_per_matrix<T, M, N, K><<<grid, threads>>>(A, B, C, batch); }});
    for (int threads : {128, 256})
        runs.push_back({"elem/" + std::to_string(threads), [&, threads] {
            elem_per_thread<T, M, N, K><<<grid, threads>>>(A, B, C, batch); }});
    constexpr bool fits = (M * K * sizeof(T)) % 16 == 0 && (K * N * sizeof(T)) % 16 == 0;
    if constexpr (fits) {
        constexpr int bytes_one = (M * K + K * N) * sizeof(T);
        constexpr int mpb_small = std::max(1, 8192 / bytes_one), mpb_large = std::max(1, 32768 / bytes_one);
        runs.push_back({"staged/" + std::to_string(mpb_small), [&] {
            staged<T, M, N, K, mpb_small><<<grid, 256>>>(A, B, C, batch); }});
        runs.push_back({"staged/" + std::to_string(mpb_large), [&] {
            staged<T, M, N, K, mpb_large><<<grid, 256>>>(A, B, C, batch); }});
    }
    cublas(R);
    CHECK(cudaDeviceSynchronize());
    for (auto& r : runs) {
        if (r.name == "copy") continue;
        CHECK(cudaMemset(C, 0xFF, batch * M * N * sizeof(T)));      // NaN
        r.run();
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        r.diff = r.name == "cublas" ? 0 : max_rel_diff(C, R, size_t(batch) * M * N);
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
    const double bytes = double(per) * batch;
    const double cublas_ms = median(runs[0].ms);
    for (auto& r : runs) {
        if (r.name == "copy") continue;
        const double ms = median(r.ms), bw = bytes / (ms * 1e-3);
        std::printf("%-8s %2dx%2dx%2d batch %9lld %-12s %8.4f ms %7.1f GB/s %5.1f%% of copy  %5.2fx cuBLAS  diff %.1e\n",
                    type_name<T>(), M, N, K, (long long)batch, r.name.c_str(), ms, bw / 1e9, 100 * bw / copy_bw,
                    cublas_ms / ms, r.diff);
    }
    std::printf("%-8s %2dx%2dx%2d copy %.1f GB/s\n", type_name<T>(), M, N, K, copy_bw / 1e9);
    CHECK(cudaFree(A)); CHECK(cudaFree(B)); CHECK(cudaFree(C)); CHECK(cudaFree(R));
    CHECK(cudaEventDestroy(a)); CHECK(cudaEventDestroy(b));
}

template <typename T>
static void probe_type() {
    probe<T, 2, 2, 2>();
    probe<T, 3, 3, 3>();
    probe<T, 4, 4, 4>();
    probe<T, 8, 8, 8>();
    probe<T, 16, 16, 16>();
    probe<T, 32, 32, 32>();
    probe<T, 4, 4, 16>();
    probe<T, 16, 64, 16>();
}

int main(int argc, char** argv) {
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
    const std::string which = argc > 1 ? argv[1] : "all";
    if (which == "all" || which == "float32") probe_type<float>();
    if (which == "all" || which == "float16") probe_type<__half>();
    if (which == "all" || which == "float64") probe_type<double>();
    CHECK_BLAS(cublasDestroy(handle));
    return 0;
}
