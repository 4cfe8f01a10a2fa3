/* cygemm's grouped-GEMM kernel: write the A, B and C pointer arrays that
 * cublasGemmGroupedBatchedEx reads from device memory. Shared by cygemm/grouped_kernels.cu and
 * cygemm/grouped_kernels.pxd.
 *
 * The pointers travel by value, as the kernel's parameter (up to CYGEMM_GROUPED_PTRS_PER_LAUNCH
 * triples, 3 KiB: under the 4 KiB parameter limit), so nothing is copied from host memory: the
 * launch allocates nothing, and a captured graph bakes the pointers into its kernel node. */
#ifndef CYGEMM_GROUPED_KERNELS_H
#define CYGEMM_GROUPED_KERNELS_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CYGEMM_GROUPED_PTRS_PER_LAUNCH 128

typedef struct {
    const void* a[CYGEMM_GROUPED_PTRS_PER_LAUNCH];
    const void* b[CYGEMM_GROUPED_PTRS_PER_LAUNCH];
    void* c[CYGEMM_GROUPED_PTRS_PER_LAUNCH];
} cygemm_ptr_triples;

/* a_out[i] = src->a[i], b_out[i] = src->b[i], c_out[i] = src->c[i] for i < count (device
 * arrays of pointers), enqueued on `stream`. count 0 launches nothing; count beyond
 * CYGEMM_GROUPED_PTRS_PER_LAUNCH is cudaErrorInvalidValue. */
cudaError_t cygemm_write_pointer_table(const cygemm_ptr_triples* src, int count, const void** a_out,
                                       const void** b_out, void** c_out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* CYGEMM_GROUPED_KERNELS_H */
