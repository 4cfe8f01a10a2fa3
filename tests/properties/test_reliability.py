"""GPU: edge sizes (zero, past 2**31), misaligned pointers, random properties against
float64, eight threads, two streams, a 100,000-call soak and 10,000 graph replays."""
import os
import threading

import numpy as np
import pytest

import cygemm
from cygemm import gemm_ops
from cygemm.engine import context as _context
from cygemm.gemm_ops import backward_into, forward_into
from gpu_util import err_vs_scale, f64, poisoned, rand, rel_err
from refs import activations

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")
hyp = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402


def fp32_bound(k):
    return 1e-5 * max(1.0, np.sqrt(k / 64))


# GPU property tests: examples each (scripts/gpu_suite.sh sets 500).
GPU_EXAMPLES = int(os.environ.get("CYGEMM_GPU_PROPERTY_EXAMPLES", "40"))
SLOPE = 0.07          # not leaky_relu's default 0.01: a kernel that ignores the slope fails


# ------------------------------------------------------------------ zero sizes

@pytest.mark.parametrize("m,n,k", [(0, 5, 3), (4, 0, 3), (0, 0, 0)])
def test_gemm_empty_output_is_a_no_op(m, n, k):
    out = cp.empty((m, n), cp.float32)
    assert cygemm.gemm(rand(cp, (m, k)), rand(cp, (k, n)), out, beta=1.0) is out


def test_batched_zero_batch_and_zero_k():
    out = cygemm.gemm_strided_batched(cp.empty((0, 3, 4), cp.float32), cp.empty((0, 4, 2), cp.float32))
    assert out.shape == (0, 3, 2)
    C0 = rand(cp, (3, 5, 6))
    out = C0.copy()
    cygemm.gemm_strided_batched(cp.empty((3, 5, 0), cp.float32), cp.empty((3, 0, 6), cp.float32), out,
                                alpha=2.0, beta=-0.5)
    assert rel_err(out.get(), -0.5 * f64(cp, C0)) < 1e-7


@pytest.mark.parametrize("accumulate", [False, True])
def test_backward_with_zero_rows_gives_zero_or_unchanged_grads(accumulate):
    K, N = 7, 9
    A, gY, Z = cp.empty((0, K), cp.float32), cp.empty((0, N), cp.float32), cp.empty((0, N), cp.float32)
    B = rand(cp, (K, N))
    gB0, gb0 = rand(cp, (K, N)), rand(cp, (N,))
    gB, gb = gB0.copy(), gb0.copy()
    backward_into(A, B, gY, Z, act="relu", gA_out=cp.empty((0, K), cp.float32), gB_out=gB, gBias_out=gb,
                  work_dZ=cp.empty((0, N), cp.float32), accumulate=accumulate, math="fp32")
    want_gB, want_gb = (gB0.get(), gb0.get()) if accumulate else (np.zeros((K, N)), np.zeros(N))
    np.testing.assert_array_equal(gB.get(), want_gB)
    np.testing.assert_array_equal(gb.get(), want_gb)


def test_backward_with_zero_columns_gives_zero_gA():
    M, K = 6, 5
    gA = poisoned(cp, (M, K))
    backward_into(rand(cp, (M, K)), cp.empty((K, 0), cp.float32), cp.empty((M, 0), cp.float32), None,
                  gA_out=gA, gBias_out=cp.empty((0,), cp.float32), math="fp32")
    np.testing.assert_array_equal(gA.get(), np.zeros((M, K)))


def test_forward_zero_rows_is_a_no_op():
    out = cp.empty((0, 4), cp.float32)
    assert forward_into(cp.empty((0, 3), cp.float32), rand(cp, (3, 4)), out, rand(cp, (4,)), act="gelu") is out


# ------------------------------------------------------------------ past 32-bit sizes

