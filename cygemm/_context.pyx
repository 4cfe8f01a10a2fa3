# cython: language_level=3, boundscheck=False, wraparound=False
"""Per (device, thread): the cuBLAS/cuBLASLt handles, per-stream workspaces, the queue of
releases that wait for open captures to end, capture tracking and streams.

Everything here is owned by one object per (device, thread), _Context; nothing else creates or
frees a handle or a workspace. Graphs hand their teardown to the same release queue.
"""
import threading

from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport realloc, free
from libc.string cimport memset
from cpython.pythread cimport (PyThread_type_lock, PyThread_allocate_lock, PyThread_acquire_lock,
                               PyThread_release_lock, WAIT_LOCK)

from cygemm.cudart cimport *
from cygemm.cublas cimport *
from cygemm.cublaslt cimport cublasLtHandle_t, cublasLtCreate, cublasLtDestroy, cublasLtGetVersion
from cygemm._errors cimport check_cuda, check_cublas, check_driver
from cygemm._errors import CudaError
from cygemm._settings cimport options, loaded_options

try:
    import cupy as _cupy
    _current_stream = _cupy.cuda.get_current_stream
except ImportError:  # cupy is needed only for allocating forms and stream=None
    _cupy = None
    _current_stream = None

# cuBLAS recommends 32 MiB of workspace on Hopper; smaller chips use less.
cdef enum:
    WORKSPACE_BYTES = 32 * 1024 * 1024


# ---------------------------------------------------------------- handles

cdef void _free_relaxed(void* ptr) noexcept nogil:
    """cudaFree in relaxed capture mode (allowed while this thread captures elsewhere).

    cudaFree returns only once the work already enqueued on the device is done (it
    synchronizes implicitly), so no kernel still uses ptr, even one on a stream that has
    since been destroyed. That synchronization invalidates any capture under way on the
    device, in any thread (seen on the H200: 8 threads capturing while others freed), so
    cygemm frees through _defer_free / _drain_if_safe, never while it knows of an open capture."""
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    cudaThreadExchangeStreamCaptureMode(&mode)
    cudaFree(ptr)
    cudaThreadExchangeStreamCaptureMode(&mode)


cdef unsigned long long _contexts_generation = 1     # see current_context


