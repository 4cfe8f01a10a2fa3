"""cygemm.nn optimizers: SGD, Adam and AdamW steps against torch.optim in float64, and the
learning-rate schedule computed on the device inside a captured graph."""
import numpy as np
import pytest

from gpu_util import f64, rel_err

pytestmark = pytest.mark.gpu


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
    torch = pytest.importorskip("torch")
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
