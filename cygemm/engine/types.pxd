# The structs every layer shares, the limits, and the one compute-type rule. No code of its
# own but inline functions: a module that needs a type cimports it from here, not from the
# module that happens to produce it.
from libc.stdint cimport int64_t, uint32_t, uintptr_t
from cygemm.bindings.cudart cimport (cudaDataType, CUDA_R_32F, CUDA_R_64F, CUDA_C_32F, CUDA_C_64F, CUDA_R_8I,
                                     CUDA_R_32I, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2)
from cygemm.bindings.cublas cimport (cublasOperation_t, CUBLAS_OP_N, cublasComputeType_t, CUBLAS_COMPUTE_32F,
                            CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_64F, CUBLAS_COMPUTE_32I)

cdef enum:
    MAX_NDIM = 64               # dimensions of an array cygemm reads
    WORKSPACE_ALIGNMENT = 256   # bytes: cuBLASLt's rule for a workspace pointer


# A strided (batch, rows, cols) device array; strides in elements. 2-D arrays
# have batch 1 and batch_stride 0, which is also how an operand is broadcast.
ctypedef struct MatrixView:
    char* ptr
    int64_t batch
    int64_t rows
    int64_t cols
    int64_t batch_stride
    int64_t row_stride
    int64_t col_stride
    cudaDataType dtype
    int itemsize
    int device          # the memory's device as the array object says, -1: ask CUDA


# Any device array as read once from its object: strides in elements.
ctypedef struct ArrayDesc:
    char* ptr
    int ndim
    int64_t shape[64]
    int64_t strides[64]
    cudaDataType dtype
    int itemsize
    int device          # as the array object says, -1: ask CUDA


# The arguments of one column-major cuBLAS call: D(m x n) = op(a) @ op(b), over `batch`
# matrices at element strides stride_a/b/c when strided_batched (0 broadcasts).
ctypedef struct ColMajorGemm:
    cublasOperation_t opa
    cublasOperation_t opb
    int64_t m
    int64_t n
    int64_t k
    const void* a
    int64_t lda
    int64_t stride_a
    const void* b
    int64_t ldb
    int64_t stride_b
    void* c
    int64_t ldc
    int64_t stride_c
    int64_t batch
    bint strided_batched


# The storage types of a GEMM whose operands and output differ (FP8), and its device scalars
# for this call. Plain GEMMs pass none: one dtype throughout. a and b are cuBLAS's A and B
# (after the row-major swap); c is C's layout type, which equals d except for an FP8 output
# (cuBLASLt then takes C as bfloat16 or float16).
ctypedef struct GemmTypes:
    cudaDataType a
    cudaDataType b
    cudaDataType c
    cudaDataType d
    cudaDataType bias
    const float* a_scale        # dequantizing scales of A and B (NULL: 1)
    const float* b_scale
    const float* d_scale        # D's quantizing scale (FP8 outputs only; NULL: 1)
    float* amax_d               # receives max |D| before d_scale (NULL: not computed)
    bint fast_accum             # FP8: skip the periodic promotion of partial sums
    int a_scale_mode            # how a_scale / b_scale apply: a cublasLtMatmulMatrixScale_t (0: one
    int b_scale_mode            # scalar; see cygemm.engine.fp8_args), each its operand's (cuBLAS's A, B)


# How float32 products are computed: math="tf32" / "fp32"; "cupy" is resolved to one of the
# two by the caller (CuPy's CUPY_TF32 rule).
cdef enum Math:
    MATH_TF32 = 0
    MATH_FP32 = 1
    MATH_CUPY = 2


cdef inline cublasComputeType_t compute_type(cudaDataType dtype, Math math) noexcept nogil:
    """The one compute-type rule: float64 in fp64; float32 in TF32 or strict fp32; the half
    types accumulate in fp32 either way."""
    if dtype == CUDA_R_64F or dtype == CUDA_C_64F:
        return CUBLAS_COMPUTE_64F
    if (dtype == CUDA_R_32F or dtype == CUDA_C_32F) and math == MATH_TF32:
        return CUBLAS_COMPUTE_32F_FAST_TF32
    if dtype == CUDA_R_8I:
        return CUBLAS_COMPUTE_32I
    return CUBLAS_COMPUTE_32F


