"""GPU: correct on every stream, thread and device (issue 10). Each test names the item it
covers; each failed before its fix (the note of issue 10 says how each was seen to fail).

Multi-GPU tests carry the multigpu marker and run where there are two GPUs."""
import gc
import threading
import time

import numpy as np
import pytest

import cygemm
from cygemm import dense, gemm_ops
from cygemm.engine import plans
from cygemm.engine import context as _context, release as _release
from cygemm.gemm_ops import backward_into, forward_into
from gpu_util import f64, poisoned, rand, rel_err
from refs import activations

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

_SPIN_FILL = r"""
extern "C" __global__ void spin_fill(float* x, long long n, unsigned long long ns, float value) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { __nanosleep(1000); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = value;
}
"""


def spin_fill(x, ms, stream, value=12345.0):
    """On `stream`: wait `ms` milliseconds, then write `value` over all of x."""
    kernel = cp.RawKernel(_SPIN_FILL, "spin_fill")
    with stream:
        kernel((64,), (256,), (x, np.int64(x.size), np.uint64(int(ms * 1e6)), np.float32(value)))


def _freed_block_pending_on_current_stream(nbytes, ms=200):
    """Leave in CuPy's pool, on the current stream, a freed block of `nbytes` that a kernel
    still pending on that stream will overwrite (the trap of item 1)."""
    trap = cp.empty(nbytes // 4, cp.float32)
    spin_fill(trap, ms, cp.cuda.get_current_stream())
    del trap


# ------------------------------------------------------------------ item 1: allocations on the call's stream

@pytest.mark.parametrize("call", ["gemm", "gemm_strided_batched", "forward", "backward"])
def test_allocating_calls_allocate_on_the_callers_stream(call):
    M, K, N = 256, 64, 128
    s = cp.cuda.Stream(non_blocking=True)
    current = cp.cuda.Stream(non_blocking=True)
    with current:
        A, B, gY = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (M, N))
        A2 = cp.stack([A, A])               # before the trap: it would wait behind it
        current.synchronize()
        nbytes = {"gemm": M * N, "gemm_strided_batched": 2 * M * N, "forward": M * N, "backward": M * K}[call] * 4
        _freed_block_pending_on_current_stream(nbytes)
        if call == "gemm":
            out, ref = cygemm.gemm(A, B, math="fp32", stream=s), f64(cp, A) @ f64(cp, B)
        elif call == "gemm_strided_batched":
            out = cygemm.gemm_strided_batched(A2, B, math="fp32", stream=s)
            ref = np.stack([f64(cp, A) @ f64(cp, B)] * 2)
        elif call == "forward":
            out, _ = gemm_ops.forward(A, B, None, act="relu", math="fp32", stream=s)
            ref = np.maximum(f64(cp, A) @ f64(cp, B), 0)
        else:
            out, _, _ = gemm_ops.backward(A, B, gY, None, with_bias=False, need_gB=False, math="fp32", stream=s)
            ref = f64(cp, gY) @ f64(cp, B).T
        s.synchronize()
        current.synchronize()           # the trap kernel has run: it must not have hit `out`
    assert rel_err(out.get(), ref) < 1e-5
    # The block came from `s`'s part of CuPy's pool: freed, it is handed out again on `s`.
    ptr = out.data.ptr
    del out
    with s:
        again = cp.empty(nbytes // 4, cp.float32)
    assert again.data.ptr == ptr


# ------------------------------------------------------------------ item 2: no buffer shared across streams

def test_ensure_workspaces_gives_each_stream_its_own_buffers():
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    w1, w2 = gemm_ops.ensure_workspaces(96, 80, stream=s1), gemm_ops.ensure_workspaces(96, 80, stream=s2)
    assert w1.dZ.data.ptr != w2.dZ.data.ptr and w1.lt_ws.data.ptr != w2.lt_ws.data.ptr
    assert gemm_ops.ensure_workspaces(96, 80, stream=s1) == w1


def test_backward_on_two_streams_at_once_gives_both_right_gradients():
    """A long backward on s1 (large K) while s2 runs many of the same (M, N): with a dZ shared
    by shape, s2's dZ overwrote s1's while s1's GEMMs read it (relative error 1.41)."""
    M, N, K1, K2 = 512, 512, 65536, 64
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    A1, B1, gY1 = rand(cp, (M, K1)), rand(cp, (K1, N)), rand(cp, (M, N))
    A2, B2, gY2 = rand(cp, (M, K2)), rand(cp, (K2, N)), rand(cp, (M, N))
    Z1, Z2 = rand(cp, (M, N)), rand(cp, (M, N))
    cp.cuda.Device().synchronize()
    results2 = []
    gA1, _, _ = gemm_ops.backward(A1, B1, gY1, Z1, act="gelu", with_bias=False, need_gB=False, math="fp32",
                                  stream=s1)
    for _ in range(40):
        results2.append(gemm_ops.backward(A2, B2, gY2, Z2, act="gelu", with_bias=False, need_gB=False,
                                          math="fp32", stream=s2)[0])
    s1.synchronize()
    s2.synchronize()
    ref1 = (f64(cp, gY1) * activations.act_grad("gelu", f64(cp, Z1))) @ f64(cp, B1).T
    ref2 = (f64(cp, gY2) * activations.act_grad("gelu", f64(cp, Z2))) @ f64(cp, B2).T
    assert rel_err(gA1.get(), ref1) < 1e-4
    assert max(rel_err(r.get(), ref2) for r in results2) < 1e-4


# ------------------------------------------------------------------ item 3: one-row outputs of any row stride

def _one_row_views(N, kind):
    if kind == "y1d[None]":                  # row stride 0
        return poisoned(cp, (N,))[None], poisoned(cp, (N,))[None]
    return poisoned(cp, (N, 1)).T, poisoned(cp, (N, 1)).T   # "x.T": row stride 1


@pytest.mark.parametrize("kind", ["y1d[None]", "x.T"])
@pytest.mark.parametrize("act,K", [("gelu", 64), ("silu", 64), ("relu", 64), ("none", 64), ("gelu", 0)])
def test_one_row_out_and_z_out_of_row_stride_0_or_1(kind, act, K):
    N = 64                                   # a multiple of 8: GELU_AUX may write Z as its aux
    A, B, bias = rand(cp, (1, K)), rand(cp, (K, N)), rand(cp, (N,))
    Y, Z = _one_row_views(N, kind)
    assert Y.strides[0] in (0, 4)
    forward_into(A, B, Y, bias, act=act, save_z=True, z_out=Z, math="fp32")
    z = f64(cp, A) @ f64(cp, B) + f64(cp, bias)
    assert rel_err(Z.get(), z) < 1e-5 and rel_err(Y.get(), activations.act(act, z)) < 1e-5
    Y2, _ = _one_row_views(N, kind)
    forward_into(A, B, Y2, bias, act=act, math="fp32")          # the single-epilogue route
    assert rel_err(Y2.get(), activations.act(act, z)) < 1e-5


# ------------------------------------------------------------------ item 4: interleaved batched outputs

def test_per_head_results_written_into_one_interleaved_buffer():
    S, H, D, K = 96, 4, 32, 48
    A, B = rand(cp, (H, S, K)), rand(cp, (H, K, D))
    buf = poisoned(cp, (S, H * D))
    out = buf.reshape(S, H, D).transpose(1, 0, 2)              # batch stride D, row stride H*D
    assert out.strides == (D * 4, H * D * 4, 4)
    cygemm.gemm_strided_batched(A, B, out, math="fp32")
    ref = np.matmul(f64(cp, A), f64(cp, B)).transpose(1, 0, 2).reshape(S, H * D)
    assert rel_err(buf.get(), ref) < 1e-5                      # every element written, none twice


# ------------------------------------------------------------------ item 5: allocating forms take W.T

def test_forward_and_backward_take_a_transposed_weight():
    M, K, N = 64, 48, 80
    A, W, bias, gY = rand(cp, (M, K)), rand(cp, (N, K)), rand(cp, (N,)), rand(cp, (M, N))
    Y, Z = gemm_ops.forward(A, W.T, bias, act="relu", save_z=True, math="fp32")
    z = f64(cp, A) @ f64(cp, W).T + f64(cp, bias)
    assert rel_err(Y.get(), np.maximum(z, 0)) < 1e-5
    gA, gB, gb = gemm_ops.backward(A, W.T, gY, Z, act="relu", math="fp32")
    dz = f64(cp, gY) * (f64(cp, Z) > 0)
    assert rel_err(gA.get(), dz @ f64(cp, W)) < 1e-5 and rel_err(gB.get(), f64(cp, A).T @ dz) < 1e-5
    assert rel_err(gb.get(), dz.sum(0)) < 1e-5 and gB.shape == (K, N)


# ------------------------------------------------------------------ item 6: autotuning releases the GIL

def test_first_large_call_autotunes_without_holding_the_gil():
    # 2.7e11 multiply-adds in strict fp32: each timed run takes ~10 ms, which the old code
    # waited for with the GIL held (the issue saw another thread stall 47.5 ms).
    M = N = 8192
    K = 4096
    A, B, Y = rand(cp, (M, K)), rand(cp, (K, N)), cp.empty((M, N), cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    plans.clear_plan_cache()
    gaps, stop = [], threading.Event()

    def ticker():
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.0005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.05)
    gaps.clear()
    start = time.perf_counter()
    forward_into(A, B, Y, None, act="gelu", math="fp32", stream=s)   # a new plan: the candidates are timed
    s.synchronize()
    took = time.perf_counter() - start
    stop.set()
    t.join()
    tuned = [p.tuned_ms for p in plans.thread_plans().values()]
    assert any(ms > 0 for ms in tuned), "the call did not autotune"
    assert took > 0.02, took                                 # long enough for the check to mean something
    assert max(gaps) < 0.02, f"another thread waited {max(gaps) * 1e3:.1f} ms during a {took * 1e3:.0f} ms call"


# ------------------------------------------------------------------ item 7: workspaces have a bound

def test_hundred_short_lived_streams_leave_memory_flat():
    A, B, C = rand(cp, (64, 64)), rand(cp, (64, 64)), poisoned(cp, (64, 64))
    bound = _context.context_info()["max_eager_workspaces"]

    def churn(n):
        for _ in range(n):
            s = cp.cuda.Stream(non_blocking=True)
            cygemm.gemm(A, B, C, math="fp32", stream=s)
            s.synchronize()
            del s

    churn(2 * bound)                          # warm: the bound is reached
    gc.collect()
    used0 = device_bytes_in_use(release=False)
    churn(100)
    gc.collect()
    used1 = device_bytes_in_use(release=False)
    assert _context.context_info()["eager_workspaces"] <= bound
    assert _release.pending_workspace_frees() == 0               # evicted ones were freed at once
    assert used1 - used0 < 32 << 20, f"{(used1 - used0) >> 20} MiB more in use after 100 streams"
    assert rel_err(C.get(), f64(cp, A) @ f64(cp, B)) < 1e-5


def test_release_workspaces_frees_them_and_calls_still_work():
    A, B, C = rand(cp, (64, 64)), rand(cp, (64, 64)), poisoned(cp, (64, 64))
    cygemm.gemm(A, B, C, math="fp32")
    assert _context.context_info()["workspaces"] >= 1
    cp.cuda.Device().synchronize()
    cygemm.release_workspaces()
    assert _context.context_info()["workspaces"] == 0
    C[...] = cp.nan
    cygemm.gemm(A, B, C, math="fp32")
    assert rel_err(C.get(), f64(cp, A) @ f64(cp, B)) < 1e-5


# ------------------------------------------------------------------ a misaligned workspace: refused, nothing spoiled

def test_misaligned_lt_workspace_is_refused_and_the_aligned_one_works():
    """cuBLASLt needs a 256-byte aligned workspace: one byte off is refused before anything
    runs (it once made a plan of its own), and the aligned one then computes right."""
    M, K, N = 256, 128, 192
    A, B, bias = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,))
    store = cp.empty((4 << 20) + 512, cp.uint8)
    plans.clear_plan_cache()
    Y = poisoned(cp, (M, N))
    with pytest.raises(ValueError, match="lt_workspace: expected a workspace aligned to 256 bytes"):
        forward_into(A, B, Y, bias, act="relu", lt_workspace=store[1:1 + (4 << 20)], math="fp32")
    cp.cuda.Device().synchronize()
    assert bool(cp.isnan(Y).all()) and plans.plan_cache_size() == 0
    forward_into(A, B, Y, bias, act="relu", lt_workspace=store[:4 << 20], math="fp32")
    assert rel_err(Y.get(), np.maximum(f64(cp, A) @ f64(cp, B) + f64(cp, bias), 0)) < 1e-5
    assert all(p.usable for p in plans.thread_plans().values())


