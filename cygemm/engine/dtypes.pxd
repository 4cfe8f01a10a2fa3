# The dtype table: every fact cygemm knows about a storage type, in one C table (its rows
# below), and the rules that derive from it. Readers, allocators, describers and checkers
# (cygemm.engine.arrays, .alloc, .described, ...) ask it; none names a dtype itself.
from cygemm.bindings.cudart cimport (cudaDataType, CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF, CUDA_R_64F, CUDA_C_32F,
                                     CUDA_C_64F, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_8I, CUDA_R_32I, CUDA_R_64I, CUDA_R_8U)
from cygemm.bindings.cublas cimport (cublasComputeType_t, CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32,
                                     CUBLAS_COMPUTE_64F, CUBLAS_COMPUTE_32I)

# Which dtypes an entry takes (a reader's `wide` argument): the float types every entry takes;
# also float64 and complex (matmul and the GEMMs); also int8 and int32 (the GEMMs' int8 path).
# FP8 and bytes rows are read by their own readers (cygemm.engine.arrays.read_fp8); the index
# level takes the integer rows of 4 bytes or more (offsets on the device).
cdef enum:
    DTYPES_FLOAT = 0
    DTYPES_WIDE = 1
    DTYPES_GEMM = 2
    DTYPES_FP8 = 3
    DTYPES_BYTES = 4
    DTYPES_INDEX = 5        # the integer types of offsets and indices (int32, int64)

# How float32 products are computed: math="tf32" / "fp32"; "cupy" is resolved to one of the
# two by the caller (CuPy's CUPY_TF32 rule).
cdef enum Math:
    MATH_TF32 = 0
    MATH_FP32 = 1
    MATH_CUPY = 2

