"""The array backend protocol: what model code written against a backend may call."""
from typing import Any, Optional, Protocol, runtime_checkable


@runtime_checkable
class Backend(Protocol):
    """The operations a backend provides. Arrays are the backend's own (NumPy or CuPy), of its
    one floating dtype; arithmetic between them (``+ - * /``, ``.T``, ``.sum()``) is the array
    library's. Reductions return 0-d arrays of the backend (on a GPU: no synchronisation)."""

    name: str
    dtype: Any

    def asarray(self, x) -> Any:
        """x (a list, NumPy, CuPy or torch array) as an array of this backend and its dtype."""

    def to_numpy(self, x) -> Any:
        """x as a NumPy array (from the GPU: a copy, which waits for x)."""

    def zeros(self, shape) -> Any:
        """A new array of zeros of this backend's dtype."""

    def eye(self, n) -> Any:
        """The n×n identity of this backend's dtype."""

    def one_hot(self, labels, classes) -> Any:
        """(n, classes): row i is 1 at labels[i], 0 elsewhere."""

    def matmul(self, a, b, out: Optional[Any] = None) -> Any:
        """a @ b with NumPy's matmul semantics (into `out` when given)."""

    def gram(self, x) -> Any:
        """XᵀX of a 2-D x."""

    def dot(self, x, y, out: Optional[Any] = None) -> Any:
        """x · y of two 1-D arrays as a 0-d array (into a 0-d `out` when given)."""

    def sum_squares(self, x) -> Any:
        """The sum of x's squared elements (an L2 term), a 0-d array."""

    def softmax(self, x, axis: int = -1, out: Optional[Any] = None) -> Any:
        """Softmax along `axis`, exact for large inputs (the row maximum subtracted first)."""

    def log_softmax(self, x, axis: int = -1, out: Optional[Any] = None) -> Any:
        """Log-softmax along `axis`: ``x - max - log(sum(exp(x - max)))``."""

    def sigmoid(self, x, out: Optional[Any] = None) -> Any:
        """1 / (1 + exp(-x)), without overflow for either sign."""

    def cholesky_solve(self, a, b) -> Any:
        """Solve a x = b for a symmetric positive-definite a (a general solve, with a
        RuntimeWarning, where the Cholesky factorisation fails)."""

    def solve(self, a, b) -> Any:
        """Solve a x = b for a square a."""

    def l2_normalize(self, x, axis: int = -1, eps: float = 1e-12) -> Any:
        """x / max(||x||₂ along `axis`, eps)."""

    def ridge(self, x, y, alpha: float, fit_intercept: bool = True) -> Any:
        """Ridge regression in closed form, centred when `fit_intercept` (as scikit-learn's
        ``Ridge``): ``(coef, intercept)``."""

    def synchronize(self) -> None:
        """Wait for the backend's work (nothing to wait for on the CPU)."""