# ------------------------------------------------------------------ a bias misaligned on its own (kept)

@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("offset", [1, 2, 3])
def test_bias_misaligned_on_its_own(dtype, offset):
    M, K, N = 256, 128, 192
    A, B = rand(cp, (M, K), dtype), rand(cp, (K, N), dtype)
    bias = rand(cp, (N + 8,), dtype)[offset:offset + N]
    Y = poisoned(cp, (M, N), dtype)
    forward_into(A, B, Y, bias, act="relu", math="fp32")
    ref = np.maximum(f64(cp, A) @ f64(cp, B) + f64(cp, bias), 0)
    assert rel_err(Y.get(), ref) < (1e-2 if dtype == "float16" else 1e-5)


# ------------------------------------------------------------------ a graph owns its workspace

def test_graph_replayed_on_another_stream_while_eager_work_runs_on_the_capture_stream():
    M, K, N = 512, 256, 384
    s, t = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    A, B, gY, Z = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (M, N)), rand(cp, (M, N))
    gA, gb, dZ = poisoned(cp, (M, K)), poisoned(cp, (N,)), poisoned(cp, (M, N))
    A2, B2, gY2, Z2 = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (M, N)), rand(cp, (M, N))
    gA2, gb2, dZ2 = poisoned(cp, (M, K)), poisoned(cp, (N,)), poisoned(cp, (M, N))
    cp.cuda.Device().synchronize()
    kw = dict(act="gelu", math="fp32")
    backward_into(A, B, gY, Z, gA_out=gA, gBias_out=gb, work_dZ=dZ, stream=s, **kw)     # warm
    s.synchronize()
    before = _context.context_info()["capture_workspaces"]
    with cygemm.graph.capture(s) as g:
        backward_into(A, B, gY, Z, gA_out=gA, gBias_out=gb, work_dZ=dZ, stream=s, **kw)
    assert _context.context_info()["capture_workspaces"] == before + 1    # the graph's own workspace
    for _ in range(20):                      # replays on t, eager backward (other data) on s
        g.launch(t)
        backward_into(A2, B2, gY2, Z2, gA_out=gA2, gBias_out=gb2, work_dZ=dZ2, stream=s, **kw)
    s.synchronize()
    t.synchronize()
    dz = f64(cp, gY) * activations.act_grad("gelu", f64(cp, Z))
    dz2 = f64(cp, gY2) * activations.act_grad("gelu", f64(cp, Z2))
    assert rel_err(gA.get(), dz @ f64(cp, B).T) < 1e-4 and rel_err(gb.get(), dz.sum(0)) < 1e-4
    assert rel_err(gA2.get(), dz2 @ f64(cp, B2).T) < 1e-4 and rel_err(gb2.get(), dz2.sum(0)) < 1e-4


