# cython: language_level=3, boundscheck=False, wraparound=False
"""Errors, handles, streams and array views: the core every cygemm module uses."""
import contextlib
import threading

from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t, uintptr_t
from libc.stdlib cimport realloc, free
from libc.string cimport memset
from cpython.pythread cimport (PyThread_type_lock, PyThread_allocate_lock, PyThread_acquire_lock,
                               PyThread_release_lock, WAIT_LOCK)

from cygemm.cudart cimport *
from cygemm.cublas cimport *
from cygemm.cublaslt cimport cublasLtHandle_t, cublasLtCreate, cublasLtDestroy, cublasLtGetVersion

try:
    import cupy as _cupy
    _cupy_ndarray = _cupy.ndarray
    _current_stream = _cupy.cuda.get_current_stream
except ImportError:  # cupy is needed only for allocating forms and stream=None
    _cupy = None
    _cupy_ndarray = None
    _current_stream = None

# cuBLAS recommends 32 MiB of workspace on Hopper; smaller chips use less.
cdef enum:
    WORKSPACE_BYTES = 32 * 1024 * 1024


# ---------------------------------------------------------------- errors

class CygemmError(RuntimeError):
    """A CUDA, cuBLAS or cuBLASLt call failed."""


class CudaError(CygemmError):
    def __init__(self, int status, str call):
        self.status = status
        self.call = call
        self.name = cudaGetErrorName(<cudaError_t>status).decode()
        super().__init__(f"{call} failed with {self.name} ({status}): "
                         f"{cudaGetErrorString(<cudaError_t>status).decode()}")

    def __reduce__(self):
        return (type(self), (self.status, self.call))


class CublasError(CygemmError):
    def __init__(self, int status, str call):
        self.status = status
        self.call = call
        self.name = cublasGetStatusName(<cublasStatus_t>status).decode()
        super().__init__(f"{call} failed with {self.name} ({status}): "
                         f"{cublasGetStatusString(<cublasStatus_t>status).decode()}")

    def __reduce__(self):
        return (type(self), (self.status, self.call))


cdef int check_cuda(cudaError_t status, const char* call) except -1 nogil:
    if status == cudaSuccess:
        return 0
    with gil:
        cudaGetLastError()  # clear the sticky-free error so the next call starts clean
        raise CudaError(<int>status, call.decode())


cdef int check_cublas(cublasStatus_t status, const char* call) except -1 nogil:
    if status == CUBLAS_STATUS_SUCCESS:
        return 0
    with gil:
        raise CublasError(<int>status, call.decode())


# ---------------------------------------------------------------- handles

