# The one argument path: every entry point reads its buffers into a CallArgs, then
# prepare_call checks what all calls share (overlaps of every output and workspace with every
# other buffer, workspace alignment, the math, the stream, this thread's context, the device
# of every buffer and of the stream) and fills in the call's context, stream and compute type.
from cpython.object cimport PyObject
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasComputeType_t
from cygemm._types cimport MatrixView, Math
from cygemm._context cimport GemmContext
from cygemm._arrays cimport view_from_object, read_buffer

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


cdef inline void args_init(CallArgs* c) noexcept nogil:
    c.n = 0
    c.check_overlap = True
    c.ctx = NULL
    c.stream = NULL


# Read `x` into the next slot (view_from_object; a workspace: read_buffer) and return it.
# Inline: every entry point calls it for each buffer (the hot path).
cdef inline MatrixView* add_array(CallArgs* c, object x, str name, ArgRole role, int min_ndim,
                                  int max_ndim) except NULL:
    if c.n >= MAX_ARGS:
        raise RuntimeError("cygemm: too many buffers for one call (internal limit)")
    cdef MatrixView* v = &c.views[c.n]
    if role == ARG_SCRATCH:
        read_buffer(x, v, name)
    else:
        view_from_object(x, v, name, min_ndim, max_ndim)
    c.names[c.n], c.roles[c.n] = <PyObject*>name, role
    c.n += 1
    return v


# A view the entry point made itself (e.g. out=None's result, once allocated).
cdef inline MatrixView* add_view(CallArgs* c, const MatrixView* v, str name, ArgRole role) except NULL:
    if c.n >= MAX_ARGS:
        raise RuntimeError("cygemm: too many buffers for one call (internal limit)")
    c.views[c.n] = v[0]
    c.names[c.n], c.roles[c.n] = <PyObject*>name, role
    c.n += 1
    return &c.views[c.n - 1]
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
cdef int raise_dtype(const MatrixView* v, str name, cudaDataType dtype, str whose) except -1
# A (rows, cols) matrix of `dtype` read into c (row_major: unit stride along its last axis, rows
# not overlapping; ValueError naming it otherwise).
cdef MatrixView* add_matrix(CallArgs* c, object x, str name, ArgRole role, int64_t rows, int64_t cols,
                            cudaDataType dtype, bint row_major) except NULL
# An (n,) or (1, n) contiguous vector of `dtype` read into c.
cdef MatrixView* add_vector(CallArgs* c, object x, str name, ArgRole role, int64_t n,
                            cudaDataType dtype) except NULL
# The workspace of a call that prepare_call has filled in: the caller's (wv, its view in c,
# checked there with the call's other buffers), else the stream's own.
cdef int call_workspace_of(CallArgs* c, const MatrixView* wv, void** ptr, size_t* nbytes) except -1
cdef inline int expect_dtype(const MatrixView* v, str name, cudaDataType dtype, str whose) except -1:
    """TypeError unless v has `dtype` (whose: the operand it must match, or None)."""
    if v.dtype != dtype:
        raise_dtype(v, name, dtype, whose)
    return 0