def test_graph_workspaces_are_freed_once_graphs_go_whatever_captured_them():
    """Captures by cygemm.graph and by CuPy's own capture API: each graph owns its workspace
    (a CUDA user object); dropping the graphs frees them, so 40 captures leave memory flat."""
    M = K = N = 64
    A, B, Y = rand(cp, (M, K)), rand(cp, (K, N)), poisoned(cp, (M, N))
    s = cp.cuda.Stream(non_blocking=True)
    cygemm.gemm(A, B, Y, stream=s)
    s.synchronize()

    def capture_and_drop(n):
        for i in range(n):
            if i % 2:
                with cygemm.graph.capture(s) as g:
                    cygemm.gemm(A, B, Y, math="fp32", stream=s)
                g.launch(s)
            else:
                s.begin_capture()
                cygemm.gemm(A, B, Y, math="fp32", stream=s)
                g = s.end_capture()
                g.launch(s)
            s.synchronize()
            del g
            gc.collect()

    capture_and_drop(4)
    used0 = device_bytes_in_use()
    capture_and_drop(40)
    time.sleep(0.2)             # CUDA runs the user objects' destructors on its own thread
    cygemm.gemm(A, B, Y, math="fp32", stream=cp.cuda.Stream(non_blocking=True))   # frees the queue
    used1 = device_bytes_in_use()
    assert used1 - used0 < 64 << 20, f"{(used1 - used0) >> 20} MiB more after 40 captured graphs"
    assert rel_err(Y.get(), f64(cp, A) @ f64(cp, B)) < 1e-5


