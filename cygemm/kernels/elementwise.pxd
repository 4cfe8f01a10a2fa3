# cygemm's own CUDA kernels (include/cygemm/kernels.h, defined in cygemm/kernels.cu).
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaError_t, cudaStream_t, cudaDataType

cdef extern from "cygemm/kernels.h" nogil:
    ctypedef enum cygemm_act_t:
        CYGEMM_ACT_NONE
        CYGEMM_ACT_RELU
        CYGEMM_ACT_LEAKY_RELU
        CYGEMM_ACT_GELU
        CYGEMM_ACT_GELU_ERF
        CYGEMM_ACT_SIGMOID
        CYGEMM_ACT_TANH
        CYGEMM_ACT_SILU

    cudaError_t cygemm_bias_act_forward(
        cudaDataType dtype, int64_t m, int64_t n,
        const void* x, int64_t ldx, const void* bias,
        void* y, int64_t ldy, void* z, int64_t ldz,
        cygemm_act_t act, float slope, cudaStream_t stream)

    int64_t cygemm_act_backward_scratch_floats(int64_t m, int64_t n)

    cudaError_t cygemm_act_backward(
        cudaDataType dtype, int64_t m, int64_t n,
        const void* gy, int64_t ldgy, const void* z, int64_t ldz,
        void* dz, int64_t lddz, void* dbias, float beta_bias,
        float* scratch, cygemm_act_t act, float slope, int z_is_output, cudaStream_t stream)
