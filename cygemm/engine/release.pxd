# The release queue (what waits for open captures to end) and capture tracking.
from cygemm.bindings.cudart cimport cudaStream_t, cudaGraph_t

# What the release queue frees or destroys.
cdef enum ReleaseKind:
    RELEASE_WORKSPACE, RELEASE_BLAS, RELEASE_LT, RELEASE_GRAPH_EXEC, RELEASE_GRAPH

# Queue an item, then release the queue if no capture is known to be open.
cdef void defer_release(ReleaseKind kind, int device, void* ptr) noexcept nogil
# The same for a workspace.
cdef void defer_free(void* ptr) noexcept nogil
# Queue a workspace only (also a CUDA user object's destructor: no CUDA call in it).
cdef void queue_free(void* ptr) noexcept nogil
# cudaFree now, in relaxed capture mode (release_workspaces, when the caller says it is safe).
cdef void free_now(void* ptr) noexcept nogil
# Release the queue if no capture is known open or opening; release_all: regardless.
cdef void drain_if_safe() noexcept nogil
cdef void release_all() noexcept nogil

# `cid` is the capture under way on `stream` now (0: none): remember it, forget ended ones.
cdef int note_capture_id(cudaStream_t stream, unsigned long long cid) except -1 with gil
# cid: the id of the capture under way on `stream`, 0 if none; graph: its graph.
cdef int capture_info(cudaStream_t stream, unsigned long long* cid, cudaGraph_t* graph) except -1 nogil
# How many captures cygemm knows to be open.
cdef int open_captures() noexcept nogil
