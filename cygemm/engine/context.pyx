# cython: language_level=3, boundscheck=False, wraparound=False
"""Per (device, thread): the cuBLAS/cuBLASLt handles and the per-stream workspaces.

Everything here is owned by one object per (device, thread), _Context; nothing else creates a
handle or a workspace. What they hold is released through the release queue (cygemm.engine.release).
"""
import threading

from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport realloc, free
from libc.string cimport memset

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport cublasLtCreate, cublasLtGetVersion
from cygemm.engine.errors cimport check_cuda, check_cublas
from cygemm.engine.settings cimport options, loaded_options
from cygemm.engine.types cimport WORKSPACE_ALIGNMENT
from cygemm.engine.errors import CaptureError
# The one no-GPU check and its reason (cygemm.nn and cygemm.backend ask through here).
from cygemm.engine.errors import gpu_unavailable_reason, require_gpu
from cygemm.engine import streams as _streams
from cygemm.engine import lt_features as _lt_features

from cygemm.engine.release cimport (RELEASE_BLAS, RELEASE_LT, defer_release, queue_free, free_now, drain_if_safe,
                                    release_all, note_capture_id, capture_info, open_captures)

# cuBLAS recommends 32 MiB of workspace on Hopper; smaller chips use less.
cdef enum:
    WORKSPACE_BYTES = 32 * 1024 * 1024


# ---------------------------------------------------------------- handles
cdef unsigned long long _contexts_generation = 1     # see current_context


cdef class _Context:
    """Owns one GemmContext: the handles and workspaces of a (device, thread)."""
    cdef GemmContext ctx

    def __cinit__(self, int device):
        self.ctx.device = device
        self.ctx.workspace_bytes = WORKSPACE_BYTES
        options()           # loaded before any context exists: nogil code reads loaded_options()
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
                    free_now(self.ctx.workspaces[i].ptr)
                    if self.ctx.workspaces[i].side_ptr != NULL:
                        free_now(self.ctx.workspaces[i].side_ptr)
                else:
                    queue_free(self.ctx.workspaces[i].ptr)
                    if self.ctx.workspaces[i].side_ptr != NULL:
                        queue_free(self.ctx.workspaces[i].side_ptr)
        self.ctx.n_workspaces = 0
        self.ctx.bound = False
        _destroy_side(&self.ctx.given_side)        # (its memory was a given buffer's)

    def __dealloc__(self):
        global _contexts_generation
        _contexts_generation += 1       # no thread's cached pointer to this context survives
        # At thread end: handles and workspaces wait in the release queue while any
        # capture is open (cublasDestroy and cudaFree synchronize the device).
        self.release(False)
        free(self.ctx.workspaces)
        if self.ctx.lt != NULL:
            defer_release(RELEASE_LT, self.ctx.device, <void*>self.ctx.lt)
        if self.ctx.blas != NULL:
            defer_release(RELEASE_BLAS, self.ctx.device, <void*>self.ctx.blas)
        with nogil:
            drain_if_safe()

    @property
    def device(self):
        return self.ctx.device

    @property
    def n_workspaces(self):
        return self.ctx.n_workspaces

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
        device_count()          # known before the first device check
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


# Buffers cached per (device, stream, name, shape, dtype) for layers above (ensure_workspaces'
# dZ and cuBLASLt workspace): work on one stream is serial, so they are never used by two
# kernels at once. Allocated on that stream; process-wide, under a lock. A graph captured while
# they exist keeps them alive (a keepalive provider).
_stream_buffers = {}
_stream_buffers_lock = threading.Lock()


def stream_buffer(name, tuple shape, dtype, stream, allocate):
    """The buffer `name` of `shape` and `dtype` for `stream` (None: CuPy's current stream) on
    the current device: made once with ``allocate(shape, dtype, stream_ptr)``, then cached.
    CaptureError, naming `name`, where it must be made while the stream is being captured."""
    ptr = _streams.stream_pointer(stream)
    key = (current_device(), ptr, name, shape, str(dtype))
    with _stream_buffers_lock:
        buf = _stream_buffers.get(key)
        if buf is None:
            if _streams.is_capturing(ptr):
                raise CaptureError(f"{name}: allocating it would break the stream's capture; call "
                                   "ensure_workspaces once on this stream before capturing")
            buf = allocate(shape, dtype, ptr)
            _stream_buffers[key] = buf
        return buf


def stream_buffer_keys():
    """The keys (device, stream, name, shape, dtype) of the cached stream buffers."""
    with _stream_buffers_lock:
        return list(_stream_buffers)


