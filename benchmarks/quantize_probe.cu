// Times cygemm's FP8 quantize kernels (cygemm/kernels/fp8_scales.cu, compiled in with whatever
// -D flags the build gives) against a device-to-device copy of the same bytes, on one
// 8192 x 8192 bfloat16 matrix: each mode, plain and transposed. CUDA events around 20 launches,
// median of 7 interleaved rounds. It chose the kernels' shape (16 elements a thread, 4 loads in
// flight, 4 blocks an SM); scripts/quantize_probe.sh builds and runs it, in variants.
#include "../cygemm/kernels/fp8_scales.cu"

#include <cstdio>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)

int main() {
    const int64_t n = 8192;
    const size_t xb = n * n * 2, qb = n * n;
    void *x, *q, *src, *dst;
    float* scale;
    CHECK(cudaMalloc(&x, xb));
    CHECK(cudaMalloc(&q, qb));
    CHECK(cudaMalloc(&scale, size_t(n) * n / 64 * 4 + 4096));
    std::vector<unsigned short> h(n * n);
    for (size_t i = 0; i < h.size(); ++i) h[i] = 0x3f80 ^ ((i * 2654435761u) >> 17 & 0x807f);   // varied bf16
    CHECK(cudaMemcpy(x, h.data(), xb, cudaMemcpyHostToDevice));
    const int modes[] = {CYGEMM_SCALE_TENSOR, CYGEMM_SCALE_ROWWISE, CYGEMM_SCALE_1X128, CYGEMM_SCALE_128X128};
    const char* names[] = {"tensor", "rowwise", "1x128", "128x128"};
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int mi = 0; mi < 4; ++mi)
        for (int t = 0; t < 2; ++t) {
            const size_t bytes = xb + qb;   // (scales: < 2%, left out of both)
            CHECK(cudaMalloc(&src, bytes / 2));
            CHECK(cudaMalloc(&dst, bytes / 2));
            std::vector<float> mine, copy;
            for (int round = 0; round < 7; ++round)
                for (int which = 0; which < 2; ++which) {
                    auto run = [&] {
                        if ((which + round) % 2 == 0)
                            CHECK(cygemm_fp8_quantize_scaled(CUDA_R_16BF, CUDA_R_8F_E4M3, modes[mi], t, 0, n, n, x, q,
                                                             scale, 0));
                        else CHECK(cudaMemcpyAsync(dst, src, bytes / 2, cudaMemcpyDeviceToDevice, 0));
                    };
                    for (int w = 0; w < 3; ++w) run();
                    CHECK(cudaEventRecord(a, 0));
                    for (int r = 0; r < 20; ++r) run();
                    CHECK(cudaEventRecord(b, 0));
                    CHECK(cudaEventSynchronize(b));
                    float ms;
                    CHECK(cudaEventElapsedTime(&ms, a, b));
                    ((which + round) % 2 == 0 ? mine : copy).push_back(ms / 20);
                }
            std::sort(mine.begin(), mine.end());
            std::sort(copy.begin(), copy.end());
            std::printf("%-8s %-10s %8.4f ms  copy %8.4f ms  %5.1f%% of copy\n", names[mi], t ? "transposed" : "plain",
                        mine[3], copy[3], 100 * copy[3] / mine[3]);
            CHECK(cudaFree(src));
            CHECK(cudaFree(dst));
        }
    return 0;
}
