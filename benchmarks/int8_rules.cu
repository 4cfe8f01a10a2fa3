// Which int8 x int8 -> int32 GEMMs cuBLASLt runs on this GPU, and whether each gives the exact
// product: for every pair of ops (N/T on A and B, column-major as cuBLAS sees them), several m,
// n, k (multiples of 1, 4, 8, 16) and pointer offsets (0, 1, 4, 16 bytes), ask the heuristic
// (CUBLAS_COMPUTE_32I, scale CUDA_R_32I, A and B CUDA_R_8I, C and D CUDA_R_32I), run its first
// algorithm, and compare with the exact product computed on the host. One line per case:
//   ops m n k offset: found=<algorithms> ran=<status> exact=<yes|no>
// cygemm reads these rules into its int8 path's checks (the error names the rule and the fix).
//   nvcc -O2 -std=c++17 -arch=sm_90 benchmarks/int8_rules.cu -lcublasLt -o /tmp/int8_rules && /tmp/int8_rules
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CUDA_CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)

namespace {

struct Result {
    int found = 0;
    cublasStatus_t ran = CUBLAS_STATUS_NOT_SUPPORTED;
    bool exact = false;
};

Result try_case(cublasLtHandle_t lt, cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k,
                int offset, int ld_pad, bool out8, void* ws, size_t ws_bytes) {
    Result r;
    // Column-major storage: A is m x k (opa N) or k x m (opa T), ld = its rows; the same for B.
    const int a_rows = opa == CUBLAS_OP_N ? m : k, a_cols = opa == CUBLAS_OP_N ? k : m;
    const int b_rows = opb == CUBLAS_OP_N ? k : n, b_cols = opb == CUBLAS_OP_N ? n : k;
    const int lda = a_rows + ld_pad, ldb = b_rows + ld_pad, ldc = m + ld_pad;
    std::vector<int8_t> ha(size_t(lda) * a_cols), hb(size_t(ldb) * b_cols);
    for (size_t i = 0; i < ha.size(); ++i) ha[i] = int8_t((i * 37 + 11) % 256 - 128);     // -128..127
    for (size_t i = 0; i < hb.size(); ++i) hb[i] = int8_t((i * 53 + 7) % 256 - 128);
    char *da, *db;
    int32_t* dc;
    CUDA_CHECK(cudaMalloc(&da, ha.size() + 64));
    CUDA_CHECK(cudaMalloc(&db, hb.size() + 64));
    CUDA_CHECK(cudaMalloc(&dc, size_t(ldc) * n * sizeof(int32_t) + 64));
    CUDA_CHECK(cudaMemcpy(da + offset, ha.data(), ha.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(db + offset, hb.data(), hb.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dc, 0x7f, size_t(ldc) * n * sizeof(int32_t) + 64));   // poisoned
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    // out8: int8 D with an fp32 scale (alpha 1/256), the int8 -> int8 form.
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32I, out8 ? CUDA_R_32F : CUDA_R_32I);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8I, a_rows, a_cols, lda);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8I, b_rows, b_cols, ldb);
    cublasLtMatrixLayoutCreate(&lc, out8 ? CUDA_R_8I : CUDA_R_32I, m, n, ldc);
    cublasLtMatmulPreferenceCreate(&pref);
    uint64_t limit = ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &limit, sizeof(limit));
    cublasLtMatmulHeuristicResult_t res[8];
    if (cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 8, res, &r.found) != CUBLAS_STATUS_SUCCESS)
        r.found = 0;
    if (r.found > 0) {
        const int32_t alpha = 1, beta = 0;
        const float alpha8 = 1.0f / 256, beta8 = 0;
        r.ran = cublasLtMatmul(lt, desc, out8 ? (const void*)&alpha8 : &alpha, da + offset, la, db + offset, lb,
                               out8 ? (const void*)&beta8 : &beta, dc, lc, dc, lc, &res[0].algo, ws, ws_bytes, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        if (r.ran == CUBLAS_STATUS_SUCCESS) {
            std::vector<int32_t> hc(size_t(ldc) * n);
            std::vector<int8_t> hc8(size_t(ldc) * n);
            if (out8) CUDA_CHECK(cudaMemcpy(hc8.data(), dc, hc8.size(), cudaMemcpyDeviceToHost));
            else CUDA_CHECK(cudaMemcpy(hc.data(), dc, hc.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
            r.exact = true;
            for (int j = 0; j < n && r.exact; ++j)
                for (int i = 0; i < m; ++i) {
                    int64_t s = 0;
                    for (int p = 0; p < k; ++p) {
                        const int a = opa == CUBLAS_OP_N ? ha[size_t(p) * lda + i] : ha[size_t(i) * lda + p];
                        const int b = opb == CUBLAS_OP_N ? hb[size_t(j) * ldb + p] : hb[size_t(p) * ldb + j];
                        s += int64_t(a) * b;
                    }
                    if (out8) {   // round(s / 256) saturated to int8; allow one unit for the rounding mode
                        double want = double(s) / 256;
                        want = want > 127 ? 127 : want < -128 ? -128 : want;
                        if (std::abs(hc8[size_t(j) * ldc + i] - want) > 1.0) { r.exact = false; break; }
                    } else if (hc[size_t(j) * ldc + i] != int32_t(s)) { r.exact = false; break; }
                }
        }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    return r;
}

}  // namespace

int main() {
    cublasLtHandle_t lt;
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) { std::printf("cublasLtCreate failed\n"); return 1; }
    size_t ws_bytes = 32u << 20;
    void* ws;
    CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    const cublasOperation_t ops[2] = {CUBLAS_OP_N, CUBLAS_OP_T};
    const int shapes[][3] = {{64, 64, 64}, {64, 64, 68}, {64, 64, 72}, {64, 64, 80}, {68, 64, 64}, {64, 68, 64},
                             {63, 61, 64}, {17, 4096, 4096}, {256, 512, 1024}, {1, 64, 64}};
    const int offsets[] = {0, 1, 4, 16};
    const int pads[] = {0, 1, 4};
    for (int out8 = 0; out8 < 2; ++out8)
    for (auto opa : ops)
        for (auto opb : ops)
            for (const auto& s : shapes)
                for (int off : offsets)
                    for (int pad : pads) {
                    const bool base = s[0] == 64 && s[1] == 64 && s[2] == 64;
                    if ((off || pad) && !base) continue;   // offsets and ld padding on one shape
                    if (off && pad) continue;
                    if (out8 && !base && s[0] != 17) continue;
                    const Result r = try_case(lt, opa, opb, s[0], s[1], s[2], off, pad, out8, ws, ws_bytes);
                    std::printf("%s %c%c m=%d n=%d k=%d offset=%d ldpad=%d: found=%d ran=%d exact=%s\n",
                                out8 ? "i8out" : "i32out", opa == CUBLAS_OP_N ? 'N' : 'T',
                                opb == CUBLAS_OP_N ? 'N' : 'T', s[0], s[1], s[2], off, pad, r.found, int(r.ran),
                                r.found && r.ran == CUBLAS_STATUS_SUCCESS ? (r.exact ? "yes" : "no") : "-");
                }
    cudaFree(ws);
    cublasLtDestroy(lt);
    return 0;
}