def clear_stream_buffers():
    """Forget the cached stream buffers (a graph that uses one keeps it alive)."""
    with _stream_buffers_lock:
        _stream_buffers.clear()


def _all_stream_buffers():
    with _stream_buffers_lock:
        return list(_stream_buffers.values())


add_capture_keepalive(_all_stream_buffers)


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
        release_all()


def context_info():
    """This thread's context on the current device: device, handles, workspaces and their bound."""
    cdef GemmContext* ctx = current_context()
    cdef int i, eager = 0
    for i in range(ctx.n_workspaces):
        eager += ctx.workspaces[i].capture_id == 0
    return dict(device=ctx.device, blas=<uintptr_t>ctx.blas, lt=<uintptr_t>ctx.lt,
                workspaces=ctx.n_workspaces, eager_workspaces=eager, capture_workspaces=ctx.n_workspaces - eager,
                max_eager_workspaces=loaded_options().max_stream_workspaces, workspace_bytes=ctx.workspace_bytes)
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
        queue_free(ctx.workspaces[victim].ptr)      # freed by _drain_if_safe
        if ctx.workspaces[victim].side_ptr != NULL:
            queue_free(ctx.workspaces[victim].side_ptr)
    ctx.n_workspaces -= 1
    ctx.workspaces[victim] = ctx.workspaces[ctx.n_workspaces]
    return 0


cdef enum:
    MAX_CAPTURE_ENTRIES = 16   # remembered capture workspaces (they belong to graphs)

cdef extern from *:
    """
    static unsigned long long cg_workspace_allocations = 0;      /* by every thread: atomic */
    static inline void cg_count_allocation(void) {
    #if defined(_MSC_VER)
        cg_workspace_allocations++;
    #else
        __atomic_fetch_add(&cg_workspace_allocations, 1ULL, __ATOMIC_RELAXED);
    #endif
    }
    """
    unsigned long long cg_workspace_allocations
    void cg_count_allocation() noexcept nogil


def workspace_allocations():
    """How many workspaces (each a stream's, a capture's or a side stream's) cygemm has
    allocated in this process: calls in a given workspace (cygemm.jax's) add none."""
    return cg_workspace_allocations


cdef void _queue_free(void* ptr) noexcept nogil:
    """A CUDA user object's destructor (runs on CUDA's own thread: no CUDA call here)."""
    queue_free(ptr)


cdef int _give_to_graph(void* ptr, cudaGraph_t graph) except -1 nogil:
    """Make `graph` (being captured) own ptr: freed after the graph and its execs are gone."""
    cdef cudaUserObject_t obj = NULL
    cdef cudaError_t err = cudaUserObjectCreate(&obj, ptr, _queue_free, 1, cudaUserObjectNoDestructorSync)
    if err == cudaSuccess:
        err = cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove)
    if err != cudaSuccess:
        if obj == NULL:
            queue_free(ptr)
        else:
            cudaUserObjectRelease(obj, 1)      # its destructor queues ptr to be freed
        return check_cuda(err, "cudaUserObjectCreate/cudaGraphRetainUserObject")
    return 0


cdef int _workspace_entry(GemmContext* ctx, cudaStream_t stream, bint create=True) except -1 nogil:
    """Index of the workspace entry of `stream` (or of the capture under way on it), made on
    first use (create False: -2 instead of making it)."""
    cdef unsigned long long cid = 0
    cdef cudaGraph_t graph = NULL
    capture_info(stream, &cid, &graph)
    if cid != 0 or open_captures() > 0:
        note_capture_id(stream, cid)
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
    drain_if_safe()
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
    cdef cudaError_t err = cudaMalloc(&ptr, ctx.workspace_bytes + STREAM_TABLE_BYTES)
    cudaThreadExchangeStreamCaptureMode(&mode)
    check_cuda(err, "cudaMalloc(workspace)")
    cg_count_allocation()
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
    # (a given workspace allocates and frees nothing: no capture of its stream is noted, which
    # would hold the release queue back until a later call on that stream saw it end)
    cdef char* given = _given_for(stream) if cg_given.ptr != NULL else NULL
    if given != NULL:
        return given
    for i in range(ctx.n_workspaces):      # a side stream works in its owner's side workspace
        if ctx.workspaces[i].side == stream and stream != NULL and ctx.workspaces[i].side_ptr != NULL:
            return ctx.workspaces[i].side_ptr
    i = _workspace_entry(ctx, stream, create)
    return NULL if i == -2 else ctx.workspaces[i].ptr


