# Whether views share memory (see overlap.pyx).
from libc.stdint cimport int64_t
from cygemm.engine.types cimport MatrixView, ArrayDesc

# The one geometry of memory: [lo, hi), the bytes a non-empty (batch, rows, cols) view can touch,
# and those an n-D array spans (hi == lo when empty). Every overlap check reads these.
cdef void view_byte_range(const MatrixView* v, int64_t* lo, int64_t* hi) noexcept nogil
cdef void desc_byte_range(const ArrayDesc* d, int64_t* lo, int64_t* hi) noexcept nogil

# Whether two views share memory: exact for two 2-D views with the same leading dimension
# (column blocks of one buffer do not overlap), conservative (address ranges) otherwise.
# Empty views overlap nothing.
cdef bint views_overlap(const MatrixView* x, const MatrixView* y) noexcept nogil
# ValueError naming both when `out` overlaps `other`.
cdef int check_no_overlap(const MatrixView* out, str out_name, const MatrixView* other,
                          str other_name) except -1