cdef extern from *:
    """
    /* One row per storage type. level: the DTYPES_* level that takes it; listed: named in the
       errors' lists of what an entry takes (int32 is the int8 GEMM's result, not an input);
       kind: 'f' real float, 'c' complex, 'i' integer, '8' FP8, 'u' bytes; dl_code/dl_bits:
       DLPack's (dl_code -1: none read); typestr: __cuda_array_interface__'s ("" : none);
       compute_fast/compute_strict: the compute type under math "tf32"/"fp32" (-1: none);
       alias: a second name ("" : none; an FP8 format's short name); max_finite: the largest
       finite value, where an entry saturates to it (FP8; 0: not used); promote: the width rank
       by which matmul promotes mixed operands (float16/bfloat16 1, float32 2, float64 3; complex
       by their parts' width; 0: not promoted); fp8_c, fp8_bias: for an FP8 GEMM that writes this
       type, the C matrix's and the epilogue bias's types (cuBLASLt's rule; -1: no FP8 GEMM
       writes it); ktail: whether the K-tail guard covers GEMMs of this type (where the defect
       was measured); fp8_self: whether an FP8 GEMM takes this type for both operands
       (cuBLASLt has no E5M2 x E5M2 kernel); xla: XLA's element type code (its FFI's
       XLA_FFI_DataType, what cygemm.jax's handlers read). */
    typedef struct {
        int cuda; int size; const char* name; int level; int listed; char kind;
        int dl_code; int dl_bits; const char* typestr; int compute_fast; int compute_strict;
        const char* alias; double max_finite; int promote; int fp8_c; int fp8_bias; int ktail; int fp8_self; int xla;
    } cg_dtype_row;
    static const cg_dtype_row cg_DTYPES[] = {
        {CUDA_R_16F, 2, "float16", 0, 1, 'f', 2, 16, "<f2", CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F, "", 0.0, 1, CUDA_R_16F, CUDA_R_16F, 1, 0, 10},
        {CUDA_R_16BF, 2, "bfloat16", 0, 1, 'f', 4, 16, "", CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F, "", 0.0, 1, CUDA_R_16BF, CUDA_R_16BF, 1, 0, 16},
        {CUDA_R_32F, 4, "float32", 0, 1, 'f', 2, 32, "<f4", CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_32F, "", 0.0, 2, CUDA_R_32F, CUDA_R_16BF, 0, 0, 11},
        {CUDA_R_64F, 8, "float64", 1, 1, 'f', 2, 64, "<f8", CUBLAS_COMPUTE_64F, CUBLAS_COMPUTE_64F, "", 0.0, 3, -1, -1, 0, 0, 12},
        {CUDA_C_32F, 8, "complex64", 1, 1, 'c', 5, 64, "<c8", CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_32F, "", 0.0, 2, -1, -1, 0, 0, 15},
        {CUDA_C_64F, 16, "complex128", 1, 1, 'c', 5, 128, "<c16", CUBLAS_COMPUTE_64F, CUBLAS_COMPUTE_64F, "", 0.0, 3, -1, -1, 0, 0, 18},
        {CUDA_R_8I, 1, "int8", 2, 1, 'i', 0, 8, "|i1", CUBLAS_COMPUTE_32I, CUBLAS_COMPUTE_32I, "", 0.0, 0, -1, -1, 0, 0, 2},
        {CUDA_R_32I, 4, "int32", 2, 0, 'i', 0, 32, "<i4", -1, -1, "", 0.0, 0, -1, -1, 0, 0, 4},
        {CUDA_R_8F_E4M3, 1, "float8_e4m3fn", 3, 1, '8', -1, 8, "", CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F, "e4m3", 448.0, 0, CUDA_R_16BF, CUDA_R_16BF, 0, 1, 20},
        {CUDA_R_8F_E5M2, 1, "float8_e5m2", 3, 1, '8', -1, 8, "", CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F, "e5m2", 57344.0, 0, CUDA_R_16BF, CUDA_R_16BF, 0, 0, 19},
        {CUDA_R_8U, 1, "uint8", 4, 0, 'u', 1, 8, "|u1", -1, -1, "", 0.0, 0, -1, -1, 0, 0, 6},
        {CUDA_R_64I, 8, "int64", 5, 0, 'i', 0, 64, "<i8", -1, -1, "", 0.0, 0, -1, -1, 0, 0, 5},
    };
    enum { cg_N_DTYPES = sizeof(cg_DTYPES) / sizeof(cg_DTYPES[0]) };
    static inline const cg_dtype_row* cg_dtype_at(int i) { return &cg_DTYPES[i]; }

    /* The row of a type (NULL: none). */
    static inline const cg_dtype_row* cg_dtype_row_of(int cuda) {
        for (int i = 0; i < cg_N_DTYPES; i++)
            if (cg_DTYPES[i].cuda == cuda) return &cg_DTYPES[i];
        return 0;
    }
    """
    ctypedef struct cg_dtype_row:
        int cuda, size, level, listed, dl_code, dl_bits, compute_fast, compute_strict, promote, fp8_c, fp8_bias, ktail
        int fp8_self, xla
        const char* name
        const char* typestr
        const char* alias
        double max_finite
        char kind
    int cg_N_DTYPES
    const cg_dtype_row* cg_dtype_at(int i) noexcept nogil
    const cg_dtype_row* cg_dtype_row_of(int cuda) noexcept nogil


cdef inline bint is_fp8_type(cudaDataType t) noexcept nogil:
    cdef const cg_dtype_row* r = cg_dtype_row_of(t)
    return r != NULL and r.kind == b'8'


# Whether an FP8 GEMM takes a and b together (both FP8, not two of a type that cannot pair
# with itself).
cdef inline bint fp8_pair_ok(cudaDataType a, cudaDataType b) noexcept nogil:
    cdef const cg_dtype_row* r = cg_dtype_row_of(a)
    return is_fp8_type(a) and is_fp8_type(b) and (a != b or r.fp8_self)


# The 16-bit float types (float16, bfloat16).
cdef inline bint is_half_type(cudaDataType t) noexcept nogil:
    cdef const cg_dtype_row* r = cg_dtype_row_of(t)
    return r != NULL and r.kind == b'f' and r.size == 2


