# The CUDABackend's kernels (include/cygemm/backend_kernels.h, defined in
# cygemm/kernels/backend.cu).
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaError_t, cudaStream_t, cudaDataType

cdef extern from "cygemm/backend_kernels.h" nogil:
    ctypedef enum cygemm_row_op_t:
        CYGEMM_ROW_SOFTMAX
        CYGEMM_ROW_LOG_SOFTMAX

    cudaError_t cygemm_row_op(cudaDataType dtype, cygemm_row_op_t op, const void* x, void* y, int64_t rows,
                              int64_t cols, cudaStream_t stream)

    enum: CYGEMM_SIGMOID_MAX_DIMS
    ctypedef struct cygemm_strided_layout:
        int ndim
        int64_t shape[32]
        int64_t x_strides[32]
        int64_t y_strides[32]

    cudaError_t cygemm_sigmoid(cudaDataType dtype, const void* x, void* y, int64_t n, cudaStream_t stream)
    cudaError_t cygemm_sigmoid_strided(cudaDataType dtype, const void* x, void* y, int64_t n,
                                       const cygemm_strided_layout* layout, cudaStream_t stream)
