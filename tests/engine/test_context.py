"""cygemm.engine.context: the per (device, thread) cuBLAS/cuBLASLt handles, the per-stream
workspaces and buffers, the one side-stream fork/join, and the no-GPU check it re-exports.

CPU: the no-GPU check is the errors module's one; versions() needs no GPU; the stream buffers
(made once per (device, stream, name, shape, dtype) even when threads race, refused while the
stream is captured, nothing cached by a failed or refused allocation) and what a graph is given
to keep alive, with the stream resolution and the device replaced by fakes. Without a GPU
(skipped where one is present): the calls that need one raise the plain-words reason before
allocating anything. GPU: one workspace per stream, reused by its later calls and bounded by
max_stream_workspaces set at run time; each thread its own handles and workspaces
(release_workspaces frees only the caller's); the fork/join orders the side stream after the
caller's earlier work and the caller's later work after the side's; a stream buffer asked for
inside a capture. (tests/engine/test_streams_devices.py has the many-streams memory bound,
release_workspaces, graphs owning their workspaces and a thread ending mid-capture.)
"""
import gc
import threading
import time
import types
import weakref

import numpy as np
import pytest

import cygemm
from cygemm.engine import context as _context, errors as _errors, release as _release
from gpu_util import f64, poisoned, rand, rel_err, tol


# ---------------------------------------------------------------- CPU: the no-GPU check, versions

def test_the_no_gpu_check_is_the_errors_modules_one_and_its_answer_is_kept():
    assert _context.gpu_unavailable_reason is _errors.gpu_unavailable_reason
    assert _context.require_gpu is _errors.require_gpu
    first = _context.gpu_unavailable_reason()
    assert cygemm.gpu_unavailable_reason() == first
    assert all(_context.gpu_unavailable_reason() == first for _ in range(3))
    assert first is None or (isinstance(first, str) and "NVIDIA" in first)


def test_versions_need_no_gpu_and_name_the_loaded_cublas_and_the_verified_ones():
    from cygemm.engine.promises import VERIFIED_CUBLASLT
    v = _context.versions()
    assert set(v) == {"cuda_runtime", "cuda_driver", "cublasLt", "cublasLt_verified", "features"}
    assert v["cuda_runtime"] >= 13000                                      # the CUDA 13 runtime
    assert v["cublasLt"] // 10000 == 13, v["cublasLt"]                    # the nvidia-cublas 13 wheel
    assert v["cublasLt_verified"] == list(VERIFIED_CUBLASLT)
    v["cublasLt_verified"].append(0)                                       # the caller's copy
    assert _context.versions()["cublasLt_verified"] == list(VERIFIED_CUBLASLT)
    if cygemm.gpu_unavailable_reason() is None:
        assert v["cuda_driver"] >= 13000
    elif "libcuda.so.1 is not installed" in cygemm.gpu_unavailable_reason():
        assert v["cuda_driver"] == 0


# ---------------------------------------------------------------- CPU: stream buffers, on fakes

@pytest.fixture
def fake_streams(monkeypatch):
    """Stream buffers in a dict of their own, streams as ints (0 for None), capture and device
    as the test sets them (no CUDA call)."""
    state = types.SimpleNamespace(device=0, capturing=set())
    monkeypatch.setattr(_context, "_streams", types.SimpleNamespace(
        stream_pointer=lambda s: 0 if s is None else int(s), is_capturing=lambda ptr: ptr in state.capturing))
    monkeypatch.setattr(_context, "current_device", lambda: state.device)
    monkeypatch.setattr(_context, "_stream_buffers", {})
    return state


class Buffer:
    """What an allocate callback returns (weakly referenceable)."""

    def __init__(self, shape, dtype, ptr):
        self.shape, self.dtype, self.ptr = shape, dtype, ptr


