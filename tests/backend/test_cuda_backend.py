"""GPU: cygemm.backend's CUDABackend against float64 references written in the tests (tests/refs)
and scikit-learn, on random and extreme inputs; conversions, no synchronisation, everything on
the backend's stream, the Cholesky fallback. NumPyBackend's tests: test_numpy_backend.py."""
import warnings

import numpy as np
import pytest

from refs import rows
from refs.activations import sigmoid

gpu = pytest.mark.gpu


def _cuda(**kw):
    from cygemm.backend import CUDABackend
    return CUDABackend(**kw)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_backend_matches_numpy_backend(dtype):
    import cupy as cp
    cb = _cuda(dtype=dtype, math="fp32")
    rng = np.random.default_rng()
    A, B = rng.standard_normal((70, 40)), rng.standard_normal((40, 30))
    tol = 1e-5 if dtype == "float32" else 1e-12
    out = cb.zeros((70, 30))
    out.fill(cp.nan)
    cb.matmul(cb.asarray(A), cb.asarray(B), out=out)
    assert np.linalg.norm(cb.to_numpy(out) - A @ B) / np.linalg.norm(A @ B) < tol
    assert np.linalg.norm(cb.to_numpy(cb.gram(cb.asarray(A))) - A.T @ A) / np.linalg.norm(A.T @ A) < tol
    x, y = rng.standard_normal(1000), rng.standard_normal(1000)
    d = cb.dot(cb.asarray(x), cb.asarray(y))
    assert isinstance(d, cp.ndarray) and d.shape == ()
    assert abs(float(d) - x @ y) < tol * np.abs(x) @ np.abs(y)
    assert abs(float(cb.sum_squares(cb.asarray(A))) - (A * A).sum()) < tol * (A * A).sum()
    X = rng.standard_normal((257, 67)) * 30
    X[0, :3] = [1e4, -1e4, 0]
    X[1, :] = -1e4
    xin = cb.asarray(X)
    Xr = cb.to_numpy(xin).astype(np.float64)          # the input as rounded to the dtype
    eps = np.finfo(dtype).eps
    # x - logsumexp(x) loses |x| * eps to cancellation: bounds scale with each row's largest |x|.
    row_scale = np.maximum(1.0, np.abs(Xr).max(axis=-1, keepdims=True))
    for op in ("softmax", "log_softmax", "sigmoid"):
        got = cb.to_numpy(getattr(cb, op)(xin)).astype(np.float64)
        ref = {"softmax": rows.softmax, "log_softmax": rows.log_softmax, "sigmoid": sigmoid}[op](Xr)
        assert np.isfinite(got).all(), op
        if op == "log_softmax":
            assert (np.abs(got - ref) <= 8 * eps * row_scale).all(), op
        elif op == "softmax":
            assert (np.abs(got - ref) <= 8 * eps * row_scale * ref + 1e-37).all(), op
        else:
            assert np.allclose(got, ref, rtol=8 * eps, atol=1e-37), op
    sm_axis0 = cb.to_numpy(cb.softmax(cb.asarray(X), axis=0))
    assert np.allclose(sm_axis0, rows.softmax(X, axis=0), atol=1e-6)
    v = rng.standard_normal((5, 9))
    assert np.allclose(cb.to_numpy(cb.l2_normalize(cb.asarray(v), axis=1)), rows.l2_normalize(v, axis=1), atol=1e-6)


@gpu
def test_row_kernels_in_place_and_large_rows():
    cb = _cuda()
    rng = np.random.default_rng()
    X = rng.standard_normal((33, 5000)) * 10
    x = cb.asarray(X)
    assert cb.softmax(x, out=x) is x
    assert np.allclose(cb.to_numpy(x), rows.softmax(X), atol=1e-6, rtol=1e-4)
    x = cb.asarray(X)
    assert cb.sigmoid(x, out=x) is x
    assert np.allclose(cb.to_numpy(x), sigmoid(X), rtol=1e-6)


@gpu
def test_cuda_asarray_mixed_and_object_dtypes_and_torch():
    torch = pytest.importorskip("torch")
    cb = _cuda()
    assert cb.asarray([1, 2.5, np.int16(3)]).dtype == np.float32
    assert cb.asarray(np.array([1, 2], np.int64)).dtype == np.float32
    with pytest.raises(TypeError, match=r"element \(2,\) is 'x'"):
        cb.asarray(np.array([1.0, 2, "x"], dtype=object))
    t = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
    got = cb.asarray(t)
    assert np.array_equal(cb.to_numpy(got), np.arange(6).reshape(2, 3))


@gpu
def test_dot_and_row_kernels_inside_a_stream_capture():
    import cupy as cp
    import cygemm.graph
    cb = _cuda(math="fp32")
    rng = np.random.default_rng()
    x, y = cb.asarray(rng.standard_normal(4096)), cb.asarray(rng.standard_normal(4096))
    z = cb.asarray(rng.standard_normal((64, 10)))
    out = cb.zeros(())
    out.fill(cp.nan)
    cb.dot(x, y, out=out)                  # plans first
    cb.softmax(z, out=z)
    cb.synchronize()
    z0 = cb.to_numpy(z)
    with cygemm.graph.capture(cb.stream) as g:    # any synchronisation would end the capture
        cb.dot(x, y, out=out)
        cb.softmax(z, out=z)
    out.fill(cp.nan)
    g.launch(cb.stream)
    cb.synchronize()
    ref = cb.to_numpy(x).astype(np.float64) @ cb.to_numpy(y).astype(np.float64)
    assert abs(float(out) - ref) < 1e-4 * np.sqrt(4096)
    assert np.allclose(cb.to_numpy(z), rows.softmax(z0), atol=1e-6)