cdef int _max_eager_workspaces() except -1:
    import os
    value = os.environ.get("CYGEMM_MAX_STREAM_WORKSPACES", "8")
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"CYGEMM_MAX_STREAM_WORKSPACES: expected an integer >= 1, got {value!r}")
    return n


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
        self.ctx.max_eager = _max_eager_workspaces()
        cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
        # Creating handles may allocate: allowed even while another stream of
        # this thread is being captured.
        check_cuda(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode")
        try:
            check_cublas(cublasCreate(&self.ctx.blas), "cublasCreate")
            check_cublas(cublasLtCreate(&self.ctx.lt), "cublasLtCreate")
        finally:
            cudaThreadExchangeStreamCaptureMode(&mode)

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
        _drain_if_safe()

    @property
    def device(self):
        return self.ctx.device

    @property
    def n_workspaces(self):
        return self.ctx.n_workspaces


# What waits to be released: workspaces of captures once their graph is gone (CUDA runs a
# user object's destructor on its own thread, where no CUDA call may be made), evicted ones,
# and the workspaces and cuBLAS/cuBLASLt handles of ended threads (cublasDestroy synchronizes
# the device, as cudaFree does, so it would invalidate captures other threads have open). The
# next workspace allocation or thread end releases the queue when no capture is known to be
# open; release_workspaces() releases it regardless.
cdef enum _ReleaseKind:
    RELEASE_WORKSPACE = 0
    RELEASE_BLAS = 1
    RELEASE_LT = 2

ctypedef struct _Deferred:
    int kind
    int device
    void* ptr

cdef PyThread_type_lock _deferred_lock = PyThread_allocate_lock()
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
    if cudaGetDevice(&current) == cudaSuccess and current != item.device:
        cudaSetDevice(item.device)
    if item.kind == RELEASE_BLAS:
        cublasDestroy(<cublasHandle_t>item.ptr)
    else:
        cublasLtDestroy(<cublasLtHandle_t>item.ptr)
    if current >= 0 and current != item.device:
        cudaSetDevice(current)
    cudaThreadExchangeStreamCaptureMode(&mode)


cdef void _free_deferred() noexcept nogil:
    global _n_deferred
    cdef _Deferred item
    while True:
        PyThread_acquire_lock(_deferred_lock, WAIT_LOCK)
        if _n_deferred == 0:
            PyThread_release_lock(_deferred_lock)
            return
        _n_deferred -= 1
        item = _deferred[_n_deferred]
        PyThread_release_lock(_deferred_lock)
        _release_now(item)


def pending_workspace_frees():
    """How many workspaces and handles wait to be released (for tests)."""
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


def note_capture(stream):
    """Record whether `stream` is capturing now (cygemm.graph.capture calls this at both ends)."""
    cdef cudaStream_t s
    cdef unsigned long long cid = 0
    stream_from_object(stream, &s)
    _capture_info(s, &cid, NULL)
    _note_capture(s, cid)
    _drain_if_safe()            # what waited for the captures to end


def open_capture_count():
    """How many captures cygemm knows to be open (see note_capture)."""
    return _n_open_captures


# Graphs dropped while captures were open: destroying one then may invalidate them.
_pending_graphs = []
cdef int _n_pending_graphs = 0


def destroy_graph_when_safe(uintptr_t exec_, uintptr_t graph):
    """Destroy a CUDA graph and its executable graph now, or once no capture is known open."""
    global _n_pending_graphs
    if exec_ or graph:
        _pending_graphs.append((exec_, graph))
        _n_pending_graphs = len(_pending_graphs)
    if _n_open_captures == 0:
        _destroy_pending_graphs()


cdef void _destroy_pending_graphs() noexcept with gil:
    global _n_pending_graphs
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    while _pending_graphs:
        e, g = _pending_graphs.pop()
        _n_pending_graphs = len(_pending_graphs)
        # Relaxed: a graph is often dropped inside the next capture of this thread
        # (`with capture(s) as g` rebinds g); destroying it is an "unsafe" call.
        cudaThreadExchangeStreamCaptureMode(&mode)
        if e:
            cudaGraphExecDestroy(<cudaGraphExec_t><uintptr_t>e)
        if g:
            cudaGraphDestroy(<cudaGraph_t><uintptr_t>g)
        cudaThreadExchangeStreamCaptureMode(&mode)


cdef void _drain_if_safe() noexcept nogil:
    if _n_open_captures == 0:
        if _n_pending_graphs:
            _destroy_pending_graphs()
        _free_deferred()


cdef object _tls = threading.local()
cdef int _device_count = -1


def device_count():
    """Number of visible CUDA devices (cached); raises CudaError without a driver."""
    global _device_count
    cdef int n = 0
    if _device_count < 0:
        check_cuda(cudaGetDeviceCount(&n), "cudaGetDeviceCount")
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


# Buffers of ensure_workspaces (the backward's dZ, a cuBLASLt workspace), one set per
# (device, stream, name, shape, dtype): work on one stream is serial, so they are never used
# by two kernels at once. Allocated on that stream; process-wide, under a lock.
_stream_buffers = {}
_stream_buffers_lock = threading.Lock()


def stream_buffer(str name, tuple shape, dtype, stream=None):
    """The cached CuPy buffer `name` of this shape and dtype for `stream` on the current device,
    allocated (on that stream) the first time. Refused while the stream is being captured."""
    cdef cudaStream_t s
    stream_from_object(stream, &s)
    cdef int device = 0
    check_cuda(cudaGetDevice(&device), "cudaGetDevice")
    key = (device, <uintptr_t>s, name, shape, str(dtype))
    with _stream_buffers_lock:
        buf = _stream_buffers.get(key)
        if buf is None:
            if stream_is_capturing(s):
                raise RuntimeError(f"{name}: allocating it would break the stream's capture; call "
                                   "ensure_workspaces once on this stream before capturing")
            if _cupy is None:
                raise RuntimeError("ensure_workspaces needs CuPy to allocate")
            buf = _empty_on(shape, dtype, <uintptr_t>s)
            _stream_buffers[key] = buf
        return buf


def all_stream_buffers():
    """Every cached buffer: what a graph captured now may use (a buffer made for one stream
    may be passed to a call on another)."""
    with _stream_buffers_lock:
        return list(_stream_buffers.values())


def clear_stream_buffers():
    """Forget every cached buffer; a graph that uses one keeps it alive."""
    with _stream_buffers_lock:
        _stream_buffers.clear()


def stream_buffer_keys():
    with _stream_buffers_lock:
        return list(_stream_buffers)


def graph_keepalive():
    """What a graph captured now must keep alive besides its own workspaces: this thread's
    contexts (the handles its cuBLAS calls were recorded with)."""
    return list(getattr(_tls, "contexts", {}).values())


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
        owner.release(True)
    _destroy_pending_graphs()     # their workspaces are freed once CUDA runs the destructors
    _free_deferred()


def context_info():
    """This thread's context on the current device: device, handles, workspaces and their bound."""
    cdef GemmContext* ctx = current_context()
    cdef int i, eager = 0
    for i in range(ctx.n_workspaces):
        eager += ctx.workspaces[i].capture_id == 0
    return dict(device=ctx.device, blas=<uintptr_t>ctx.blas, lt=<uintptr_t>ctx.lt,
                workspaces=ctx.n_workspaces, eager_workspaces=eager, capture_workspaces=ctx.n_workspaces - eager,
                max_eager_workspaces=ctx.max_eager, workspace_bytes=ctx.workspace_bytes)


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


cdef int _entry(GemmContext* ctx, cudaStream_t stream) except -1 nogil:
    """Index of the workspace entry of `stream` (or of the capture under way on it), made on first use."""
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
    if cid == 0 and eager >= ctx.max_eager:
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


cdef void* stream_workspace(GemmContext* ctx, cudaStream_t stream) except NULL nogil:
    cdef int i
    for i in range(ctx.n_workspaces):      # a side stream works in its owner's side workspace
        if ctx.workspaces[i].side == stream and stream != NULL and ctx.workspaces[i].side_ptr != NULL:
            return ctx.workspaces[i].side_ptr
    return ctx.workspaces[_entry(ctx, stream)].ptr


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


# ---------------------------------------------------------------- arrays

cdef extern from *:
    """
    /* DLPack v0.x ABI, enough to read a tensor's description. */
    typedef struct { int32_t device_type; int32_t device_id; } cg_DLDevice;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } cg_DLDataType;
    typedef struct {
        void* data; cg_DLDevice device; int32_t ndim; cg_DLDataType dtype;
        int64_t* shape; int64_t* strides; uint64_t byte_offset;
    } cg_DLTensor;
    """
    ctypedef struct cg_DLDevice:
        int32_t device_type
        int32_t device_id
    ctypedef struct cg_DLDataType:
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct cg_DLTensor:
        void* data
        cg_DLDevice device
        int32_t ndim
        cg_DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset

cdef enum:
    DL_FLOAT = 2
    DL_BFLOAT = 4
    DL_CUDA = 2

# typestr -> (cudaDataType, itemsize); float64 only where the caller accepts it (wide).
_DTYPES = {"<f4": (CUDA_R_32F, 4), "<f2": (CUDA_R_16F, 2)}
_WIDE_DTYPES = {"<f4": (CUDA_R_32F, 4), "<f2": (CUDA_R_16F, 2), "<f8": (CUDA_R_64F, 8)}
_F32, _F16, _F64 = _DTYPES["<f4"], _DTYPES["<f2"], _WIDE_DTYPES["<f8"]
import numpy as _np
_NP_F32, _NP_F16 = _np.dtype("float32"), _np.dtype("float16")


cdef object dtype_name(cudaDataType dtype):
    if dtype == CUDA_R_32F:
        return "float32"
    if dtype == CUDA_R_16F:
        return "float16"
    if dtype == CUDA_R_16BF:
        return "bfloat16"
    if dtype == CUDA_R_64F:
        return "float64"
    return f"cudaDataType {<int>dtype}"


cdef str _expected(bint wide):
    return "float16, bfloat16, float32 or float64" if wide else "float32 or float16"


cdef int _fill_desc(ArrayDesc* d, str name, uintptr_t ptr, tuple shape, object strides, int itemsize,
                    int device) except -1:
    cdef int ndim = len(shape), i
    if ndim > MAX_NDIM:
        raise ValueError(f"{name}: expected at most {MAX_NDIM} dimensions, got {ndim}")
    cdef int64_t expect = 1
    d.ptr, d.ndim, d.itemsize, d.device = <char*>ptr, ndim, itemsize, device
    # C-contiguous; also for an empty array, whose strides are meaningless (CuPy gives 0s).
    if strides is None or 0 in shape:
        for i in range(ndim - 1, -1, -1):
            d.shape[i] = shape[i]
            d.strides[i] = expect
            expect *= d.shape[i]
        return 0
    cdef int64_t st
    for i in range(ndim):
        d.shape[i] = shape[i]
        st = strides[i]
        if st % itemsize:
            raise ValueError(f"{name}: stride {st} bytes on axis {i} is not a multiple "
                             f"of the element size ({itemsize} bytes)")
        d.strides[i] = st // itemsize
    return 0


cdef tuple desc_shape(const ArrayDesc* d):
    return tuple([d.shape[i] for i in range(d.ndim)])


cdef int read_array(object x, ArrayDesc* d, str name, bint wide) except -1:
    """Read pointer, shape, strides, dtype and device of a device array, once, without touching
    the GPU. wide: float64 too (else float32, float16, bfloat16)."""
    cdef object dt
    if _cupy_ndarray is not None and type(x) is _cupy_ndarray:    # fast path: no dict built
        dt_obj = x.dtype
        # NumPy's builtin dtypes are singletons: identity beats building dtype.str.
        dt = _F32 if dt_obj is _NP_F32 else (_F16 if dt_obj is _NP_F16 else (
            _WIDE_DTYPES if wide else _DTYPES).get(dt_obj.str))
        if dt is None:
            raise TypeError(f"{name}: expected {_expected(wide)}, got {x.dtype}")
        d.dtype = <cudaDataType>(<int>dt[0])
        mem = x.data        # its device_id spares check_devices a cudaPointerGetAttributes
        return _fill_desc(d, name, mem.ptr, x.shape, x.strides, dt[1], mem.device_id)
    if _torch_tensor is not None and isinstance(x, _torch_tensor):
        return _read_torch(x, d, name, wide)
    if _torch_tensor is None and type(x).__module__.startswith("torch") and _find_torch():
        return read_array(x, d, name, wide)
    cdef object cai
    try:
        cai = x.__cuda_array_interface__
    except AttributeError:
        cai = None
    except (TypeError, BufferError, RuntimeError):  # e.g. torch bfloat16: use DLPack
        cai = None
    if cai is not None:
        dt = (_WIDE_DTYPES if wide else _DTYPES).get(cai["typestr"])
        if dt is None and hasattr(x, "__dlpack__"):
            # CAI has no bfloat16 typestr (torch says '<V2'); DLPack names it.
            return _read_dlpack(x, d, name, wide)
        if dt is None:
            raise TypeError(f"{name}: expected {_expected(wide)}, got typestr {cai['typestr']!r}")
        d.dtype = <cudaDataType>(<int>dt[0])
        return _fill_desc(d, name, cai["data"][0], tuple(cai["shape"]), cai.get("strides"), dt[1], -1)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return _read_dlpack(x, d, name, wide)
    raise TypeError(f"{name}: expected a CUDA device array (__cuda_array_interface__ or DLPack "
                    f"on a CUDA device), got {type(x).__module__}.{type(x).__name__}")


cdef int view_from_object(object x, MatrixView* view, str name, int min_ndim, int max_ndim) except -1:
    """A (batch, rows, cols) view of a device array of min_ndim..max_ndim (<= 3) dimensions;
    a 1-D array is one row."""
    cdef ArrayDesc d
    read_array(x, &d, name, False)
    cdef int ndim = d.ndim
    if ndim < min_ndim or ndim > max_ndim:
        want = f"{min_ndim}-D" if min_ndim == max_ndim else f"{min_ndim}-D or {max_ndim}-D"
        raise ValueError(f"{name}: expected a {want} array, got {ndim}-D with shape {desc_shape(&d)}")
    view.ptr, view.itemsize, view.device, view.dtype = d.ptr, d.itemsize, d.device, d.dtype
    if ndim == 1:                             # a vector is one row
        view.rows, view.cols = 1, d.shape[0]
        view.row_stride, view.col_stride = d.shape[0], d.strides[0]
        view.batch, view.batch_stride = 1, 0
        return 0
    view.rows, view.cols = d.shape[ndim - 2], d.shape[ndim - 1]
    view.row_stride, view.col_stride = d.strides[ndim - 2], d.strides[ndim - 1]
    if ndim == 3:
        view.batch, view.batch_stride = d.shape[0], d.strides[0]
    else:
        view.batch, view.batch_stride = 1, 0
    return 0


# torch tensors are read through their attributes: torch's __cuda_array_interface__
# and __dlpack__ cost several microseconds a call, refuse tensors that require grad
# (CAI) or cannot name bfloat16 (CAI).
cdef object _torch_tensor = None
cdef dict _torch_dtypes = None
cdef object _torch_f64 = None


cdef bint _find_torch() except -1:
    global _torch_tensor, _torch_dtypes, _torch_f64
    import sys
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor"):
        return False
    _torch_dtypes = {torch.float32: (CUDA_R_32F, 4), torch.float16: (CUDA_R_16F, 2),
                     torch.bfloat16: (CUDA_R_16BF, 2)}
    _torch_f64 = torch.float64
    _torch_tensor = torch.Tensor
    return True


cdef int _read_torch(object x, ArrayDesc* d, str name, bint wide) except -1:
    if not x.is_cuda:
        raise TypeError(f"{name}: expected a CUDA tensor, got a torch tensor on {x.device}")
    dt = _torch_dtypes.get(x.dtype)
    if dt is None and wide and x.dtype == _torch_f64:
        dt = _F64
    if dt is None:
        raise TypeError(f"{name}: expected {_expected(wide).replace('float32 or float16', 'float32, float16 or bfloat16')}, "
                        f"got {x.dtype}")
    d.dtype = <cudaDataType>(<int>dt[0])
    itemsize = dt[1]
    strides = tuple([st * itemsize for st in x.stride()])
    return _fill_desc(d, name, x.data_ptr(), tuple(x.shape), strides, itemsize, x.get_device())


cdef int _read_dlpack(object x, ArrayDesc* d, str name, bint wide) except -1:
    dev = x.__dlpack_device__()
    if int(dev[0]) != DL_CUDA:
        raise TypeError(f"{name}: expected an array on a CUDA device, got "
                        f"{type(x).__module__}.{type(x).__name__} on DLPack device type {dev[0]}")
    # The capsule keeps its own reference; x outlives this call, so the memory does too.
    capsule = x.__dlpack__(stream=-1)
    if not PyCapsule_IsValid(capsule, b"dltensor"):
        raise TypeError(f"{name}: __dlpack__ returned no 'dltensor' capsule")
    cdef cg_DLTensor* t = <cg_DLTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
    cdef int itemsize
    if t.dtype.lanes == 1 and t.dtype.bits == 16 and t.dtype.code == DL_BFLOAT:
        d.dtype = CUDA_R_16BF
    elif t.dtype.lanes == 1 and t.dtype.bits == 16 and t.dtype.code == DL_FLOAT:
        d.dtype = CUDA_R_16F
    elif t.dtype.lanes == 1 and t.dtype.bits == 32 and t.dtype.code == DL_FLOAT:
        d.dtype = CUDA_R_32F
    elif wide and t.dtype.lanes == 1 and t.dtype.bits == 64 and t.dtype.code == DL_FLOAT:
        d.dtype = CUDA_R_64F
    else:
        raise TypeError(f"{name}: expected {_expected(wide).replace('float32 or float16', 'float32, float16 or bfloat16')}, "
                        f"got DLPack dtype (code={t.dtype.code}, bits={t.dtype.bits}, lanes={t.dtype.lanes})")
    itemsize = t.dtype.bits // 8
    shape = tuple([t.shape[i] for i in range(t.ndim)])
    strides = None if t.strides == NULL else tuple([t.strides[i] * itemsize for i in range(t.ndim)])
    return _fill_desc(d, name, <uintptr_t>t.data + t.byte_offset, shape, strides, itemsize,
                      t.device.device_id)


def describe_array(x, str name="x"):
    """How cygemm reads `x`: dict of ptr, batch, rows, cols, strides (elements), dtype."""
    cdef MatrixView v
    view_from_object(x, &v, name, 2, 3)
    return dict(ptr=<uintptr_t>v.ptr, batch=v.batch, rows=v.rows, cols=v.cols,
                batch_stride=v.batch_stride, row_stride=v.row_stride, col_stride=v.col_stride,
                dtype=dtype_name(v.dtype))


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


cdef int _stream_device(cudaStream_t stream, int* device) except -1:
    """The stream's device; left as given (unchecked) when only cudaStreamGetDevice could
    tell and the stream is capturing: that call would invalidate the capture."""
    cdef void* sctx = NULL
    cdef int rc
    if _cuStreamGetCtx != NULL and _cuCtxGetDevice_v2 != NULL:
        rc = _cuStreamGetCtx(stream, &sctx)
        if rc == 0:
            rc = _cuCtxGetDevice_v2(device, sctx)
        if rc != 0:
            raise CudaError(400, f"cuStreamGetCtx/cuCtxGetDevice_v2 (CUresult {rc})")  # 400: invalid handle
        return 0
    if stream_is_capturing(stream):
        return 0
    return check_cuda(cudaStreamGetDevice(stream, device), "cudaStreamGetDevice")


cdef int check_devices(GemmContext* ctx, cudaStream_t stream, const MatrixView** views, list names) except -1:
    if _device_count < 2:      # set when the first context was made, before any check
        return 0
    cdef int stream_device = ctx.device, i
    _stream_device(stream, &stream_device)
    if stream_device != ctx.device:
        raise ValueError(f"stream: the stream belongs to device {stream_device} but the call runs on "
                         f"device {ctx.device} (make that device current)")
    cdef cudaPointerAttributes attr
    cdef const MatrixView* v
    for i in range(len(names)):
        v = views[i]
        if v == NULL or v.ptr == NULL or _empty(v):    # not given, not allocated yet, or empty
            continue
        if v.device == ctx.device:      # the array object named its device (CuPy, torch, DLPack)
            continue
        check_cuda(cudaPointerGetAttributes(&attr, v.ptr), "cudaPointerGetAttributes")
        if attr.type != cudaMemoryTypeDevice and attr.type != cudaMemoryTypeManaged:
            raise ValueError(f"{names[i]}: expected device memory, got a pointer of memory type "
                             f"{<int>attr.type} (host memory)")
        if attr.type == cudaMemoryTypeDevice and attr.device != ctx.device:
            raise ValueError(f"{names[i]}: the array is on device {attr.device} but the call runs on "
                             f"device {ctx.device} (make that device current)")
    return 0


cdef inline bint _empty(const MatrixView* v) noexcept nogil:
    return v.rows == 0 or v.cols == 0 or v.batch == 0


cdef void _byte_range(const MatrixView* v, int64_t* lo, int64_t* hi) noexcept nogil:
    """[lo, hi): the bytes a non-empty view can touch."""
    cdef int64_t start = <int64_t><uintptr_t>v.ptr, span
    lo[0] = start
    hi[0] = start + v.itemsize
    cdef int64_t sizes[3]
    cdef int64_t strides[3]
    sizes[0], sizes[1], sizes[2] = v.batch, v.rows, v.cols
    strides[0], strides[1], strides[2] = v.batch_stride, v.row_stride, v.col_stride
    for i in range(3):
        span = (sizes[i] - 1) * strides[i] * v.itemsize
        if span < 0:
            lo[0] += span
        else:
            hi[0] += span


cdef bint _as_lines(const MatrixView* v, int64_t* n, int64_t* length, int64_t* ld) noexcept nogil:
    """The memory of 2-D view v as n segments of `length` contiguous elements, ld apart
    (ld 0: one segment). False when v is not such a view (no unit-stride axis, batches)."""
    if v.batch != 1:
        return False
    cdef int64_t count, stride
    if v.rows == 1 or v.cols == 1:          # a vector: one segment, or segments of one
        count = v.rows * v.cols
        stride = v.col_stride if v.cols > 1 else v.row_stride
        if count == 1 or stride == 1:
            n[0], length[0], ld[0] = 1, count, 0
        elif stride > 0:
            n[0], length[0], ld[0] = count, 1, stride
        else:
            return False
    elif v.col_stride == 1:                 # rows are the segments
        n[0], length[0], ld[0] = v.rows, v.cols, v.row_stride
    elif v.row_stride == 1:                 # columns are the segments
        n[0], length[0], ld[0] = v.cols, v.rows, v.col_stride
    else:
        return False
    return True


cdef bint _blocks_overlap(const MatrixView* x, const MatrixView* y) noexcept nogil:
    """Whether two views with overlapping byte ranges share an element. Exact when both
    are blocks of one matrix (segments of contiguous elements, one distance ld apart);
    True (conservative) otherwise."""
    if x.itemsize != y.itemsize:
        return True
    cdef int64_t xn, xl, xld, yn, yl, yld, ld, base, ox, oy
    if not (_as_lines(x, &xn, &xl, &xld) and _as_lines(y, &yn, &yl, &yld)):
        return True
    if xld and yld and xld != yld:
        return True
    ld = xld if xld else yld
    if ld == 0:
        return True          # two contiguous segments: their byte ranges are exact
    if xl > ld or yl > ld:
        return True
    base = min(<int64_t><uintptr_t>x.ptr, <int64_t><uintptr_t>y.ptr)
    ox = <int64_t><uintptr_t>x.ptr - base
    oy = <int64_t><uintptr_t>y.ptr - base
    if ox % x.itemsize or oy % x.itemsize:
        return True
    ox //= x.itemsize
    oy //= x.itemsize
    if ox % ld + xl > ld or oy % ld + yl > ld:     # a block that wraps past the line's end
        return True
    return (ox // ld < oy // ld + yn and oy // ld < ox // ld + xn and
            ox % ld < oy % ld + yl and oy % ld < ox % ld + xl)


cdef bint views_overlap(const MatrixView* x, const MatrixView* y) noexcept nogil:
    if _empty(x) or _empty(y):
        return False
    cdef int64_t lo1, hi1, lo2, hi2
    _byte_range(x, &lo1, &hi1)
    _byte_range(y, &lo2, &hi2)
    return not (hi1 <= lo2 or hi2 <= lo1) and _blocks_overlap(x, y)


cdef int check_no_overlap(const MatrixView* out, str out_name, const MatrixView* other,
                          str other_name) except -1:
    if not views_overlap(out, other):
        return 0
    cdef int64_t lo1, hi1, lo2, hi2
    _byte_range(out, &lo1, &hi1)
    _byte_range(other, &lo2, &hi2)
    raise ValueError(f"{out_name}: its memory overlaps {other_name} (bytes "
                     f"[{lo1:#x}, {hi1:#x}) and [{lo2:#x}, {hi2:#x})); cuBLAS and cygemm's kernels "
                     f"need outputs that share no memory with the other arguments")


def arrays_overlap(x, y):
    """Whether cygemm would treat device arrays x and y as sharing memory (the check every
    output goes through). Exact for two 2-D views of one leading dimension; otherwise by
    address ranges, so it may say True for interleaved views that share no element."""
    cdef MatrixView a, b
    view_from_object(x, &a, "x", 1, 3)
    view_from_object(y, &b, "y", 1, 3)
    return views_overlap(&a, &b)


class _RawStream:
    """A cudaStream_t as the CUDA stream protocol (__cuda_stream__) presents it."""
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


cdef object _cupy_stream(uintptr_t ptr):
    """A CuPy stream object for the raw stream `ptr`, to make it CuPy's current stream."""
    from_external = getattr(_cupy.cuda.Stream, "from_external", None)     # CuPy >= 14
    if from_external is not None:
        return from_external(_RawStream(ptr))
    return _cupy.cuda.ExternalStream(ptr)


cdef object _empty_on(tuple shape, object dtype, uintptr_t ptr):
    # CuPy's pool hands out blocks by the current stream: a block freed on another stream
    # may still be in use there, so allocate with the call's stream current.
    with stream_context(ptr):
        return _cupy.empty(shape, dtype=dtype)


def stream_context(uintptr_t ptr):
    """A context manager that makes the raw stream `ptr` CuPy's current stream (nothing
    when it is already), so CuPy's allocations and kernels go to it."""
    if _current_stream().ptr == ptr:
        return contextlib.nullcontext()
    return _cupy_stream(ptr)


cdef object empty_array(tuple shape, cudaDataType dtype, cudaStream_t stream):
    if _cupy is None:
        raise RuntimeError("out=None needs CuPy to allocate the result; pass out= instead")
    return _empty_on(shape, dtype_name(dtype), <uintptr_t>stream)


def empty(shape, dtype, stream=None, str what="the result"):
    """A C-ordered CuPy array from CuPy's pool on `stream` (None: CuPy's current stream).
    RuntimeError, naming `what`, while the stream is being captured."""
    cdef cudaStream_t s
    stream_from_object(stream, &s)
    if stream_is_capturing(s):
        raise RuntimeError(f"{what}: allocating it would use device memory while the stream is being "
                           "captured; allocate before capturing and use the *_into form")
    name = _np.dtype(dtype).name
    if name not in ("float32", "float16", "float64"):
        raise TypeError(f"dtype: expected float32, float16 or float64, got {name}")
    if _cupy is None:
        raise RuntimeError(f"{what}: allocating needs CuPy")
    return _empty_on(tuple(shape), name, <uintptr_t>s)


def versions():
    """Versions of what cygemm was built with and runs on (no GPU needed for the first two)."""
    cdef int rt = 0, drv = 0
    cudaRuntimeGetVersion(&rt)
    cudaDriverGetVersion(&drv)
    return {"cuda_runtime": rt, "cuda_driver": drv, "cublasLt": cublasLtGetVersion()}
