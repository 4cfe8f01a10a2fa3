"""cygemm.engine.release: the release queue (workspace frees, cuBLAS handle and CUDA graph
teardown) and the captures it waits for.

CPU: null graph handles queue nothing; a stream that is not one is refused by name and changes
no capture count. Without a GPU (skipped where one is present; the queue is given handles no
driver can touch): what is queued while a capture is opening waits until the opening is noted,
also when noting it fails, and for every capture opening at once. GPU: a graph dropped while
a capture is open (one another stream joined) is destroyed once it ends, and not before; a raw
CuPy capture is known open from cygemm's first call in it until its next call on that stream;
the workspace a captured graph owns survives release_workspaces and is freed once the graph
goes; begin_capture holds real releases until its note. (tests/engine/test_streams_devices.py
has many graphs leaving memory flat and an ended thread's handles waiting for a capture.)
"""
import gc
import time

import pytest

import cygemm
from cygemm.engine import context as _context, release as _release
from gpu_util import f64, poisoned, rand, rel_err, tol


# ---------------------------------------------------------------- CPU

def test_null_graph_handles_queue_nothing():
    before = _release.pending_workspace_frees(), _release.open_capture_count()
    _release.destroy_graph_when_safe(0, 0)
    assert (_release.pending_workspace_frees(), _release.open_capture_count()) == before


def test_noting_a_capture_on_something_not_a_stream_is_refused_by_name_and_counts_nothing():
    count = _release.open_capture_count()
    for bad in ("stream 3", 2.5, [7]):
        with pytest.raises(TypeError, match=r"^stream: expected None, a cupy.cuda.Stream"):
            _release.note_capture(bad)
    assert _release.open_capture_count() == count


# Handles that only a driver could act on; without one the CUDA runtime refuses them unread.
FAKE_EXEC, FAKE_GRAPH = 0x7E00_0000_1000, 0x7E00_0000_2000


def _no_driver():
    reason = cygemm.gpu_unavailable_reason()
    if reason is None:
        pytest.skip("hands the queue fake graph handles: only where no GPU is usable")
    assert _release.open_capture_count() == 0
    return _release.pending_workspace_frees()


@pytest.mark.nogpu
def test_without_a_gpu_releases_wait_for_an_opening_capture_even_when_noting_it_fails():
    base = _no_driver()
    _release.begin_capture()
    _release.destroy_graph_when_safe(FAKE_EXEC, FAKE_GRAPH)
    opening = _release.pending_workspace_frees()
    with pytest.raises(TypeError, match="^stream:"):
        _release.note_capture("not a stream", opening=True)     # (the opening ends all the same)
    after_failure = _release.pending_workspace_frees()
    _release.destroy_graph_when_safe(0, 0)                      # the next drain: none opening now
    assert opening == base + 2, "released while a capture was opening"
    assert after_failure == base + 2                            # nothing released by the failure
    assert _release.pending_workspace_frees() == base, "the failed note left the queue held"


@pytest.mark.nogpu
def test_without_a_gpu_releases_wait_for_every_capture_opening_at_once():
    base = _no_driver()
    _release.begin_capture()
    _release.begin_capture()
    _release.destroy_graph_when_safe(FAKE_EXEC, 0)
    with pytest.raises(TypeError):
        _release.note_capture(object(), opening=True)          # one opening over
    _release.destroy_graph_when_safe(0, FAKE_GRAPH)
    one_opening = _release.pending_workspace_frees()
    with pytest.raises(cygemm.CudaError):                      # no GPU: the capture check fails...
        _release.note_capture(0, opening=True)                 # ... and the last opening is over
    _release.destroy_graph_when_safe(0, 0)
    assert one_opening == base + 2, "released while another capture was opening"
    assert _release.open_capture_count() == 0
    assert _release.pending_workspace_frees() == base


# ---------------------------------------------------------------- on the GPU

def _settle():
    """An empty queue: graphs dropped by earlier tests destroyed, their workspaces (queued by
    destructors CUDA runs on its own thread) freed."""
    cygemm.release_workspaces()
    time.sleep(0.2)
    cygemm.release_workspaces()
    assert _release.open_capture_count() == 0
    return _release.pending_workspace_frees()


