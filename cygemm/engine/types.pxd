# The structs every layer shares and the limits. No code of its own but inline functions: a
# module that needs a type cimports it from here, not from the module that happens to produce
# it. The dtype rules (compute type, sizes, scale type) are the dtype table's
# (cygemm.engine.dtypes), re-exported here for the modules that take them with these structs.
from libc.stdint cimport int64_t, uint32_t, uintptr_t
from cygemm.bindings.cudart cimport cudaDataType
from cygemm.bindings.cublas cimport cublasOperation_t, CUBLAS_OP_N, cublasComputeType_t, CUBLAS_COMPUTE_32F
from cygemm.engine.dtypes cimport (Math, MATH_TF32, MATH_FP32, MATH_CUPY, compute_type, is_fp8_type, type_size,
                                   is_complex_type, scale_type)

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
    bint torch          # read from a torch tensor (its call's stream=None is torch's current stream)


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
    int b_scale_mode            # scalar; see cygemm.fp8.args), each its operand's (cuBLAS's A, B)


cdef inline cublasComputeType_t typed_compute_type(const GemmTypes* t) noexcept nogil:
    """The compute type of a GEMM of mixed storage types, from the operands' real types: FP8
    operands accumulate in fp32 (cuBLASLt's one FP8 compute type); others as compute_type
    says for A's type under strict fp32."""
    if is_fp8_type(t.a) or is_fp8_type(t.b):
        return CUBLAS_COMPUTE_32F
    return compute_type(t.a, MATH_FP32)


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