cdef class _Context:
    """Owns one GemmContext: the handles and workspaces of a (device, thread)."""
    cdef GemmContext ctx

    def __cinit__(self, int device):
        self.ctx.device = device
        self.ctx.workspace_bytes = WORKSPACE_BYTES
        cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
        cdef cublasStatus_t st_blas, st_lt = CUBLAS_STATUS_SUCCESS
        # Creating handles may allocate: allowed even while another stream of this thread is
        # being captured. It loads cuBLAS's kernels (tens of ms): without the GIL.
        check_cuda(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode")
        with nogil:
            st_blas = cublasCreate(&self.ctx.blas)
            if st_blas == CUBLAS_STATUS_SUCCESS:
                st_lt = cublasLtCreate(&self.ctx.lt)
            cudaThreadExchangeStreamCaptureMode(&mode)
        check_cublas(st_blas, "cublasCreate")
        check_cublas(st_lt, "cublasLtCreate")

    cdef void release(self, bint now) noexcept nogil:
        """Free (now) or queue (at thread exit: other threads may be capturing) the workspaces
        this context owns; forget those of captures (their graphs own them)."""
        cdef int i
        for i in range(self.ctx.n_workspaces):
            _destroy_side(&self.ctx.workspaces[i])
            if self.ctx.workspaces[i].capture_id == 0:
                if now:
                    _free_relaxed(self.ctx.workspaces[i].ptr)
                    if self.ctx.workspaces[i].side_ptr != NULL:
                        _free_relaxed(self.ctx.workspaces[i].side_ptr)
                else:
                    _defer_free(self.ctx.workspaces[i].ptr)
                    if self.ctx.workspaces[i].side_ptr != NULL:
                        _defer_free(self.ctx.workspaces[i].side_ptr)
        self.ctx.n_workspaces = 0
        self.ctx.bound = False

    def __dealloc__(self):
        global _contexts_generation
        _contexts_generation += 1       # no thread's cached pointer to this context survives
        # At thread end: handles and workspaces wait in the release queue while any
        # capture is open (cublasDestroy and cudaFree synchronize the device).
        self.release(False)
        free(self.ctx.workspaces)
        if self.ctx.lt != NULL:
            _defer_release(RELEASE_LT, self.ctx.device, <void*>self.ctx.lt)
        if self.ctx.blas != NULL:
            _defer_release(RELEASE_BLAS, self.ctx.device, <void*>self.ctx.blas)
        with nogil:
            _drain_if_safe()

    @property
    def device(self):
        return self.ctx.device

    @property
    def n_workspaces(self):
        return self.ctx.n_workspaces


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


cdef void _defer_free(void* ptr) noexcept nogil:
    """Queue a workspace to be freed (also a CUDA user object's destructor: no CUDA call here)."""
    _defer_release(RELEASE_WORKSPACE, -1, ptr)


cdef void _release_now(_Deferred item) noexcept nogil:
    """Free a workspace or destroy a handle, in relaxed capture mode and on the handle's device.
    Errors are ignored: at interpreter exit the driver may be gone."""
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    cdef int current = -1
    if item.kind == RELEASE_WORKSPACE:
        _free_relaxed(item.ptr)
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
    _drain_if_safe()


cdef void _drain_if_safe() noexcept nogil:
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


cdef int _note_capture(cudaStream_t stream, unsigned long long cid) except -1 with gil:
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
        _capture_info(s, &cid, NULL)
        _note_capture(s, cid)
    finally:
        if opening:
            _n_opening -= 1
    with nogil:
        _drain_if_safe()        # what waited for the captures to end


def open_capture_count():
    """How many captures cygemm knows to be open (see note_capture)."""
    return _n_open_captures
cdef object _tls = threading.local()
cdef int _device_count = -1


def device_count():
    """Number of visible CUDA devices (cached): 0 where there is no driver or no GPU
    (:func:`cygemm.gpu_unavailable_reason` says why); CudaError for other failures."""
    global _device_count
    cdef int n = 0
    cdef cudaError_t err
    if _device_count < 0:
        err = cudaGetDeviceCount(&n)
        if err == cudaErrorNoDevice or err == cudaErrorInsufficientDriver:
            cudaGetLastError()
            n = 0
        else:
            check_cuda(err, "cudaGetDeviceCount")
        _device_count = n
    return _device_count


def gpu_unavailable_reason():
    """Why no GPU is usable here, in plain words, or None when one is (see cygemm.gpu_unavailable_reason)."""
    cdef int n = 0
    cdef cudaError_t err = cudaGetDeviceCount(&n)
    if err == cudaSuccess and n > 0:
        return None
    cudaGetLastError()
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA GPU/driver found (the driver library libcuda.so.1 is not installed)"
    if err == cudaSuccess or err == cudaErrorNoDevice:
        return "no NVIDIA GPU found (the driver is installed but sees no device)"
    if err == cudaErrorInsufficientDriver:
        return ("the NVIDIA driver is too old for this CUDA runtime "
                f"(cudaGetDeviceCount: {cudaGetErrorName(err).decode()}); CUDA 13 needs driver >= 580")
    return (f"no usable NVIDIA GPU (cudaGetDeviceCount failed with {cudaGetErrorName(err).decode()}: "
            f"{cudaGetErrorString(err).decode()})")


# Each thread's last contexts by device, in C thread-local storage: the common call finds its
# context without the threading.local and dict lookups. A slot is trusted only while
# _contexts_generation (bumped whenever a context is destroyed) is what it was when filled.
cdef extern from *:
    """
    #if defined(_MSC_VER)
    #define CG_THREAD_LOCAL __declspec(thread)
    #else
    #define CG_THREAD_LOCAL __thread
    #endif
    #define CG_TLS_DEVICES 64
    static CG_THREAD_LOCAL void* cg_tls_context[CG_TLS_DEVICES];
    static CG_THREAD_LOCAL unsigned long long cg_tls_generation;
    """
    int CG_TLS_DEVICES
    void* cg_tls_context[64]
    unsigned long long cg_tls_generation

cdef GemmContext* current_context() except NULL:
    global cg_tls_generation
    cdef int device = 0
    check_cuda(cudaGetDevice(&device), "cudaGetDevice")
    if 0 <= device < CG_TLS_DEVICES and cg_tls_generation == _contexts_generation \
            and cg_tls_context[device] != NULL:
        return <GemmContext*>cg_tls_context[device]
    try:
        contexts = _tls.contexts
    except AttributeError:
        contexts = _tls.contexts = {}
    cdef _Context owner = contexts.get(device)
    if owner is None:
        if device_count() > 1 and _cuStreamGetCtx == NULL:
            _load_driver_entry_points()
        owner = _Context(device)
        contexts[device] = owner
    if 0 <= device < CG_TLS_DEVICES:
        if cg_tls_generation != _contexts_generation:
            memset(cg_tls_context, 0, sizeof(cg_tls_context))
            cg_tls_generation = _contexts_generation
        cg_tls_context[device] = <void*>&owner.ctx
    return &owner.ctx
_keepalive_providers = []


def add_capture_keepalive(provider):
    """Register `provider()`, which returns objects a graph captured now must keep alive
    (layers above register their buffer caches here, so that this module names none of them)."""
    _keepalive_providers.append(provider)


def graph_keepalive():
    """What a graph captured now must keep alive besides its own workspaces: this thread's
    contexts (the handles its cuBLAS calls were recorded with) and what the registered
    providers give."""
    keep = list(getattr(_tls, "contexts", {}).values())
    for provider in _keepalive_providers:
        keep.extend(provider())
    return keep


def destroy_graph_when_safe(uintptr_t exec_, uintptr_t graph):
    """Destroy a CUDA graph and its executable graph now, or once no capture is known open."""
    if exec_:
        _defer_release(RELEASE_GRAPH_EXEC, -1, <void*>exec_)
    if graph:
        _defer_release(RELEASE_GRAPH, -1, <void*>graph)
    with nogil:                 # frees may synchronize the device: other threads run meanwhile
        _drain_if_safe()


def release_workspaces():
    """Free the cuBLAS/cuBLASLt workspaces this thread's contexts hold, on every device.

    The next call on a stream allocates a new one. Workspaces of captured graphs (with any
    capture tool) belong to those graphs and stay until the graphs go. Also frees the
    workspaces queued for freeing (of gone graphs, evicted, of ended threads). cudaFree
    synchronizes the device, which invalidates a capture under way on it in any thread:
    call this when no capture is running.
    """
    cdef _Context owner
    for owner in getattr(_tls, "contexts", {}).values():
        with nogil:
            owner.release(True)
    with nogil:
        _free_deferred(False)


def context_info():
    """This thread's context on the current device: device, handles, workspaces and their bound."""
    cdef GemmContext* ctx = current_context()
    cdef int i, eager = 0
    for i in range(ctx.n_workspaces):
        eager += ctx.workspaces[i].capture_id == 0
    return dict(device=ctx.device, blas=<uintptr_t>ctx.blas, lt=<uintptr_t>ctx.lt,
                workspaces=ctx.n_workspaces, eager_workspaces=eager, capture_workspaces=ctx.n_workspaces - eager,
                max_eager_workspaces=loaded_options().max_stream_workspaces, workspace_bytes=ctx.workspace_bytes)

cdef int _capture_info(cudaStream_t stream, unsigned long long* cid, cudaGraph_t* graph) except -1 nogil:
    """cid: the id of the capture under way on `stream`, 0 if none; graph: its graph."""
    cdef cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone
    cid[0] = 0
    check_cuda(cudaStreamGetCaptureInfo(stream, &status, cid, graph, NULL, NULL, NULL),
               "cudaStreamGetCaptureInfo")
    if status != cudaStreamCaptureStatusActive:
        cid[0] = 0
    return 0


cdef int _evict_lru(GemmContext* ctx, bint capture) except -1 nogil:
    """Drop the least recently used entry of one kind: an eager workspace is freed (its
    stream may be gone: streams come and go); a capture's is only forgotten (its graph owns it)."""
    cdef int i, victim = -1
    for i in range(ctx.n_workspaces):
        if (ctx.workspaces[i].capture_id != 0) == capture and not ctx.workspaces[i].forked and (
                victim < 0 or ctx.workspaces[i].last_use < ctx.workspaces[victim].last_use):
            victim = i
    if victim < 0:
        return 0
    if ctx.bound_workspace == ctx.workspaces[victim].ptr or ctx.bound_workspace == ctx.workspaces[victim].side_ptr:
        ctx.bound = False
    _destroy_side(&ctx.workspaces[victim])
    if not capture:
        _defer_free(ctx.workspaces[victim].ptr)      # freed by _drain_if_safe
        if ctx.workspaces[victim].side_ptr != NULL:
            _defer_free(ctx.workspaces[victim].side_ptr)
    ctx.n_workspaces -= 1
    ctx.workspaces[victim] = ctx.workspaces[ctx.n_workspaces]
    return 0


cdef enum:
    MAX_CAPTURE_ENTRIES = 16   # remembered capture workspaces (they belong to graphs)


cdef int _give_to_graph(void* ptr, cudaGraph_t graph) except -1 nogil:
    """Make `graph` (being captured) own ptr: freed after the graph and its execs are gone."""
    cdef cudaUserObject_t obj = NULL
    cdef cudaError_t err = cudaUserObjectCreate(&obj, ptr, _defer_free, 1, cudaUserObjectNoDestructorSync)
    if err == cudaSuccess:
        err = cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove)
    if err != cudaSuccess:
        if obj == NULL:
            _defer_free(ptr)
        else:
            cudaUserObjectRelease(obj, 1)      # its destructor queues ptr to be freed
        return check_cuda(err, "cudaUserObjectCreate/cudaGraphRetainUserObject")
    return 0


