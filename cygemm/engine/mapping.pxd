# The one mapping from row-major array views to column-major cuBLAS arguments (pure: no GPU
# state, no allocation; cimports only _types and the bindings).
from libc.stdint cimport int64_t
from cygemm.engine.types cimport MatrixView, ColMajorGemm


cdef enum MapResult:
    MAP_OK = 0
    MAP_BAD_A = 1
    MAP_BAD_B = 2
    MAP_BAD_OUT = 3
    MAP_CONJ_A = 4      # conj(A) without a transpose: cuBLAS has no such op
    MAP_CONJ_B = 5


# The one place where row-major views become cuBLAS arguments.
cdef MapResult map_rowmajor_gemm(const MatrixView* a, const MatrixView* b, const MatrixView* c,
                                 bint trans_a, bint trans_b, ColMajorGemm* g) noexcept nogil

# Conjugate the user's A and/or B in a call map_rowmajor_gemm mapped (c: its output view): the
# operand's op T becomes C. MAP_CONJ_A / MAP_CONJ_B where that operand is read with op N (its
# conjugate would need conj without a transpose, which cuBLAS lacks); g is then unchanged.
cdef MapResult conjugate_ops(const MatrixView* c, ColMajorGemm* g, bint conj_a, bint conj_b) noexcept nogil

# The leading dimension cuBLAS and cygemm's kernels take for a row-major view (unit
# stride along its last axis): its row stride, or, for a single row, its length (a
# single row's stride is meaningless: y[None] and x.T of an (N, 1) array have 0 or 1).
cdef int64_t rowmajor_ld(const MatrixView* v) noexcept nogil
# Whether v is row-major as rowmajor_ld needs (the mapping reads it that way).
cdef bint is_rowmajor(const MatrixView* v) noexcept nogil
# The ValueError for a layout map_rowmajor_gemm refused (r: MAP_BAD_A, MAP_BAD_B or MAP_BAD_OUT;
# MAP_CONJ_A/B: conjugate_ops):
# names that operand (`names`: of a, b and c), its strides, and the fix; `note` ("" or "; ...")
# says what the caller would do instead.
cdef object layout_error(MapResult r, const MatrixView* a, const MatrixView* b, const MatrixView* c,
                         tuple names, str note)
# map_rowmajor_gemm, raising ValueError that names the argument cuBLAS cannot read
# (`names`: the names of a, b and c). The one message for every entry point.
cdef int map_or_raise(const MatrixView* a, const MatrixView* b, const MatrixView* c, bint trans_a,
                      bint trans_b, ColMajorGemm* g, tuple names) except -1
# ValueError unless the `batch` matrices of the mapped output do not overlap one another
# (exact for any batch stride: interleaved batches, e.g. heads of one (S, H*D) buffer, pass).
cdef int check_batch_disjoint(const ColMajorGemm* g, str name) except -1

# A row-major matrix (rows x cols, `ld` elements between rows) of `batch` matrices `stride`
# elements apart, as a view: how the C entry points describe their pointers.
cdef void rowmajor_view(MatrixView* v, const void* ptr, int64_t rows, int64_t cols, int64_t ld,
                        int64_t stride, int64_t batch) noexcept nogil
