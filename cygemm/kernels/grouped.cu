// The pointer-table kernel of cygemm.grouped: one thread per GEMM copies its three pointers
// from the kernel's parameter (by value) into the device table cuBLAS reads.
#include "cygemm/grouped_kernels.h"

namespace {

__global__ void write_pointer_table(cygemm_ptr_triples src, int count, const void** a_out,
                                    const void** b_out, void** c_out) {
    int i = threadIdx.x;
    if (i < count) {
        a_out[i] = src.a[i];
        b_out[i] = src.b[i];
        c_out[i] = src.c[i];
    }
}

}  // namespace

// Kernel parameters are limited to 4 KiB on every GPU and toolkit cygemm builds for (CUDA 12.1
// allows more on Volta and later only): the triples and the other arguments stay under it.
static_assert(sizeof(cygemm_ptr_triples) + 3 * sizeof(void*) + sizeof(int) <= 4096,
              "pointer triples must fit the 4 KiB kernel-parameter limit");

extern "C" cudaError_t cygemm_write_pointer_table(const cygemm_ptr_triples* src, int count, const void** a_out,
                                                  const void** b_out, void** c_out, cudaStream_t stream) {
    if (count <= 0) return cudaSuccess;
    if (count > CYGEMM_GROUPED_PTRS_PER_LAUNCH) return cudaErrorInvalidValue;
    write_pointer_table<<<1, CYGEMM_GROUPED_PTRS_PER_LAUNCH, 0, stream>>>(*src, count, a_out, b_out, c_out);
    return cudaGetLastError();
}
