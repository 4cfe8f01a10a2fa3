# Allocation of device arrays of the caller's library (CuPy's pool, or torch's allocator for
# torch tensors), ordered on the call's stream.
from libc.stdint cimport uintptr_t
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType

# A new C-ordered array on `stream` (CaptureError saying `what` while it is captured): a torch
# tensor on like's device when like (a torch tensor) is given, else a CuPy array. FP8 types
# give torch float8 tensors, or CuPy uint8 arrays of the codes.
cdef object empty_array(tuple shape, cudaDataType dtype, cudaStream_t stream, str what, object like=*)
# The device address of an array empty_array made.
cdef uintptr_t data_pointer(object x) except? 0
# Whether x is a torch tensor (arrays' question); the first torch tensor of arrays.
from cygemm.engine.arrays cimport is_torch
cdef object first_torch(tuple arrays)
# torch's dtype for t; a torch stream object for the raw stream s of device.
cdef object torch_dtype(object torch, cudaDataType t)
cdef object torch_stream(object torch, cudaStream_t s, object device)
# A new C-ordered array of the caller's library (torch_lib: a torch tensor on like's device,
# else CuPy), ordered on s. A CuPy one is refused in a capture; a torch one is not checked.
cdef object new_array(bint torch_lib, object like, tuple shape, cudaDataType t, cudaStream_t s)