def test_gemm_past_int32_uses_the_64bit_api():
    rows = 2**31 + 96                                   # n of the column-major call > INT32_MAX
    need = rows * 4 * (1 + 2 + 2) + (1 << 30)
    if cp.cuda.Device().mem_info[0] < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory")
    A = cp.random.standard_normal((rows, 1), dtype=cp.float32)
    B = cp.asarray(np.random.default_rng().standard_normal((1, 2)).astype(np.float32))
    out = cp.full((rows, 2), cp.nan, cp.float32)
    cygemm.gemm(A, B, out, math="fp32")                 # k = 1: each element is one exact product
    cp.cuda.Device().synchronize()
    b = B.get()
    for j in range(2):
        bad = int(cp.count_nonzero(out[:, j] != A[:, 0] * b[0, j]))
        assert bad == 0, f"column {j}: {bad} elements differ"
    del A, out
    cp.get_default_memory_pool().free_all_blocks()


# ------------------------------------------------------------------ misaligned pointers

@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
def test_misaligned_forward_and_backward_are_correct(dtype, act):
    M, K, N = 40, 24, 56
    off = 1                                             # one element: 4- or 2-byte alignment only
    A = rand(cp, (M * K + off,), dtype)[off:].reshape(M, K)
    B = rand(cp, (K * N + off,), dtype)[off:].reshape(K, N)
    bias = rand(cp, (N + off,), dtype)[off:]
    Y = poisoned(cp, (M * N + off,), dtype)[off:].reshape(M, N)
    Z = poisoned(cp, (M * N + 3,), dtype)[3:].reshape(M, N)
    forward_into(A, B, Y, bias, act=act, save_z=True, z_out=Z, math="fp32")
    z = f64(cp, A) @ f64(cp, B) + f64(cp, bias)
    tol = 1e-5 if dtype == "float32" else 1e-2
    assert rel_err(Z.get(), z) < tol
    gY = rand(cp, (M * N + off,), dtype)[off:].reshape(M, N)
    gA, gB = poisoned(cp, (M * K + off,), dtype)[off:].reshape(M, K), poisoned(cp, (K, N), dtype)
    gb, dZ = poisoned(cp, (N + off,), dtype)[off:], poisoned(cp, (M * N + off,), dtype)[off:].reshape(M, N)
    backward_into(A, B, gY, Z, act=act, gA_out=gA, gB_out=gB, gBias_out=gb, work_dZ=dZ, math="fp32")
    zz = f64(cp, Z)
    dz = f64(cp, gY) * activations.act_grad(act, zz)
    tol = 2e-5 if dtype == "float32" else 2e-2
    assert rel_err(gA.get(), dz @ f64(cp, B).T) < tol
    assert rel_err(gB.get(), f64(cp, A).T @ dz) < tol
    assert rel_err(gb.get(), dz.sum(0)) < tol


# ------------------------------------------------------------------ properties (bounded random run)

def _operand(rng, rows, cols, transposed, sliced):
    """A (rows, cols) float32 view: maybe a transposed array, maybe a slice of a larger one."""
    shape = (cols, rows) if transposed else (rows, cols)
    if sliced:
        big = rand(cp, (shape[0] + 3, shape[1] + 5), rng=rng)
        x = big[2:2 + shape[0], 1:1 + shape[1]]
    else:
        x = rand(cp, shape, rng=rng)
    return x.T if transposed else x


@settings(max_examples=max(60, GPU_EXAMPLES), deadline=None, database=None)
@given(m=st.integers(1, 300), n=st.integers(1, 300), k=st.integers(1, 300), ta=st.booleans(), tb=st.booleans(),
       lay=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
       alpha=st.sampled_from([1.0, -0.5, 2.0]), beta=st.sampled_from([0.0, 1.0, -1.5]), seed=st.integers(0, 2**32 - 1))
