# The one argument path: every entry point reads its buffers into a CallArgs, then
# prepare_call checks what all calls share (overlaps of every output and workspace with every
# other buffer, workspace alignment, the math, the stream, this thread's context, the device
# of every buffer and of the stream) and fills in the call's context, stream and compute type.
from cpython.object cimport PyObject
from libc.stdint cimport int64_t
from cygemm.cudart cimport cudaStream_t, cudaDataType
from cygemm.cublas cimport cublasComputeType_t
from cygemm._types cimport MatrixView, Math
from cygemm._context cimport GemmContext

cdef enum ArgRole:
    ARG_READ = 0        # read by the call
    ARG_WRITE = 1       # written: shares memory with no other buffer of the call
    ARG_SCRATCH = 2     # a workspace: written; 256-byte aligned; shares memory with nothing

cdef enum:
    MAX_ARGS = 10

ctypedef struct CallArgs:
    MatrixView views[10]
    PyObject* names[10]     # borrowed: the callers pass str constants
    ArgRole roles[10]
    int n
    bint check_overlap      # False: the entry point resolves overlaps itself (matmul)
    # Filled by prepare_call:
    GemmContext* ctx
    cudaStream_t stream
    cublasComputeType_t compute
    Math math


cdef void args_init(CallArgs* c) noexcept nogil
# Read `x` into the next slot (view_from_object; a workspace: read_buffer) and return it.
cdef MatrixView* add_array(CallArgs* c, object x, str name, ArgRole role, int min_ndim,
                           int max_ndim) except NULL
# A view the entry point made itself (e.g. out=None's result, once allocated).
cdef MatrixView* add_view(CallArgs* c, const MatrixView* v, str name, ArgRole role) except NULL
cdef int prepare_call(CallArgs* c, object math, cudaDataType dtype, object stream) except -1
# The first part of prepare_call alone: overlaps and workspace rules (no GPU state).
cdef int check_overlaps(CallArgs* c) except -1
# The stream's and every given buffer's device against the context's (several GPUs only).
cdef int check_devices(CallArgs* c) except -1

# "tf32" / "fp32" / "cupy" -> Math (cupy: CuPy's CUPY_TF32 rule resolved now).
cdef Math parse_math(object math) except *

# Shape, dtype and layout checks shared by the entry points (ValueError/TypeError naming x).
cdef int expect_matrix(const MatrixView* v, str name, int64_t rows, int64_t cols,
                       cudaDataType dtype) except -1
cdef int expect_vector(const MatrixView* v, object x, str name, int64_t n,
                       cudaDataType dtype) except -1
cdef int expect_dtype(const MatrixView* v, str name, cudaDataType dtype, str whose) except -1


