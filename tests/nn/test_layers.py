"""cygemm.nn layers: Dense forward and backward against torch autograd in float64, its
initialisation (torch's Kaiming-uniform, seeded), loading a torch Linear."""
import numpy as np
import pytest

from gpu_util import f64, rel_err

pytestmark = pytest.mark.gpu

ACTS = ["none", "relu", "gelu", "silu", "tanh", "sigmoid"]


def _torch_act(torch, act):
    import torch.nn.functional as F
    return {"none": lambda z: z, "relu": torch.relu, "gelu": lambda z: F.gelu(z, approximate="tanh"),
            "silu": F.silu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[act]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("math", ["fp32", "tf32"])
def test_dense_forward_backward_against_torch_float64(act, math):
    import cupy as cp
    import cygemm.nn as nn
    torch = pytest.importorskip("torch")
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
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(33, 17).cuda()
    layer = nn.Dense(33, 17, act="none", math="fp32")
    layer.load_torch(lin)
    layer.bind(8)
    x = torch.randn(8, 33, device="cuda")
    y = layer.forward(cp.from_dlpack(x))
    ref = torch.nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double())
    assert rel_err(f64(cp, y), ref.detach().cpu().numpy()) < 1e-5
