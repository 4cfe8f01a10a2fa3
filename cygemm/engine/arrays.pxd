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