def test_gemm_property_against_float64(m, n, k, ta, tb, lay, alpha, beta, seed):
    rng = np.random.default_rng(seed)
    A = _operand(rng, k, m, lay[0], lay[1]) if ta else _operand(rng, m, k, lay[0], lay[1])
    B = _operand(rng, n, k, lay[2], lay[3]) if tb else _operand(rng, k, n, lay[2], lay[3])
    C0 = rand(cp, (m, n), rng=rng)
    out = C0.copy() if beta else poisoned(cp, (m, n))       # beta = 0 must not read out
    cygemm.gemm(A, B, out, trans_a=ta, trans_b=tb, alpha=alpha, beta=beta, math="fp32")
    a, b = f64(cp, A), f64(cp, B)
    opa, opb, c0 = (a.T if ta else a), (b.T if tb else b), f64(cp, C0)
    ref = alpha * opa @ opb + (beta * c0 if beta else 0)
    # Rounding is bounded by the size of the terms, not of their sum: where beta * C cancels
    # A @ B (an m = n = 1 result), the sum is small and its own norm would bound nothing.
    terms = abs(alpha) * np.abs(opa) @ np.abs(opb) + abs(beta) * np.abs(c0)
    assert err_vs_scale(out.get(), ref, terms) < fp32_bound(k) * 3


@settings(max_examples=GPU_EXAMPLES, deadline=None, database=None)
@given(batch=st.integers(1, 6), m=st.integers(1, 80), n=st.integers(1, 80), k=st.integers(1, 80),
       broadcast=st.sampled_from(["none", "A", "B"]), gap=st.integers(0, 7), ta=st.booleans(), tb=st.booleans(),
       beta=st.sampled_from([0.0, 0.5]), seed=st.integers(0, 2**32 - 1))
def test_batched_property_against_float64(batch, m, n, k, broadcast, gap, ta, tb, beta, seed):
    rng = np.random.default_rng(seed)
    sa, sb = ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))
    A = rand(cp, (1 if broadcast == "A" else batch,) + sa, rng=rng)
    B = rand(cp, (1 if broadcast == "B" else batch,) + sb, rng=rng)
    # out with `gap` unused elements between matrices: a batch stride larger than m*n.
    store = poisoned(cp, (batch, m * n + gap))
    out = store[:, :m * n].reshape(batch, m, n)
    C0 = rand(cp, (batch, m, n), rng=rng)
    if beta:
        out[...] = C0
    cygemm.gemm_strided_batched(A, B, out, trans_a=ta, trans_b=tb, beta=beta, math="fp32")
    a, b = f64(cp, A), f64(cp, B)
    a, b = (a.transpose(0, 2, 1) if ta else a), (b.transpose(0, 2, 1) if tb else b)
    ref = np.matmul(a, b) + (beta * f64(cp, C0) if beta else 0)
    terms = np.matmul(np.abs(a), np.abs(b)) + abs(beta) * np.abs(f64(cp, C0))     # (a sum may cancel)
    assert err_vs_scale(out.get(), ref, terms) < fp32_bound(k) * 3
    if gap:
        assert bool(cp.isnan(store[:, m * n:]).all())       # nothing written between matrices