def _graph_without_workspace(cp, s, x):
    """A cygemm.graph capture of one CuPy kernel (no cygemm call: no workspace, no user object),
    so that dropping it queues exactly its two handles."""
    with s:
        x += 1                                  # (compiled and run once before the capture)
    s.synchronize()
    with cygemm.graph.capture(s) as g:
        with s:
            x += 1
    return g


def _device_bytes_in_use(cp):
    """Device memory in use outside CuPy's pool."""
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    free, total = cp.cuda.runtime.memGetInfo()
    return total - free - pool.total_bytes()


@pytest.mark.gpu
def test_a_graph_dropped_while_a_capture_is_open_is_destroyed_once_it_ends_not_before():
    import cupy as cp
    M, K, N = 64, 96, 80
    s, t = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    A, B, A2, B2 = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (M, K)), rand(cp, (K, N))
    Y, Y2 = poisoned(cp, (M, N)), poisoned(cp, (M, N))
    x = cp.zeros(16, cp.float32)
    cp.cuda.Device().synchronize()
    for stream, out in ((s, Y), (t, Y2)):                        # plans made eagerly
        cygemm.gemm(A, B, out, math="fp32", stream=stream)
    old = _graph_without_workspace(cp, s, x)
    fork, join = cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True)
    base = _settle()
    counts = {}
    with cygemm.graph.capture(s) as graph:
        counts["open"] = _release.open_capture_count()
        cygemm.gemm(A, B, Y, math="fp32", stream=s)
        fork.record(s)
        t.wait_event(fork)                                     # t joins the capture
        cygemm.gemm(A2, B2, Y2, math="fp32", stream=t)
        counts["joined"] = _release.open_capture_count()
        del old
        gc.collect()
        counts["dropped"] = _release.pending_workspace_frees()
        join.record(t)
        s.wait_event(join)
    counts["ended"] = _release.open_capture_count()
    assert counts["open"] == 1 and counts["joined"] == 2
    assert counts["dropped"] == base + 2, "the dropped graph was destroyed during the capture"
    assert counts["ended"] == 0, "the capture is over on the stream that joined it too"
    assert _release.pending_workspace_frees() == base, "the capture's end released what waited for it"
    with s:
        Y[...] = cp.nan
        Y2[...] = cp.nan
    graph.launch(s)
    s.synchronize()
    assert rel_err(Y.get(), f64(cp, A) @ f64(cp, B)) < tol("float32", "fp32", K)
    assert rel_err(Y2.get(), f64(cp, A2) @ f64(cp, B2)) < tol("float32", "fp32", K)


@pytest.mark.gpu
def test_a_raw_capture_is_known_open_from_cygemms_first_call_in_it_until_its_next_call_after():
    import cupy as cp
    M, K, N = 48, 64, 32
    s = cp.cuda.Stream(non_blocking=True)
    A, B = rand(cp, (M, K)), rand(cp, (K, N))
    Y, Y_eager = poisoned(cp, (M, N)), poisoned(cp, (M, N))
    x = cp.zeros(16, cp.float32)
    cp.cuda.Device().synchronize()
    cygemm.gemm(A, B, Y_eager, math="fp32", stream=s)          # plans and s's eager workspace
    old = _graph_without_workspace(cp, s, x)
    base = _settle()
    seen = {}
    try:
        s.begin_capture()                                      # CuPy's, not cygemm.graph's
        try:
            seen["before"] = _release.open_capture_count()
            cygemm.gemm(A, B, Y, math="fp32", stream=s)
            seen["in"] = _release.open_capture_count()
            del old
            gc.collect()
            seen["dropped"] = _release.pending_workspace_frees()
        finally:
            raw = s.end_capture()
        seen["unnoticed"] = _release.open_capture_count(), _release.pending_workspace_frees()
        with s:
            Y_eager[...] = cp.nan
        cygemm.gemm(A, B, Y_eager, math="fp32", stream=s)      # its next call: the capture is over
        seen["noticed"] = _release.open_capture_count()
        t, junk = cp.cuda.Stream(non_blocking=True), cp.empty((M, N), cp.float32)
        cygemm.gemm(A, B, junk, math="fp32", stream=t)        # (a new workspace: the queue drains)
        t.synchronize()
        seen["drained"] = _release.pending_workspace_frees()
    finally:
        _release.note_capture(s)                               # (known over whatever failed)
    assert seen["before"] == 0 and seen["in"] == 1
    assert seen["dropped"] == base + 2, "the dropped graph was destroyed during the capture"
    assert seen["unnoticed"] == (1, base + 2)                  # cygemm cannot see a CuPy capture end
    assert seen["noticed"] == 0
    assert seen["drained"] <= base
    with s:
        Y[...] = cp.nan
    raw.launch(s)
    s.synchronize()
    ref = f64(cp, A) @ f64(cp, B)
    assert rel_err(Y.get(), ref) < tol("float32", "fp32", K)
    assert rel_err(Y_eager.get(), ref) < tol("float32", "fp32", K)


