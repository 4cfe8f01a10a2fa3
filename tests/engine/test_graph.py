"""GPU: capturing cygemm calls into CUDA graphs and replaying them."""
import gc
import os
import sys

import numpy as np
import pytest

import cygemm
from cygemm import gemm_ops
from cygemm.gemm_ops import backward_into, forward_into
from gpu_util import f64, rand, rel_err, tol

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


def test_capture_forward_backward_replays_match_eager():
    M, K, N = 96, 80, 72
    s = cp.cuda.Stream(non_blocking=True)
    A, B, bias, gY = (cp.empty(sh, cp.float32) for sh in ((M, K), (K, N), (N,), (M, N)))
    Y, Z, gA, gB, gb = (cp.empty(sh, cp.float32) for sh in ((M, N), (M, N), (M, K), (K, N), (N,)))
    ws = gemm_ops.ensure_workspaces(M, N)

    def step():
        forward_into(A, B, Y, bias, act="gelu", save_z=True, z_out=Z, lt_workspace=ws.lt_ws, stream=s)
        backward_into(A, B, gY, Z, act="gelu", gA_out=gA, gB_out=gB, gBias_out=gb, work_dZ=ws.dZ,
                      lt_workspace=ws.lt_ws, stream=s)

    def load_inputs():
        for x in (A, B, bias, gY):
            x[...] = rand(cp, x.shape)
        cp.cuda.Device().synchronize()

    load_inputs()
    step()                       # warm: plans and workspaces exist before capture
    s.synchronize()
    with cygemm.graph.capture(s) as g:
        step()
    assert g.num_nodes >= 4
    for _ in range(5):
        load_inputs()
        g.launch(s)
        s.synchronize()
        graph_out = [x.copy() for x in (Y, Z, gA, gB, gb)]
        for x in (Y, Z, gA, gB, gb):
            x[...] = cp.nan
        step()
        s.synchronize()
        for got, eager in zip(graph_out, (Y, Z, gA, gB, gb)):
            np.testing.assert_array_equal(got.get(), eager.get())
        z = f64(cp, A) @ f64(cp, B) + f64(cp, bias)
        assert rel_err(graph_out[1].get(), z) < 3e-3


def test_plain_gemm_captures_without_warmup_on_a_new_stream():
    s = cp.cuda.Stream(non_blocking=True)      # never used by cygemm before: workspace made in capture
    A, B, C = rand(cp, (64, 48)), rand(cp, (48, 32)), cp.empty((64, 32), cp.float32)
    cp.cuda.Device().synchronize()
    with cygemm.graph.capture(s) as g:
        cygemm.gemm(A, B, C, math="fp32", stream=s)
    C[...] = cp.nan
    g.launch(s)
    s.synchronize()
    assert rel_err(C.get(), f64(cp, A) @ f64(cp, B)) < 1e-5


def test_a_graph_dropped_inside_the_next_capture_does_not_break_it():
    M, K, N = 64, 64, 64
    s = cp.cuda.Stream(non_blocking=True)
    A, B, bias = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,))
    Y = cp.empty((M, N), cp.float32)
    forward_into(A, B, Y, bias, act="relu", stream=s)
    s.synchronize()
    with cygemm.graph.capture(s) as g:
        cygemm.gemm(A, B, Y, stream=s)
    with cygemm.graph.capture(s) as g:      # rebinding g destroys the first graph mid-capture
        forward_into(A, B, Y, bias, act="relu", stream=s)
    Y[...] = cp.nan
    g.launch(s)
    s.synchronize()
    assert rel_err(Y.get(), np.maximum(f64(cp, A) @ f64(cp, B) + f64(cp, bias), 0)) < 3e-3


def test_clear_ws_cache_does_not_break_a_live_graph():
    M, K, N = 64, 64, 64
    s = cp.cuda.Stream(non_blocking=True)
    A, B, gY, Z = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (M, N)), rand(cp, (M, N))
    gA = cp.empty((M, K), cp.float32)
    ws = gemm_ops.ensure_workspaces(M, N)
    backward_into(A, B, gY, Z, act="relu", gA_out=gA, work_dZ=ws.dZ, stream=s)
    s.synchronize()
    with cygemm.graph.capture(s) as g:
        backward_into(A, B, gY, Z, act="relu", gA_out=gA, work_dZ=ws.dZ, stream=s)
    del ws
    gemm_ops.clear_ws_cache()
    gc.collect()
    junk = [cp.full((M, N), cp.nan, cp.float32) for _ in range(8)]   # would reuse freed memory
    gA[...] = cp.nan
    g.launch(s)
    s.synchronize()
    ref = (f64(cp, gY) * (f64(cp, Z) > 0)) @ f64(cp, B).T
    assert rel_err(gA.get(), ref) < 3e-3
    del junk