@settings(max_examples=GPU_EXAMPLES, deadline=None, database=None)
@given(m=st.integers(1, 200), n=st.integers(1, 200), k=st.integers(1, 200),
       act=st.sampled_from(["none", "relu", "leaky_relu", "gelu", "gelu_erf", "sigmoid", "tanh", "silu"]),
       with_bias=st.booleans(), save_z=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_forward_backward_property_against_float64(m, n, k, act, with_bias, save_z, seed):
    rng = np.random.default_rng(seed)
    A, B, bias, gY = (rand(cp, s, rng=rng) for s in ((m, k), (k, n), (n,), (m, n)))
    Y, Z = poisoned(cp, (m, n)), poisoned(cp, (m, n))
    forward_into(A, B, Y, bias if with_bias else None, act=act, leaky_slope=SLOPE, save_z=True, z_out=Z, math="fp32")
    a, b, c, g = f64(cp, A), f64(cp, B), (f64(cp, bias) if with_bias else 0), f64(cp, gY)
    z = a @ b + c
    # Errors are measured against the magnitudes that went in (|A||B|, |dZ||B|, column sums
    # of |dZ|), not against the result: with m or n = 1 a result can cancel to ~0, and a
    # norm-wise relative error then has no bound (item 9 of issue 10: n=1, k=77, gelu).
    z_scale = np.abs(a) @ np.abs(b) + np.abs(c)
    assert err_vs_scale(Z.get(), z, z_scale) < fp32_bound(k) * 3
    y_ref = activations.act(act, z, SLOPE)
    assert err_vs_scale(Y.get(), y_ref, z_scale) < fp32_bound(k) * 12
    gA, gB, gb, dZ = poisoned(cp, (m, k)), poisoned(cp, (k, n)), poisoned(cp, (n,)), poisoned(cp, (m, n))
    backward_into(A, B, gY, Z, act=act, leaky_slope=SLOPE, gA_out=gA, gB_out=gB, gBias_out=gb, work_dZ=dZ,
                  math="fp32")
    dz = g * activations.act_grad(act, f64(cp, Z), SLOPE)
    # act' is evaluated in fp32 from terms of size <= ~1 (gelu' = 0.5(1 + t) + ...): its error
    # is ~1e-7 absolute, so dZ's scale is |gY|, not |dZ| (gelu' = 0 at z = -0.75).
    dz_scale = np.abs(g)
    assert err_vs_scale(gA.get(), dz @ b.T, dz_scale @ np.abs(b).T) < 1e-4
    assert err_vs_scale(gB.get(), a.T @ dz, np.abs(a).T @ dz_scale) < 1e-4
    assert err_vs_scale(gb.get(), dz.sum(0), dz_scale.sum(0)) < 1e-4


def test_property_bound_is_met_where_norm_relative_error_fails():
    """Item 9: at n = 1 the old bound (||out - ref|| / ||ref|| < 1e-4) fails for correct
    results whose reference cancels: Z at gelu's stationary point makes gelu'(Z) ~ 0 and gA
    tiny; a column sum of +x and -x makes gBias ~ 0. The magnitude-scaled bound holds."""
    m, k = 2, 77
    rng = np.random.default_rng(7)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, 1)).astype(np.float32)
    # Rescale row 0 so that z[0] = a[0] @ b is gelu's stationary point (gelu'(z) = 0).
    z0 = -0.75246142
    a[0] *= np.float32(z0 / float(a[0].astype(np.float64) @ b[:, 0]))
    a[1] = a[0]                               # the same row: gY of +1 and -1 cancel in gBias
    A, B = cp.asarray(a), cp.asarray(b)
    gY = cp.asarray(np.array([[1.0], [-1.0]], np.float32))
    Z = poisoned(cp, (m, 1))
    forward_into(A, B, poisoned(cp, (m, 1)), None, act="gelu", save_z=True, z_out=Z, math="fp32")
    gA, gb, dZ = poisoned(cp, (m, k)), poisoned(cp, (1,)), poisoned(cp, (m, 1))
    backward_into(A, B, gY, Z, with_bias=True, act="gelu", gA_out=gA, gBias_out=gb, work_dZ=dZ, math="fp32")
    g, bb = f64(cp, gY), b.astype(np.float64)
    dz = g * activations.act_grad("gelu", f64(cp, Z))
    assert np.abs(dz).max() < 1e-4                       # the reference nearly vanishes
    assert err_vs_scale(gA.get(), dz @ bb.T, np.abs(g) @ np.abs(bb).T) < 1e-4
    assert err_vs_scale(gb.get(), dz.sum(0), np.abs(g).sum(0)) < 1e-4


# ------------------------------------------------------------------ threads and streams

