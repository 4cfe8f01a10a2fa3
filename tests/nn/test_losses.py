"""cygemm.nn losses: softmax cross-entropy and mean squared error against float64 references
(finite differences, the softmax gradient written out, torch), labels out of range refused or
flagged in a graph."""
import numpy as np
import pytest

from gpu_util import f64, rel_err
from refs import rows

pytestmark = pytest.mark.gpu


def _finite_difference_grad(f, w, eps=1e-3):
    g = np.zeros_like(w)
    for idx in np.ndindex(w.shape):
        wp, wm = w.copy(), w.copy()
        wp[idx] += eps
        wm[idx] -= eps
        g[idx] = (f(wp) - f(wm)) / (2 * eps)
    return g


def test_softmax_cross_entropy_against_finite_differences_and_extremes():
    import cupy as cp
    import cygemm.nn as nn
    rng = np.random.default_rng()
    B, C = 13, 7
    z = rng.standard_normal((B, C))
    labels = rng.integers(0, C, B).astype(np.int32)
    loss = nn.SoftmaxCrossEntropy().bind(B, C)
    loss.grad.fill(cp.nan)
    val = loss(cp.asarray(z.astype(np.float32)), cp.asarray(labels))

    def ref(zz):
        m = zz.max(1, keepdims=True)
        lse = (m + np.log(np.exp(zz - m).sum(1, keepdims=True)))[:, 0]
        return float(np.mean(lse - zz[np.arange(B), labels]))
    assert abs(float(val) - ref(z)) < 1e-5 * max(1, abs(ref(z)))
    assert rel_err(f64(cp, loss.grad), _finite_difference_grad(ref, z)) < 1e-4
    # Logits of +-1e4: exact, finite results (the log-sum-exp has its maximum taken out).
    big = np.zeros((B, C))
    big[:, 0], big[:, 1] = 1e4, -1e4
    val = float(loss(cp.asarray(big.astype(np.float32)), cp.asarray(labels)))
    assert np.isfinite(val) and abs(val - ref(big)) <= 1e-3 * max(1.0, abs(ref(big)))
    assert np.isfinite(loss.grad.get()).all()


def test_softmax_cross_entropy_int64_labels_and_against_torch():
    import cupy as cp
    import cygemm.nn as nn
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    B, C = 300, 45
    z = rng.standard_normal((B, C)) * 5
    labels = rng.integers(0, C, B)
    loss = nn.SoftmaxCrossEntropy()
    val = loss(cp.asarray(z.astype(np.float32)), cp.asarray(labels))
    tz = torch.tensor(z, requires_grad=True)
    tl = torch.nn.functional.cross_entropy(tz, torch.tensor(labels))
    tl.backward()
    assert abs(float(val) - tl.item()) < 1e-5 * abs(tl.item())
    assert rel_err(f64(cp, loss.grad), tz.grad.numpy()) < 1e-5


def test_labels_out_of_range_raise_eagerly_and_set_the_flag_in_a_graph():
    import cupy as cp
    import cygemm.graph
    import cygemm.nn as nn
    loss = nn.SoftmaxCrossEntropy().bind(4, 3)
    z = cp.asarray(np.random.default_rng().standard_normal((4, 3)).astype(np.float32))
    loss.grad.fill(cp.nan)
    with pytest.raises(ValueError, match=r"labels: expected integers in \[0, 3\)"):
        loss(z, np.array([0, 1, 3, 2]))              # host labels: checked before any launch
    assert np.isnan(loss.grad.get()).all()
    with pytest.raises(ValueError, match="labels"):
        loss(z, cp.asarray(np.array([0, -1, 1, 2], np.int32)))
    loss.check()                                      # the flag was cleared
    s = cp.cuda.Stream(non_blocking=True)
    loss.bind(4, 3, s)
    bad = cp.asarray(np.array([0, 1, 7, 2], np.int32))
    with s:
        zz = z.copy()
    loss(zz, bad, check=False)                        # left to check(): no synchronisation
    with pytest.raises(ValueError, match="labels"):
        loss.check()
    loss.check()
    s.synchronize()
    with cygemm.graph.capture(s) as g:
        loss(zz, bad, check=False)
    g.launch(s)
    with pytest.raises(ValueError, match="labels"):
        loss.check()


def test_mse_against_float64():
    import cupy as cp
    import cygemm.nn as nn
    rng = np.random.default_rng()
    y, t = rng.standard_normal((19, 5)), rng.standard_normal((19, 5))
    loss = nn.MeanSquaredError()
    val = loss(cp.asarray(y.astype(np.float32)), cp.asarray(t.astype(np.float32)))
    assert abs(float(val) - np.mean((y - t) ** 2)) < 1e-5
    assert rel_err(f64(cp, loss.grad), 2 * (y - t) / y.size) < 1e-5


def test_cross_entropy_sums_the_bias_gradient_in_its_kernel():
    import cupy as cp
    import cygemm.nn as nn
    rng = np.random.default_rng()
    for B, C in ((5, 3), (300, 10), (1000, 1024)):
        loss = nn.SoftmaxCrossEntropy().bind(B, C)
        z64 = (rng.standard_normal((B, C)) * 4).astype(np.float32).astype(np.float64)
        labels = rng.integers(0, C, B)
        bias_grad = cp.full(C, cp.nan, np.float32)
        loss(cp.asarray(z64.astype(np.float32)), cp.asarray(labels.astype(np.int32)), bias_grad=bias_grad)
        # The mean loss's gradient is (softmax(z) - onehot(label)) / B per row; the bias gradient
        # is its column sum. float32 sums B terms: the error bound grows with sqrt(B) times the
        # magnitudes summed.
        p = rows.softmax(z64)
        counts = np.bincount(labels, minlength=C)
        ref = (p.sum(axis=0) - counts) / B
        scale = (p.sum(axis=0) + counts) / B
        got = f64(cp, bias_grad)
        assert np.all(np.abs(got - ref) <= 1e-6 * np.sqrt(B) * scale + 1e-12), (B, C, np.abs(got - ref).max())
    with pytest.raises(ValueError, match="bias_grad: fused for at most 1024 classes"):
        nn.SoftmaxCrossEntropy().bind(4, 1025)(cp.zeros((4, 1025), cp.float32), cp.zeros(4, cp.int32),
                                               bias_grad=cp.zeros(1025, cp.float32))
