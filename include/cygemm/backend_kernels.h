/* The CUDABackend's own kernels (cygemm.backend): row-wise softmax and log-softmax, and a
 * sigmoid that never forms exp of a large positive number. Shared by cygemm/kernels/backend.cu
 * (definitions) and cygemm/kernels/backend.pxd (Cython).
 *
 * dtype is CUDA_R_32F or CUDA_R_64F (else cudaErrorInvalidValue, nothing launched). Each
 * launcher enqueues at most one kernel on `stream` (none for an empty array) and returns
 * cudaGetLastError(): no allocation, no synchronisation, so a launch can be captured into a
 * CUDA graph. In place when y is x. */
#ifndef CYGEMM_BACKEND_KERNELS_H
#define CYGEMM_BACKEND_KERNELS_H

#include <stdint.h>
#include <cuda_runtime_api.h>
#include <library_types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CYGEMM_ROW_SOFTMAX = 0,
    CYGEMM_ROW_LOG_SOFTMAX = 1
} cygemm_row_op_t;

/* softmax or log_softmax of each row of x (rows x cols, contiguous) into y (same layout): one
 * warp per row, the row's maximum subtracted first. cols at most INT32_MAX. */
cudaError_t cygemm_row_op(cudaDataType dtype, cygemm_row_op_t op, const void* x, void* y, int64_t rows,
                          int64_t cols, cudaStream_t stream);

/* The most dimensions of a strided sigmoid (after the caller merges those it can). */
#define CYGEMM_SIGMOID_MAX_DIMS 32

/* Where the elements of x and y lie: y's element (i_0, ..., i_{ndim-1}), i_d < shape[d], is at
 * byte offset sum(i_d * y_strides[d]) from y, x's likewise (a stride 0 broadcasts x). Passed by
 * value, as the kernel's parameter (776 bytes): nothing to copy to the device. */
typedef struct {
    int ndim;
    int64_t shape[CYGEMM_SIGMOID_MAX_DIMS];
    int64_t x_strides[CYGEMM_SIGMOID_MAX_DIMS];
    int64_t y_strides[CYGEMM_SIGMOID_MAX_DIMS];
} cygemm_strided_layout;

/* y = 1 / (1 + exp(-x)), computed as e / (1 + e) with e = exp(x) for x < 0, over n contiguous
 * elements (x and y both dense in one order). */
cudaError_t cygemm_sigmoid(cudaDataType dtype, const void* x, void* y, int64_t n, cudaStream_t stream);

/* The same over a strided layout (ndim from 1 to CYGEMM_SIGMOID_MAX_DIMS; n = the product of
 * its shape). */
cudaError_t cygemm_sigmoid_strided(cudaDataType dtype, const void* x, void* y, int64_t n,
                                   const cygemm_strided_layout* layout, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* CYGEMM_BACKEND_KERNELS_H */
