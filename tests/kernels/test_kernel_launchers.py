"""The launchers of cygemm.nn's and cygemm.backend's kernels (cygemm/kernels/nn.cu, backend.cu,
compiled at build time): they load without a GPU, refuse bad input naming the argument before
anything launches, and the backend's sigmoid and row ops match float64 NumPy on every layout
(strided, broadcast, in place) with NaN-poisoned outputs."""
import numpy as np
import pytest

gpu = pytest.mark.gpu


# ---------------------------------------------------------------- CPU: loading and bad input

def test_the_launcher_modules_are_compiled_and_load_without_a_gpu():
    import importlib.machinery
    from cygemm.backend import _kernels as backend_kernels
    from cygemm.nn import _kernels as nn_kernels
    for mod in (nn_kernels, backend_kernels):
        assert mod.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), mod.__file__
    assert nn_kernels.THREADS == 256 and nn_kernels.MAX_BLOCKS == 1024


def test_grid_for_covers_n_with_at_least_one_and_at_most_max_blocks():
    from cygemm.nn._kernels import grid_for
    assert [grid_for(n) for n in (0, 1, 256, 257, 10007, 10 ** 9)] == [1, 1, 1, 2, 40, 1024]
    assert grid_for(100, threads=32) == 4


def test_launchers_refuse_host_arrays_naming_the_argument():
    from cygemm.backend import _kernels as bk
    from cygemm.nn import _kernels as nk
    x = np.zeros((4, 3), np.float32)
    with pytest.raises(TypeError, match="x: expected a float32 or float64 CuPy array, got ndarray"):
        bk.sigmoid(x, x, None)
    with pytest.raises(TypeError, match="x: expected a float32 or float64 CuPy array, got ndarray"):
        bk.row_op("softmax", x, x, None)
    with pytest.raises(ValueError, match="kind: expected 'softmax' or 'log_softmax', got 'max'"):
        bk.row_op("max", x, x, None)
    with pytest.raises(TypeError, match=r"logits: expected a 2-D CuPy float32 array, got \(4, 3\)"):
        nk.softmax_xent(x, None, x, 1.0, 1.0, None, None, None, None, 1, None)
    with pytest.raises(TypeError, match=r"y: expected a 2-D CuPy float32 array, got \(4, 3\)"):
        nk.mse(x, x, x, 1.0, 1.0, None, None, None, 1, None)
    with pytest.raises(TypeError, match="params: expected a CuPy float32 array, got ndarray"):
        nk.sgd(x, x, x, None, None, None, 0.0, 0.0, 0.0, False, 0, 0, 0, 0.0, 1, None)
    with pytest.raises(TypeError, match="params: expected a CuPy float32 array, got ndarray"):
        nk.adam(x, x, x, x, None, None, None, 0.9, 0.999, 1e-8, 0.0, False, 0, 0, 0, 0.0, 1, None)


# ---------------------------------------------------------------- GPU: wrong arrays, every layout

@gpu
def test_nn_launchers_refuse_wrong_dtypes_and_sizes_before_launching():
    import cupy as cp
    from cygemm.nn import _kernels as nk
    B, C, blocks = 8, 5, 2
    logits, grad = cp.zeros((B, C), np.float32), cp.full((B, C), np.nan, np.float32)
    partial, done = cp.zeros(blocks, np.float32), cp.zeros((), np.uint32)
    loss, bad = cp.full((), np.nan, np.float32), cp.zeros((), np.int32)
    labels = cp.zeros(B, np.int32)
    args = dict(grad_scale=1.0, loss_scale=1.0, partial=partial, done=done, loss=loss, bad=bad, blocks=blocks,
                stream=None)
    with pytest.raises(TypeError, match="labels: expected a CuPy int32 or int64 array, got float32"):
        nk.softmax_xent(logits, labels.astype(np.float32), grad, **args)
    with pytest.raises(TypeError, match="logits: expected dtype float32, got float64"):
        nk.softmax_xent(logits.astype(np.float64), labels, grad, **args)
    with pytest.raises(ValueError, match=r"grad: expected shape \(8, 5\), got \(8, 4\)"):
        nk.softmax_xent(logits, labels, grad[:, :4], **args)
    with pytest.raises(ValueError, match="partial: expected at least 3 elements, got 2"):
        nk.softmax_xent(logits, labels, grad, **{**args, "blocks": 3})
    with pytest.raises(ValueError, match="bias_grad, col_partial: expected both or neither"):
        nk.softmax_xent(logits, labels, grad, **args, bias_grad=cp.zeros(C, np.float32))
    params = cp.zeros(100, np.float32)
    with pytest.raises(ValueError, match="grads: expected at least 100 elements, got 99"):
        nk.sgd(params, cp.zeros(99, np.float32), params, cp.ones((), np.float32), cp.zeros((), np.int32),
               done, 0.0, 0.0, 0.0, False, 0, 0, 0, 0.0, 1, None)
    cp.cuda.Device().synchronize()
    assert bool(cp.isnan(grad).all()) and bool(cp.isnan(loss))      # nothing ran


