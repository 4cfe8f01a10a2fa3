"""The dense layer's elementwise passes on their own, against float64 NumPy on fresh random
inputs with NaN-poisoned outputs; aligned (16-byte) and unaligned rows take different paths."""
import numpy as np
import pytest

from cygemm import elementwise
from fakes import FakeDeviceArray
from gpu_util import rel_err
from refs import activations


def test_bad_arguments_are_refused_before_anything_runs():
    x = FakeDeviceArray((8, 16))
    with pytest.raises(ValueError, match="out: expected shape"):
        elementwise.bias_act(x, out=FakeDeviceArray((8, 8)))
    with pytest.raises(ValueError, match="act:"):
        elementwise.bias_act(x, out=x, act="swish2")
    with pytest.raises(ValueError, match="x: expected a row-major"):
        elementwise.bias_act(FakeDeviceArray((8, 16), strides=(4, 32)), out=x)
    with pytest.raises(ValueError, match="z: act='gelu' needs z"):
        elementwise.act_backward(x, None, dz_out=x, act="gelu")
    with pytest.raises(ValueError, match="z_is_output"):
        elementwise.act_backward(x, x, dz_out=x, act="gelu", z_is_output=True)
    with pytest.raises(ValueError, match="give at least one output"):
        elementwise.act_backward(x, x, act="relu")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("act", ["none", "relu", "gelu", "silu"])
@pytest.mark.parametrize("cols, col0", [(1024, 0), (77, 0), (1024, 1)])
def test_forward_and_backward_passes_match_float64(dtype, act, cols, col0):
    import cupy as cp
    rng = np.random.default_rng()
    M = 333
    tol = 1e-5 if dtype == "float32" else 2e-3
    xh = rng.standard_normal((M, cols + col0)).astype(dtype)
    bh = rng.standard_normal(cols).astype(dtype)
    x = cp.asarray(xh)[:, col0:]                  # col0 1: rows not 16-byte aligned
    b = cp.asarray(bh)
    out, z = cp.full((M, cols), cp.nan, dtype), cp.full((M, cols), cp.nan, dtype)
    elementwise.bias_act(x, b, out=out, z_out=z, act=act)
    z64 = xh[:, col0:].astype(np.float64) + bh.astype(np.float64)
    assert rel_err(cp.asnumpy(z), z64) < tol
    assert rel_err(cp.asnumpy(out), activations.act(act, z64)) < tol
    gy_h = rng.standard_normal((M, cols)).astype(dtype)
    dz, db = cp.full((M, cols), cp.nan, dtype), cp.full(cols, cp.nan, dtype)
    elementwise.act_backward(cp.asarray(gy_h), z, dz_out=dz, dbias_out=db, act=act)
    dz64 = gy_h.astype(np.float64) * activations.act_grad(act, cp.asnumpy(z).astype(np.float64))
    assert rel_err(cp.asnumpy(dz), dz64) < (1e-4 if dtype == "float32" else 3e-3)
    assert rel_err(cp.asnumpy(db), dz64.sum(axis=0)) < (1e-4 if dtype == "float32" else 3e-3)


@pytest.mark.gpu
def test_bias_gradient_accumulates_and_dz_may_be_gy():
    import cupy as cp
    rng = np.random.default_rng()
    gy = cp.asarray(rng.standard_normal((500, 256)).astype(np.float32))
    z = cp.asarray(rng.standard_normal((500, 256)).astype(np.float32))
    start = rng.standard_normal(256).astype(np.float32)
    db = cp.asarray(start)
    want = cp.asnumpy(gy).astype(np.float64) * (cp.asnumpy(z) > 0)
    elementwise.act_backward(gy, z, dz_out=gy, dbias_out=db, act="relu", accumulate=True)
    assert rel_err(cp.asnumpy(gy), want) < 1e-6
    assert rel_err(cp.asnumpy(db), want.sum(axis=0) + start) < 1e-5


def test_shifted_outputs_are_refused_exact_in_place_is_not():
    import numpy as np
    buf = np.zeros((9, 16), np.float32)
    from fakes import fake_view
    x, shifted = fake_view(buf, buf[:8]), fake_view(buf, buf[1:])
    with pytest.raises(ValueError, match="out"):
        elementwise.bias_act(x, out=shifted)
    with pytest.raises(ValueError, match="dz_out"):
        elementwise.act_backward(x, None, dz_out=shifted)
    with pytest.raises(ValueError, match="z_out"):
        elementwise.bias_act(x, out=fake_view(buf, buf[:8]), z_out=fake_view(buf, buf[:8]))