def test_eight_threads_thousands_of_mixed_calls():
    calls_per_thread, errors, handles = 320, [], {}

    def worker(tid):
        try:
            rng = np.random.default_rng(tid)
            s = cp.cuda.Stream(non_blocking=True)
            handles[tid] = _context.context_info()["blas"]
            s.use()          # CuPy's own work (random inputs, poison) goes on s too: no race
            for i in range(calls_per_thread):
                m, n, k = (int(x) for x in rng.integers(1, 96, 3))
                A, B = rand(cp, (m, k), rng=rng), rand(cp, (k, n), rng=rng)
                kind = i % 4
                if kind == 0:
                    out = poisoned(cp, (m, n))
                    cygemm.gemm(A, B, out, math="fp32", stream=s)
                    ref = f64(cp, A) @ f64(cp, B)
                elif kind == 1:
                    A3, B3 = rand(cp, (3, m, k), rng=rng), rand(cp, (3, k, n), rng=rng)
                    out = poisoned(cp, (3, m, n))
                    cygemm.gemm_strided_batched(A3, B3, out, math="fp32", stream=s)
                    ref = np.matmul(f64(cp, A3), f64(cp, B3))
                elif kind == 2:
                    bias, out = rand(cp, (n,), rng=rng), poisoned(cp, (m, n))
                    forward_into(A, B, out, bias, act="relu", math="fp32", stream=s)
                    ref = np.maximum(f64(cp, A) @ f64(cp, B) + f64(cp, bias), 0)
                else:
                    gY, out, gb = rand(cp, (m, n), rng=rng), poisoned(cp, (m, k)), poisoned(cp, (n,))
                    backward_into(A, B, gY, None, gA_out=out, gBias_out=gb, math="fp32", stream=s)
                    ref = f64(cp, gY) @ f64(cp, B).T
                s.synchronize()
                err = rel_err(out.get(), ref)
                if not err < 5e-5:
                    errors.append((tid, i, kind, (m, n, k), err))
        except Exception as exc:   # reported below, with the thread
            errors.append((tid, repr(exc)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    assert len(set(handles.values())) == 8           # one cuBLAS handle per thread, never shared


def test_two_streams_write_different_outputs_concurrently():
    n = 2048
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    A1, B1, A2, B2 = (rand(cp, (n, n)) for _ in range(4))
    C1, C2 = poisoned(cp, (n, n)), poisoned(cp, (n, n))
    cp.cuda.Device().synchronize()     # inputs were made on the default stream
    for _ in range(5):   # interleaved enqueues: the two streams run side by side
        cygemm.gemm(A1, B1, C1, math="fp32", stream=s1)
        cygemm.gemm(A2, B2, C2, math="fp32", stream=s2)
        forward_into(A1, B1, C1, None, act="relu", math="fp32", stream=s1)
        forward_into(A2, B2, C2, None, act="none", math="fp32", stream=s2)
    e1, e2 = s1.record(), s2.record()
    e2.synchronize()
    ref2 = cp.matmul(A2.astype(cp.float64), B2.astype(cp.float64))
    assert float(cp.linalg.norm(C2 - ref2) / cp.linalg.norm(ref2)) < fp32_bound(n)
    e1.synchronize()
    ref1 = cp.maximum(cp.matmul(A1.astype(cp.float64), B1.astype(cp.float64)), 0)
    assert float(cp.linalg.norm(C1 - ref1) / cp.linalg.norm(ref1)) < fp32_bound(n)
    assert _context.context_info()["workspaces"] >= 2       # one cuBLAS workspace per stream


# ------------------------------------------------------------------ soak and replays

def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_soak_100k_mixed_calls_memory_flat():
    M = K = N = 64
    s = cp.cuda.Stream(non_blocking=True)
    A, B, bias, gY = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,)), rand(cp, (M, N))
    A3, B3, C3 = rand(cp, (8, 32, 32)), rand(cp, (8, 32, 32)), poisoned(cp, (8, 32, 32))
    C, Y, Z, gA, gB, gb = (poisoned(cp, sh) for sh in ((M, N), (M, N), (M, N), (M, K), (K, N), (N,)))
    ws = gemm_ops.ensure_workspaces(M, N, stream=s)
    cp.cuda.Device().synchronize()

    def block(n):
        for i in range(n):
            cygemm.gemm(A, B, C, math="fp32", stream=s)
            cygemm.gemm_strided_batched(A3, B3, C3, math="fp32", stream=s)
            forward_into(A, B, Y, bias, act=("relu", "gelu", "silu")[i % 3], save_z=True, z_out=Z,
                         lt_workspace=ws.lt_ws, math="fp32", stream=s)
            backward_into(A, B, gY, Z, act=("relu", "gelu", "silu")[i % 3], gA_out=gA, gB_out=gB, gBias_out=gb,
                          work_dZ=ws.dZ, lt_workspace=ws.lt_ws, math="fp32", stream=s)
            if i % 2000 == 0:
                s.synchronize()   # keep the queue short
        s.synchronize()

    pool = cp.get_default_memory_pool()
    block(2000)                                       # warm: plans, workspaces, CuPy caches
    before = (pool.used_bytes(), pool.total_bytes(), cp.cuda.runtime.memGetInfo()[0], _rss_bytes())
    block(25000)                                      # 4 calls each: 100,000 calls
    after = (pool.used_bytes(), pool.total_bytes(), cp.cuda.runtime.memGetInfo()[0], _rss_bytes())
    assert after[:2] == before[:2], f"CuPy pool used/total changed: {before[:2]} -> {after[:2]}"
    assert after[2] == before[2], f"free device memory changed by {after[2] - before[2]} bytes"
    assert after[3] - before[3] < 8 << 20, f"host RSS grew by {(after[3] - before[3]) / 2**20:.1f} MiB"
    # ... and the last results are right (the last block's i was 24999: relu).
    z = f64(cp, A) @ f64(cp, B) + f64(cp, bias)
    assert rel_err(C.get(), f64(cp, A) @ f64(cp, B)) < 1e-5
    assert rel_err(Z.get(), z) < 1e-5
    dz = f64(cp, gY) * activations.act_grad(("relu", "gelu", "silu")[24999 % 3], z)
    assert rel_err(gA.get(), dz @ f64(cp, B).T) < 2e-5


