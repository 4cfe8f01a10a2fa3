"""cygemm.nn: layers, losses and optimizers against float64 references (torch autograd in
float64, finite differences), the captured step against the eager one, no allocation after
bind, and bad input."""
import numpy as np
import pytest

from gpu_util import f64, rel_err

pytestmark = pytest.mark.gpu

ACTS = ["none", "relu", "gelu", "silu", "tanh", "sigmoid"]


def _torch():
    return pytest.importorskip("torch")


def _torch_act(torch, act):
    import torch.nn.functional as F
    return {"none": lambda z: z, "relu": torch.relu, "gelu": lambda z: F.gelu(z, approximate="tanh"),
            "silu": F.silu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[act]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("math", ["fp32", "tf32"])
def test_dense_forward_backward_against_torch_float64(act, math):
    import cupy as cp
    import cygemm.nn as nn
    torch = _torch()
    rng = np.random.default_rng()
    B, I, O = 37, 48, 29
    layer = nn.Dense(I, O, act=act, math=math, seed=int(rng.integers(1 << 30)))
    layer.bind(B)
    x = cp.asarray(rng.standard_normal((B, I)).astype(np.float32))
    gy = cp.asarray(rng.standard_normal((B, O)).astype(np.float32))
    layer.y.fill(cp.nan)
    layer.gx.fill(cp.nan)
    layer.weight_grad.fill(cp.nan)
    layer.bias_grad.fill(cp.nan)
    y = layer.forward(x)
    if act == "relu":
        # Where z is within the GEMM's rounding of 0 (TF32: ~1e-3), relu' may fall either side of
        # the kink: no gradient flows from there, so the check does not hinge on a coin flip.
        z64 = f64(cp, x) @ f64(cp, layer.weight).T + f64(cp, layer.bias)
        gy[cp.asarray(np.abs(z64) < (1e-5 if math == "fp32" else 1e-2))] = 0
    gx = layer.backward(gy)
    t = lambda a: torch.tensor(f64(cp, a), requires_grad=True)
    tx, tw, tb = t(x), t(layer.weight), t(layer.bias)
    ty = _torch_act(torch, act)(tx @ tw.T + tb)
    ty.backward(torch.tensor(f64(cp, gy)))
    bound = 1e-5 if math == "fp32" else 3e-3
    assert rel_err(f64(cp, y), ty.detach().numpy()) < bound
    assert rel_err(f64(cp, gx), tx.grad.numpy()) < bound
    assert rel_err(f64(cp, layer.weight_grad), tw.grad.numpy()) < bound
    assert rel_err(f64(cp, layer.bias_grad), tb.grad.numpy()) < bound


def test_dense_initialisation_is_torchs_kaiming_uniform_and_seeded():
    import cygemm.nn as nn
    a, b = nn.Dense(300, 200, seed=3), nn.Dense(300, 200, seed=3)
    w = a.weight.get()
    assert np.array_equal(w, b.weight.get())
    bound = 1 / np.sqrt(300)
    assert w.min() >= -bound and w.max() <= bound
    # U(-bound, bound) has standard deviation bound / sqrt(3).
    assert abs(w.std() - bound / np.sqrt(3)) < 0.02 * bound
    assert not np.array_equal(w, nn.Dense(300, 200, seed=4).weight.get())


def test_dense_loads_torch_linear_and_matches_its_output():
    import cupy as cp
    import cygemm.nn as nn
    torch = _torch()
    lin = torch.nn.Linear(33, 17).cuda()
    layer = nn.Dense(33, 17, act="none", math="fp32")
    layer.load_torch(lin)
    layer.bind(8)
    x = torch.randn(8, 33, device="cuda")
    y = layer.forward(cp.from_dlpack(x))
    ref = torch.nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double())
    assert rel_err(f64(cp, y), ref.detach().cpu().numpy()) < 1e-5


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
    torch = _torch()
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


