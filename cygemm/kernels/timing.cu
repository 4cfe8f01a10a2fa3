// The kernel that holds a stream while the host enqueues timed work behind it.
#include "cygemm/timing.h"

namespace {

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void hold_kernel(uint64_t nanoseconds) {
    const uint64_t start = global_ns();
    while (global_ns() - start < nanoseconds) __nanosleep(1000);
}

}  // namespace

extern "C" cudaError_t cygemm_hold_stream(uint64_t nanoseconds, cudaStream_t stream) {
    hold_kernel<<<1, 1, 0, stream>>>(nanoseconds);
    return cudaGetLastError();
}
