/* The current device's number of SMs, looked up once per device: memory-bound kernels size
 * their grids to fill every SM a few times over (cygemm/kernels/fp8.cu, fp8_scales.cu). nvcc only. */
#ifndef CYGEMM_SM_COUNT_CUH
#define CYGEMM_SM_COUNT_CUH

#include <atomic>
#include <cuda_runtime_api.h>

namespace cygemm_grid {

inline int sm_count() {
    static std::atomic<int> counts[64];        // (zero-initialized: static storage)
    int device = 0;
    cudaGetDevice(&device);
    std::atomic<int>& slot = counts[device & 63];
    int count = slot.load(std::memory_order_relaxed);
    if (count == 0) {
        if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
            cudaGetLastError();
            count = 132;
        }
        slot.store(count, std::memory_order_relaxed);
    }
    return count;
}

}  // namespace cygemm_grid

#endif /* CYGEMM_SM_COUNT_CUH */
