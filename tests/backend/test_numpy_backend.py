"""CPU: cygemm.backend's NumPyBackend: the Backend protocol, conversions (naming the bad element),
softmax, log-softmax and sigmoid exact at extremes, Cholesky solves, ridge and the fallback,
against float64 formulas written here."""
import numpy as np
import pytest

from cygemm.backend import Backend, NumPyBackend


def test_both_backends_satisfy_the_protocol():
    assert isinstance(NumPyBackend(), Backend)


def test_asarray_converts_object_arrays_of_numbers_and_names_the_bad_element():
    be = NumPyBackend()
    got = be.asarray(np.array([[1, 2.5], [np.float32(3), np.int64(4)]], dtype=object))
    assert got.dtype == np.float64 and np.array_equal(got, [[1, 2.5], [3, 4]])
    assert be.asarray([1, 2, 3]).dtype == np.float64
    assert NumPyBackend("float32").asarray(np.arange(3)).dtype == np.float32
    with pytest.raises(TypeError, match=r"x: element \(1, 0\) is 'a' \(str\), not a real number"):
        be.asarray(np.array([[1, 2], ["a", 4]], dtype=object))
    with pytest.raises(TypeError, match=r"element \(1,\) is None"):
        be.asarray([1.0, None])
    with pytest.raises(TypeError, match="not a real number"):
        be.asarray(np.array([1, 2j], dtype=object))
    with pytest.raises(TypeError, match="not a real number"):
        be.asarray(np.array([1.0, True], dtype=object))
    with pytest.raises(TypeError, match="expected real numbers, got dtype complex128"):
        be.asarray(np.array([1 + 2j]))
    with pytest.raises(TypeError, match="dtype: expected one of"):
        NumPyBackend("int32")


def test_numpy_softmax_log_softmax_sigmoid_exact_at_extremes():
    be = NumPyBackend()
    x = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [3.0, 1.0, -2.0]])
    sm, lsm, sg = be.softmax(x), be.log_softmax(x), be.sigmoid(x)
    assert np.isfinite(sm).all() and np.isfinite(lsm).all() and np.isfinite(sg).all()
    assert np.allclose(sm.sum(-1), 1)
    assert np.allclose(sm[1], 1 / 3) and lsm[0, 1] == -2e4
    e = np.exp(x[2] - 3.0)
    assert np.allclose(sm[2], e / e.sum(), rtol=1e-15)
    assert sg[0, 0] == 1.0 and sg[0, 1] == 0.0 and sg[0, 2] == 0.5
    assert np.isclose(be.sigmoid(np.array(-30.0)), np.exp(-30.0) / (1 + np.exp(-30.0)), rtol=1e-14)


def test_numpy_cholesky_solve_ridge_and_fallback():
    be = NumPyBackend()
    rng = np.random.default_rng()
    M = rng.standard_normal((30, 20))
    A, b = M.T @ M + np.eye(20), rng.standard_normal(20)
    assert np.allclose(A @ be.cholesky_solve(A, b), b)
    X, y = rng.standard_normal((50, 6)), rng.standard_normal(50)
    coef, intercept = be.ridge(X, y, 2.0)
    Xc, yc = X - X.mean(0), y - y.mean()
    assert np.allclose(coef, np.linalg.solve(Xc.T @ Xc + 2 * np.eye(6), Xc.T @ yc))
    assert np.isclose(intercept, y.mean() - X.mean(0) @ coef)
    S = np.array([[1.0, 2.0], [2.0, 1.0]])        # symmetric, not positive definite
    with pytest.warns(RuntimeWarning, match="Cholesky factorisation failed"):
        x = be.cholesky_solve(S, np.array([1.0, 0.0]))
    assert np.allclose(S @ x, [1.0, 0.0])


def test_bad_arguments():
    be = NumPyBackend()
    with pytest.raises(ValueError, match="alpha"):
        be.ridge(np.zeros((3, 2)), np.zeros(3), -1.0)
    with pytest.raises(ValueError, match=r"labels: expected integers in \[0, 3\)"):
        be.one_hot(np.array([0, 3]), 3)