def test_a_thread_ending_mid_capture_leaves_the_capture_valid():
    """A thread's end releases its cuBLAS/cuBLASLt handles; cublasDestroy synchronizes the
    device, which invalidates a capture another thread has open (the stress test's one-GPU
    failure, CUBLAS_STATUS_INTERNAL_ERROR). The handles wait until no capture is open."""
    m, n, k = 96, 64, 80
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        A, B, bias, Y = rand(cp, (m, k)), rand(cp, (k, n)), rand(cp, (n,)), poisoned(cp, (m, n))
    forward_into(A, B, Y, bias, act="relu", math="fp32", stream=s)      # plans and kernels
    s.synchronize()
    kept = []                       # the worker's stream outlives it: only its context goes
    ready, go = threading.Event(), threading.Event()

    def worker():
        t = cp.cuda.Stream(non_blocking=True)
        kept.append(t)
        out = cp.empty((m, n), cp.float32)
        cygemm.gemm(A, B, out, math="fp32", stream=t)       # this thread now has handles
        t.synchronize()
        kept.append(out)
        ready.set()
        go.wait()

    th = threading.Thread(target=worker)
    th.start()
    ready.wait()
    cygemm.release_workspaces()     # an empty queue (but for graph destructors CUDA runs late)
    pending0 = _release.pending_workspace_frees()
    with s:
        Y[...] = cp.nan
    with cygemm.graph.capture(s) as graph:
        forward_into(A, B, Y, bias, act="relu", math="fp32", stream=s)
        go.set()
        th.join()                   # its thread-local context is gone once join returns
        gc.collect()
        pending_mid = _release.pending_workspace_frees()
        forward_into(A, B, Y, bias, act="relu", math="fp32", stream=s)
    pending_after = _release.pending_workspace_frees()
    graph.launch(s)
    s.synchronize()
    ref = np.maximum(f64(cp, A) @ f64(cp, B) + f64(cp, bias), 0)
    assert rel_err(Y.get(), ref) < 1e-5
    assert pending_mid >= pending0 + 2, "the ended thread's handles were destroyed mid-capture"
    assert pending_after <= pending0, "the queue is released once no capture is open"