class _Params:
    """A bare model for the optimizers: flat parameters and gradients."""

    def __init__(self, cp, n, rng):
        self.flat_parameters = cp.asarray(rng.standard_normal(n).astype(np.float32))
        self.flat_gradients = cp.asarray(rng.standard_normal(n).astype(np.float32))
        self.stream = None


@pytest.mark.parametrize("name,kwargs", [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("SGD", dict(lr=0.05, momentum=0.5, dampening=0.3)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, weight_decay=0.1, betas=(0.8, 0.99))),
    ("AdamW", dict(lr=0.01, weight_decay=0.1)),
])
def test_optimizer_steps_match_torch(name, kwargs):
    import cupy as cp
    import cygemm.nn as nn
    torch = _torch()
    rng = np.random.default_rng()
    n = 10007                                        # not a multiple of the block size
    model = _Params(cp, n, rng)
    p0 = model.flat_parameters.get().astype(np.float64)
    opt = getattr(nn, name)(model, **kwargs)
    tp = torch.tensor(p0, requires_grad=True)
    topt = getattr(torch.optim, name)([tp], **kwargs)
    for _ in range(5):
        g = rng.standard_normal(n).astype(np.float32)
        model.flat_gradients[...] = cp.asarray(g)
        opt.step()
        tp.grad = torch.tensor(g.astype(np.float64))
        topt.step()
    assert int(opt.steps.get()) == 5
    assert rel_err(f64(cp, model.flat_parameters) - p0, tp.detach().numpy() - p0) < 1e-4


def test_schedule_runs_on_the_device_inside_a_graph():
    import cupy as cp
    import cygemm.graph
    import cygemm.nn as nn
    rng = np.random.default_rng()
    model = _Params(cp, 1000, rng)
    s = cp.cuda.Stream(non_blocking=True)
    opt = nn.SGD(model, lr=1.0, schedule="cosine", total_steps=10, warmup_steps=2, stream=s)
    model.flat_gradients.fill(1.0)
    cp.cuda.Device().synchronize()
    with cygemm.graph.capture(s) as g:
        opt.step()
    p = [model.flat_parameters.get()[0]]
    assert g.num_nodes == 1                          # the update is one kernel
    for _ in range(10):
        g.launch(s)
        s.synchronize()
        p.append(model.flat_parameters.get()[0])
    lrs = -np.diff(p)
    expect = [0.5, 1.0] + [0.5 * (1 + np.cos(np.pi * k / 8)) for k in range(1, 9)]
    assert np.allclose(lrs, expect, atol=1e-5)
    assert int(opt.steps.get()) == 10


def _model_and_step(nn, eager, seed, opt_name="Adam", sizes=(20, 32, 32, 5), batch=16):
    model = nn.MLP(list(sizes), act="relu", seed=seed)
    opt = nn.Adam(model, lr=1e-2) if opt_name == "Adam" else nn.SGD(model, lr=0.05, momentum=0.9)
    return model, nn.compile_step(model, nn.SoftmaxCrossEntropy(), opt, batch=batch, eager=eager)


@pytest.mark.parametrize("opt_name", ["Adam", "SGD"])
def test_captured_step_equals_eager_steps_bitwise(opt_name):
    import cygemm.nn as nn
    rng = np.random.default_rng()
    data = [(rng.standard_normal((16, 20)).astype(np.float32), rng.integers(0, 5, 16)) for _ in range(12)]
    m_eager, s_eager = _model_and_step(nn, True, 7, opt_name)
    m_graph, s_graph = _model_and_step(nn, False, 7, opt_name)
    assert np.array_equal(m_eager.flat_parameters.get(), m_graph.flat_parameters.get())  # compiling changed nothing
    for x, y in data:
        le = float(s_eager(x, y))
        lg = float(s_graph(x, y))
        assert le == lg
    assert np.array_equal(m_eager.flat_parameters.get(), m_graph.flat_parameters.get())
    assert int(s_graph.optimizer.steps.get()) == len(data)