def _sigmoid64(x):
    x = np.asarray(x, np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_on_strided_broadcast_and_in_place_layouts(dtype):
    import cupy as cp
    from cygemm.backend import _kernels as bk
    rng = np.random.default_rng()
    eps, tiny = np.finfo(dtype).eps, 4 * np.finfo(dtype).tiny       # (e^x below tiny: subnormal)
    base = (rng.standard_normal((6, 7, 9)) * 20).astype(dtype)
    base[0, 0, :3] = [80, -80, 0]
    xd = cp.asarray(base)
    cases = [(xd, (6, 7, 9), "C"), (xd.transpose(2, 0, 1), (9, 6, 7), "C"), (xd[:, ::-2, 1::3], (6, 4, 3), "F"),
             (xd[2, 3], (4, 9), "C"), (xd[0, 0, 5], (), "C"), (cp.asfortranarray(xd), (6, 7, 9), "F")]
    for x, out_shape, order in cases:
        out = cp.full(out_shape, cp.nan, dtype, order=order)
        assert bk.sigmoid(x, out, None) is out
        ref = _sigmoid64(np.broadcast_to(cp.asnumpy(x), out_shape))
        got = cp.asnumpy(out).astype(np.float64)
        assert not np.isnan(got).any(), x.shape
        assert np.allclose(got, ref, rtol=8 * eps, atol=tiny), x.shape
    x = cp.asarray(base)
    assert bk.sigmoid(x, x, None) is x                                   # in place
    assert np.allclose(cp.asnumpy(x).astype(np.float64), _sigmoid64(base), rtol=8 * eps, atol=tiny)
    with pytest.raises(TypeError, match="out: expected x's dtype"):
        bk.sigmoid(xd, cp.empty(xd.shape, np.float16), None)
    with pytest.raises(ValueError, match=r"out: expected a shape x \(6, 7, 9\) broadcasts to, got \(6, 7\)"):
        bk.sigmoid(xd, cp.empty((6, 7), dtype), None)


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_ops_against_float64_and_refuse_strided_arrays(dtype):
    import cupy as cp
    from cygemm.backend import _kernels as bk
    rng = np.random.default_rng()
    X = (rng.standard_normal((19, 45)) * 30).astype(dtype)
    X64 = X.astype(np.float64)
    m = X64.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(X64 - m).sum(axis=1, keepdims=True))
    for kind, ref in (("softmax", np.exp(X64 - lse)), ("log_softmax", X64 - lse)):
        out = cp.full(X.shape, cp.nan, dtype)
        assert bk.row_op(kind, cp.asarray(X), out, None) is out
        got = cp.asnumpy(out).astype(np.float64)
        assert not np.isnan(got).any()
        scale = np.maximum(1.0, np.abs(X64).max(axis=1, keepdims=True))
        # Relative to the value, down to the smallest normal number: below it (softmax of rows
        # spread by 30) the dtype holds subnormals, exact to an absolute step only.
        bound = 8 * np.finfo(dtype).eps * scale * (ref if kind == "softmax" else 1) + np.finfo(dtype).tiny
        assert (np.abs(got - ref) <= bound).all(), kind
    x = cp.asarray(X)
    with pytest.raises(ValueError, match="x, out: expected C-contiguous arrays"):
        bk.row_op("softmax", x.T, cp.empty(x.T.shape, dtype), None)
