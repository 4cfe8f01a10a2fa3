# Whether views share memory (see overlap.pyx).
from cygemm.engine.types cimport MatrixView

# Whether two views share memory: exact for two 2-D views with the same leading dimension
# (column blocks of one buffer do not overlap), conservative (address ranges) otherwise.
# Empty views overlap nothing.
cdef bint views_overlap(const MatrixView* x, const MatrixView* y) noexcept nogil
# ValueError naming both when `out` overlaps `other`.
cdef int check_no_overlap(const MatrixView* out, str out_name, const MatrixView* other,
                          str other_name) except -1
