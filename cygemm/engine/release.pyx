# cython: language_level=3, boundscheck=False, wraparound=False
"""The release queue and the captures it waits for.

cudaFree, cublasDestroy and cudaGraphDestroy synchronize the device, which invalidates any
capture under way on it, in any thread (seen on the H200: 8 threads capturing while others
freed). So cygemm never releases while it knows of an open capture: what is to be released
waits here, and goes when none is known open (or at release_workspaces()). Captures are known
from cygemm.graph.capture (begin to end) and from cygemm's own calls on a capturing stream.
"""
from libc.stdint cimport uintptr_t
from libc.stdlib cimport realloc
from cpython.pythread cimport (PyThread_type_lock, PyThread_allocate_lock, PyThread_acquire_lock,
                               PyThread_release_lock, WAIT_LOCK)

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport cublasHandle_t, cublasDestroy
from cygemm.bindings.cublaslt cimport cublasLtHandle_t, cublasLtDestroy
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.streams cimport stream_from_object


cdef void free_now(void* ptr) noexcept nogil:
    """cudaFree in relaxed capture mode (allowed while this thread captures elsewhere).

    cudaFree returns only once the work already enqueued on the device is done (it
    synchronizes implicitly), so no kernel still uses ptr, even one on a stream that has
    since been destroyed. That synchronization invalidates any capture under way on the
    device, in any thread (seen on the H200: 8 threads capturing while others freed), so
    cygemm frees through queue_free / drain_if_safe, never while it knows of an open capture."""
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    cudaThreadExchangeStreamCaptureMode(&mode)
    cudaFree(ptr)
    cudaThreadExchangeStreamCaptureMode(&mode)



# What waits to be released: workspaces of captures once their graph is gone (CUDA runs a
# user object's destructor on its own thread, where no CUDA call may be made), evicted ones,
# the workspaces and cuBLAS/cuBLASLt handles of ended threads (cublasDestroy synchronizes
# the device, as cudaFree does, so it would invalidate captures other threads have open), and
# dropped CUDA graphs (destroying one may invalidate an open capture). The next workspace
# allocation, thread end or capture end releases the queue when no capture is known to be
# open; release_workspaces() releases it regardless.

ctypedef struct _Deferred:
    int kind
    int device
    void* ptr

cdef PyThread_type_lock _deferred_lock = PyThread_allocate_lock()
# Held while one queued item is released when no capture is known open, and by a capture about
# to begin (begin_capture): a release never overlaps the start of a capture in another thread.
cdef PyThread_type_lock _release_mutex = PyThread_allocate_lock()
cdef int _n_opening = 0         # captures between begin_capture and their note_capture
cdef _Deferred* _deferred = NULL
cdef int _n_deferred = 0, _cap_deferred = 0


cdef void _defer_release(int kind, int device, void* ptr) noexcept nogil:
    global _deferred, _n_deferred, _cap_deferred
    cdef _Deferred* grown
    PyThread_acquire_lock(_deferred_lock, WAIT_LOCK)
    if _n_deferred == _cap_deferred:
        grown = <_Deferred*>realloc(_deferred, (2 * _cap_deferred + 8) * sizeof(_Deferred))
        if grown != NULL:
            _deferred, _cap_deferred = grown, 2 * _cap_deferred + 8
    if _n_deferred < _cap_deferred:
        _deferred[_n_deferred].kind = kind
        _deferred[_n_deferred].device = device
        _deferred[_n_deferred].ptr = ptr
        _n_deferred += 1
    PyThread_release_lock(_deferred_lock)


cdef void queue_free(void* ptr) noexcept nogil:
    """Queue a workspace to be freed (also a CUDA user object's destructor: no CUDA call here)."""
    _defer_release(RELEASE_WORKSPACE, -1, ptr)


cdef void _release_now(_Deferred item) noexcept nogil:
    """Free a workspace or destroy a handle, in relaxed capture mode and on the handle's device.
    Errors are ignored: at interpreter exit the driver may be gone."""
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    cdef int current = -1
    if item.kind == RELEASE_WORKSPACE:
        free_now(item.ptr)
        return
    cudaThreadExchangeStreamCaptureMode(&mode)
    if item.kind == RELEASE_GRAPH_EXEC or item.kind == RELEASE_GRAPH:
        # Relaxed: a graph is often dropped inside the next capture of this thread
        # (`with capture(s) as g` rebinds g); destroying it is an "unsafe" call.
        if item.kind == RELEASE_GRAPH_EXEC:
            cudaGraphExecDestroy(<cudaGraphExec_t>item.ptr)
        else:
            cudaGraphDestroy(<cudaGraph_t>item.ptr)
        cudaThreadExchangeStreamCaptureMode(&mode)
        return
    if cudaGetDevice(&current) == cudaSuccess and current != item.device:
        cudaSetDevice(item.device)
    if item.kind == RELEASE_BLAS:
        cublasDestroy(<cublasHandle_t>item.ptr)
    else:
        cublasLtDestroy(<cublasLtHandle_t>item.ptr)
    if current >= 0 and current != item.device:
        cudaSetDevice(current)
    cudaThreadExchangeStreamCaptureMode(&mode)