def test_10k_graph_replays_are_bit_identical():
    M, K, N = 64, 96, 80
    s = cp.cuda.Stream(non_blocking=True)
    A, B, bias, gY = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,)), rand(cp, (M, N))
    Y, Z, gA, gB, gb = (poisoned(cp, sh) for sh in ((M, N), (M, N), (M, K), (K, N), (N,)))
    ws = gemm_ops.ensure_workspaces(M, N, stream=s)
    cp.cuda.Device().synchronize()

    def step():
        forward_into(A, B, Y, bias, act="gelu", save_z=True, z_out=Z, lt_workspace=ws.lt_ws, stream=s)
        backward_into(A, B, gY, Z, act="gelu", gA_out=gA, gB_out=gB, gBias_out=gb, work_dZ=ws.dZ,
                      lt_workspace=ws.lt_ws, stream=s)
    step()
    s.synchronize()
    with cygemm.graph.capture(s) as g:
        step()
    outs = (Y, Z, gA, gB, gb)
    with s:
        for o in outs:
            o.fill(cp.nan)
    g.launch(s)
    s.synchronize()
    refs = [o.copy() for o in outs]
    assert not any(bool(cp.isnan(r).any()) for r in refs)
    bad = cp.zeros((), cp.int64)
    with s:
        for _ in range(10000):
            g.launch(s)
            for o, r in zip(outs, refs):
                bad += cp.count_nonzero(o.view(cp.uint32) != r.view(cp.uint32))
    s.synchronize()
    assert int(bad) == 0, f"{int(bad)} elements differed bit-wise across 10,000 replays"
