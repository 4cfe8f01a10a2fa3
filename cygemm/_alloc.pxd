# Allocation of device arrays from CuPy's pool, ordered on the call's stream.
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType

# A new C-ordered CuPy array on `stream` (CaptureError saying `what` while it is captured).
cdef object empty_array(tuple shape, cudaDataType dtype, cudaStream_t stream, str what)
