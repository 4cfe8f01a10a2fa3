"""bf16-mixed training (GPU): the conversions against ml_dtypes' rounding, a layer's forward and
backward against float64 on the bfloat16-rounded operands, the optimizers reading bfloat16
gradients and rewriting the bfloat16 copy in the same launch (against torch in float64), and
the digits MLP trained within a point of fp32 with float32 master weights."""
import numpy as np
import pytest

from gpu_util import RTOL, f64, rel_err

pytestmark = pytest.mark.gpu


def _bf16():
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


def _device_bf16(cp, host):
    return cp.asarray(host.astype(_bf16()))


def test_conversions_round_to_nearest_even_as_ml_dtypes():
    import cupy as cp
    from cygemm.nn import _kernels
    rng = np.random.default_rng()
    host = (rng.standard_normal(10007) * 10.0 ** rng.integers(-30, 30, 10007)).astype(np.float32)
    host[:3] = [np.inf, -0.0, 3.0e38]
    y = _device_bf16(cp, np.full(host.shape, np.nan, np.float32))          # poisoned
    _kernels.f32_to_bf16(cp.asarray(host), y, None)
    assert np.array_equal(y.get().view(np.uint16), host.astype(_bf16()).view(np.uint16))
    back = cp.full(host.shape, cp.nan, cp.float32)
    _kernels.bf16_to_f32(y, back, None)
    assert np.array_equal(back.get(), host.astype(_bf16()).astype(np.float32))
    with pytest.raises(ValueError, match="y: expected 10007 elements"):
        _kernels.f32_to_bf16(cp.asarray(host), y[:5], None)


def test_mixed_dense_forward_and_backward_against_float64():
    import cupy as cp
    import cygemm.nn as nn
    rng = np.random.default_rng()
    layer = nn.Dense(48, 40, act="gelu", seed=int(rng.integers(1 << 30)), precision="bf16-mixed")
    assert layer.weight.dtype == np.float32 and layer.flat_parameters_bf16.dtype == _bf16()
    layer.bind(32)
    x = rng.standard_normal((32, 48)).astype(np.float32)
    gy = rng.standard_normal((32, 40)).astype(np.float32)
    y = layer.forward(cp.asarray(x))
    assert y.dtype == _bf16()
    gx = layer.backward(cp.asarray(gy))
    r = lambda a: np.asarray(a, np.float32).astype(_bf16()).astype(np.float64)   # noqa: E731
    W, b, X, GY = r(layer.weight.get()), r(layer.bias.get()), r(x), r(gy)
    z = X @ W.T + b
    k = np.sqrt(2 / np.pi)
    t = np.tanh(k * (z + 0.044715 * z ** 3))
    ref_y = 0.5 * z * (1 + t)
    dz = GY * (0.5 * (1 + t) + 0.5 * z * (1 - t ** 2) * k * (1 + 3 * 0.044715 * z ** 2))
    f = lambda a: a.get().astype(np.float64)                                   # noqa: E731
    assert rel_err(f(y), ref_y) < RTOL["bfloat16"]
    assert rel_err(f(layer.weight_grad), dz.T @ X) < RTOL["bfloat16"]
    assert rel_err(f(layer.bias_grad), dz.sum(0)) < RTOL["bfloat16"]
    assert rel_err(f(gx), dz @ W) < RTOL["bfloat16"]


@pytest.mark.parametrize("name,kwargs", [("SGD", dict(lr=0.1, momentum=0.9)), ("Adam", dict(lr=0.01)),
                                         ("AdamW", dict(lr=0.01, weight_decay=0.1))])
def test_optimizers_read_bf16_gradients_and_rewrite_the_bf16_copy(name, kwargs):
    import cupy as cp
    import cygemm.nn as nn
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    model = nn.MLP([30, 50, 7], seed=int(rng.integers(1 << 30)), precision="bf16-mixed")
    opt = getattr(nn, name)(model, **kwargs)
    p0 = model.flat_parameters.get().astype(np.float64)
    tp = torch.tensor(p0, requires_grad=True)
    topt = getattr(torch.optim, name)([tp], **kwargs)
    for _ in range(3):
        g = rng.standard_normal(p0.size).astype(np.float32)
        model.flat_gradients.set(g.astype(_bf16()))
        opt.step()
        tp.grad = torch.tensor(g.astype(_bf16()).astype(np.float64))
        topt.step()
    master = model.flat_parameters.get()
    assert master.dtype == np.float32
    assert rel_err(master.astype(np.float64) - p0, tp.detach().numpy() - p0) < 1e-4     # the updates
    copy = model.flat_parameters_bf16.get()
    assert np.array_equal(copy.view(np.uint16), master.astype(_bf16()).view(np.uint16))


def test_digits_trains_in_bf16_mixed_within_a_point_of_fp32():
    pytest.importorskip("sklearn")
    import examples_path  # noqa: F401
    import train_digits as ex
    Xtr, Xte, ytr, yte = ex.load(0)
    orders = ex.batch_orders(len(Xtr), 64, 40, 0)        # the example's defaults
    sizes = [64, 128, 128, 10]
    acc = {}
    for precision in ("fp32", "bf16-mixed"):
        model, step, curve, _ = ex.train_cygemm(Xtr, ytr, orders, sizes, 1e-3, False, 0, None, precision)
        assert step.graph is not None and curve[-1] < curve[0]
        acc[precision] = ex.accuracy_cygemm(model, Xte, yte)
        if precision == "bf16-mixed":
            master = model.flat_parameters.get()
            assert master.dtype == np.float32 and all(l.weight.dtype == np.float32 for l in model.layers)
            # The masters hold more than bfloat16 does: updates below bfloat16's step were kept.
            assert not np.array_equal(master, master.astype(_bf16()).astype(np.float32))
            state = model.state_dict()
            assert all(v.dtype == np.float32 for v in state.values())
            assert np.array_equal(np.concatenate([v.ravel() for v in state.values()]), master)
    assert acc["fp32"] > 0.9
    assert acc["bf16-mixed"] >= acc["fp32"] - 0.01, acc