cdef bint _pop(_Deferred* item, bint graphs_only) noexcept nogil:
    """Take one queued item (a graph first when graphs_only), under the queue's lock."""
    global _n_deferred
    cdef int i, found = -1
    PyThread_acquire_lock(_deferred_lock, WAIT_LOCK)
    for i in range(_n_deferred):
        if not graphs_only or _deferred[i].kind == RELEASE_GRAPH_EXEC or _deferred[i].kind == RELEASE_GRAPH:
            found = i
            break
    if found >= 0:
        item[0] = _deferred[found]
        _deferred[found] = _deferred[_n_deferred - 1]
        _n_deferred -= 1
    PyThread_release_lock(_deferred_lock)
    return found >= 0


cdef void _free_deferred(bint only_if_safe) noexcept nogil:
    """Release the queue, graphs first (destroying one releases the workspaces it owns into
    the queue, once CUDA runs their destructors). only_if_safe: item by item, each only while
    no capture is known open or about to open."""
    cdef _Deferred item
    cdef bint graphs_only = True, got
    while True:
        if only_if_safe:
            PyThread_acquire_lock(_release_mutex, WAIT_LOCK)
            if _n_open_captures != 0 or _n_opening != 0:
                PyThread_release_lock(_release_mutex)
                return
        got = _pop(&item, graphs_only)
        if got:
            _release_now(item)
        if only_if_safe:
            PyThread_release_lock(_release_mutex)
        if not got:
            if not graphs_only:
                return
            graphs_only = False


cdef void defer_release(ReleaseKind kind, int device, void* ptr) noexcept nogil:
    _defer_release(kind, device, ptr)
    drain_if_safe()


cdef void drain_if_safe() noexcept nogil:
    if _n_open_captures == 0 and _n_opening == 0:
        _free_deferred(True)


def pending_workspace_frees():
    """How many workspaces, handles and graphs wait to be released (for tests)."""
    return _n_deferred

# Captures cygemm knows to be open, as (stream, capture id): those of cygemm.graph.capture
# from begin to end, and any other capture from cygemm's first call in it until a later
# call on that stream shows it over. Under the GIL; _n_open_captures mirrors its size.
cdef int _n_open_captures = 0
_open_captures = set()


cdef int note_capture_id(cudaStream_t stream, unsigned long long cid) except -1 with gil:
    """`cid` is the capture under way on `stream` now (0: none): forget earlier ones there."""
    global _n_open_captures
    key = <uintptr_t>stream
    # A capture seen over on `stream` is over on every stream that joined it (the backward's
    # side streams): entries are dropped by capture id, not by stream.
    over = {k[1] for k in _open_captures if k[0] == key and k[1] != cid}
    for k in [k for k in _open_captures if k[1] in over]:
        _open_captures.discard(k)
    if cid:
        _open_captures.add((key, cid))
    _n_open_captures = len(_open_captures)
    return 0


def begin_capture():
    """Call before cudaStreamBeginCapture (cygemm.graph.capture does): waits for a release in
    progress, and no release starts until the matching note_capture(opening=True)."""
    global _n_opening
    with nogil:
        PyThread_acquire_lock(_release_mutex, WAIT_LOCK)
    _n_opening += 1
    PyThread_release_lock(_release_mutex)


def note_capture(stream, bint opening=False):
    """Record whether `stream` is capturing now (cygemm.graph.capture calls this at both ends;
    opening: the end of a begin_capture, whether or not the capture began)."""
    global _n_opening
    cdef cudaStream_t s
    cdef unsigned long long cid = 0
    try:
        stream_from_object(stream, &s)
        capture_info(s, &cid, NULL)
        note_capture_id(s, cid)
    finally:
        if opening:
            _n_opening -= 1
    with nogil:
        drain_if_safe()        # what waited for the captures to end


def open_capture_count():
    """How many captures cygemm knows to be open (see note_capture)."""
    return _n_open_captures


def forget_open_captures():
    """Forget every capture cygemm knows to be open, release what waited for them, and return
    how many there were. For test suites: a raw capture stays known open until cygemm's next
    call on its stream, and a test that makes none after it leaves the releases held."""
    global _n_open_captures
    n = len(_open_captures)
    _open_captures.clear()
    _n_open_captures = 0
    with nogil:
        drain_if_safe()
    return n
cdef int capture_info(cudaStream_t stream, unsigned long long* cid, cudaGraph_t* graph) except -1 nogil:
    """cid: the id of the capture under way on `stream`, 0 if none; graph: its graph."""
    cdef cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone
    cid[0] = 0
    check_cuda(cudaStreamGetCaptureInfo(stream, &status, cid, graph, NULL, NULL, NULL),
               "cudaStreamGetCaptureInfo")
    if status != cudaStreamCaptureStatusActive:
        cid[0] = 0
    return 0


def destroy_graph_when_safe(uintptr_t exec_, uintptr_t graph):
    """Destroy a CUDA graph and its executable graph now, or once no capture is known open."""
    if exec_:
        _defer_release(RELEASE_GRAPH_EXEC, -1, <void*>exec_)
    if graph:
        _defer_release(RELEASE_GRAPH, -1, <void*>graph)
    with nogil:                 # frees may synchronize the device: other threads run meanwhile
        drain_if_safe()


cdef void defer_free(void* ptr) noexcept nogil:
    queue_free(ptr)
    drain_if_safe()



cdef void release_all() noexcept nogil:
    _free_deferred(False)


cdef int open_captures() noexcept nogil:
    return _n_open_captures
