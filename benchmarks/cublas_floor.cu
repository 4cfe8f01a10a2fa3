// The floor: cuBLAS called directly from C++, no Python. cygemm's overhead is
// measured against this program in the same run (benchmarks/bench_gemm.py).
// Prints one JSON object per line.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#define CUDA_CHECK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorName(err_)); exit(1); } } while (0)
#define CUBLAS_CHECK(x) do { cublasStatus_t st_ = (x); if (st_ != CUBLAS_STATUS_SUCCESS) { \
    fprintf(stderr, "%s failed: %s\n", #x, cublasGetStatusName(st_)); exit(1); } } while (0)

static float* random_device(size_t n) {
    std::vector<float> h(n);
    std::mt19937 gen(42);
    std::normal_distribution<float> d;
    for (auto& v : h) v = d(gen);
    float* p;
    CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return p;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char** argv) {
    // "host": only the host-time-per-call cases, so that the benchmark can run this
    // program between its own measurements (interleaved, same moment, same machine).
    const bool host_only = argc > 1 && std::string(argv[1]) == "host";
    cublasHandle_t h;
    cudaStream_t s;
    CUBLAS_CHECK(cublasCreate(&h));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void* ws;
    size_t ws_bytes = 32u << 20;
    CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    CUBLAS_CHECK(cublasSetStream(h, s));
    CUBLAS_CHECK(cublasSetWorkspace(h, ws, ws_bytes));
    const float alpha = 1.f, beta = 0.f;

    // Host time per call, 64^3, back-to-back calls, one sync at the end.
    for (int tf32 = 0; tf32 < 2; ++tf32) {
        int n = 64;
        float *A = random_device(n * n), *B = random_device(n * n), *C = random_device(n * n);
        cublasComputeType_t ct = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        auto call = [&] {
            CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, B, CUDA_R_32F, n,
                                      A, CUDA_R_32F, n, &beta, C, CUDA_R_32F, n, ct, CUBLAS_GEMM_DEFAULT));
        };
        for (int i = 0; i < 200; ++i) call();
        CUDA_CHECK(cudaStreamSynchronize(s));
        std::vector<double> per_call;
        const int calls = 5000;
        for (int r = 0; r < 7; ++r) {
            auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < calls; ++i) call();
            CUDA_CHECK(cudaStreamSynchronize(s));
            auto t1 = std::chrono::steady_clock::now();
            per_call.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / calls);
        }
        printf("{\"case\": \"host_per_call_64\", \"math\": \"%s\", \"us\": %.3f}\n",
               tf32 ? "tf32" : "fp32", median(per_call));
        cudaFree(A); cudaFree(B); cudaFree(C);
    }

    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    auto time_ms = [&](auto&& fn, int reps) {
        for (int i = 0; i < 3; ++i) fn();
        std::vector<double> t;
        for (int r = 0; r < reps; ++r) {
            CUDA_CHECK(cudaEventRecord(e0, s));
            fn();
            CUDA_CHECK(cudaEventRecord(e1, s));
            CUDA_CHECK(cudaEventSynchronize(e1));
            float ms;
            CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back(ms);
        }
        return median(t);
    };
    cublasLtHandle_t lt;
    CUBLAS_CHECK(cublasLtCreate(&lt));
    // GPU time by CUDA events: 8192^3 TF32 and 16384 batched 64^3 TF32.
    if (!host_only) {
        int n = 8192;
        float *A = random_device((size_t)n * n), *B = random_device((size_t)n * n), *C = random_device((size_t)n * n);
        double ms = time_ms([&] {
            CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, B, CUDA_R_32F, n, A,
                                      CUDA_R_32F, n, &beta, C, CUDA_R_32F, n, CUBLAS_COMPUTE_32F_FAST_TF32,
                                      CUBLAS_GEMM_DEFAULT));
        }, 20);
        printf("{\"case\": \"square_8192_tf32\", \"ms\": %.4f}\n", ms);
        cudaFree(A); cudaFree(B); cudaFree(C);
    }
    if (!host_only) {
        int n = 64, batch = 16384;
        size_t sz = (size_t)n * n;
        float *A = random_device(sz * batch), *B = random_device(sz * batch), *C = random_device(sz * batch);
        double ms = time_ms([&] {
            CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, B, CUDA_R_32F, n, sz,
                                                    A, CUDA_R_32F, n, sz, &beta, C, CUDA_R_32F, n, sz, batch,
                                                    CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
        }, 50);
        printf("{\"case\": \"batched_16384x64_tf32\", \"ms\": %.4f}\n", ms);
        cudaFree(A); cudaFree(B); cudaFree(C);
    }
    // cuBLASLt RELU_BIAS with the heuristic's first algorithm, chosen once before timing.
    auto lt_case = [&](int m, int n, int k, bool host) {
        float *A = random_device((size_t)m * k), *B = random_device((size_t)k * n), *D = random_device((size_t)m * n);
        float* bias = random_device(m);
        cublasLtMatmulDesc_t desc;
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F));
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_RELU_BIAS;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        cublasLtMatrixLayout_t la, lb, ld;
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, m));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m));
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t wsb = ws_bytes;
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &res, &found));
        if (!found) { fprintf(stderr, "no Lt algorithm\n"); exit(1); }
        auto call = [&] {
            CUBLAS_CHECK(cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res.algo, ws, ws_bytes, s));
        };
        if (host) {
            for (int i = 0; i < 200; ++i) call();
            CUDA_CHECK(cudaStreamSynchronize(s));
            std::vector<double> per_call;
            for (int r = 0; r < 7; ++r) {
                auto t0 = std::chrono::steady_clock::now();
                for (int i = 0; i < 5000; ++i) call();
                CUDA_CHECK(cudaStreamSynchronize(s));
                auto t1 = std::chrono::steady_clock::now();
                per_call.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 5000);
            }
            printf("{\"case\": \"lt_relu_bias_host_per_call_64\", \"us\": %.3f}\n", median(per_call));
        } else {
            printf("{\"case\": \"lt_relu_bias_%dx%dx%d\", \"ms\": %.4f}\n", m, n, k, time_ms(call, 20));
        }
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(desc);
        cudaFree(A); cudaFree(B); cudaFree(D); cudaFree(bias);
    };
    lt_case(64, 64, 64, true);
    if (!host_only) lt_case(8192, 8192, 1024, false);
    return 0;
}