def test_a_stream_buffer_is_made_once_on_its_stream_then_returned(fake_streams):
    calls = []

    def allocate(shape, dtype, ptr):
        calls.append((shape, dtype, ptr))
        return Buffer(shape, dtype, ptr)

    first = _context.stream_buffer("dZ", (96, 80), "float32", 7, allocate)
    for _ in range(3):
        assert _context.stream_buffer("dZ", (96, 80), "float32", 7, allocate) is first
    assert calls == [((96, 80), "float32", 7)]          # made once, with the stream's pointer
    assert _context.stream_buffer_keys() == [(0, 7, "dZ", (96, 80), "float32")]
    assert _context.stream_buffer("dZ", (96, 80), "float32", None, allocate) is not first   # None: stream 0
    assert calls[-1] == ((96, 80), "float32", 0)


def test_stream_buffers_differ_by_device_stream_name_shape_and_dtype(fake_streams):
    made = []

    def allocate(shape, dtype, ptr):
        made.append(Buffer(shape, dtype, ptr))
        return made[-1]

    base = ("dZ", (8, 4), "float32", 5)
    variants = [base, ("lt_ws", (8, 4), "float32", 5), ("dZ", (4, 8), "float32", 5),
                ("dZ", (8, 4), "float16", 5), ("dZ", (8, 4), "float32", 6)]
    got = [_context.stream_buffer(*v, allocate) for v in variants]
    fake_streams.device = 1
    got.append(_context.stream_buffer(*base, allocate))
    assert len({id(b) for b in got}) == len(made) == 6
    assert sorted(_context.stream_buffer_keys()) == sorted(
        [(0, v[3], v[0], v[1], v[2]) for v in variants] + [(1, 5, "dZ", (8, 4), "float32")])
    fake_streams.device = 0
    assert _context.stream_buffer(*base, allocate) is got[0]
    _context.clear_stream_buffers()
    assert _context.stream_buffer_keys() == []
    assert _context.stream_buffer(*base, allocate) is not got[0]


def test_a_stream_buffer_first_asked_for_during_a_capture_is_refused_by_name(fake_streams):
    calls = []
    fake_streams.capturing.add(9)
    with pytest.raises(cygemm.CaptureError, match=r"^work_q: allocating it would break the stream's capture; "
                                                   r"call ensure_workspaces once on this stream before capturing"):
        _context.stream_buffer("work_q", (16,), "float32", 9, lambda *a: calls.append(a))
    assert calls == [] and _context.stream_buffer_keys() == []
    fake_streams.capturing.clear()                     # after the capture: made now
    buf = _context.stream_buffer("work_q", (16,), "float32", 9, lambda *a: Buffer(*a))
    fake_streams.capturing.add(9)                      # and returned during the next one
    assert _context.stream_buffer("work_q", (16,), "float32", 9, lambda *a: calls.append(a)) is buf
    assert calls == []


def test_a_failed_allocation_caches_nothing_and_the_next_call_tries_again(fake_streams):
    def out_of_memory(shape, dtype, ptr):
        raise MemoryError("out of memory allocating 1 GiB")

    with pytest.raises(MemoryError, match="1 GiB"):
        _context.stream_buffer("dZ", (1 << 14, 1 << 14), "float32", 3, out_of_memory)
    assert _context.stream_buffer_keys() == []
    buf = _context.stream_buffer("dZ", (1 << 14, 1 << 14), "float32", 3, lambda *a: Buffer(*a))
    assert isinstance(buf, Buffer) and len(_context.stream_buffer_keys()) == 1


def test_threads_racing_for_a_new_stream_buffer_get_the_one_made_once(fake_streams):
    calls, got, errors = [], [], []
    barrier = threading.Barrier(8)

    def allocate(shape, dtype, ptr):
        calls.append(ptr)
        time.sleep(0.05)                # the others arrive while it is being made
        return Buffer(shape, dtype, ptr)

    def worker():
        try:
            barrier.wait(timeout=10)
            got.append(_context.stream_buffer("dZ", (32, 32), "float32", 11, allocate))
        except BaseException as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a thread hung in stream_buffer"
    assert errors == []
    assert calls == [11] and len(got) == 8 and all(b is got[0] for b in got)