# Whether products of t run in TF32 or strict fp32 by the call's math (float32, complex64).
cdef inline bint has_tf32(cudaDataType t) noexcept nogil:
    cdef const cg_dtype_row* r = cg_dtype_row_of(t)
    return r != NULL and r.compute_fast != r.compute_strict


cdef inline bint is_complex_type(cudaDataType t) noexcept nogil:
    cdef const cg_dtype_row* r = cg_dtype_row_of(t)
    return r != NULL and r.kind == b'c'


# The types a role fixes, named once (checks compare with these, never with a CUDA_R_* name):
# every scale array (FP8 scales, per-expert and block scales, device alpha and beta) and the MoE
# scales' workspace are float32; the int8 GEMM takes int8 operands and adds into int32.
cdef extern from *:
    """
    #define cg_SCALES_DTYPE ((cudaDataType)CUDA_R_32F)
    #define cg_INT8_DTYPE ((cudaDataType)CUDA_R_8I)
    #define cg_INT8_SUMS_DTYPE ((cudaDataType)CUDA_R_32I)
    """
    const cudaDataType SCALES_DTYPE "cg_SCALES_DTYPE"
    const cudaDataType INT8_DTYPE "cg_INT8_DTYPE"
    const cudaDataType INT8_SUMS_DTYPE "cg_INT8_SUMS_DTYPE"


# matmul's promotion rank of a type (0: not promoted; see the table).
cdef inline int promote_rank(cudaDataType t) noexcept nogil:
    cdef const cg_dtype_row* r = cg_dtype_row_of(t)
    return r.promote if r != NULL else 0


# An FP8 GEMM writing type d: its C matrix's and its epilogue bias's types (cuBLASLt's rule).
cdef inline cudaDataType fp8_c_type(cudaDataType d) noexcept nogil:
    cdef const cg_dtype_row* r = cg_dtype_row_of(d)
    return <cudaDataType>(r.fp8_c if r != NULL and r.fp8_c >= 0 else d)


cdef inline cudaDataType fp8_bias_type(cudaDataType d) noexcept nogil:
    cdef const cg_dtype_row* r = cg_dtype_row_of(d)
    return <cudaDataType>(r.fp8_bias if r != NULL and r.fp8_bias >= 0 else CUDA_R_16BF)


# Whether the K-tail guard covers GEMMs of type t.
cdef inline bint ktail_covers(cudaDataType t) noexcept nogil:
    cdef const cg_dtype_row* r = cg_dtype_row_of(t)
    return r != NULL and r.ktail


# The DTYPES_* level of a type (-1: not in the table).
cdef inline int dtype_level(cudaDataType t) noexcept nogil:
    cdef const cg_dtype_row* r = cg_dtype_row_of(t)
    return r.level if r != NULL else -1


# Bytes per element of a storage type (0: not in the table).
cdef inline int type_size(cudaDataType t) noexcept nogil:
    cdef const cg_dtype_row* r = cg_dtype_row_of(t)
    return r.size if r != NULL else 0


cdef inline cublasComputeType_t compute_type(cudaDataType dtype, Math math) noexcept nogil:
    """The compute type of a GEMM of one storage type: the table's, by math (float64 in fp64;
    float32 and complex64 in TF32 or strict fp32; the half types in fp32 either way; int8 in
    int32)."""
    cdef const cg_dtype_row* r = cg_dtype_row_of(dtype)
    if r == NULL or r.compute_fast < 0:
        return CUBLAS_COMPUTE_32F
    return <cublasComputeType_t>(r.compute_fast if math == MATH_TF32 else r.compute_strict)


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


# The name of a type ("float32", "float8_e4m3fn", ...; "cudaDataType N" outside the table).
cdef object dtype_name(cudaDataType dtype)
# "float16, bfloat16 or float32": the listed names of the rows a level takes, for errors.
cdef str expected_names(int level)
# (type, itemsize) by name, typestr or DLPack (code, bits), of the rows `level` takes (dicts
# built once from the table).
cdef dict by_name(int level)
cdef dict by_typestr(int level)
cdef dict by_dlpack(int level)
