# What every describe_* shares: operands read by their layout alone (host NumPy arrays,
# (shape, dtype) pairs; device arrays pass through unchanged), and one cuBLAS call described in
# the user's row-major terms first, then cuBLAS's arguments. Nothing here touches memory or a GPU.
from libc.stdint cimport uintptr_t
from cygemm.engine.types cimport ArrayDesc, MatrixView, ColMajorGemm

cdef enum LayoutKind:
    LAYOUT_TYPED = 0        # d.dtype is a type cygemm computes with (float16/32/64, bfloat16, FP8)
    LAYOUT_BYTES = 1        # uint8: FP8 bytes whose format an argument names
    LAYOUT_OTHER = 2        # any other dtype: the readers refuse it, naming it


# An operand known by its layout only; _arrays' readers read it as they read a device array.
cdef class ArrayLayout:
    cdef ArrayDesc d
    cdef LayoutKind kind
    cdef bint has_memory            # a NumPy array's (its host address); a pair has none
    cdef readonly object dtype      # the dtype's name ("bfloat16", "float8_e4m3fn", "uint8", ...)
    cdef readonly tuple shape


# Made-up, disjoint, 256-byte aligned addresses for the (shape, dtype) pairs of one call.
cdef class Addresses:
    cdef uintptr_t cursor
    cdef uintptr_t take(self, object nbytes)


# x as the readers take it for describing: a host (NumPy) array or a (shape, dtype) pair as an
# ArrayLayout, a device array unchanged; TypeError
# naming `name` and the forms accepted for anything else (a list of numbers included).
cdef object layout_operand(object x, str name, Addresses addresses)
# Whether x is read as a (shape, dtype) pair: two items, the second no number, sequence or array
# (a dtype, checked when read, as its shape is).
cpdef bint is_pair(object x)
# Whether x (as layout_operand returned it) has memory whose address a description may show.
cdef bint has_memory(object x)
# One mapped call: M, N, K, batch, swapped, cublas_a, cublas_b, why (row-major terms, with the
# caller's argument names), determinism (the option in force) and kernels (what it lets run), then opa, opb, m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c
# and the pointers a, b, c (None where the operand has no memory). g NULL: a group that maps to
# nothing (an empty one): cuBLAS's arguments None. memory: (a, b, out) have memory.
cdef dict describe_call(const MatrixView* va, const MatrixView* vb, const MatrixView* vc,
                        const ColMajorGemm* g, bint trans_a, bint trans_b, tuple names, tuple memory)