def test_a_graph_keeps_the_providers_objects_and_the_stream_buffers_alive_beyond_a_clear(fake_streams, monkeypatch):
    monkeypatch.setattr(_context, "_keepalive_providers", list(_context._keepalive_providers))
    handle = Buffer((), "none", 0)
    _context.add_capture_keepalive(lambda: [handle])
    buf = _context.stream_buffer("dZ", (4, 4), "float32", 2, lambda *a: Buffer(*a))
    gone = weakref.ref(buf)
    keep = _context.graph_keepalive()          # what cygemm.graph.capture gives the graph
    assert any(x is handle for x in keep) and any(x is buf for x in keep)
    del buf
    _context.clear_stream_buffers()
    gc.collect()
    assert gone() is not None, "a graph's stream buffer went with the cache"
    assert not any(x is gone() for x in _context.graph_keepalive())     # a later capture keeps it no more
    del keep
    gc.collect()
    assert gone() is None


# ---------------------------------------------------------------- without a GPU

def _reason():
    reason = cygemm.gpu_unavailable_reason()
    if reason is None:
        pytest.skip("checks the no-GPU path; cygemm sees a usable GPU here")
    return reason


@pytest.mark.nogpu
@pytest.mark.parametrize("call", ["current_device", "context_info"])
def test_without_a_gpu_the_context_calls_raise_the_plain_words_reason(call):
    reason = _reason()
    with pytest.raises(_errors.NoGpuError) as info:
        getattr(_context, call)()
    assert str(info.value) == reason and info.value.call == "cudaGetDevice"
    assert isinstance(info.value, cygemm.CudaError)


@pytest.mark.nogpu
def test_without_a_gpu_a_stream_buffer_is_refused_before_allocating():
    reason = _reason()
    calls = []
    keys = _context.stream_buffer_keys()
    for stream in (None, 0):
        with pytest.raises(cygemm.CudaError) as info:
            _context.stream_buffer("dZ", (4, 4), "float32", stream, lambda *a: calls.append(a))
        assert str(info.value) == reason
    assert calls == [] and _context.stream_buffer_keys() == keys


@pytest.mark.nogpu
def test_without_a_gpu_require_gpu_raises_every_time_and_nothing_else_fails():
    reason = _reason()
    for _ in range(2):
        with pytest.raises(_errors.NoGpuError) as info:
            _context.require_gpu()
        assert str(info.value) == reason and info.value.call == "cudaGetDeviceCount"
        assert info.value.name in ("cudaErrorInsufficientDriver", "cudaErrorNoDevice")
    assert _context.device_count() == 0
    _context.release_workspaces()              # nothing to free: no error either
    assert _release.pending_workspace_frees() == 0


# ---------------------------------------------------------------- on the GPU