def test_training_step_gradients_against_torch_float64():
    import cupy as cp
    import cygemm.nn as nn
    torch = _torch()
    rng = np.random.default_rng()
    model = nn.MLP([12, 16, 6], act="gelu", seed=1, math="fp32")
    model.bind(10)
    x = cp.asarray(rng.standard_normal((10, 12)).astype(np.float32))
    y = rng.integers(0, 6, 10)
    loss = nn.SoftmaxCrossEntropy()
    model.flat_gradients.fill(cp.nan)
    val = loss(model.forward(x), cp.asarray(y))
    model.backward(loss.grad)
    tl = [torch.nn.Linear(12, 16).double(), torch.nn.Linear(16, 6).double()]
    with torch.no_grad():
        for lin, layer in zip(tl, model.layers):
            lin.weight.copy_(torch.tensor(f64(cp, layer.weight)))
            lin.bias.copy_(torch.tensor(f64(cp, layer.bias)))
    out = tl[1](torch.nn.functional.gelu(tl[0](torch.tensor(f64(cp, x))), approximate="tanh"))
    ref = torch.nn.functional.cross_entropy(out, torch.tensor(y))
    ref.backward()
    assert abs(float(val) - ref.item()) < 1e-5 * abs(ref.item())
    for lin, layer in zip(tl, model.layers):
        assert rel_err(f64(cp, layer.weight_grad), lin.weight.grad.numpy()) < 1e-5
        assert rel_err(f64(cp, layer.bias_grad), lin.bias.grad.numpy()) < 1e-5


def test_no_allocation_after_compile_over_100_steps():
    import cupy as cp
    import cygemm.nn as nn
    model, step = _model_and_step(nn, False, 3, "Adam", (64, 128, 128, 10), 64)
    x = cp.asarray(np.random.default_rng().standard_normal((64, 64)).astype(np.float32))
    y = cp.asarray(np.random.default_rng().integers(0, 10, 64).astype(np.int32))
    step(x, y)
    step.stream.synchronize()
    pool = cp.get_default_memory_pool()
    used, total = pool.used_bytes(), pool.total_bytes()
    for _ in range(100):
        step(x, y)
    step.stream.synchronize()
    assert (pool.used_bytes(), pool.total_bytes()) == (used, total)
    # The eager step allocates nothing either, once its plans exist.
    model_e, step_e = _model_and_step(nn, True, 3, "Adam", (64, 128, 128, 10), 64)
    step_e(x, y)
    step_e.stream.synchronize()
    used, total = pool.used_bytes(), pool.total_bytes()
    for _ in range(100):
        step_e(x, y)
    step_e.stream.synchronize()
    assert (pool.used_bytes(), pool.total_bytes()) == (used, total)


def test_training_reduces_the_loss_on_a_learnable_problem():
    import cygemm.nn as nn
    rng = np.random.default_rng(0)
    X = rng.standard_normal((512, 20)).astype(np.float32)
    y = (X[:, :5].argmax(1)).astype(np.int32)
    model, step = _model_and_step(nn, False, 0, "Adam", (20, 32, 32, 5), 64)
    first = None
    for epoch in range(30):
        for i in range(8):
            loss = float(step(X[i * 64:(i + 1) * 64], y[i * 64:(i + 1) * 64]))
            first = first if first is not None else loss
    assert loss < 0.25 * first


