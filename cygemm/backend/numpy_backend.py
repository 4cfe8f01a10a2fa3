"""The CPU reference backend: NumPy, float64 by default."""
import numpy as np

from cygemm.backend._base import ArrayBackend, check_matrix
from cygemm.backend._convert import host_numbers, is_torch


class NumPyBackend(ArrayBackend):
    """The :class:`~cygemm.backend.Backend` protocol on NumPy (the CPU reference).

    Parameters
    ----------
    dtype : {"float64", "float32"}
        The one floating dtype of every array it makes.
    """
    name = "numpy"
    xp = np

    def __init__(self, dtype="float64"):
        super().__init__(dtype)

    def asarray(self, x, name="x"):
        """x as a NumPy array of the backend's dtype (device arrays and torch tensors copied to the
        host); TypeError names an element that is not a real number.

        Parameters
        ----------
        x : array-like
            A list (nested lists of numbers), a NumPy array (object arrays of numbers too), a
            CuPy or other ``__cuda_array_interface__`` array, or a torch tensor, of real numbers.
        name : str
            What the error messages call x.

        Returns
        -------
        numpy.ndarray
            x's shape, the backend's dtype; x itself when it is a NumPy array of that dtype
            already.

        Raises
        ------
        TypeError
            An element that is not a real number (bool, str, None, complex, ...), named by its
            index, or an array whose dtype is not a real number's.
        ValueError
            A ragged nested sequence (rows of different lengths).
        """
        if hasattr(x, "__cuda_array_interface__") or is_torch(x):
            x = _to_host(x)
        return host_numbers(x, self.dtype, name)

    def to_numpy(self, x):
        """x as a NumPy array."""
        return np.asarray(x)

    def _from_host(self, arr):
        return arr

    def _index_array(self, labels):
        return np.asarray(labels).astype(np.intp)

    def matmul(self, a, b, out=None):
        """a @ b by ``np.matmul``.

        As :meth:`cygemm.backend.Backend.matmul` (its parameters, result and errors).
        """
        return np.matmul(a, b, out=out)

    def gram(self, x):
        """XᵀX of a 2-D x."""
        check_matrix(x, "x")
        return x.T @ x

    def dot(self, x, y, out=None):
        """x · y as a 0-d array of the backend's dtype (into a 0-d `out` when given).

        As :meth:`cygemm.backend.Backend.dot` (its parameters, result and errors).
        """
        r = np.asarray(np.dot(x, y), dtype=self.dtype)
        if out is not None:
            out[...] = r
            return out
        return r

    def softmax(self, x, axis=-1, out=None):
        """Softmax along `axis`, the row maximum subtracted first.

        As :meth:`cygemm.backend.Backend.softmax` (its parameters, result and errors).
        """
        z = x - x.max(axis=axis, keepdims=True)
        e = np.exp(z)
        return np.divide(e, e.sum(axis=axis, keepdims=True), out=out)

    def log_softmax(self, x, axis=-1, out=None):
        """Log-softmax along `axis`: ``x - max - log(sum(exp(x - max)))``.

        As :meth:`cygemm.backend.Backend.log_softmax` (its parameters, result and errors).
        """
        z = x - x.max(axis=axis, keepdims=True)
        return np.subtract(z, np.log(np.exp(z).sum(axis=axis, keepdims=True)), out=out)

    def sigmoid(self, x, out=None):
        """1 / (1 + exp(-x)), without overflow for either sign.

        As :meth:`cygemm.backend.Backend.sigmoid` (its parameters, result and errors).
        """
        e = np.exp(-np.abs(x))
        return np.divide(np.where(x >= 0, 1, e), 1 + e, out=out)

    def _cholesky_solve(self, a, b):
        lower = np.linalg.cholesky(a)
        return np.linalg.solve(lower.T, np.linalg.solve(lower, b))

    def solve(self, a, b):
        """Solve a x = b by ``np.linalg.solve``.

        As :meth:`cygemm.backend.Backend.solve` (its parameters, result and errors).
        """
        return np.linalg.solve(a, b)


def _to_host(x):
    if is_torch(x):
        return x.detach().cpu().numpy()
    import cupy
    return cupy.asnumpy(cupy.asarray(x))