cdef int _entry(GemmContext* ctx, cudaStream_t stream, bint create=True) except -1 nogil:
    """Index of the workspace entry of `stream` (or of the capture under way on it), made on
    first use (create False: -2 instead of making it)."""
    cdef unsigned long long cid = 0
    cdef cudaGraph_t graph = NULL
    _capture_info(stream, &cid, &graph)
    if cid != 0 or _n_open_captures > 0:
        _note_capture(stream, cid)
    cdef int i, eager = 0
    ctx.use_counter += 1
    for i in range(ctx.n_workspaces):
        if ctx.workspaces[i].stream == stream and ctx.workspaces[i].capture_id == cid:
            ctx.workspaces[i].last_use = ctx.use_counter
            return i
        eager += ctx.workspaces[i].capture_id == 0
    if not create:
        return -2
    if cid == 0 and eager >= loaded_options().max_stream_workspaces:
        _evict_lru(ctx, False)
    elif cid != 0 and ctx.n_workspaces - eager >= MAX_CAPTURE_ENTRIES:
        _evict_lru(ctx, True)
    _drain_if_safe()
    cdef StreamWorkspace* grown
    if ctx.n_workspaces == ctx.cap_workspaces:
        grown = <StreamWorkspace*>realloc(ctx.workspaces, (2 * ctx.cap_workspaces + 4) * sizeof(StreamWorkspace))
        if grown == NULL:
            with gil:
                raise MemoryError()
        ctx.workspaces = grown
        ctx.cap_workspaces = 2 * ctx.cap_workspaces + 4
    cdef void* ptr = NULL
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    check_cuda(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode")
    cdef cudaError_t err = cudaMalloc(&ptr, ctx.workspace_bytes)
    cudaThreadExchangeStreamCaptureMode(&mode)
    check_cuda(err, "cudaMalloc(workspace)")
    if cid != 0:
        _give_to_graph(ptr, graph)
    i = ctx.n_workspaces
    memset(&ctx.workspaces[i], 0, sizeof(StreamWorkspace))
    ctx.workspaces[i].stream = stream
    ctx.workspaces[i].capture_id = cid
    ctx.workspaces[i].ptr = ptr
    ctx.workspaces[i].last_use = ctx.use_counter
    ctx.n_workspaces += 1
    return i


cdef void* _workspace_of(GemmContext* ctx, cudaStream_t stream, bint create) except? NULL nogil:
    cdef int i
    for i in range(ctx.n_workspaces):      # a side stream works in its owner's side workspace
        if ctx.workspaces[i].side == stream and stream != NULL and ctx.workspaces[i].side_ptr != NULL:
            return ctx.workspaces[i].side_ptr
    i = _entry(ctx, stream, create)
    return NULL if i == -2 else ctx.workspaces[i].ptr


cdef void* stream_workspace(GemmContext* ctx, cudaStream_t stream) except NULL nogil:
    return _workspace_of(ctx, stream, True)


cdef void* call_workspace(GemmContext* ctx, cudaStream_t stream) except NULL:
    cdef void* ws = _workspace_of(ctx, stream, False)
    if ws == NULL:
        with nogil:         # the stream's (or capture's) first call allocates: other threads run
            ws = _workspace_of(ctx, stream, True)
    return ws


cdef void _destroy_side(StreamWorkspace* w) noexcept nogil:
    """Destroy an entry's side stream and events (neither call waits for the GPU: work
    still queued there completes first)."""
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    if w.side == NULL and w.fork == NULL and w.join == NULL:
        return
    cudaThreadExchangeStreamCaptureMode(&mode)
    if w.side != NULL:
        cudaStreamDestroy(w.side)
    if w.fork != NULL:
        cudaEventDestroy(w.fork)
    if w.join != NULL:
        cudaEventDestroy(w.join)
    cudaThreadExchangeStreamCaptureMode(&mode)
    w.side, w.fork, w.join = NULL, NULL, NULL


cdef int fork_side(GemmContext* ctx, cudaStream_t stream, cudaStream_t* side, cudaEvent_t* join) except -1 nogil:
    cdef StreamWorkspace* w = &ctx.workspaces[_entry(ctx, stream)]
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    cdef cudaError_t err = cudaSuccess
    cdef unsigned long long cid = 0
    cdef cudaGraph_t graph = NULL
    if w.side == NULL:
        # Creating streams and events, and cudaMalloc, are allowed while this thread
        # captures, in relaxed mode.
        cudaThreadExchangeStreamCaptureMode(&mode)
        err = cudaStreamCreateWithFlags(&w.side, cudaStreamNonBlocking)
        if err == cudaSuccess and w.fork == NULL:
            err = cudaEventCreateWithFlags(&w.fork, cudaEventDisableTiming)
        if err == cudaSuccess and w.join == NULL:
            err = cudaEventCreateWithFlags(&w.join, cudaEventDisableTiming)
        cudaThreadExchangeStreamCaptureMode(&mode)
        if err != cudaSuccess:
            _destroy_side(w)
            check_cuda(err, "cudaStreamCreateWithFlags/cudaEventCreateWithFlags(side stream)")
    if w.side_ptr == NULL:
        cudaThreadExchangeStreamCaptureMode(&mode)
        err = cudaMalloc(&w.side_ptr, ctx.workspace_bytes)
        cudaThreadExchangeStreamCaptureMode(&mode)
        if err != cudaSuccess:
            w.side_ptr = NULL
            check_cuda(err, "cudaMalloc(side workspace)")
        if w.capture_id != 0:          # a capture's entry: its graph owns this one too
            _capture_info(stream, &cid, &graph)
            _give_to_graph(w.side_ptr, graph)
    check_cuda(cudaEventRecord(w.fork, stream), "cudaEventRecord(fork)")
    check_cuda(cudaStreamWaitEvent(w.side, w.fork, 0), "cudaStreamWaitEvent(fork)")
    w.forked = True
    side[0], join[0] = w.side, w.join
    return 0


cdef int join_side(GemmContext* ctx, cudaStream_t stream, cudaStream_t side, cudaEvent_t join,
                   bint quiet) except -1 nogil:
    cdef int i
    for i in range(ctx.n_workspaces):
        if ctx.workspaces[i].side == side:
            ctx.workspaces[i].forked = False
    cdef cudaError_t err = cudaEventRecord(join, side)
    if err == cudaSuccess:
        err = cudaStreamWaitEvent(stream, join, 0)
    if quiet:
        return 0
    return check_cuda(err, "cudaEventRecord/cudaStreamWaitEvent(join)")


cdef void defer_free(void* ptr) noexcept nogil:
    _defer_free(ptr)
    _drain_if_safe()


cdef int bind_stream(GemmContext* ctx, cudaStream_t stream) except -1 nogil:
    cdef void* ws = stream_workspace(ctx, stream)
    if ctx.bound and ctx.bound_stream == stream and ctx.bound_workspace == ws:
        return 0
    ctx.bound = False
    check_cublas(cublasSetStream(ctx.blas, stream), "cublasSetStream")
    check_cublas(cublasSetWorkspace(ctx.blas, ws, ctx.workspace_bytes), "cublasSetWorkspace")
    ctx.bound_stream = stream
    ctx.bound_workspace = ws
    ctx.bound = True
    return 0

# ---------------------------------------------------------------- streams

cdef object _cupy_current_stream_ptr():
    """CuPy's current stream; CuPy's own CUDA error (e.g. no driver) as cygemm's CudaError."""
    try:
        return _current_stream().ptr
    except Exception as exc:
        status = getattr(exc, "status", None)
        if type(exc).__name__ == "CUDARuntimeError" and isinstance(status, int):
            raise CudaError(status, "cupy.cuda.get_current_stream (stream=None)") from exc
        raise


cdef int stream_from_object(object stream, cudaStream_t* out) except -1:
    if stream is None:
        out[0] = <cudaStream_t><uintptr_t>(_cupy_current_stream_ptr() if _current_stream is not None else 0)
    elif type(stream) is int:
        if stream < 0:
            raise ValueError(f"stream: expected a cudaStream_t handle (int >= 0), got {stream}")
        out[0] = <cudaStream_t><uintptr_t>stream
    elif hasattr(stream, "ptr"):                 # cupy.cuda.Stream / ExternalStream
        out[0] = <cudaStream_t><uintptr_t>stream.ptr
    elif hasattr(stream, "__cuda_stream__"):     # CUDA stream protocol (cuda.core, numba)
        out[0] = <cudaStream_t><uintptr_t>stream.__cuda_stream__()[1]
    elif hasattr(stream, "cuda_stream"):         # torch.cuda.Stream
        out[0] = <cudaStream_t><uintptr_t>stream.cuda_stream
    else:
        raise TypeError("stream: expected None, a cupy.cuda.Stream, an object with "
                        f"__cuda_stream__, or an int cudaStream_t; got {type(stream).__name__}")
    return 0


cdef bint stream_is_capturing(cudaStream_t stream) except -1 nogil:
    cdef cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone
    check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing")
    return status != cudaStreamCaptureStatusNone


def is_capturing(stream=None):
    """Whether `stream` (as cygemm resolves it) is being captured into a CUDA graph."""
    cdef cudaStream_t s
    stream_from_object(stream, &s)
    return stream_is_capturing(s)


def stream_pointer(stream=None):
    """The raw cudaStream_t (int) that `stream` denotes, as cygemm resolves it."""
    cdef cudaStream_t s
    stream_from_object(stream, &s)
    return <uintptr_t>s

# The stream's device, through the driver: cudaStreamGetDevice (cuStreamGetDevice) is
# refused while the stream is being captured (cudaErrorStreamCaptureUnsupported, seen on a
# two-GPU H200 host), cuStreamGetCtx is not. Looked up once, when there are several GPUs.
ctypedef int (*_cuStreamGetCtx_t)(cudaStream_t, void**) noexcept nogil
ctypedef int (*_cuCtxGetDevice_v2_t)(int*, void*) noexcept nogil
cdef _cuStreamGetCtx_t _cuStreamGetCtx = NULL
cdef _cuCtxGetDevice_v2_t _cuCtxGetDevice_v2 = NULL


cdef int _load_driver_entry_points() except -1:
    global _cuStreamGetCtx, _cuCtxGetDevice_v2
    cdef void* fn = NULL
    cdef cudaDriverEntryPointQueryResult found
    if cudaGetDriverEntryPointByVersion(b"cuStreamGetCtx", &fn, 9020, cudaEnableDefault, &found) == cudaSuccess \
            and found == cudaDriverEntryPointSuccess:
        _cuStreamGetCtx = <_cuStreamGetCtx_t>fn
    fn = NULL
    # The base name at 13000 is the two-argument cuCtxGetDevice_v2 (at 12080 it is the
    # one-argument v1, which reports the current device); "cuCtxGetDevice_v2" is not found.
    if cudaGetDriverEntryPointByVersion(b"cuCtxGetDevice", &fn, 13000, cudaEnableDefault, &found) == cudaSuccess \
            and found == cudaDriverEntryPointSuccess:
        _cuCtxGetDevice_v2 = <_cuCtxGetDevice_v2_t>fn
    cudaGetLastError()
    return 0


cdef int stream_device(cudaStream_t stream, int* device) except -1:
    """The stream's device; left as given (unchecked) when only cudaStreamGetDevice could
    tell and the stream is capturing: that call would invalidate the capture."""
    cdef void* sctx = NULL
    cdef int rc
    if _cuStreamGetCtx != NULL and _cuCtxGetDevice_v2 != NULL:
        rc = _cuStreamGetCtx(stream, &sctx)
        if rc == 0:
            rc = _cuCtxGetDevice_v2(device, sctx)
        return check_driver(rc, "cuStreamGetCtx/cuCtxGetDevice_v2 (the stream's device)")
    if stream_is_capturing(stream):
        return 0
    return check_cuda(cudaStreamGetDevice(stream, device), "cudaStreamGetDevice")


def versions():
    """Versions of what cygemm was built with and runs on (no GPU needed for the first two)."""
    cdef int rt = 0, drv = 0
    cudaRuntimeGetVersion(&rt)
    cudaDriverGetVersion(&drv)
    return {"cuda_runtime": rt, "cuda_driver": drv, "cublasLt": cublasLtGetVersion()}


cdef int known_device_count() noexcept nogil:
    return _device_count


def current_device():
    """The CUDA device current on this thread (cudaGetDevice)."""
    cdef int device = 0
    check_cuda(cudaGetDevice(&device), "cudaGetDevice")
    return device