# ------------------------------------------------------------------ several GPUs

def _on(device, fn):
    with cp.cuda.Device(device):
        return fn()


def device_bytes_in_use(device=None, release=True):
    """Device memory in use outside CuPy's pool (its cached blocks are let go first); with
    `release`, after cygemm's queue of workspaces to free is emptied (it waits while captures
    run) and this thread's workspaces are freed."""
    def read():
        if release:
            cygemm.release_workspaces()   # destroys graphs dropped during captures, ...
            time.sleep(0.2)   # ... whose user-object destructors CUDA runs on its own thread,
            cygemm.release_workspaces()   # queueing their workspaces: freed now
        cp.get_default_memory_pool().free_all_blocks()
        free, total = cp.cuda.runtime.memGetInfo()
        return total - free - cp.get_default_memory_pool().total_bytes()
    return read() if device is None else _on(device, read)


@pytest.mark.multigpu
def test_each_device_computes_with_its_own_context_out_none_and_capture():
    for dev in range(cp.cuda.runtime.getDeviceCount()):
        with cp.cuda.Device(dev):
            s = cp.cuda.Stream(non_blocking=True)
            A, B, bias = rand(cp, (96, 64)), rand(cp, (64, 80)), rand(cp, (80,))
            out = cygemm.gemm(A, B, math="fp32", stream=s)                 # out=None on this device
            Y, Z = gemm_ops.forward(A, B, bias, act="gelu", save_z=True, math="fp32", stream=s)
            s.synchronize()
            assert out.device.id == dev and Y.device.id == dev
            assert _context.context_info()["device"] == dev
            z = f64(cp, A) @ f64(cp, B)
            assert rel_err(out.get(), z) < 1e-5
            Y2 = poisoned(cp, (96, 80))
            with cygemm.graph.capture(s) as g:
                forward_into(A, B, Y2, bias, act="relu", math="fp32", stream=s)
            g.launch(s)
            s.synchronize()
            assert rel_err(Y2.get(), np.maximum(z + f64(cp, bias), 0)) < 1e-5


