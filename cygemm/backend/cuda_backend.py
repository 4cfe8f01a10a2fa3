"""The GPU backend: CuPy arrays, products through cygemm, fused row kernels, cuSOLVER, all on
one stream that cygemm's calls and the kernels share."""
from typing import Literal

import cupy as cp
import cupyx
import cupyx.scipy.linalg
import numpy as np

import cygemm
from cygemm.backend import _kernels
from cygemm.backend._base import ArrayBackend, check_matrix
from cygemm.backend._convert import host_numbers, is_torch
from cygemm.typing import StreamLike
from cygemm import require_gpu


class CUDABackend(ArrayBackend):
    """The :class:`~cygemm.backend.Backend` protocol on the GPU.

    Parameters
    ----------
    stream : cupy.cuda.Stream, optional
        Where everything runs: cygemm's GEMMs, the backend's kernels and CuPy's operations
        (the backend's methods enter it). Default: a new blocking stream, which CuPy's
        default stream waits for, so ``float(result)`` always reads a finished result.
    dtype : {"float32", "float64"}
        The one floating dtype of every array it makes; float32 products go through cygemm,
        float64 ones through cygemm's matmul (which runs them in fp64).
    math : {"tf32", "fp32"}
        float32 products in :meth:`matmul` and :meth:`gram`. :meth:`dot` is always strict fp32.

    Raises
    ------
    cygemm.CygemmError
        Where no GPU is usable: the message is :func:`cygemm.gpu_unavailable_reason`'s.

    Notes
    -----
    Nothing here synchronises the host except :meth:`to_numpy`, ``float()`` of a result, and a
    :meth:`cholesky_solve` whose factorisation status is read (once per call).
    """
    name = "cuda"
    xp = cp

    def __init__(self, stream: StreamLike = None, dtype: object = "float32",
                 math: Literal["tf32", "fp32"] = "tf32") -> None:
        super().__init__(dtype)
        if math not in ("tf32", "fp32"):
            raise ValueError(f"math: expected 'tf32' or 'fp32', got {math!r}")
        if stream is not None and not (hasattr(stream, "ptr") and hasattr(stream, "__enter__")):
            raise TypeError(f"stream: expected a cupy.cuda.Stream (the backend's methods enter it) or None, "
                            f"got {type(stream).__module__}.{type(stream).__name__}")
        require_gpu()           # before CuPy makes a stream (cygemm's plain-words reason, not CuPy's), after the arguments
        self.math = math
        self.stream = stream if stream is not None else cp.cuda.Stream(non_blocking=False)

    def _on(self):
        return self.stream

    # ------------------------------------------------------------ data in and out

    def asarray(self, x, name="x"):
        """x as a CuPy array of the backend's dtype, on its stream (a device array of another
        dtype is cast on the device; torch tensors come through DLPack, without a copy when
        the dtype matches).

        Parameters
        ----------
        x : array-like
            A list (nested lists of numbers), a NumPy array (object arrays of numbers too), a
            CuPy array or a torch tensor (CUDA or CPU), of real numbers.
        name : str
            What the error messages call x.

        Returns
        -------
        cupy.ndarray
            x's shape, the backend's dtype; x itself when it is a CuPy array of that dtype
            already (a torch CUDA tensor of that dtype: a view of its memory).

        Raises
        ------
        TypeError
            An element that is not a real number (bool, str, None, complex, ...), named by its
            index, or an array whose dtype is not a real number's.
        ValueError
            A ragged nested sequence (rows of different lengths).
        """
        with self.stream:
            if is_torch(x):
                x = cp.from_dlpack(x.detach()) if x.is_cuda else x.detach().numpy()
            if isinstance(x, cp.ndarray):
                if x.dtype.kind not in "fiu":
                    raise TypeError(f"{name}: expected real numbers, got dtype {x.dtype.name}")
                return x.astype(self.dtype, copy=False)
            return cp.asarray(host_numbers(x, self.dtype, name))

    def to_numpy(self, x):
        """x as a NumPy array: a copy on the backend's stream, which waits for x."""
        return cp.asnumpy(x, stream=self.stream, blocking=True) if isinstance(x, cp.ndarray) else np.asarray(x)

    def zeros(self, shape):
        """A new array of zeros of the backend's dtype, on its stream."""
        with self.stream:
            return cp.zeros(shape, self.dtype)

    def eye(self, n):
        """The n×n identity of the backend's dtype, on its stream."""
        with self.stream:
            return cp.eye(n, dtype=self.dtype)

    def _index_array(self, labels):
        return cp.asarray(labels).astype(cp.int64, copy=False)

    def _from_host(self, arr):
        with self.stream:
            return cp.asarray(arr)

    # ------------------------------------------------------------ products

    def matmul(self, a, b, out=None):
        """a @ b through :func:`cygemm.matmul` (NumPy semantics), on the backend's stream.

        As :meth:`cygemm.backend.Backend.matmul` (its parameters, result and errors).
        """
        return cygemm.matmul(a, b, out, math=self.math, stream=self.stream)

    def gram(self, x):
        """XᵀX as one GEMM (X read transposed in place)."""
        check_matrix(x, "x")
        with self.stream:
            out = cp.empty((x.shape[1], x.shape[1]), x.dtype)
        if x.dtype == np.float64:
            return cygemm.matmul(x.T, x, out, stream=self.stream)
        return cygemm.gemm(x, x, out, trans_a=True, math=self.math, stream=self.stream)

    def dot(self, x, y, out=None):
        """x · y of two 1-D arrays as a 0-d device array: no synchronisation (``float()`` of it
        waits). With ``out`` (0-d), nothing is allocated and the call can be captured.

        As :meth:`cygemm.backend.Backend.dot` (its parameters, result and errors).
        """
        if x.ndim != 1 or y.ndim != 1 or x.shape != y.shape:
            raise ValueError(f"x, y: expected two 1-D arrays of one length, got {x.shape} and {y.shape}")
        if out is None:
            with self.stream:
                out = cp.empty((), self.dtype)
        if x.dtype == np.float64:
            with self.stream:
                return cp.dot(x, y, out=out)
        # Two columns, x read transposed: any stride of either is read in place.
        cygemm.gemm(x.reshape(-1, 1), y.reshape(-1, 1), out.reshape(1, 1), trans_a=True, math="fp32",
                    stream=self.stream)
        return out

    # ------------------------------------------------------------ row kernels

    def softmax(self, x, axis=-1, out=None):
        """Softmax along `axis`: max-subtracted, one kernel (in place when ``out is x``).

        As :meth:`cygemm.backend.Backend.softmax` (its parameters, result and errors).
        """
        return self._row("softmax", x, axis, out)

    def log_softmax(self, x, axis=-1, out=None):
        """Log-softmax along `axis`: ``x - max - log(sum(exp(x - max)))``, one kernel.

        As :meth:`cygemm.backend.Backend.log_softmax` (its parameters, result and errors).
        """
        return self._row("log_softmax", x, axis, out)

    def _row(self, kind, x, axis, out):
        self._check_float(x, "x")
        with self.stream:
            if out is None:
                out_ = cp.empty_like(x, order="C")
            else:
                if out.shape != x.shape or out.dtype != x.dtype:
                    raise ValueError(f"out: expected {x.dtype.name} {x.shape}, got {out.dtype.name} {out.shape}")
                out_ = out
            return self._apply_axis(lambda a, o: _kernels.row_op(kind, a, o if o is not None else out_,
                                                                 self.stream), x, axis, out_)

    def sigmoid(self, x, out=None):
        """1 / (1 + exp(-x)) without overflow for either sign; one kernel (in place when
        ``out is x``).

        As :meth:`cygemm.backend.Backend.sigmoid` (its parameters, result and errors).
        """
        self._check_float(x, "x")
        with self.stream:
            if out is None:
                out = cp.empty(x.shape, x.dtype)
            return _kernels.sigmoid(x, out, self.stream)

    def _check_float(self, x, name):
        if not isinstance(x, cp.ndarray) or x.dtype not in (np.float32, np.float64):
            raise TypeError(f"{name}: expected a float32 or float64 CuPy array, got "
                            f"{getattr(x, 'dtype', type(x).__name__)}")

    # ------------------------------------------------------------ solvers

    def _cholesky_solve(self, a, b):
        # cuSOLVER's potrf reports failure in a device status; errstate makes CuPy read it
        # (one synchronisation) and raise LinAlgError, which cholesky_solve turns into the
        # general solve.
        with self.stream, cupyx.errstate(linalg="raise"):
            lower = cp.linalg.cholesky(a)
            y = cupyx.scipy.linalg.solve_triangular(lower, b, lower=True)
            return cupyx.scipy.linalg.solve_triangular(lower, y, lower=True, trans="T")

    def solve(self, a, b):
        """Solve a x = b for a square a (cuSOLVER, on the backend's stream).

        As :meth:`cygemm.backend.Backend.solve` (its parameters, result and errors).
        """
        with self.stream:
            return cp.linalg.solve(a, b)

    def synchronize(self):
        """Wait for everything enqueued on the backend's stream."""
        self.stream.synchronize()