cdef void* stream_workspace(GemmContext* ctx, cudaStream_t stream) except NULL nogil:
    return _workspace_of(ctx, stream, True)


cdef void* stream_table(GemmContext* ctx, cudaStream_t stream) except NULL nogil:
    # The table sits past the workspace cuBLAS is given: bound with workspace_bytes, cuBLAS
    # never reaches it, and it has the workspace's owner (the context, or a capture's graph).
    return <char*>_workspace_of(ctx, stream, True) + ctx.workspace_bytes


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
    if cg_given.ptr != NULL and stream == cg_given.stream:
        return _fork_given(ctx, stream, side, join)
    cdef StreamWorkspace* w = &ctx.workspaces[_workspace_entry(ctx, stream)]
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
        err = cudaMalloc(&w.side_ptr, ctx.workspace_bytes + STREAM_TABLE_BYTES)
        cudaThreadExchangeStreamCaptureMode(&mode)
        if err != cudaSuccess:
            w.side_ptr = NULL
            check_cuda(err, "cudaMalloc(side workspace)")
        cg_count_allocation()
        if w.capture_id != 0:          # a capture's entry: its graph owns this one too
            capture_info(stream, &cid, &graph)
            _give_to_graph(w.side_ptr, graph)
    check_cuda(cudaEventRecord(w.fork, stream), "cudaEventRecord(fork)")
    check_cuda(cudaStreamWaitEvent(w.side, w.fork, 0), "cudaStreamWaitEvent(fork)")
    w.forked = True
    side[0], join[0] = w.side, w.join
    return 0


cdef int join_side(GemmContext* ctx, cudaStream_t stream, cudaStream_t side, cudaEvent_t join,
                   bint quiet) except -1 nogil:
    cdef int i
    if join == NULL:            # the side's work ran on the stream itself (_fork_given)
        return 0
    for i in range(ctx.n_workspaces):
        if ctx.workspaces[i].side == side:
            ctx.workspaces[i].forked = False
    cdef cudaError_t err = cudaEventRecord(join, side)
    if err == cudaSuccess:
        err = cudaStreamWaitEvent(stream, join, 0)
    if quiet:
        return 0
    return check_cuda(err, "cudaEventRecord/cudaStreamWaitEvent(join)")


cdef int run_forked(GemmContext* ctx, cudaStream_t stream, forked_fn fn, void* arg) except -1:
    cdef cudaStream_t side
    cdef cudaEvent_t join
    with nogil:             # the first fork creates the stream and allocates its workspace
        fork_side(ctx, stream, &side, &join)
    try:
        fn(arg, stream, side)
    except BaseException:
        join_side(ctx, stream, side, join, True)      # the original error matters more
        raise
    join_side(ctx, stream, side, join, False)
    return 0


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
# ---------------------------------------------------------------- a workspace the caller gives
# (see context.pxd): per thread, for the calls of one handler at a time.
cdef extern from *:
    """
    typedef struct { void* stream; char* ptr; size_t parts; void* side; } cg_given_workspace;
    static CG_THREAD_LOCAL cg_given_workspace cg_given;
    """
    ctypedef struct cg_given_workspace:
        cudaStream_t stream
        char* ptr
        size_t parts
        cudaStream_t side
    cg_given_workspace cg_given

cdef size_t GIVEN_PART_BYTES = WORKSPACE_BYTES + STREAM_TABLE_BYTES
#: The bytes of one part of a given workspace: cuBLAS's workspace and the stream's table.
PART_BYTES = GIVEN_PART_BYTES
#: The alignment a given workspace's parts start at (cuBLASLt's): its first ALIGNMENT bytes may
#: go to reach it.
ALIGNMENT = WORKSPACE_ALIGNMENT


cdef char* _given_for(cudaStream_t stream) noexcept nogil:
    """The part of the given workspace that `stream` works in (NULL: none given for it)."""
    if cg_given.ptr == NULL:
        return NULL
    if stream == cg_given.stream:
        return cg_given.ptr
    if stream == cg_given.side and cg_given.side != NULL:
        return cg_given.ptr + GIVEN_PART_BYTES
    return NULL