@pytest.mark.multigpu
def test_outputs_and_bias_of_another_device_are_refused_before_anything_runs():
    with cp.cuda.Device(1):
        gA1, b1 = poisoned(cp, (8, 4)), rand(cp, (6,))
    with cp.cuda.Device(0):
        A, B, gY, Y = rand(cp, (8, 4)), rand(cp, (4, 6)), rand(cp, (8, 6)), poisoned(cp, (8, 6))
        with pytest.raises(ValueError, match="gA_out: the array is on device 1"):
            backward_into(A, B, gY, None, gA_out=gA1)
        with pytest.raises(ValueError, match="bias: the array is on device 1"):
            forward_into(A, B, Y, b1, act="relu")
        assert bool(cp.isnan(Y).all())
    with cp.cuda.Device(1):
        assert bool(cp.isnan(gA1).all())


@pytest.mark.multigpu
def test_stream_of_another_device_is_refused_during_capture_and_the_capture_survives():
    with cp.cuda.Device(1):
        s1 = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.Device(0):
        s = cp.cuda.Stream(non_blocking=True)
        A, B, Y = rand(cp, (16, 16)), rand(cp, (16, 16)), poisoned(cp, (16, 16))
        cygemm.gemm(A, B, Y, stream=s)
        s.synchronize()
        Y[...] = cp.nan
        cp.cuda.Device().synchronize()
        with cygemm.graph.capture(s) as g:
            with pytest.raises(ValueError, match="stream: the stream belongs to device 1"):
                cygemm.gemm(A, B, Y, stream=s1)
            cygemm.gemm(A, B, Y, math="fp32", stream=s)
        g.launch(s)
        s.synchronize()
        assert rel_err(Y.get(), f64(cp, A) @ f64(cp, B)) < 1e-5


