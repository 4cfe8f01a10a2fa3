"""FP8 dense layers (GPU): each recipe's forward and backward against float64 of the bfloat16
operands within FP8's error, a captured training step, and the digits MLP trained within a
point of bf16-mixed. Refusals of sizes FP8 GEMMs cannot read (CPU needs no GPU: below)."""
import numpy as np
import pytest

from gpu_util import rel_err

RECIPES = ("fp8-tensor", "fp8-rowwise", "fp8-block")
# E4M3 keeps 3 mantissa bits (~3% of an element), E5M2 2 (~6%): relative Frobenius errors of a
# GEMM over random operands stay well inside these.
TOL = {"fp8-tensor": 0.08, "fp8-rowwise": 0.05, "fp8-block": 0.05}


@pytest.mark.gpu
@pytest.mark.parametrize("precision", RECIPES)
@pytest.mark.parametrize("act", ["relu", "gelu", "none"])
def test_forward_and_gradients_match_float64_within_fp8s_error(precision, act):
    import cupy as cp
    import ml_dtypes
    from cygemm import nn
    from refs import activations
    M, K, N = 256, 384, 128
    rng = np.random.default_rng()
    layer = nn.Dense(K, N, act=act, seed=1, precision=precision).bind(M)
    x = rng.standard_normal((M, K)).astype(np.float32)
    gy = rng.standard_normal((M, N)).astype(np.float32)
    bf = lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float64)
    w, b = bf(layer.weight.get()), bf(layer.bias.get())
    x64, gy64 = bf(x), bf(gy)
    z = x64 @ w.T + b
    y = layer.forward(cp.asarray(x))
    assert rel_err(y.get().astype(np.float64), activations.act(act, z)) < TOL[precision]
    gx = layer.backward(cp.asarray(gy))
    # act' where the layer's own forward put z (FP8's z moves elements across relu's kink: the
    # gradient follows the forward that ran); relu reads it from y, as the layer does.
    z_run = (layer.z if layer.z is not None else layer.y).get().astype(np.float64)
    dz = gy64 * activations.act_grad(act, z_run)
    assert rel_err(gx.get().astype(np.float64), dz @ w) < TOL[precision]
    assert rel_err(layer.weight_grad.get().astype(np.float64), dz.T @ x64) < TOL[precision]
    assert rel_err(layer.bias_grad.get().astype(np.float64), dz.sum(axis=0)) < 2e-2


@pytest.mark.gpu
def test_sizes_fp8_cannot_read_are_refused_or_run_in_bf16_in_an_mlp():
    from cygemm import nn
    with pytest.raises(ValueError, match=r"precision: 'fp8-block' needs in_features and out_features that are "
                                         r"multiples of 16 .* got 64 and 10"):
        nn.Dense(64, 10, precision="fp8-block")
    model = nn.MLP([64, 128, 10], precision="fp8-block", seed=0)
    assert [layer.precision for layer in model.layers] == ["fp8-block", "bf16-mixed"]
    with pytest.raises(ValueError, match=r"batch: precision='fp8-block' needs a multiple of 16 rows"):
        model.bind(50)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", RECIPES)
def test_digits_trains_in_fp8_within_a_point_of_bf16_mixed_captured(precision):
    pytest.importorskip("sklearn")
    import examples_path  # noqa: F401
    import train_digits as ex
    Xtr, Xte, ytr, yte = ex.load(0)
    orders = ex.batch_orders(len(Xtr), 64, 40, 0)
    sizes = [64, 256, 256, 10]
    acc = {}
    for p in ("bf16-mixed", precision):
        model, step, curve, _ = ex.train_cygemm(Xtr, ytr, orders, sizes, 1e-3, False, 0, None, p)
        assert step.graph is not None and curve[-1] < curve[0] / 4
        acc[p] = ex.accuracy_cygemm(model, Xte, yte)
    assert acc["bf16-mixed"] > 0.9
    assert acc[precision] >= acc["bf16-mixed"] - 0.01, acc
