"""What both backends compute the same way, written once over the array module ``xp``; each
backend supplies its products, row kernels and solvers."""
import contextlib
import warnings

import numpy as np

from cygemm.backend._convert import float_dtype, host_numbers, is_torch


class ArrayBackend:
    name = "base"
    xp = np

    def __init__(self, dtype="float32"):
        self.dtype = float_dtype(dtype)

    def _on(self):
        """The context the backend's array operations run in (the GPU backend: its stream)."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------ data in and out

    def asarray(self, x, name="x"):
        """x as an array of this backend and its float dtype: lists, NumPy arrays (object
        arrays of numbers too), CuPy arrays, torch tensors. TypeError names an element that is
        not a real number."""
        return self._from_host(host_numbers(x, self.dtype, name))

    def to_numpy(self, x):
        """x as a NumPy array (from the GPU: a copy, which waits for x)."""
        return np.asarray(x)

    def zeros(self, shape):
        """A new array of zeros of this backend's dtype."""
        return self.xp.zeros(shape, self.dtype)

    def eye(self, n):
        """The n×n identity of this backend's dtype."""
        return self.xp.eye(n, dtype=self.dtype)

    def one_hot(self, labels, classes):
        """(n, classes) of this dtype: row i is 1 at labels[i].

        As :meth:`cygemm.backend.Backend.one_hot` (its parameters, result and errors).
        """
        with self._on():
            labels = self._labels(labels, classes)
            out = self.xp.zeros((labels.shape[0], classes), self.dtype)
            out[self.xp.arange(labels.shape[0]), labels] = 1
            return out

    def _labels(self, labels, classes):
        host = np.asarray(labels) if not hasattr(labels, "__cuda_array_interface__") else None
        if host is not None:
            if host.ndim != 1 or not np.issubdtype(host.dtype, np.integer):
                raise TypeError(f"labels: expected a 1-D array of integers, got {host.dtype.name} {host.shape}")
            if host.size and (host.min() < 0 or host.max() >= classes):
                raise ValueError(f"labels: expected integers in [0, {classes}), got values from "
                                 f"{host.min()} to {host.max()}")
        return self._index_array(labels)

    # ------------------------------------------------------------ reductions and norms

    def sum_squares(self, x):
        """Sum of x's squared elements (an L2 term), a 0-d array."""
        with self._on():
            flat = x.reshape(-1)
            return self.dot(flat, flat)

    def l2_normalize(self, x, axis=-1, eps=1e-12):
        """x / max(||x||_2 along axis, eps).

        As :meth:`cygemm.backend.Backend.l2_normalize` (its parameters, result and errors).
        """
        with self._on():
            norm = self.xp.sqrt((x * x).sum(axis=axis, keepdims=True))
            return x / self.xp.maximum(norm, eps)

    # ------------------------------------------------------------ solvers

    def cholesky_solve(self, a, b):
        """Solve a x = b for a symmetric positive-definite a by a Cholesky factorisation; when
        the factorisation fails (a not SPD), warn (RuntimeWarning) and solve it as a general
        system.

        As :meth:`cygemm.backend.Backend.cholesky_solve` (its parameters, result and errors).
        """
        try:
            with self._on():
                return self._cholesky_solve(a, b)
        except np.linalg.LinAlgError as exc:
            warnings.warn(f"cholesky_solve: the Cholesky factorisation failed ({exc}); solving a "
                          "general system instead", RuntimeWarning, stacklevel=2)
            return self.solve(a, b)

    def ridge(self, x, y, alpha, fit_intercept=True):
        """Ridge regression in closed form: ``(XcᵀXc + alpha I) coef = Xcᵀ yc`` through
        :meth:`cholesky_solve`, with X and y centred when ``fit_intercept`` (as scikit-learn's
        ``Ridge``). Returns ``(coef, intercept)``: coef (features,) or (features, targets).

        As :meth:`cygemm.backend.Backend.ridge` (its parameters, result and errors).
        """
        if alpha < 0:
            raise ValueError(f"alpha: expected a number >= 0, got {alpha!r}")
        with self._on():
            return self._ridge(x, y, alpha, fit_intercept)

    def _ridge(self, x, y, alpha, fit_intercept):
        if fit_intercept:
            x_mean, y_mean = x.mean(axis=0), y.mean(axis=0)
            xc, yc = x - x_mean, y - y_mean
        else:
            xc, yc = x, y
        g = self.gram(xc)
        g += alpha * self.eye(g.shape[0])
        rhs = self.matmul(xc.T, yc if yc.ndim == 2 else yc[:, None])
        coef = self.cholesky_solve(g, rhs)
        if y.ndim == 1:
            coef = coef[:, 0]
        intercept = (y_mean - self.matmul(x_mean[None, :], coef if coef.ndim == 2 else coef[:, None])
                     .reshape(y_mean.shape)) if fit_intercept else self.xp.zeros(y.shape[1:], self.dtype)
        return coef, intercept

    def _apply_axis(self, op, x, axis, out):
        """Run a last-axis row op along any axis (other axes go through a contiguous copy)."""
        if axis in (-1, x.ndim - 1) and x.flags.c_contiguous and (out is None or out.flags.c_contiguous):
            return op(x, out)
        moved = self.xp.ascontiguousarray(self.xp.moveaxis(x, axis, -1))
        res = self.xp.moveaxis(op(moved, moved), -1, axis)
        if out is None:
            return res
        out[...] = res
        return out

    def synchronize(self):
        """Wait for the backend's work (nothing to wait for on the CPU)."""


def check_matrix(a, name, ndim=2):
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {a.shape}")


__all__ = ["ArrayBackend", "check_matrix", "is_torch"]
