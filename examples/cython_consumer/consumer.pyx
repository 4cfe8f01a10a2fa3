# cython: language_level=3
"""Row-major GEMMs through cygemm's C API, with the GIL released: no Python objects on the hot path."""
from libc.stdint cimport int64_t, uintptr_t
# cygemm.capi is cygemm's cimport contract: everything below comes from it.
from cygemm.capi cimport (GemmContext, current_context, cudaStream_t, CUDA_R_32F, CUDA_R_8F_E4M3,
                          CUBLAS_COMPUTE_32F, CYGEMM_ACT_NONE, gemm_rowmajor,
                          gemm_rowmajor_strided_batched, scaled_gemm_rowmajor, SCALE_1X128, SCALE_128X128)


def sgemm(uintptr_t A, uintptr_t B, uintptr_t C, int64_t m, int64_t n, int64_t k,
          float alpha, float beta, uintptr_t stream):
    """C (m, n) = alpha * A (m, k) @ B (n, k).T + beta * C; float32, C order, strict fp32."""
    cdef GemmContext* ctx = current_context()   # this thread's cuBLAS handles on the current device
    with nogil:
        gemm_rowmajor(ctx, <cudaStream_t>stream, CUDA_R_32F, CUBLAS_COMPUTE_32F,
                      False, True, m, n, k,                # trans_a, trans_b, sizes
                      alpha, <const void*>A, k,            # A and its leading dimension
                      <const void*>B, k,                   # B (n, k), read transposed
                      beta, <void*>C, n)                   # C and its leading dimension


def sgemm_batched(uintptr_t A, uintptr_t B, uintptr_t C, int64_t m, int64_t n, int64_t k,
                  int64_t batch, uintptr_t stream):
    """C[i] (m, n) = A[i] (m, k) @ B (k, n) for i < batch; B is shared (batch stride 0)."""
    cdef GemmContext* ctx = current_context()
    with nogil:
        gemm_rowmajor_strided_batched(ctx, <cudaStream_t>stream, CUDA_R_32F, CUBLAS_COMPUTE_32F,
                                      False, False, m, n, k, 1.0,
                                      <const void*>A, k, m * k,    # lda, batch stride
                                      <const void*>B, n, 0,        # ldb, stride 0: broadcast
                                      0.0, <void*>C, n, m * n, batch)


def fp8_gemm(uintptr_t A, uintptr_t W, uintptr_t D, int64_t m, int64_t n, int64_t k,
             uintptr_t scale_a, uintptr_t scale_w, uintptr_t stream):
    """D (m, n) float32 = scale_a * scale_w * A (m, k) @ W (n, k).T, A and W in FP8 E4M3."""
    cdef GemmContext* ctx = current_context()
    with nogil:
        scaled_gemm_rowmajor(ctx, <cudaStream_t>stream, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_32F,
                             m, n, k, <const void*>A, k, <const void*>W, k, <void*>D, n,
                             <const float*>scale_a, <const float*>scale_w, NULL, NULL, NULL, CYGEMM_ACT_NONE, False)


def fp8_gemm_blocks(uintptr_t A, uintptr_t W, uintptr_t D, int64_t m, int64_t n, int64_t k,
                    uintptr_t scale_a, uintptr_t scale_w, uintptr_t stream):
    """The same with DeepSeek-V3's scales: A's per 1 x 128 tile along k, W's per 128 x 128 block
    (as cygemm.fp8.quantize_scaled writes them)."""
    cdef GemmContext* ctx = current_context()
    with nogil:
        scaled_gemm_rowmajor(ctx, <cudaStream_t>stream, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_32F,
                             m, n, k, <const void*>A, k, <const void*>W, k, <void*>D, n,
                             <const float*>scale_a, <const float*>scale_w, NULL, NULL, NULL, CYGEMM_ACT_NONE, False,
                             SCALE_1X128, SCALE_128X128)
