# cython: language_level=3
"""Capture a stream into a CUDA graph, instantiate it and launch it, through the
CUDA runtime directly: the same on every CuPy version, old ones included.

    with cygemm.graph.capture(stream) as g:
        cygemm.gemm_ops.forward_into(A, B, Y, bias, act="relu", stream=stream)
    g.launch(stream)
"""
from libc.stdlib cimport malloc, free
from libc.stdint cimport uintptr_t

from cygemm.bindings.cudart cimport *
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.streams cimport stream_from_object

from cygemm.engine import context as _context, release as _release

_MODES = {"global": cudaStreamCaptureModeGlobal, "thread_local": cudaStreamCaptureModeThreadLocal,
          "relaxed": cudaStreamCaptureModeRelaxed}


cdef class Graph:
    """An instantiated CUDA graph, made by :class:`capture` (``with capture(s) as graph:``).

    The workspaces cygemm made for its capture belong to the CUDA graph itself (a user
    object), so replays never share memory with eager work; this object also holds references
    to the handles and the buffers layers registered (those of ensure_workspaces), so that they
    outlive it (clear_ws_cache included). Dropped, it is destroyed through cygemm's release
    queue: at once, or, while a capture may be open on the device (destroying a graph then
    could invalidate that capture), once none is known to be open.

    Attributes
    ----------
    keepalive : list
        The objects the graph holds references to (:meth:`keep` adds to it).
    """
    cdef cudaGraph_t graph
    cdef cudaGraphExec_t exec_
    cdef readonly list keepalive

    def __cinit__(self):
        self.keepalive = []

    def launch(self, stream=None):
        """Enqueue one replay of the graph on `stream`."""
        if self.exec_ == NULL:
            raise RuntimeError("graph: nothing captured yet (use it after the capture block)")
        cdef cudaStream_t s
        stream_from_object(stream, &s)
        with nogil:
            check_cuda(cudaGraphLaunch(self.exec_, s), "cudaGraphLaunch")

    def keep(self, *objects):
        """Hold references to buffers the graph reads or writes, for as long as it lives."""
        self.keepalive.extend(objects)

    @property
    def num_nodes(self):
        """How many nodes (kernels, copies, event records...) the captured graph has."""
        cdef size_t n = 0
        if self.graph != NULL:
            check_cuda(cudaGraphGetNodes(self.graph, NULL, &n), "cudaGraphGetNodes")
        return n

    @property
    def edges(self):
        """The dependencies between the graph's nodes, as (from, to) pairs of indices into its
        node list: a capture of one stream is a chain; forked work gives a node two successors."""
        cdef size_t n_nodes = 0, n_edges = 0, i
        if self.graph == NULL:
            return []
        check_cuda(cudaGraphGetNodes(self.graph, NULL, &n_nodes), "cudaGraphGetNodes")
        check_cuda(cudaGraphGetEdges(self.graph, NULL, NULL, NULL, &n_edges), "cudaGraphGetEdges")
        cdef void** nodes = <void**>malloc((n_nodes + 1) * sizeof(void*))
        cdef void** frm = <void**>malloc((n_edges + 1) * sizeof(void*))
        cdef void** to = <void**>malloc((n_edges + 1) * sizeof(void*))
        try:
            if nodes == NULL or frm == NULL or to == NULL:
                raise MemoryError()
            check_cuda(cudaGraphGetNodes(self.graph, nodes, &n_nodes), "cudaGraphGetNodes")
            check_cuda(cudaGraphGetEdges(self.graph, frm, to, NULL, &n_edges), "cudaGraphGetEdges")
            index = {<uintptr_t>nodes[i]: i for i in range(n_nodes)}
            return [(index[<uintptr_t>frm[i]], index[<uintptr_t>to[i]]) for i in range(n_edges)]
        finally:
            free(nodes); free(frm); free(to)

    def __dealloc__(self):
        # Destroying a graph while a capture is under way on the device (in any thread)
        # may invalidate that capture: the release queue destroys it once none is known open.
        if self.exec_ != NULL or self.graph != NULL:
            _release.destroy_graph_when_safe(<uintptr_t>self.exec_, <uintptr_t>self.graph)


class capture:
    """Context manager: capture the work enqueued on `stream` into a CUDA graph.

    Parameters
    ----------
    stream : optional
        The stream to capture (as :func:`cygemm.gemm` takes one); not the legacy default
        stream, where capture is illegal.
    mode : {"thread_local", "global", "relaxed"}
        The cudaStreamCaptureMode: "thread_local" (default) lets other threads keep
        allocating meanwhile.

    Returns
    -------
    Graph
        From ``with capture(s) as graph:``; instantiated when the block ends, then
        ``graph.launch(stream)`` replays it.

    Raises
    ------
    ValueError
        An unknown mode or the legacy default stream.
    CudaError
        Capture could not begin or end (e.g. a call in the block invalidated it).
    """

    def __init__(self, stream=None, mode="thread_local"):
        if mode not in _MODES:
            raise ValueError(f"mode: expected one of {sorted(_MODES)}, got {mode!r}")
        cdef cudaStream_t s
        stream_from_object(stream, &s)
        if <uintptr_t>s == 0 or <uintptr_t>s == 1:
            raise ValueError("stream: capture needs a created stream, got the legacy default stream")
        self.stream = <uintptr_t>s
        self.mode = mode
        self.graph = Graph()

    def __enter__(self):
        cdef cudaStream_t s = <cudaStream_t><uintptr_t>self.stream
        cdef cudaError_t err
        _release.begin_capture()                 # no release overlaps the capture's start
        try:
            err = cudaStreamBeginCapture(s, <cudaStreamCaptureMode>(<int>_MODES[self.mode]))
        finally:
            _release.note_capture(self.stream, opening=True)     # cygemm frees nothing while it is open
        check_cuda(err, "cudaStreamBeginCapture")
        return self.graph

    def __exit__(self, exc_type, exc, tb):
        cdef cudaStream_t s = <cudaStream_t><uintptr_t>self.stream
        cdef cudaGraph_t graph = NULL
        cdef cudaError_t err = cudaStreamEndCapture(s, &graph)
        _release.note_capture(self.stream)        # and releases what waited for it to end
        cdef Graph g = self.graph
        g.graph = graph
        if exc_type is not None:
            return False          # the original error matters more than the capture's
        check_cuda(err, "cudaStreamEndCapture")
        check_cuda(cudaGraphInstantiate(&g.exec_, graph, 0), "cudaGraphInstantiate")
        g.keepalive.extend(_context.graph_keepalive())
        return False
