"""The array backend protocol: what model code written against a backend may call."""
from typing import Any, Optional, Protocol, runtime_checkable


@runtime_checkable
class Backend(Protocol):
    """The operations a backend provides. Arrays are the backend's own (NumPy or CuPy), of its
    one floating dtype; arithmetic between them (``+ - * /``, ``.T``, ``.sum()``) is the array
    library's. Reductions return 0-d arrays of the backend (on a GPU: no synchronisation).

    A ``typing.Protocol``, so it takes no constructor arguments and is never instantiated:
    make a :class:`NumPyBackend` or a :class:`CUDABackend`, and check any object with
    ``isinstance(obj, Backend)``.
    """

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
        """(n, classes): row i is 1 at labels[i], 0 elsewhere.

        Parameters
        ----------
        labels : array of int (n,)
            Class indices in [0, classes).
        classes : int
            The number of classes: the result's number of columns.

        Returns
        -------
        array (n, classes)
            In the backend's dtype.
        """

    def matmul(self, a, b, out: Optional[Any] = None) -> Any:
        """a @ b with NumPy's matmul semantics (into `out` when given).

        Parameters
        ----------
        a, b : array
            The backend's arrays; shapes as ``numpy.matmul`` takes them (1-D operands, batch
            axes that broadcast).
        out : array, optional
            Where to write the product: the result's shape. None: a new array.

        Returns
        -------
        array
            The product (``out`` when given).
        """

    def gram(self, x) -> Any:
        """XᵀX of a 2-D x."""

    def dot(self, x, y, out: Optional[Any] = None) -> Any:
        """x · y of two 1-D arrays as a 0-d array (into a 0-d `out` when given).

        Parameters
        ----------
        x, y : array (n,)
            Two 1-D arrays of one length.
        out : array (), optional
            A 0-d array of the backend's dtype to write the result to. None: a new one.

        Returns
        -------
        array ()
            The inner product (``out`` when given).
        """

    def sum_squares(self, x) -> Any:
        """The sum of x's squared elements (an L2 term), a 0-d array."""

    def softmax(self, x, axis: int = -1, out: Optional[Any] = None) -> Any:
        """Softmax along `axis`, exact for large inputs (the row maximum subtracted first).

        Parameters
        ----------
        x : array
            Floating-point scores, any shape.
        axis : int
            The axis whose entries sum to 1 (default: the last).
        out : array, optional
            Where to write the result: x's shape and dtype (it may be x itself). None: a new
            array.

        Returns
        -------
        array
            x's shape (``out`` when given).
        """

    def log_softmax(self, x, axis: int = -1, out: Optional[Any] = None) -> Any:
        """Log-softmax along `axis`: ``x - max - log(sum(exp(x - max)))``.

        Parameters
        ----------
        x, axis, out
            As :meth:`softmax`.

        Returns
        -------
        array
            x's shape (``out`` when given).
        """

    def sigmoid(self, x, out: Optional[Any] = None) -> Any:
        """1 / (1 + exp(-x)), without overflow for either sign.

        Parameters
        ----------
        x : array
            Floating-point values, any shape.
        out : array, optional
            Where to write the result: x's shape and dtype (it may be x itself). None: a new
            array.

        Returns
        -------
        array
            x's shape (``out`` when given).
        """

    def cholesky_solve(self, a, b) -> Any:
        """Solve a x = b for a symmetric positive-definite a (a general solve, with a
        RuntimeWarning, where the Cholesky factorisation fails).

        Parameters
        ----------
        a : array (n, n)
            Symmetric positive-definite.
        b : array (n,) or (n, k)
            The right-hand side(s).

        Returns
        -------
        array
            x, b's shape.

        Warns
        -----
        RuntimeWarning
            The factorisation failed (a is not positive definite): x is :meth:`solve`'s.
        """

    def solve(self, a, b) -> Any:
        """Solve a x = b for a square a.

        Parameters
        ----------
        a : array (n, n)
            A square, non-singular matrix.
        b : array (n,) or (n, k)
            The right-hand side(s).

        Returns
        -------
        array
            x, b's shape.
        """

    def l2_normalize(self, x, axis: int = -1, eps: float = 1e-12) -> Any:
        """x / max(||x||₂ along `axis`, eps).

        Parameters
        ----------
        x : array
            Floating-point values, any shape.
        axis : int
            The axis along which each vector's norm is taken (default: the last).
        eps : float
            The smallest norm divided by, so that a zero vector stays zero instead of NaN.

        Returns
        -------
        array
            A new array of x's shape.
        """

    def ridge(self, x, y, alpha: float, fit_intercept: bool = True) -> Any:
        """Ridge regression in closed form, centred when `fit_intercept` (as scikit-learn's
        ``Ridge``): ``(coef, intercept)``.

        Parameters
        ----------
        x : array (samples, features)
            The design matrix.
        y : array (samples,) or (samples, targets)
            The target(s).
        alpha : float
            The L2 penalty, >= 0.
        fit_intercept : bool
            Centre x and y first and fit an intercept (default); False: no intercept (zero).

        Returns
        -------
        coef : array (features,) or (features, targets)
            As y is 1-D or 2-D.
        intercept : array () or (targets,)

        Raises
        ------
        ValueError
            A negative alpha.
        """

    def synchronize(self) -> None:
        """Wait for the backend's work (nothing to wait for on the CPU)."""
