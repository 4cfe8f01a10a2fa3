# The C-level core: errors, per-(device, thread) handles, streams and array
# views. Other Cython code cimports this; nothing here calls back into Python
# on the hot path except to raise.
from libc.stdint cimport int64_t
from cygemm.cudart cimport cudaError_t, cudaStream_t, cudaEvent_t, cudaDataType
from cygemm.cublas cimport cublasHandle_t, cublasStatus_t
from cygemm.cublaslt cimport cublasLtHandle_t


# Re-take the GIL only to raise: the checks stay cheap on the hot path.
cdef int check_cuda(cudaError_t status, const char* call) except -1 nogil
cdef int check_cublas(cublasStatus_t status, const char* call) except -1 nogil


# A cuBLAS/cuBLASLt workspace (also the backward's scratch) and the stream it belongs to.
# capture_id 0: the stream's eager workspace, owned by the context; else the workspace of
# that capture, owned by the captured graph (a CUDA user object: freed once the graph and
# its executable graphs are gone), which the context only remembers for the capture's
# later calls (work in a graph must not share memory with eager work).
# side, fork, join, side_ptr: a second stream of the same entry, the events that fork work
# onto it and join it back (the backward's concurrent branches), and its own workspace;
# created on first use, released with the entry (side_ptr as ptr is: freed, or the graph's).
ctypedef struct StreamWorkspace:
    cudaStream_t stream
    unsigned long long capture_id
    void* ptr
    unsigned long long last_use
    cudaStream_t side
    cudaEvent_t fork
    cudaEvent_t join
    void* side_ptr
    bint forked         # between fork_side and join_side: never evicted then


# One per (device, thread). Owned by a Python object in a thread-local dict;
# the pointer stays valid for the life of the thread. It owns its workspaces.
ctypedef struct GemmContext:
    int device
    cublasHandle_t blas
    cublasLtHandle_t lt
    # cuBLAS handle's current stream and the workspace bound with it.
    bint bound
    cudaStream_t bound_stream
    void* bound_workspace
    # Workspaces, one per stream (work on one stream is serial, across streams it is
    # not), at most max_eager eager ones: the least recently used is freed beyond that.
    StreamWorkspace* workspaces
    int n_workspaces
    int cap_workspaces
    int max_eager
    unsigned long long use_counter
    size_t workspace_bytes


cdef GemmContext* current_context() except NULL
# Set the handle's stream and workspace (only when they change: cublasSetStream resets
# the workspace). Capture-aware: see stream_workspace.
cdef int bind_stream(GemmContext* ctx, cudaStream_t stream) except -1 nogil
# The workspace of `stream`, or of the capture under way on it; allocated on first use
# (cudaMalloc in relaxed capture mode, so an open capture survives).
cdef void* stream_workspace(GemmContext* ctx, cudaStream_t stream) except NULL nogil
# Fork work from `stream` onto its side stream (which then waits for everything enqueued on
# `stream` so far): the side stream and its join event come back; join_side(those) makes
# `stream` wait for the side's work (quiet: errors ignored, for a path already raising).
# Capturable: during a capture the side stream joins it (the graph gets two branches). The
# side stream and its workspace belong to the entry of `stream` (stream_workspace(side)
# gives that workspace); the entry is not evicted between fork and join.
cdef int fork_side(GemmContext* ctx, cudaStream_t stream, cudaStream_t* side, cudaEvent_t* join) except -1 nogil
cdef int join_side(GemmContext* ctx, cudaStream_t stream, cudaStream_t side, cudaEvent_t join,
                   bint quiet) except -1 nogil
# Free device memory now if no capture is known to be open, else once none is (cudaFree
# synchronizes the device, which would invalidate captures other threads have open).
cdef void defer_free(void* ptr) noexcept nogil


# A strided (batch, rows, cols) device array; strides in elements. 2-D arrays
# have batch 1 and batch_stride 0, which is also how an operand is broadcast.
ctypedef struct MatrixView:
    char* ptr
    int64_t batch
    int64_t rows
    int64_t cols
    int64_t batch_stride
    int64_t row_stride
    int64_t col_stride
    cudaDataType dtype
    int itemsize
    int device          # the memory's device as the array object says, -1: ask CUDA


cdef enum:
    MAX_NDIM = 64

# Any device array as read once from its object: strides in elements.
ctypedef struct ArrayDesc:
    char* ptr
    int ndim
    int64_t shape[64]
    int64_t strides[64]
    cudaDataType dtype
    int itemsize
    int device          # as the array object says, -1: ask CUDA


# Python boundary helpers, used by the other modules of the package.
# wide: accept float64 too (else float32, float16, bfloat16).
cdef int read_array(object x, ArrayDesc* d, str name, bint wide) except -1
cdef tuple desc_shape(const ArrayDesc* d)
cdef int view_from_object(object x, MatrixView* view, str name, int min_ndim, int max_ndim) except -1
cdef int stream_from_object(object stream, cudaStream_t* out) except -1
cdef bint stream_is_capturing(cudaStream_t stream) except -1 nogil
# With several GPUs, refuse a stream or a non-empty array of another device than the
# context's: one check for every entry point, correct during capture and for empty views.
cdef int check_devices(GemmContext* ctx, cudaStream_t stream, const MatrixView** views, list names) except -1
# Refuse an output whose memory overlaps another array the call reads or writes
# (cuBLAS and our kernels assume it does not). Exact for two 2-D views with the
# same leading dimension (column blocks of one buffer do not overlap), conservative
# (address ranges) otherwise. Empty views overlap nothing.
# Whether two views share memory (exact for 2-D views of one leading dimension).
cdef bint views_overlap(const MatrixView* x, const MatrixView* y) noexcept nogil
cdef int check_no_overlap(const MatrixView* out, str out_name, const MatrixView* other,
                          str other_name) except -1
cdef object dtype_name(cudaDataType dtype)
# A new C-ordered CuPy array from CuPy's pool on `stream`, so that its memory is ordered with
# the work the caller enqueues there.
cdef object empty_array(tuple shape, cudaDataType dtype, cudaStream_t stream)
