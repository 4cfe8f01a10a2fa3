# Streams: what a `stream=` argument names, capture status, the stream's device.
from cygemm.bindings.cudart cimport cudaStream_t

# The stream an argument names: None (the current stream of the arrays' library: torch's when
# torch_arrays, else CuPy's), an int cudaStream_t, or an
# object of CuPy, torch or the CUDA stream protocol.
cdef int stream_from_object(object stream, cudaStream_t* out, bint torch_arrays=*) except -1
# The same rules, the stream not resolved (describe_*: TypeError/ValueError naming stream).
cdef int check_stream_arg(object stream) except -1
# Whether one of `arrays` is a torch tensor (without importing torch).
cdef bint any_torch(tuple arrays) except -1
cdef bint stream_is_capturing(cudaStream_t stream) except -1 nogil
# CaptureError when a refused cuBLASLt call invalidated the capture under way on `stream`.
cdef int check_capture_alive(cudaStream_t stream) except -1
# The stream's device; left as given when only a call that would break the stream's capture
# could tell.
cdef int stream_device(cudaStream_t stream, int* device) except -1