@pytest.mark.multigpu
def test_two_threads_each_drive_their_own_gpu():
    errors = []

    def worker(dev):
        try:
            with cp.cuda.Device(dev):
                s = cp.cuda.Stream(non_blocking=True)
                rng = np.random.default_rng(dev)
                for i in range(200):
                    m, n, k = (int(x) for x in rng.integers(1, 200, 3))
                    A, B = rand(cp, (m, k), rng=rng), rand(cp, (k, n), rng=rng)
                    s.synchronize()
                    out = cygemm.gemm(A, B, math="fp32", stream=s) if i % 2 else \
                        gemm_ops.forward(A, B, None, act="relu", math="fp32", stream=s)[0]
                    s.synchronize()
                    ref = f64(cp, A) @ f64(cp, B)
                    ref = ref if i % 2 else np.maximum(ref, 0)
                    if not rel_err(out.get(), ref) < 1e-5 or out.device.id != dev:
                        errors.append((dev, i))
        except Exception as exc:
            errors.append((dev, repr(exc)))

    threads = [threading.Thread(target=worker, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]


# ------------------------------------------------------------------ the mix, on every GPU

def test_stress_threads_streams_allocating_and_into_forms_capture_and_replay():
    """8 threads, each creating and dropping streams as it goes, mixing allocating and *_into
    calls, captures and replays, on every GPU; every result against float64; device memory
    flat after the warm-up round."""
    n_dev = cp.cuda.runtime.getDeviceCount()
    errors = []

    # CUDA invalidates a capture when any thread synchronizes the device it runs on (a
    # blocking copy, a stream or device sync, cudaFree): the test's own host work (inputs,
    # references, checks) takes this lock, as every capture does. cygemm's calls, eager or
    # allocating, and graph launches run outside it, concurrently with other threads' captures.
    sync_lock = threading.Lock()

    # A few shapes, each run once on every device before the threads start: a kernel's first
    # launch loads its module (CUDA's lazy loading), which may synchronize the context and so
    # invalidate a capture another thread has open (suspected in a one-GPU run where a
    # capture failed with CUBLAS_STATUS_INTERNAL_ERROR, not confirmed).
    shapes = [(96, 64, 80), (33, 128, 17), (150, 40, 120), (8, 160, 64)]

    def one_round(tid, rng, dev, shape=None, capture=True):
        with cp.cuda.Device(dev):
            m, n, k = shape or shapes[int(rng.integers(len(shapes)))]
            with sync_lock:
                s, t = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
                with s:
                    A, B, bias, gY = rand(cp, (m, k), rng=rng), rand(cp, (k, n), rng=rng), \
                        rand(cp, (n,), rng=rng), rand(cp, (m, n), rng=rng)
                    Y2, gA2, dZ2 = poisoned(cp, (m, n)), poisoned(cp, (m, k)), poisoned(cp, (m, n))
                a, b, c, g = f64(cp, A), f64(cp, B), f64(cp, bias), f64(cp, gY)
            z = a @ b + c
            dz = g * (z > 0)
            out = cygemm.gemm(A, B, math="fp32", stream=s)
            Y, Z = gemm_ops.forward(A, B, bias, act="relu", save_z=True, math="fp32", stream=s)
            gA, gB, gb = gemm_ops.backward(A, B, gY, Z, act="relu", math="fp32", stream=s)
            # One eager call per shape before capturing, as the README asks (plans, kernels).
            forward_into(A, B, Y2, bias, act="gelu", math="fp32", stream=s)
            backward_into(A, B, gY, Z, act="relu", gA_out=gA2, work_dZ=dZ2, math="fp32", stream=s)
            with sync_lock:
                with s:
                    Y2[...] = cp.nan
                    gA2[...] = cp.nan
                if capture:
                    with cygemm.graph.capture(s) as graph:
                        forward_into(A, B, Y2, bias, act="gelu", math="fp32", stream=s)
                        backward_into(A, B, gY, Z, act="relu", gA_out=gA2, work_dZ=dZ2, math="fp32", stream=s)
            if capture:
                t.wait_event(s.record())
                graph.launch(t)
            else:
                forward_into(A, B, Y2, bias, act="gelu", math="fp32", stream=s)
                backward_into(A, B, gY, Z, act="relu", gA_out=gA2, work_dZ=dZ2, math="fp32", stream=s)
            checks = [(out, a @ b), (Y, np.maximum(z, 0)), (gA, dz @ b.T), (gB, a.T @ dz), (gb, dz.sum(0)),
                      (Y2, activations.act("gelu", z)), (gA2, dz @ b.T)]
            with sync_lock:
                t.synchronize()
                s.synchronize()
                got = [x.get() for x, _ in checks]
            for i, (x, (_, ref)) in enumerate(zip(got, checks)):
                err = rel_err(x, ref)
                if not err < 1e-4:
                    errors.append((tid, dev, i, (m, n, k), err))

    def worker(tid, rounds):
        try:
            rng = np.random.default_rng(1000 + tid)
            for r in range(rounds):
                one_round(tid, rng, (tid + r) % n_dev)
        except Exception as exc:
            errors.append((tid, repr(exc)))

    def run(rounds):
        threads = [threading.Thread(target=worker, args=(t, rounds)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    rng0 = np.random.default_rng(0)
    for dev in range(n_dev):                  # every kernel the threads will use, loaded
        for shape in shapes:
            one_round(-1, rng0, dev, shape, capture=False)
    run(4)                                    # warm-up: plans, handles, workspaces per thread
    gc.collect()
    used0 = [device_bytes_in_use(d) for d in range(n_dev)]
    run(12)
    gc.collect()
    used1 = [device_bytes_in_use(d) for d in range(n_dev)]
    assert not errors, errors[:5]
    for d in range(n_dev):   # threads are new each run: their contexts went with them
        assert used1[d] - used0[d] < 64 << 20, f"device {d}: {(used1[d] - used0[d]) >> 20} MiB more in use"
