# matmul's batch layout (see batch_layout.pyx).
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaDataType
from cygemm.engine.types cimport ArrayDesc, MatrixView


# Two operands' matrices and their broadcast batch axes, as one call or a loop of
# strided-batched calls sees them; strides in elements.
ctypedef struct BatchLayout:
    # The operands' last two axes, as row-major cores (1-D operands made 1 x K and K x 1).
    int64_t M, N, K
    int64_t a_rs, a_cs, b_rs, b_cs, c_rs, c_cs
    # Broadcast batch axes after merging, innermost last: sizes and element strides.
    int nb
    int64_t size[64]
    int64_t sa[64]
    int64_t sb[64]
    int64_t sc[64]
    # Element offsets of the first matrix (batch axes of out with a negative stride run backwards).
    int64_t base_a, base_b, base_c
    # The result's shape.
    int out_ndim
    int64_t out_shape[64]


# Check the shapes as NumPy does; fill the cores and the broadcast batch axes (not yet merged,
# out's strides unset) and the result's shape.
cdef int read_layout(const ArrayDesc* a, const ArrayDesc* b, BatchLayout* L) except -1
cdef tuple result_shape(const BatchLayout* L)
cdef bint has_result_shape(const ArrayDesc* d, const BatchLayout* L) noexcept
# L0 with out's strides (from c) and its batch axes merged, into L (may be L0).
cdef void merge_out(const BatchLayout* L0, const ArrayDesc* c, const ArrayDesc* a, const ArrayDesc* b,
                    BatchLayout* L) noexcept
# ValueError unless out's matrices are disjoint (exact for one batch axis cuBLAS can write, by
# nested strides otherwise).
cdef int check_out(const BatchLayout* L0, const ArrayDesc* c, const ArrayDesc* a, const ArrayDesc* b) except -1
cdef bint empty_batch(const BatchLayout* L) noexcept
# Whether out may share memory with a or b (exact for one call; by address range otherwise).
# fresh_a/fresh_b: that operand is a new array of the call's own (its address not yet known),
# which shares memory with nothing.
cdef bint may_overlap_inputs(const BatchLayout* L, const ArrayDesc* c, const ArrayDesc* a, const ArrayDesc* b,
                             bint fresh_a=*, bint fresh_b=*)
# The bytes an array spans, as one row of elements from its lowest address (batch 0 when it is
# empty): where it lies, for the device checks of the one argument path.
cdef void span_view(const ArrayDesc* d, MatrixView* v) noexcept
# The views of one call at element offsets off_*: the innermost merged batch axis is cuBLAS's batch.
cdef void call_views(const BatchLayout* L, const ArrayDesc* a, const ArrayDesc* b, const ArrayDesc* c,
                     int64_t off_a, int64_t off_b, int64_t off_c,
                     MatrixView* va, MatrixView* vb, MatrixView* vc) noexcept


# What a matmul call does besides its GEMMs, decided from the arrays' layouts before anything runs.
ctypedef struct MatmulPlan:
    bint empty          # nothing to compute (K == 0 is not empty: zeros)
    bint new_result     # out=None: the GEMMs write a new C-ordered array, the result
    bint copy_a         # a goes to a new C-ordered array of the product's dtype first (its dtype
    bint copy_b         #   differs, or its matrices have no unit-stride axis); b likewise
    bint via_temp       # the GEMMs write a new C-ordered temporary, then it is copied into out
    bint temp_like_out  # the temporary is of out's library (else of a's or b's)

# Decide the copies, casts and temporaries of matmul(a, b, out) of product dtype t (L0: the
# read_layout of a and b; L receives the layout merged with the final target). Returns the
# reason for the first of them as a capture refuses it, None when there is none.
cdef object decide_copies(const ArrayDesc* da, const ArrayDesc* db, const ArrayDesc* dc, bint has_out,
                          cudaDataType t, const BatchLayout* L0, BatchLayout* L, MatmulPlan* p)