@pytest.mark.gpu
def test_the_workspace_a_graph_owns_outlives_release_workspaces_and_is_freed_once_the_graph_goes():
    import cupy as cp
    M, K, N = 64, 64, 64
    s = cp.cuda.Stream(non_blocking=True)
    A, B, Y = rand(cp, (M, K)), rand(cp, (K, N)), poisoned(cp, (M, N))
    cp.cuda.Device().synchronize()
    cygemm.gemm(A, B, Y, math="fp32", stream=s)
    s.synchronize()
    _settle()
    used0 = _device_bytes_in_use(cp)
    with cygemm.graph.capture(s) as graph:
        cygemm.gemm(A, B, Y, math="fp32", stream=s)              # its own workspace, the graph's
    assert _context.context_info()["capture_workspaces"] >= 1
    cygemm.release_workspaces()                                 # this thread's eager ones only
    used1 = _device_bytes_in_use(cp)
    workspace = _context.context_info()["workspace_bytes"]      # (a fresh context entry list now)
    assert used1 - used0 >= workspace, f"{(used1 - used0) >> 20} MiB: the graph's workspace was freed"
    with s:
        Y[...] = cp.nan
    graph.launch(s)                                             # (a freed workspace: wrong or a fault)
    s.synchronize()
    assert rel_err(Y.get(), f64(cp, A) @ f64(cp, B)) < tol("float32", "fp32", K)
    _release.note_capture(s)                    # (drains the queue: s is not capturing)
    pending = _release.pending_workspace_frees()
    del graph
    gc.collect()                                # destroyed at once (no capture open); CUDA then
    deadline = time.monotonic() + 10            # runs the workspace's destructor on its own thread
    while _release.pending_workspace_frees() <= pending and time.monotonic() < deadline:
        s.synchronize()
        time.sleep(0.02)
    assert _release.pending_workspace_frees() == pending + 1, "the graph's workspace was never queued"
    _release.note_capture(s)                    # (s is not capturing: what waited is released)
    assert _release.pending_workspace_frees() == pending
    used2 = _device_bytes_in_use(cp)
    assert used1 - used2 >= workspace, f"only {(used1 - used2) >> 20} MiB freed after the graph went"


@pytest.mark.gpu
def test_begin_capture_holds_releases_until_its_note_even_when_the_note_fails():
    import cupy as cp
    s = cp.cuda.Stream(non_blocking=True)
    x = cp.zeros(16, cp.float32)
    cp.cuda.Device().synchronize()
    old = _graph_without_workspace(cp, s, x)
    base = _settle()
    _release.begin_capture()                    # a capture about to begin (cygemm.graph.capture's first step)
    del old
    gc.collect()
    held = _release.pending_workspace_frees()
    with pytest.raises(TypeError, match="^stream:"):
        _release.note_capture("no stream", opening=True)
    after_failure = _release.pending_workspace_frees()
    _release.note_capture(s)                    # a later note: nothing opening, nothing open
    assert held == base + 2, "a graph was destroyed while a capture was beginning"
    assert after_failure == base + 2
    assert _release.pending_workspace_frees() == base, "the failed note left the queue held"
    with cygemm.graph.capture(s) as g:          # and captures work as before
        with s:
            x += 1
    g.launch(s)
    s.synchronize()
    assert float(x[0].get()) == 2.0             # +1 warm; the captures only once replayed: this one