@pytest.mark.parametrize("math", ["fp32", "tf32"])
def test_mlp_training_step_captured_whole_matches_eager(math):
    from mlp import MLP
    s = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng()
    xs = [rng.standard_normal((64, 64)).astype(np.float32) for _ in range(4)]
    ts = [rng.standard_normal((64, 10)).astype(np.float32) for _ in range(4)]
    eager, graphed = MLP(seed=1, math=math), MLP(seed=1, math=math)
    for m in (eager, graphed):
        m.x[...] = cp.asarray(xs[0])
        m.target[...] = cp.asarray(ts[0])
    graphed.step(s)          # warm-up step, mirrored on the eager model
    eager.step(s)
    s.synchronize()
    with cygemm.graph.capture(s) as g:
        graphed.step(s)
    for x, t in zip(xs, ts):
        for m in (eager, graphed):
            m.x[...] = cp.asarray(x)
            m.target[...] = cp.asarray(t)
        cp.cuda.Device().synchronize()
        g.launch(s)
        eager.step(s)
        s.synchronize()
        for w_e, w_g in zip(eager.W + eager.b, graphed.W + graphed.b):
            if math == "fp32":
                np.testing.assert_array_equal(w_e.get(), w_g.get())
            else:   # a captured call may take another (equally correct) algorithm
                assert rel_err(w_g.get(), f64(cp, w_e)) < 1e-4
    # The replayed step against the mathematics: one SGD step of the MLP in float64 NumPy.
    W0 = [f64(cp, w) for w in graphed.W]
    b0 = [f64(cp, b) for b in graphed.b]
    x, t = xs[0].astype(np.float64), ts[0].astype(np.float64)
    graphed.x[...] = cp.asarray(xs[0])
    graphed.target[...] = cp.asarray(ts[0])
    cp.cuda.Device().synchronize()
    g.launch(s)
    s.synchronize()
    # Where a relu's input lies within the GEMM's rounding of 0 (TF32: ~1e-3), either side of the
    # kink is a right answer: the reference takes the side the GPU took (its Y > 0) there, and
    # everywhere else the GPU's side must be float64's. The update is then continuous in the
    # rounding, and held to a bound that fits the math.
    masks, h = [], x
    for Wi, bi, Yi, act in zip(W0, b0, graphed.Y, graphed.acts()):
        z = h @ Wi + bi
        mask = Yi.get() > 0 if act == "relu" else np.ones(z.shape, bool)
        clear = np.abs(z) >= 1e-2
        assert np.array_equal(mask[clear], (z > 0)[clear] | (act != "relu")), "relu's mask away from its kink"
        masks.append(mask)
        h = z * mask
    W_ref, b_ref = _mlp_step_ref(W0, b0, x, t, graphed.lr, masks)
    # fp32: W's own rounding is ~1e-4 of the update. TF32: the first layer's update comes
    # through six GEMMs (three forward, two backward, its own), each within tol() (K <= 256);
    # with truncated TF32 inputs a float64 model of these GEMMs stays within 4e-3.
    bound = 2e-3 if math == "fp32" else 4 * tol("float32", "tf32", k=256)
    for w_new, w_old, w_ref in zip(graphed.W + graphed.b, W0 + b0, W_ref + b_ref):
        assert rel_err(f64(cp, w_new) - w_old, w_ref - w_old) < bound      # the update itself


def _mlp_step_ref(W, b, x, target, lr, masks):
    """New weights and biases after one SGD step on the mean squared error, in float64; layer i's
    activation is z * masks[i] (relu: its mask; none: all ones)."""
    inputs, zs = [x], []
    for Wi, bi, mask in zip(W, b, masks):
        zs.append(inputs[-1] @ Wi + bi)
        inputs.append(zs[-1] * mask)
    g = 2 * (inputs[-1] - target) / inputs[-1].size
    W_new, b_new = list(W), list(b)
    for i in reversed(range(len(W))):
        dz = g * masks[i]
        W_new[i] = W[i] - lr * (inputs[i].T @ dz)
        b_new[i] = b[i] - lr * dz.sum(0)
        g = dz @ W[i].T
    return W_new, b_new
