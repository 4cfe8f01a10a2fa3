"""cygemm.nn's training step (compile_step): the captured step against the eager one and against
the steps written out by hand, gradients against torch autograd in float64, no allocation after
compiling, a forced backward route kept, and bad input refused before anything is written."""
import numpy as np
import pytest

from gpu_util import f64, rel_err

pytestmark = pytest.mark.gpu

def _torch():
    return pytest.importorskip("torch")


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


def _forks(graph):
    """Whether a captured graph forks: a capture of one stream is a chain (edges = nodes - 1)."""
    return len(graph.edges) > graph.num_nodes - 1


def test_compile_step_keeps_a_forced_backward_route_and_restores_the_forcing():
    import cupy as cp
    import cygemm.nn as nn
    from cygemm.engine import tuning
    rng = np.random.default_rng()
    x = rng.standard_normal((16, 20)).astype(np.float32)
    y = rng.integers(0, 5, 16)
    try:
        for route in ("serial", "branches"):
            tuning.force_routes(backward=route)
            model, step = _model_and_step(nn, False, 0)
            assert step.backward_route == route
            assert tuning.forced_routes() == {"backward": route}
            assert _forks(step.graph) == (route == "branches"), (route, step.graph.num_nodes, len(step.graph.edges))
            # The forced route's graph computes the step: the same loss and parameters as the
            # eager step under the same forcing.
            model_e, step_e = _model_and_step(nn, True, 0)
            assert float(step(x, y)) == float(step_e(x, y))
            cp.cuda.Device().synchronize()
            assert np.array_equal(model.flat_parameters.get(), model_e.flat_parameters.get()), route
    finally:
        tuning.force_routes()
    # Unforced, the step keeps one of the two graphs: its shape is the route it reports.
    _, step = _model_and_step(nn, False, 0)
    assert _forks(step.graph) == (step.backward_route == "branches"), step.backward_route
    assert tuning.forced_routes() == {}


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
