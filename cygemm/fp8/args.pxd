# Reading and checking scaled_matmul's arguments (see args.pyx): the one path from FP8
# operands, scales, out and bias to the ColMajorGemm and GemmTypes of a cuBLASLt FP8 call.
from cygemm.bindings.cublaslt cimport cublasLtEpilogue_t
from libc.stdint cimport int64_t
from cygemm.engine.types cimport ColMajorGemm, GemmTypes, ArrayDesc
from cygemm.engine.args cimport CallArgs

# How a scale applies (cuBLASLt's cublasLtMatmulMatrixScale_t values, sm_90's FP32 ones).
cdef enum ScaleMode:
    SCALE_TENSOR = 0        # one scalar for the whole operand (SCALAR_32F)
    SCALE_OUTER = 3         # one per row of a and per column of b (OUTER_VEC_32F)
    SCALE_1X128 = 4         # one per 128 consecutive elements along K (VEC128_32F)
    SCALE_128X128 = 5       # one per 128 x 128 block (BLK128x128_32F)

ctypedef struct ScaledCall:
    ColMajorGemm g
    GemmTypes types
    cublasLtEpilogue_t epi
    const void* bias

# Every check of scaled_matmul, before anything runs; fills s (out's pointer NULL when out is
# None: allocated by the caller). scale_mode: None (told by the scales' shapes), a name for both
# operands, or a pair (a's, b's); see SCALE_MODES.
cdef int read_scaled(CallArgs* c, ScaledCall* s, object a, object b, object scale_a, object scale_b,
                     object out, object out_dtype, object bias, object act, object scale_out,
                     object amax_out, object format_a, object format_b, object format_out,
                     object fast_accum, object scale_mode) except -1

# The names of the scale modes (describe_scaled_matmul's), by ScaleMode.
cdef str scale_mode_name(int mode)
# The operands' types, scales and scale modes in cuBLAS's order, as the one mapping put the
# operands: under the swap (a row-major out, mapping.is_rowmajor) cuBLAS's A is the user's b.
cdef void order_operands(GemmTypes* t, bint swapped, int type_a, int type_b, const float* scale_a,
                         const float* scale_b, int mode_a, int mode_b) noexcept nogil

# Whether a, b scale modes pair in one cuBLASLt FP8 GEMM on sm_90 (a: the row operand, b: the
# column operand, in the user's row-major terms).
cdef bint modes_pair(int mode_a, int mode_b) noexcept nogil

# ValueError (naming `name`, the shape and layout needed and a way to make it) unless d is a scale
# of `mode` for operand a (M, K) (is_a) or b (K, N) of a GEMM of that size.
cdef int expect_scale(const ArrayDesc* d, int mode, bint is_a, int64_t m, int64_t n, int64_t k, str name) except -1