_SPIN_COPY = r"""
extern "C" __global__ void spin_copy(const float* src, float* dst, long long n, unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { __nanosleep(1000); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""


def _spin_copy(cp, src, dst, ms, stream):
    """On `stream`: wait `ms` milliseconds, then copy src into dst (float32, contiguous)."""
    kernel = cp.RawKernel(_SPIN_COPY, "spin_copy")
    with stream:
        kernel((64,), (256,), (src, dst, np.int64(src.size), np.uint64(int(ms * 1e6))))


@pytest.fixture
def stream_workspaces():
    """A known bound on eager workspaces for the test; the option as it was after it."""
    old = cygemm.set_options(max_stream_workspaces=8)
    yield
    cygemm.set_options(**old)


@pytest.mark.gpu
def test_with_a_gpu_require_gpu_returns_and_there_is_no_reason():
    assert _context.require_gpu() is None
    assert _context.gpu_unavailable_reason() is None
    assert _context.device_count() >= 1 and 0 <= _context.current_device() < _context.device_count()
    info = _context.context_info()
    assert info["device"] == _context.current_device() and info["blas"] and info["lt"]


@pytest.mark.gpu
def test_each_stream_gets_one_workspace_that_its_later_calls_reuse(stream_workspaces):
    import cupy as cp
    M, K, N = 64, 80, 48
    A, B = rand(cp, (M, K)), rand(cp, (K, N))
    ref = f64(cp, A) @ f64(cp, B)
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    cygemm.release_workspaces()
    before = _context.context_info()
    assert before["workspaces"] == 0
    outs = []

    def gemm_on(s):
        C = poisoned(cp, (M, N))
        cp.cuda.Device().synchronize()
        cygemm.gemm(A, B, C, math="fp32", stream=s)
        outs.append((s, C))
        return _context.context_info()

    seen = [gemm_on(s1)]
    seen += [gemm_on(s1) for _ in range(4)]                      # the same stream: its workspace again
    seen.append(gemm_on(s2))                                     # another stream: one more
    seen += [gemm_on(s1), gemm_on(s2)]
    assert [i["eager_workspaces"] for i in seen] == [1, 1, 1, 1, 1, 2, 2, 2]
    assert all(i["capture_workspaces"] == 0 for i in seen)
    assert len({(i["blas"], i["lt"]) for i in [before] + seen}) == 1        # one pair of handles throughout
    assert seen[0]["workspace_bytes"] >= 4 << 20
    cygemm.release_workspaces()
    assert _context.context_info()["workspaces"] == 0
    assert gemm_on(s2)["eager_workspaces"] == 1                  # made anew on the next call
    for s, C in outs:
        s.synchronize()
        assert rel_err(C.get(), ref) < tol("float32", "fp32", K)


@pytest.mark.gpu
def test_eager_workspaces_stay_within_max_stream_workspaces_set_at_run_time(stream_workspaces):
    import cupy as cp
    M, K, N = 48, 64, 40
    A, B = rand(cp, (M, K)), rand(cp, (K, N))
    ref = f64(cp, A) @ f64(cp, B)
    cp.cuda.Device().synchronize()
    cygemm.release_workspaces()
    time.sleep(0.2)                 # (destructors of earlier tests' graphs: run, queued, ...)
    cygemm.release_workspaces()     # (... freed)
    cygemm.set_options(max_stream_workspaces=2)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(5)]
    outs, counts = [], []
    for s in streams + streams[:2]:
        C = poisoned(cp, (M, N))
        cp.cuda.Device().synchronize()
        cygemm.gemm(A, B, C, math="fp32", stream=s)
        outs.append((s, C))
        counts.append(_context.context_info()["eager_workspaces"])
    info = _context.context_info()
    assert info["max_eager_workspaces"] == 2
    assert counts == [1, 2, 2, 2, 2, 2, 2]
    assert _release.pending_workspace_frees() == 0, "an evicted workspace was not freed at once"
    for s, C in outs:
        s.synchronize()
        assert rel_err(C.get(), ref) < tol("float32", "fp32", K)


@pytest.mark.gpu
def test_each_thread_has_its_own_handles_and_workspaces_and_frees_only_its_own():
    import cupy as cp
    M, K, N = 96, 64, 80
    A, B = rand(cp, (M, K)), rand(cp, (K, N))
    ref = f64(cp, A) @ f64(cp, B)
    main_out = poisoned(cp, (M, N))
    cp.cuda.Device().synchronize()
    cygemm.gemm(A, B, main_out, math="fp32")
    main_info = _context.context_info()
    cygemm.release_workspaces()
    time.sleep(0.2)                 # (destructors of earlier tests' graphs: run, queued, ...)
    cygemm.release_workspaces()     # (... freed)
    pending0 = _release.pending_workspace_frees()
    ready, go = threading.Event(), threading.Event()
    worker_seen, errors, results = {}, [], []

    def worker():
        try:
            s = cp.cuda.Stream(non_blocking=True)
            for step in ("first", "after main's release"):
                with s:
                    out = poisoned(cp, (M, N))
                cygemm.gemm(A, B, out, math="fp32", stream=s)
                s.synchronize()
                results.append(out)
                worker_seen[step] = _context.context_info()
                if step == "first":
                    ready.set()
                    if not go.wait(30):
                        raise TimeoutError("the main thread never went on")
        except BaseException as exc:
            errors.append(repr(exc))
            ready.set()

    th = threading.Thread(target=worker, daemon=True)
    th.start()
    assert ready.wait(60), "the worker never computed"
    cygemm.release_workspaces()                     # the main thread's; not the worker's
    assert _context.context_info()["workspaces"] == 0
    go.set()
    th.join(timeout=60)
    assert not th.is_alive(), "the worker hung"
    assert errors == []
    first, later = worker_seen["first"], worker_seen["after main's release"]
    # Each thread its own cuBLAS handle (cuBLAS handles are not thread-safe). cuBLASLt's
    # cublasLtCreate may give two threads the same value (seen with cuBLASLt 13.1 on the H200):
    # its handles are thread-safe, so that one is not compared.
    assert first["blas"] != main_info["blas"]
    assert first["device"] == main_info["device"]
    assert (later["blas"], later["lt"]) == (first["blas"], first["lt"])
    assert first["workspaces"] == later["workspaces"] == 1, "another thread's release freed this one's workspace"
    gc.collect()
    # The ended thread's handles and workspace were released (no capture is open).
    assert _release.pending_workspace_frees() <= pending0
    assert rel_err(main_out.get(), ref) < tol("float32", "fp32", K)
    for out in results:
        assert rel_err(out.get(), ref) < tol("float32", "fp32", K)


def _forked_grouped(cp, s, late):
    """The "streams" route: group 1 (the big one) on the side stream; its A written late on s."""
    from cygemm import grouped
    A0, B0 = rand(cp, (8, 16)), rand(cp, (16, 8))
    A1, B1 = late["A"], rand(cp, (1024, 1024))              # 4096 x 1024 x 1024
    outs = [poisoned(cp, (8, 8)), poisoned(cp, (4096, 1024))]
    cp.cuda.Device().synchronize()
    _spin_copy(cp, late["src"], A1, 100, s)
    grouped.grouped_gemm([A0, A1], [B0, B1], outs, math="fp32", stream=s, route="streams", autotune="off")
    checks = [(outs[0], lambda: f64(cp, A0) @ f64(cp, B0), 16)]
    return outs[1], lambda: f64(cp, late["src"]) @ f64(cp, B1), 1024, checks


def _forked_dense(cp, s, late):
    """The backward's "branches" route: gB = A.T @ gY on the side stream; A written late on s."""
    from cygemm.engine import tuning
    from cygemm.gemm_ops import backward_into
    A = late["A"]
    B, gY = rand(cp, (1024, 1024)), rand(cp, (4096, 1024))   # M, K, N = 4096, 1024, 1024
    gA, gB = poisoned(cp, (4096, 1024)), poisoned(cp, (1024, 1024))
    cp.cuda.Device().synchronize()
    old = tuning.forced_routes()
    tuning.force_routes(**dict(old, backward="branches"))
    try:
        _spin_copy(cp, late["src"], A, 100, s)
        backward_into(A, B, gY, None, act="none", with_bias=False, gA_out=gA, gB_out=gB, math="fp32",
                      stream=s, autotune="off")
    finally:
        tuning.force_routes(**old)
    checks = [(gA, lambda: f64(cp, gY) @ f64(cp, B).T, 1024)]
    return gB, lambda: f64(cp, late["src"]).T @ f64(cp, gY), 4096, checks


