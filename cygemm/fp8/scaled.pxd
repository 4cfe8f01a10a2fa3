# FP8 GEMMs through the plan layer, and the cimport API.
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.engine.types cimport ColMajorGemm, GemmTypes
from cygemm.engine.context cimport GemmContext

# The cimport API. Row-major: D (m x n, leading dimension ldd) = act(scale_a * scale_b *
# A @ W^T + bias), A (m x k) FP8 with lda, W (n x k) FP8 with ldw (the weight layout: both
# operands K-contiguous, as Hopper's FP8 kernels read them). a_type/w_type: CUDA_R_8F_E4M3 or
# CUDA_R_8F_E5M2 (not both E5M2); d_type: CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F or an FP8 type
# (then scale_d quantizes D, and C is taken as bfloat16). bias: length n of bfloat16 (float16
# for a float16 D), or NULL. act: 0 none, 1 relu, 3 gelu (cygemm_act_t). Scalars are device
# float32 pointers (NULL: 1, or amax not computed). The caller guarantees valid pointers,
# 16-byte aligned, leading dimensions multiples of 16 bytes. scale_mode_a, scale_mode_w: how
# scale_a and scale_w apply, cuBLASLt's cublasLtMatmulMatrixScale_t (0 per tensor, the default;
# 3 per row of A and per row of W; 4 per 1 x 128 along K; 5 per 128 x 128 block: the layouts of
# cygemm.fp8.args, with W's those of b = W^T); other than per tensor, D is not FP8.
cdef int scaled_gemm_rowmajor(GemmContext* ctx, cudaStream_t stream, cudaDataType a_type,
                              cudaDataType w_type, cudaDataType d_type, int64_t m, int64_t n, int64_t k,
                              const void* A, int64_t lda, const void* W, int64_t ldw, void* D, int64_t ldd,
                              const float* scale_a, const float* scale_w, const float* scale_d,
                              float* amax_d, const void* bias, int act, bint fast_accum,
                              int scale_mode_a=*, int scale_mode_w=*) except -1 nogil