@gpu
def test_iteration_of_a_model_makes_no_host_synchronisation():
    import cupyx
    import examples_path  # noqa: F401  (puts examples/ on sys.path)
    import linear_models
    cb = _cuda()
    rng = np.random.default_rng()
    X = cb.asarray(rng.standard_normal((500, 20)))
    labels = rng.integers(0, 4, 500)
    st = linear_models.logreg_setup(cb, X, labels, 4)
    linear_models.logreg_iterate(cb, st, 2)                      # compile and plan first
    cb.synchronize()
    with cupyx.allow_synchronize(False):                         # raises at any synchronisation
        linear_models.logreg_iterate(cb, st, 20)
    W = cb.to_numpy(st["W"])
    assert np.isfinite(W).all() and np.abs(W).max() > 0


@gpu
def test_cuda_cholesky_solve_spd_and_fallback_on_a_non_spd_matrix():
    cb = _cuda(math="fp32")
    rng = np.random.default_rng()
    M = rng.standard_normal((80, 50))
    A, b = M.T @ M + np.eye(50), rng.standard_normal((50, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = cb.to_numpy(cb.cholesky_solve(cb.asarray(A), cb.asarray(b)))
    assert np.linalg.norm(A @ x - b) / np.linalg.norm(b) < 1e-4
    S = np.array([[1.0, 2.0], [2.0, 1.0]])
    with pytest.warns(RuntimeWarning, match="Cholesky factorisation failed"):
        x = cb.to_numpy(cb.cholesky_solve(cb.asarray(S), cb.asarray([1.0, 0.0])))
    assert np.allclose(S @ x, [1.0, 0.0], atol=1e-5)


@gpu
def test_ridge_on_diabetes_matches_scikit_learn():
    sklearn = pytest.importorskip("sklearn")
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import Ridge
    del sklearn
    X, y = load_diabetes(return_X_y=True)
    cb = _cuda(math="fp32")
    coef, intercept = cb.ridge(cb.asarray(X), cb.asarray(y), 1.0)
    ref = Ridge(alpha=1.0).fit(X, y)
    assert np.abs(cb.to_numpy(coef) - ref.coef_).max() / np.abs(ref.coef_).max() < 1e-4
    assert abs(float(intercept) - ref.intercept_) < 1e-4 * abs(ref.intercept_)


@gpu
def test_everything_runs_on_the_backends_stream():
    import cupy as cp
    import cygemm.graph
    s = cp.cuda.Stream(non_blocking=True)
    cb = _cuda(stream=s, math="fp32")
    rng = np.random.default_rng()
    a = cb.asarray(rng.standard_normal((256, 256)))
    out, soft = cb.zeros((256, 256)), cb.zeros((256, 256))
    cb.matmul(a, a, out=out)                 # plans first
    cb.softmax(out, out=soft)
    cb.synchronize()
    # Captured on s: work enqueued anywhere else would be missing from the graph (or, on the
    # legacy stream, end the capture with an error).
    with cygemm.graph.capture(s) as g:
        cb.matmul(a, a, out=out)
        cb.softmax(out, out=soft)
    assert g.num_nodes >= 2
    out.fill(np.nan)
    soft.fill(np.nan)
    cp.cuda.Device().synchronize()
    g.launch(s)
    cb.synchronize()
    A = cb.to_numpy(a).astype(np.float64)
    assert np.allclose(cb.to_numpy(soft), rows.softmax(A @ A), atol=1e-5)


@gpu
def test_float_of_a_result_waits_for_the_default_backend_stream():
    """float(result) reads on CuPy's current stream: the backend's default stream must be one
    that stream waits for, or the read could come before the result."""
    import cupy as cp
    cb = _cuda(math="fp32")
    rng = np.random.default_rng()
    x = cb.asarray(rng.standard_normal(1000))
    out = cb.zeros(())
    cb.dot(x, x, out=out)
    cb.synchronize()
    out.fill(np.nan)
    cp.cuda.Device().synchronize()
    spin = cp.RawKernel(r"""extern "C" __global__ void spin(long long cycles) {
        long long t0 = clock64(); while (clock64() - t0 < cycles) {} }""", "spin")
    with cb.stream:
        spin((1,), (1,), (np.int64(200_000_000),))     # holds the backend's stream ~0.1 s
    cb.dot(x, x, out=out)
    got = float(out)                                   # no explicit synchronisation
    assert abs(got - float(cb.to_numpy(x).astype(np.float64) @ cb.to_numpy(x))) < 1e-3


def test_a_stream_that_is_not_a_stream_is_refused_before_the_gpu_check():
    from cygemm.backend import CUDABackend
    with pytest.raises(TypeError, match=r"stream: expected a cupy.cuda.Stream .* or None, got builtins.str"):
        CUDABackend(stream="x")