@pytest.mark.gpu
@pytest.mark.parametrize("fork", [_forked_grouped, _forked_dense], ids=["grouped:streams", "dense:branches"])
def test_the_side_stream_waits_for_the_callers_earlier_work_and_the_caller_for_the_side(fork):
    """The side stream's GEMM reads an operand that a kernel on the caller's stream writes 100 ms
    late (without the fork's event it would read NaN); a copy of its result enqueued on the
    caller's stream right after the call must see it whole (without the join, NaN)."""
    import cupy as cp
    s = cp.cuda.Stream(non_blocking=True)
    late = {"src": rand(cp, (4096, 1024)), "A": poisoned(cp, (4096, 1024))}
    side_out, side_ref, k, checks = fork(cp, s, late)
    with s:
        snapshot = side_out.copy()                  # on the caller's stream, after the call
    s.synchronize()
    ref = side_ref()
    assert rel_err(side_out.get(), ref) < tol("float32", "fp32", k), "the side stream did not wait for the fork"
    assert rel_err(snapshot.get(), ref) < tol("float32", "fp32", k), "the caller's stream did not wait for the join"
    for out, out_ref, kk in checks:
        assert rel_err(out.get(), out_ref()) < tol("float32", "fp32", kk)


@pytest.mark.gpu
def test_a_stream_buffer_made_before_a_capture_is_returned_in_it_and_a_new_one_refused():
    import cupy as cp
    from cygemm.engine import alloc
    M, K, N = 64, 32, 48
    s = cp.cuda.Stream(non_blocking=True)
    A, B = rand(cp, (M, K)), rand(cp, (K, N))
    cp.cuda.Device().synchronize()
    name = "test_context:out"
    calls = []

    def allocate(shape, dtype, ptr):
        calls.append(ptr)
        return alloc.empty_on(shape, dtype, ptr)

    try:
        buf = _context.stream_buffer(name, (M, N), "float32", s, allocate)
        assert calls == [s.ptr] and buf.shape == (M, N) and buf.dtype == np.float32
        cygemm.gemm(A, B, buf, math="fp32", stream=s)            # plans and the eager workspace
        s.synchronize()
        with cygemm.graph.capture(s) as graph:
            assert _context.stream_buffer(name, (M, N), "float32", s, allocate) is buf
            with pytest.raises(cygemm.CaptureError, match=f"^{name}: allocating it would break"):
                _context.stream_buffer(name, (M, N + 1), "float32", s, allocate)
            cygemm.gemm(A, B, buf, math="fp32", stream=s)        # the capture is still valid
        assert calls == [s.ptr]
        assert any(x is buf for x in graph.keepalive)           # the graph keeps it alive
        keys = [k for k in _context.stream_buffer_keys() if k[2] == name]
        assert keys == [(_context.current_device(), s.ptr, name, (M, N), "float32")]
        with s:
            buf[...] = cp.nan
        graph.launch(s)
        s.synchronize()
        assert rel_err(buf.get(), f64(cp, A) @ f64(cp, B)) < tol("float32", "fp32", K)
    finally:
        with _context._stream_buffers_lock:                     # (only this test's buffers)
            for key in [k for k in _context._stream_buffers if k[2] == name]:
                del _context._stream_buffers[key]


def test_a_given_workspace_serves_its_stream_and_side_and_no_other_stream():
    """(cygemm.jax gives XLA's scratch buffer: the first part for XLA's stream, the second for
    the side stream a forked route works on; any other stream keeps its own.)"""
    part = _context.PART_BYTES
    assert part == 32 * 1024 * 1024 + 64 * 1024             # cuBLAS's workspace and the stream's table
    base = 1 << 30
    assert _context._given_lookup(0x100, base, 2 * part, 0x200, [0x100, 0x200, 0x300, 0]) == [
        base, base + part, None, None, True]                  # True: nothing given afterwards
    # its parts start at the first address cuBLASLt's alignment allows
    assert _context._given_lookup(0x100, base + 16, part + 240, 0, [0x100])[0] == base + 256
    with pytest.raises(ValueError, match="workspace: expected at least 33619968 bytes"):
        _context._given_lookup(0x100, base + 16, part + 239, 0, [0x100])
    assert _context._given_now() is None