cdef int give_workspace(cudaStream_t stream, void* ptr, size_t nbytes) except -1:
    # (XLA aligns a buffer to fewer bytes than cuBLASLt asks of a workspace: the parts start at
    # the first aligned address)
    cdef size_t skip = (WORKSPACE_ALIGNMENT - <uintptr_t>ptr % WORKSPACE_ALIGNMENT) % WORKSPACE_ALIGNMENT
    if ptr == NULL or nbytes < skip + GIVEN_PART_BYTES:
        raise ValueError(f"workspace: expected at least {GIVEN_PART_BYTES} bytes (cuBLAS's workspace and cygemm's "
                         f"table) from the first {WORKSPACE_ALIGNMENT}-byte aligned address, got {nbytes} bytes at "
                         f"{<uintptr_t>ptr:#x}")
    cg_given.stream, cg_given.ptr = stream, <char*>ptr + skip
    cg_given.parts, cg_given.side = (nbytes - skip) // GIVEN_PART_BYTES, NULL
    return 0


cdef void take_back_workspace() noexcept nogil:
    cg_given.stream, cg_given.ptr, cg_given.parts, cg_given.side = NULL, NULL, 0, NULL


cdef int _fork_given(GemmContext* ctx, cudaStream_t stream, cudaStream_t* side, cudaEvent_t* join) except -1 nogil:
    """fork_side in a given workspace: the context's given side stream, working in the buffer's
    second part; with one part, no fork (the side's work runs on the stream: join NULL)."""
    cdef StreamWorkspace* w = &ctx.given_side
    cdef cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed
    cdef cudaError_t err = cudaSuccess
    if cg_given.parts < 2:
        side[0], join[0] = stream, NULL
        return 0
    if w.side == NULL:          # (made once; creating them is allowed during a capture, relaxed)
        cudaThreadExchangeStreamCaptureMode(&mode)
        err = cudaStreamCreateWithFlags(&w.side, cudaStreamNonBlocking)
        if err == cudaSuccess:
            err = cudaEventCreateWithFlags(&w.fork, cudaEventDisableTiming)
        if err == cudaSuccess:
            err = cudaEventCreateWithFlags(&w.join, cudaEventDisableTiming)
        cudaThreadExchangeStreamCaptureMode(&mode)
        if err != cudaSuccess:
            _destroy_side(w)
            check_cuda(err, "cudaStreamCreateWithFlags/cudaEventCreateWithFlags(side stream)")
    check_cuda(cudaEventRecord(w.fork, stream), "cudaEventRecord(fork)")
    check_cuda(cudaStreamWaitEvent(w.side, w.fork, 0), "cudaStreamWaitEvent(fork)")
    cg_given.side = w.side
    side[0], join[0] = w.side, w.join
    return 0


def _given_now():
    """Test hook (no GPU): the workspace given on this thread, (stream, address, parts), or None."""
    if cg_given.ptr == NULL:
        return None
    return <uintptr_t>cg_given.stream, <uintptr_t>cg_given.ptr, cg_given.parts


def _given_lookup(int stream, int ptr, int nbytes, int side, list asked):
    """Test hook (no GPU): with a workspace given for `stream` at `ptr` (and `side` as its side
    stream), the part each stream in `asked` works in (None: not the given buffer, its own).
    Nothing is given afterwards."""
    give_workspace(<cudaStream_t><uintptr_t>stream, <void*><uintptr_t>ptr, nbytes)
    cg_given.side = <cudaStream_t><uintptr_t>side
    out = []
    try:
        for s in asked:
            p = _given_for(<cudaStream_t><uintptr_t>s)
            out.append(None if p == NULL else <uintptr_t>p)
    finally:
        take_back_workspace()
    out.append(_given_for(<cudaStream_t><uintptr_t>stream) == NULL)
    return out


def versions():
    """Versions of what cygemm was built with and runs on (no GPU needed): the CUDA runtime, the
    driver's CUDA, the loaded cuBLAS(Lt) (major * 10000 + minor * 100 + patch), the cuBLASLt
    versions this release's observed-behaviour promises were verified on (cygemm.engine.promises),
    and ``features``: what the loaded cuBLASLt offers beyond 13.1 on device 0, each usable or not
    and why (``cygemm.engine.lt_features.features()``)."""
    cdef int rt = 0, drv = 0
    cudaRuntimeGetVersion(&rt)
    cudaDriverGetVersion(&drv)
    return {"cuda_runtime": rt, "cuda_driver": drv, "cublasLt": cublasLtGetVersion(),
            "cublasLt_verified": list(_lt_features.VERIFIED_CUBLASLT), "features": _lt_features.features()}


cdef int known_device_count() noexcept nogil:
    return _device_count


def current_device():
    """The CUDA device current on this thread (cudaGetDevice)."""
    cdef int device = 0
    check_cuda(cudaGetDevice(&device), "cudaGetDevice")
    return device
