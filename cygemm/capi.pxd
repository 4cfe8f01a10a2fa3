# cygemm's cimport contract: the one file other Cython code cimports.
#
#     from cygemm.capi cimport GemmContext, current_context, gemm_rowmajor, cudaStream_t, CUDA_R_32F
#
# Every name below is re-exported from the module that defines it (a cimport inside this
# .pxd is visible to whoever cimports cygemm.capi); the functions are still looked up at
# import from those modules (cygemm.engine.context, cygemm.rowmajor, cygemm.fp8), so there is no
# cygemm.capi module to load. The names and signatures here are the contract; the modules
# behind them are private and may change between releases.
#
# Matrices are row-major (C order), given by device pointer and leading dimension (elements
# between rows, >= the stored row length). The caller guarantees valid device pointers of
# the stated types on the current device. Errors: a function returns -1 with a Python
# exception set (cygemm.CudaError, cygemm.CublasError, ValueError naming the argument), which
# Cython raises in the caller; `except -1 nogil` functions take the GIL to raise.

# ---- CUDA and cuBLAS types and values the signatures take
from cygemm.bindings.cudart cimport (
    cudaStream_t,                          # a CUDA stream (0: the legacy default stream)
    cudaDataType,                          # element types:
    CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F, CUDA_R_64F, CUDA_C_32F, CUDA_C_64F,
    CUDA_R_8F_E4M3, CUDA_R_8F_E5M2)        # FP8, for scaled_gemm_rowmajor
from cygemm.bindings.cublas cimport (
    cublasComputeType_t,                   # accumulation: strict fp32, TF32, fp64, ...
    CUBLAS_COMPUTE_16F, CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_COMPUTE_32F_FAST_16F,
    CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_64F,
    cublasOperation_t,                     # for code that also calls cuBLAS itself; the entries
    CUBLAS_OP_N, CUBLAS_OP_T)              # below take row-major trans_a/trans_b flags instead
# scaled_gemm_rowmajor's `act` (cygemm/kernels.h's cygemm_act_t).
from cygemm.kernels.elementwise cimport CYGEMM_ACT_NONE, CYGEMM_ACT_RELU, CYGEMM_ACT_GELU

# ---- the context
# GemmContext: this thread's cuBLAS/cuBLASLt handles and per-stream workspaces on one device;
# an opaque pointer to the caller (read no field). current_context() returns the context of
# the calling thread on the current CUDA device, made on first use and valid for the life of
# the thread. It needs the GIL (not nogil): call it before `with nogil:`; it raises
# cygemm.CudaError where there is no usable GPU (returns NULL to Cython).
from cygemm.engine.context cimport GemmContext, current_context

# ---- for code that launches kernels of its own (as cygemm.nn and cygemm.backend do)
# stream_from_object(stream, &out[, torch_arrays]): a Python stream argument (None: the current
#   stream of the arrays' library, torch's when torch_arrays is true, else CuPy's; a CuPy or torch stream, an object with __cuda_stream__, or an int pointer) as cudaStream_t;
#   needs the GIL; -1 with TypeError or ValueError set. check_cuda(status, call): 0 for
#   cudaSuccess, else -1 with cygemm.CudaError naming `call` (a C string); nogil.
from cygemm.engine.streams cimport stream_from_object
from cygemm.engine.errors cimport check_cuda

# ---- row-major GEMMs (defined in cygemm.rowmajor)
# gemm_rowmajor(ctx, stream, dtype, compute, trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb,
#               beta, C, ldc):
#   C (m x n) = alpha op(A) op(B) + beta C on `stream`, op(A) m x k, op(B) k x n; A, B and C
#   of `dtype` (CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F, CUDA_C_32F; CUDA_R_64F and CUDA_C_64F with
#   CUBLAS_COMPUTE_64F), accumulated as `compute` says. alpha and beta are `double complex`
#   (a real value converts; the imaginary part counts only for complex dtypes). Large problems run the fastest of cuBLASLt's candidates and
#   cublasGemmEx (timed once per shape), small ones cublasGemmEx. nogil: callable without the
#   GIL; small problems run without it, large ones take it briefly for the plan layer, and an
#   error takes it to raise. Errors: -1 with CudaError or CublasError set. The work is only
#   enqueued: synchronize `stream` before reading C on the host.
# gemm_rowmajor_strided_batched(..., A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
#                               stride_c, batch):
#   the same for `batch` matrices at element strides stride_a/b/c apart (0 broadcasts one
#   operand to every batch); same GIL use and errors.
from cygemm.rowmajor.gemm cimport gemm_rowmajor, gemm_rowmajor_strided_batched

# ---- FP8 GEMM (defined in cygemm.fp8)
# scaled_gemm_rowmajor(ctx, stream, a_type, w_type, d_type, m, n, k, A, lda, W, ldw, D, ldd,
#                      scale_a, scale_w, scale_d, amax_d, bias, act, fast_accum):
#   D (m x n) = act(scale_a * scale_w * A @ W^T + bias) through cuBLASLt (compute capability
#   8.9 or newer). A (m x k) and W (n x k) FP8: a_type/w_type CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2,
#   not both E5M2. D of d_type: CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F, or FP8 quantized by scale_d.
#   Scales are device float32 pointers (NULL: 1). amax_d: device float32 that receives max |D|
#   before scale_d (cuBLASLt computes it for an FP8 D only), or NULL. bias: n elements of
#   bfloat16 (float16 for a float16 D), or NULL. act: CYGEMM_ACT_NONE, CYGEMM_ACT_RELU or
#   CYGEMM_ACT_GELU. fast_accum: cuBLASLt's faster, less precise FP8 accumulation. Pointers
#   16-byte aligned, leading dimensions multiples of 16 bytes. nogil: callable without the GIL; it takes the GIL to plan and run. Errors: -1 with
#   ValueError (act), CudaError or CublasError set.
# scaled_gemm_rowmajor(..., fast_accum, scale_mode_a, scale_mode_w) (two optional last arguments):
#   how scale_a and scale_w apply, each SCALE_TENSOR (the default: one float), SCALE_OUTER (one
#   per row of A, one per row of W; the pair together), SCALE_1X128 (one per 128 elements along
#   k) or SCALE_128X128 (one per 128 x 128 block; not for both), the scales in the layout
#   cygemm.fp8.quantize_scaled writes for A (m x k) and for W (n x k). Finer scales need a bf16,
#   fp16 or fp32 D, m and n multiples of 4, and cuBLASLt 12.9 or newer on compute capability 9.0.
from cygemm.fp8.scaled cimport scaled_gemm_rowmajor
from cygemm.fp8.args cimport SCALE_TENSOR, SCALE_OUTER, SCALE_1X128, SCALE_128X128
