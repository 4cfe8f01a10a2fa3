# What every describe_* shares: operands read by their layout alone (host NumPy arrays,
# (shape, dtype) pairs; device arrays pass through unchanged), and one cuBLAS call described in
# the user's row-major terms first, then cuBLAS's arguments. Nothing here touches memory or a GPU.
from libc.stdint cimport uintptr_t
from cygemm.engine.types cimport ArrayDesc, MatrixView, ColMajorGemm
from cygemm.engine.settings cimport Policy
from cygemm.bindings.cublas cimport cublasComputeType_t

cdef enum LayoutKind:
    LAYOUT_TYPED = 0        # d.dtype is a type cygemm computes with (float16/32/64, bfloat16, FP8)
    LAYOUT_BYTES = 1        # uint8: FP8 bytes whose format an argument names
    LAYOUT_OTHER = 2        # any other dtype: the readers refuse it, naming it


# An operand known by its layout only; _arrays' readers read it as they read a device array.
# (cygemm.jax's handlers make them of XLA's buffers, on_gpu: device arrays cygemm computes on.)
cdef class ArrayLayout:
    cdef ArrayDesc d
    cdef LayoutKind kind
    cdef bint has_memory            # a NumPy array's (its host address); a pair has none
    cdef bint on_gpu                # a view of device memory (an XLA buffer's, cygemm.jax's handlers)
    cdef readonly object dtype      # the dtype's name ("bfloat16", "float8_e4m3fn", "uint8", ...)
    cdef readonly tuple shape


# Made-up, disjoint, 256-byte aligned addresses for the (shape, dtype) pairs of one call.
cdef class Addresses:
    cdef uintptr_t cursor
    cdef uintptr_t take(self, object nbytes)


# x as the readers take it for describing: a host (NumPy) array or torch CPU tensor, or a (shape, dtype) pair, as an
# ArrayLayout, a device array unchanged; TypeError
# naming `name` and the forms accepted for anything else (a list of numbers included).
cdef object layout_operand(object x, str name, Addresses addresses)
# Whether x is read as a (shape, dtype) pair: two items, the second no number, sequence or array
# (a dtype, checked when read, as its shape is).
cpdef bint is_pair(object x)
# Whether x (as layout_operand returned it) has memory whose address a description may show.
cdef bint has_memory(object x)
# One mapped call: M, N, K, batch, swapped, cublas_a, cublas_b, why (row-major terms, with the
# caller's argument names), determinism (the call's policy's) and kernels (what it lets run), then opa, opb, m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c
# and the pointers a, b, c (None where the operand has no memory). g NULL: a group that maps to
# nothing (an empty one): cuBLAS's arguments None. memory: (a, b, out) have memory. Last, the
# call's compute ("tf32", "fp32", "fp64", "int32") and autotune level.
cdef dict describe_call(const MatrixView* va, const MatrixView* vb, const MatrixView* vc,
                        const ColMajorGemm* g, bint trans_a, bint trans_b, tuple names, tuple memory,
                        Policy policy, cublasComputeType_t compute)
# A compute type by the name describe_* give it ("tf32", "fp32", "fp64", "int32").
cdef str compute_name(cublasComputeType_t compute)


# -------------------- described (merged into, above arrays)
# Device arrays read into views (CuPy, torch, __cuda_array_interface__, DLPack), and the
# geometry of views in memory.
from cygemm.bindings.cudart cimport cudaDataType
from cygemm.engine.types cimport MatrixView, ArrayDesc

# Which dtypes a reader takes (its `wide` argument): a DTYPES_* level of the dtype table.
from cygemm.engine.dtypes cimport DTYPES_FLOAT, DTYPES_WIDE, DTYPES_GEMM

# Read pointer, shape, strides (elements), dtype and device of a device array, once, without
# touching the GPU; `wide` a DTYPES_* level.
cdef int read_array(object x, ArrayDesc* d, str name, int wide) except -1
cdef tuple desc_shape(const ArrayDesc* d)
# Whether x is a torch tensor, a subclass too (torch is not imported for the question).
cdef bint is_torch(object x) except -1
# A (batch, rows, cols) view of a device array of min_ndim..max_ndim (<= 3) dimensions; a
# 1-D array is one row. torch[0] set True when x is a torch tensor (the stream rule's input).
cdef int view_from_object(object x, MatrixView* view, str name, int min_ndim, int max_ndim,
                          int wide=*, bint* torch=*) except -1
cdef int view_from_desc(const ArrayDesc* d, MatrixView* view, str name, int min_ndim, int max_ndim) except -1
# An FP8 array: torch float8_e4m3fn/float8_e5m2 (format from the dtype) or uint8 bytes whose
# format `fmt` ('e4m3'/'e5m2', the argument `fmt_arg`) names; d.dtype = CUDA_R_8F_E4M3/E5M2.
cdef int read_fp8(object x, ArrayDesc* d, str name, object fmt, str fmt_arg) except -1
# A workspace (any dtype, contiguous) as a view of its bytes.
cdef int read_buffer(object x, MatrixView* view, str name) except -1