cdef inline bint is_fp8_type(cudaDataType t) noexcept nogil:
    return t == CUDA_R_8F_E4M3 or t == CUDA_R_8F_E5M2


# Bytes per element of a GEMM storage type (FP8, int8, half types, float32, int32, float64, complex).
cdef inline int type_size(cudaDataType t) noexcept nogil:
    if is_fp8_type(t) or t == CUDA_R_8I:
        return 1
    if t == CUDA_C_64F:
        return 16
    if t == CUDA_R_64F or t == CUDA_C_32F:
        return 8
    return 4 if t == CUDA_R_32F or t == CUDA_R_32I else 2


cdef inline bint is_complex_type(cudaDataType t) noexcept nogil:
    return t == CUDA_C_32F or t == CUDA_C_64F


cdef inline cublasComputeType_t typed_compute_type(const GemmTypes* t) noexcept nogil:
    """The compute type of a GEMM of mixed storage types, from the operands' real types: FP8
    operands accumulate in fp32 (cuBLASLt's one FP8 compute type); others as compute_type
    says for A's type under strict fp32."""
    if is_fp8_type(t.a) or is_fp8_type(t.b):
        return CUBLAS_COMPUTE_32F
    return compute_type(t.a, MATH_FP32)


cdef inline cudaDataType scale_type(cublasComputeType_t compute, cudaDataType dtype) noexcept nogil:
    """The type of alpha and beta (cuBLAS's and cuBLASLt's scale type) for a compute type and
    the output's type: complex for complex outputs (float or double parts by the compute type),
    int32 for integer compute into int32 (float into int8: a real scale), double for fp64, float
    for every other (FP8 included)."""
    if is_complex_type(dtype):
        return CUDA_C_64F if compute == CUBLAS_COMPUTE_64F else CUDA_C_32F
    if compute == CUBLAS_COMPUTE_32I:
        return CUDA_R_32F if dtype == CUDA_R_8I else CUDA_R_32I
    return CUDA_R_64F if compute == CUBLAS_COMPUTE_64F else CUDA_R_32F


# alpha and beta of one GEMM as the caller gave them (a real value has im 0): what every layer
# passes down. _launch writes them in the call's scale type just before cuBLAS reads them, so
# that a float64 or complex GEMM gets its scalars at full precision.
ctypedef struct Scalars:
    double alpha_re
    double alpha_im
    double beta_re
    double beta_im


cdef inline Scalars real_scalars(double alpha, double beta) noexcept nogil:
    cdef Scalars s
    s.alpha_re, s.alpha_im, s.beta_re, s.beta_im = alpha, 0.0, beta, 0.0
    return s


cdef inline bint beta_is_zero(const Scalars* s) noexcept nogil:
    return s.beta_re == 0.0 and s.beta_im == 0.0


# The alignment cuBLASLt is told of a pointer: its largest power-of-two divisor, at most 256
# (NULL counts as 256: nothing is read there).
cdef inline uint32_t pointer_alignment(const void* p) noexcept nogil:
    cdef uintptr_t v = <uintptr_t>p
    if v == 0:
        return 256
    cdef uintptr_t a = v & (~v + 1)
    return <uint32_t>(a if a < 256 else 256)


cdef inline bint view_is_empty(const MatrixView* v) noexcept nogil:
    return v.rows == 0 or v.cols == 0 or v.batch == 0


# Whether cuBLASLt is asked about this batch: every operand's matrices one after another.
# Broadcast (stride 0) and interleaved batches stay with cublasGemmStridedBatchedEx, which is
# documented for them.
cdef inline bint lt_batch_ok(const ColMajorGemm* g) noexcept nogil:
    cdef int64_t a_cols = g.k if g.opa == CUBLAS_OP_N else g.m
    cdef int64_t b_cols = g.n if g.opb == CUBLAS_OP_N else g.k
    return (g.stride_a >= g.lda * a_cols and g.stride_b >= g.ldb * b_cols
            and g.stride_c >= g.ldc * g.n)