def test_bad_input_is_refused_before_anything_is_written():
    import cupy as cp
    import cygemm.nn as nn
    model, step = _model_and_step(nn, False, 0)
    before = model.flat_parameters.get()
    x_before = step.x.get()
    good_y = np.zeros(16, np.int64)
    with pytest.raises(ValueError, match=r"x: expected shape \(16, 20\)"):
        step(np.zeros((15, 20), np.float32), good_y)
    with pytest.raises(ValueError, match=r"labels: expected integers in \[0, 5\)"):
        step(np.zeros((16, 20), np.float32), np.full(16, 5))
    with pytest.raises(TypeError, match="x: expected"):
        step([[0.0] * 20] * 16, good_y)
    step.stream.synchronize()
    assert np.array_equal(step.x.get(), x_before)
    assert np.array_equal(model.flat_parameters.get(), before)
    layer = nn.Dense(4, 3)
    with pytest.raises(RuntimeError, match="bind"):
        layer.forward(cp.zeros((2, 4), cp.float32))
    layer.bind(2)
    with pytest.raises(TypeError, match="x: expected float32, got float64"):
        layer.forward(cp.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"x: expected shape \(2, 4\), got \(3, 4\)"):
        layer.forward(cp.zeros((3, 4), cp.float32))
    with pytest.raises(ValueError, match="act: expected one of"):
        nn.Dense(4, 3, act="swish")
    with pytest.raises(TypeError, match="dtype: cygemm.nn trains in float32"):
        nn.Dense(4, 3, dtype="float16")
    with pytest.raises(ValueError, match="lr: expected a finite number"):
        nn.SGD(model, lr=-1)


def test_compile_step_keeps_a_forced_backward_route_and_restores_the_forcing():
    import cygemm.nn as nn
    from cygemm import tuning
    try:
        tuning.force_routes(backward="serial")
        _, step = _model_and_step(nn, False, 0)
        assert step.backward_route == "serial"
        assert tuning.forced_routes() == {"backward": "serial"}
        tuning.force_routes(backward="branches")
        _, step = _model_and_step(nn, False, 0)
        assert step.backward_route == "branches"
        assert len(step.graph.edges) > step.graph.num_nodes - 1     # the branches fork
    finally:
        tuning.force_routes()
    _, step = _model_and_step(nn, False, 0)
    assert step.backward_route in ("serial", "branches")
    assert tuning.forced_routes() == {}


def test_cross_entropy_sums_the_bias_gradient_in_its_kernel():
    import cupy as cp
    import cygemm.nn as nn
    rng = np.random.default_rng()
    for B, C in ((5, 3), (300, 10), (1000, 1024)):
        loss = nn.SoftmaxCrossEntropy().bind(B, C)
        z = cp.asarray(rng.standard_normal((B, C)).astype(np.float32) * 4)
        labels = cp.asarray(rng.integers(0, C, B).astype(np.int32))
        bias_grad = cp.full(C, cp.nan, np.float32)
        loss(z, labels, bias_grad=bias_grad)
        ref = f64(cp, loss.grad).sum(axis=0)
        assert np.abs(f64(cp, bias_grad) - ref).max() <= 1e-6 * max(1.0, np.abs(ref).max())
    with pytest.raises(ValueError, match="bias_grad: fused for at most 1024 classes"):
        nn.SoftmaxCrossEntropy().bind(4, 1025)(cp.zeros((4, 1025), cp.float32), cp.zeros(4, cp.int32),
                                               bias_grad=cp.zeros(1025, cp.float32))


@pytest.mark.parametrize("sizes", [(20, 32, 5), (20, 16)])
def test_compiled_step_equals_forward_loss_backward_update_by_hand(sizes):
    """The compiled step sums the last bias gradient in the loss's kernel; by hand, the layer
    does: one SGD step must give the same parameters."""
    import cupy as cp
    import cygemm.nn as nn
    rng = np.random.default_rng()
    x = rng.standard_normal((16, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], 16)
    m1 = nn.MLP(list(sizes), seed=5, math="fp32")
    step = nn.compile_step(m1, nn.SoftmaxCrossEntropy(), nn.SGD(m1, lr=0.5), batch=16)
    assert step._fused_bias is not None
    step(x, y)
    m2 = nn.MLP(list(sizes), seed=5, math="fp32").bind(16)
    loss = nn.SoftmaxCrossEntropy()
    loss(m2.forward(cp.asarray(x)), cp.asarray(y))
    m2.flat_gradients.fill(cp.nan)
    m2.backward(loss.grad)
    m2.flat_parameters[...] -= 0.5 * m2.flat_gradients
    cp.cuda.Device().synchronize()
    assert np.abs(m1.flat_parameters.get() - m2.flat_parameters.get()).max() < 1e-6
