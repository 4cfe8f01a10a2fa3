# Per (device, thread): the cuBLAS/cuBLASLt handles and per-stream workspaces. Other Cython
# code cimports this; nothing here calls back into Python on the hot path except to raise.
from cygemm.bindings.cudart cimport cudaError_t, cudaStream_t, cudaEvent_t
from cygemm.bindings.cublas cimport cublasHandle_t
from cygemm.bindings.cublaslt cimport cublasLtHandle_t


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
    # not), at most max_stream_workspaces (an option) eager ones: the least recently used is
    # freed beyond that.
    StreamWorkspace* workspaces
    int n_workspaces
    int cap_workspaces
    unsigned long long use_counter
    size_t workspace_bytes
    # The side stream and events of the calls that run in a given workspace (give_workspace):
    # made once, its memory the given buffer's second part (never freed here).
    StreamWorkspace given_side


cdef GemmContext* current_context() except NULL
# Set the handle's stream and workspace (only when they change: cublasSetStream resets
# the workspace). Capture-aware: see stream_workspace.
cdef int bind_stream(GemmContext* ctx, cudaStream_t stream) except -1 nogil
# The workspace of `stream`, or of the capture under way on it; allocated on first use
# (cudaMalloc in relaxed capture mode, so an open capture survives).
cdef void* stream_workspace(GemmContext* ctx, cudaStream_t stream) except NULL nogil
# The stream's (or its capture's, or its side stream's) table of STREAM_TABLE_BYTES: device
# memory past its workspace, with the workspace's owner, for what one call hands to cuBLAS in
# device memory (the pointer arrays of a grouped GEMM). Work on one stream is serial, so a
# call may rewrite it; calls on other streams have tables of their own.
cdef enum:
    STREAM_TABLE_BYTES = 64 * 1024
cdef void* stream_table(GemmContext* ctx, cudaStream_t stream) except NULL nogil
# The same as stream_workspace from code that holds the GIL: released only when it must be allocated.
cdef void* call_workspace(GemmContext* ctx, cudaStream_t stream) except NULL
# Fork work from `stream` onto its side stream (which then waits for everything enqueued on
# `stream` so far): the side stream and its join event come back; join_side(those) makes
# `stream` wait for the side's work (quiet: errors ignored, for a path already raising).
# Capturable: during a capture the side stream joins it (the graph gets two branches). The
# side stream and its workspace belong to the entry of `stream` (stream_workspace(side)
# gives that workspace); the entry is not evicted between fork and join.
cdef int fork_side(GemmContext* ctx, cudaStream_t stream, cudaStream_t* side, cudaEvent_t* join) except -1 nogil
cdef int join_side(GemmContext* ctx, cudaStream_t stream, cudaStream_t side, cudaEvent_t join,
                   bint quiet) except -1 nogil
# The one fork/join: fork `stream`'s side stream, call fn(arg, stream, side) to enqueue work on
# either, then join the side back into `stream`, also when fn raises (that error is kept).
ctypedef int (*forked_fn)(void* arg, cudaStream_t main, cudaStream_t side) except -1
cdef int run_forked(GemmContext* ctx, cudaStream_t stream, forked_fn fn, void* arg) except -1



# A workspace the caller gives for this thread's calls on `stream` (XLA's scratch buffer, for
# cygemm.jax's handlers): until take_back_workspace, those calls use it instead of the stream's
# own and allocate nothing: its first part is the workspace and table stream_workspace and
# stream_table give, its second (where nbytes holds two) the side stream's; without a second
# part, run_forked runs the side's work on the stream itself. nbytes must hold one part
# (GIVEN_PART_BYTES); ptr aligned to 256 bytes.
cdef int give_workspace(cudaStream_t stream, void* ptr, size_t nbytes) except -1
cdef void take_back_workspace() noexcept nogil


# How many GPUs there are (-1 until the first context is made).
cdef int known_device_count() noexcept nogil
