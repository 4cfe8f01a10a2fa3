# The one argument path: every entry point reads its buffers into a CallArgs, then
# prepare_call checks what all calls share (overlaps of every output and workspace with every
# other buffer, by role; workspace alignment; the stream, this thread's context, the device of
# every buffer and of the stream) and fills in the call's context, stream and, for a GEMM, the
# compute type derived from its storage types.
#
# One preparation, prepare_call(c, kind, stream, ...), for every entry point; its kind says
# how the compute type is found (CallKind). overlaps=False where the overlaps of the buffers
# were settled apart from the call by check_overlaps: GemmPlan (at construction), grouped (its
# sweep over the groups), matmul (a temporary).
from cpython.object cimport PyObject
from libc.stdint cimport int64_t, uint32_t
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasComputeType_t
from cygemm.engine.types cimport MatrixView, Math, GemmTypes
from cygemm.engine.context cimport GemmContext
from cygemm.engine.arrays cimport view_from_object, read_buffer

cdef enum ArgRole:
    ARG_READ = 0        # read by the call
    ARG_WRITE = 1       # written: shares memory with no other buffer of the call
    ARG_SCRATCH = 2     # a workspace: written; 256-byte aligned; shares memory with nothing

cdef enum:
    MAX_ARGS = 10

# What a call computes, so how prepare_call finds its compute type.
cdef enum CallKind:
    CALL_GEMM = 0           # a GEMM of one dtype: from `dtype` and `math` (gemm, matmul, the dense layer)
    CALL_TYPED_GEMM = 1     # a GEMM of mixed storage types: from c.types, set by its reader (FP8)
    CALL_KERNELS = 2        # no GEMM: cygemm's kernels (elementwise, FP8 conversions)

ctypedef struct CallArgs:
    MatrixView views[10]
    PyObject* names[10]     # borrowed: the callers pass str constants
    ArgRole roles[10]
    uint32_t in_place_of[10]    # bit j: this output may be exactly input j (see allow_in_place)
    int n
    bint torch_arrays       # some buffer is a torch tensor: stream=None is torch's current stream
    const GemmTypes* types  # CALL_TYPED_GEMM: the storage types (the reader's)
    # Filled by prepare_call:
    GemmContext* ctx
    cudaStream_t stream
    cublasComputeType_t compute
    Math math


cdef inline void args_init(CallArgs* c) noexcept nogil:
    c.n = 0
    c.torch_arrays = False
    c.ctx = NULL
    c.stream = NULL
    c.types = NULL


# Read `x` into the next slot (view_from_object, noting a torch tensor; a workspace: read_buffer)
# and return it. wide: a DTYPES_* level of cygemm.engine.arrays (which dtypes it takes).
# Inline: every entry point calls it for each buffer (the hot path).
cdef inline MatrixView* add_array(CallArgs* c, object x, str name, ArgRole role, int min_ndim,
                                  int max_ndim, int wide=0) except NULL:
    if c.n >= MAX_ARGS:
        raise RuntimeError("cygemm: too many buffers for one call (internal limit)")
    cdef MatrixView* v = &c.views[c.n]
    if role == ARG_SCRATCH:
        read_buffer(x, v, name)
    else:
        view_from_object(x, v, name, min_ndim, max_ndim, wide, &c.torch_arrays)
    c.names[c.n], c.roles[c.n], c.in_place_of[c.n] = <PyObject*>name, role, 0
    c.n += 1
    return v


# A view the entry point made itself (e.g. out=None's result, once allocated). torch: whether
# it came from a torch tensor (its ArrayDesc's torch; False for a result not allocated yet).
cdef inline MatrixView* add_view(CallArgs* c, const MatrixView* v, str name, ArgRole role, bint torch) except NULL:
    if c.n >= MAX_ARGS:
        raise RuntimeError("cygemm: too many buffers for one call (internal limit)")
    c.torch_arrays |= torch
    c.views[c.n] = v[0]
    c.names[c.n], c.roles[c.n], c.in_place_of[c.n] = <PyObject*>name, role, 0
    c.n += 1
    return &c.views[c.n - 1]


# Read a device float32 scalar (one element, any shape) into the next slot, as a 1 x 1 view
# (ValueError naming `name` otherwise).
cdef MatrixView* add_scalar(CallArgs* c, object x, str name, ArgRole role) except NULL


# Output `out` (added after `inp`) may be exactly the input `inp` (same pointer, shape and
# strides): a kernel that reads each element before the thread that writes it (cygemm's
# elementwise passes). Any other overlap is still refused.
cdef inline void allow_in_place(CallArgs* c, const MatrixView* out, const MatrixView* inp) noexcept nogil:
    if out != NULL and inp != NULL:
        c.in_place_of[out - &c.views[0]] |= 1u << (inp - &c.views[0])


# Prepare a call whose buffers are read into c: overlaps (unless settled apart), its math and
# compute type (by kind), the stream, this thread's context and the devices.
cdef int prepare_call(CallArgs* c, CallKind kind, object stream, object math=*, cudaDataType dtype=*,
                      bint overlaps=*) except -1
# Overlaps (by role) and workspace rules alone: no GPU state. The first step of prepare_call.
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


