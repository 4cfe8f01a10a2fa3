"""Losses whose forward and backward are one kernel: the loss (a 0-d device array, read without
a synchronisation) and its gradient with respect to the prediction, written into ``grad``."""
import cupy as cp
import numpy as np

from cygemm.nn import _kernels
from cygemm.nn._gpu import require_gpu
from cygemm.nn.layers import _check_array, _stream_of

__all__ = ["SoftmaxCrossEntropy", "MeanSquaredError"]

class _Loss:
    """What both losses share: buffers made by ``bind``, the one-launch reduction."""

    def __init__(self):
        self.batch = self.features = None
        self.stream = None

    def bind(self, batch, features, stream=None):
        """Allocate the gradient (batch, features), the loss and the reduction's scratch on
        `stream`; the calls then allocate nothing.

        Parameters
        ----------
        batch : int
            Rows of the predictions each call takes.
        features : int
            Their columns: the classes C of :class:`SoftmaxCrossEntropy`, the outputs of
            :class:`MeanSquaredError`.
        stream : cupy.cuda.Stream, cupy.cuda.ExternalStream, int or None
            Where the buffers are allocated and the calls run; an int is a raw
            ``cudaStream_t``. None: CuPy's current stream.

        Returns
        -------
        SoftmaxCrossEntropy or MeanSquaredError
            The loss itself.

        Notes
        -----
        A call on predictions of another shape binds again (allocating), on the same stream.
        """
        require_gpu()
        self.batch, self.features, self.stream = int(batch), int(features), _stream_of(stream)
        self._blocks = self._grid()
        with self.stream:
            self.grad = cp.empty((self.batch, self.features), np.float32)
            self.loss = cp.zeros((), np.float32)
            self._partial = cp.zeros(self._blocks, np.float32)
            self._done = cp.zeros((), np.uint32)
            self._bad = cp.zeros((), np.int32)
        return self

    def _ready(self, pred):
        if not isinstance(pred, cp.ndarray) or pred.ndim != 2:
            raise TypeError(f"{self._pred_name}: expected a 2-D CuPy float32 array, got "
                            f"{getattr(pred, 'shape', type(pred).__name__)}")
        if self.batch is None or pred.shape != (self.batch, self.features):
            self.bind(pred.shape[0], pred.shape[1], self.stream)
        _check_array(pred, self._pred_name, (self.batch, self.features))
        if pred.strides[1] != 4:
            raise ValueError(f"{self._pred_name}: expected unit stride along its last axis, got strides "
                             f"{pred.strides}")


class SoftmaxCrossEntropy(_Loss):
    """Mean softmax cross-entropy of logits (B, C) against integer labels (B,).

    ``loss = mean(logsumexp(z_i) - z_i[y_i])``, ``grad = (softmax(z) - onehot(y)) / B``, in one
    kernel; the maximum is subtracted first, so logits of ±1e4 give finite, exact results.

    A call checks its labels: host (NumPy) labels on the host before anything launches, device
    labels through a flag the kernel sets, which the call reads (one synchronisation; pass
    ``check=False`` to leave it to :meth:`check`, as a captured step does).
    """
    _pred_name = "logits"
    # The largest C whose bias gradient the kernel sums too (its shared memory: 8 warps x C floats).
    MAX_FUSED_BIAS_CLASSES = 1024

    def _grid(self):
        return max(1, min(_kernels.MAX_BLOCKS, (self.batch + 7) // 8))     # 8 warps a block, a row a warp

    def __call__(self, logits, labels, check=True, bias_grad=None):
        """Loss (0-d device array) of `logits` against `labels`; the gradient goes to
        ``self.grad``, and with `bias_grad` (a (C,) float32 array, C at most
        ``MAX_FUSED_BIAS_CLASSES``) its column sums too: the gradient of the bias of the layer
        that made the logits, in the same kernel. Returns ``self.loss``."""
        self._ready(logits)
        if bias_grad is not None:
            if self.features > self.MAX_FUSED_BIAS_CLASSES:
                raise ValueError(f"bias_grad: fused for at most {self.MAX_FUSED_BIAS_CLASSES} classes, got "
                                 f"{self.features}")
            _check_array(bias_grad, "bias_grad", (self.features,))
            if bias_grad.strides[0] != 4:
                raise ValueError(f"bias_grad: expected a contiguous array, got strides {bias_grad.strides}")
            if getattr(self, "_col_partial", None) is None or self._col_partial.size != self._blocks * self.features:
                with self.stream:
                    self._col_partial = cp.empty(self._blocks * self.features, np.float32)
        if isinstance(labels, np.ndarray):
            _check_labels_host(labels, self.batch, self.features)
            with self.stream:
                labels = cp.asarray(labels.astype(np.int32, copy=False))
            check = False
        if not isinstance(labels, cp.ndarray) or labels.shape != (self.batch,):
            raise ValueError(f"labels: expected shape ({self.batch},), got "
                             f"{getattr(labels, 'shape', type(labels).__name__)}")
        if labels.dtype not in (np.int32, np.int64) or labels.strides[0] != labels.itemsize:
            raise TypeError(f"labels: expected a contiguous int32 or int64 array, got {labels.dtype.name} "
                            f"with strides {labels.strides}")
        _kernels.softmax_xent(logits, labels, self.grad, 1.0 / self.batch, 1.0 / self.batch, self._partial,
                              self._done, self.loss, self._bad, self._blocks, self.stream,
                              col_partial=self._col_partial if bias_grad is not None else None,
                              bias_grad=bias_grad)
        if check:
            self.check()
        return self.loss

    def check(self):
        """Raise ValueError if a label outside [0, C) was seen since the last check (reads a
        device flag: one synchronisation), and clear the flag."""
        if self._bad is None:
            return
        with self.stream:
            bad = int(self._bad.get(stream=self.stream))
            if bad:
                self._bad.fill(0)
        if bad:
            raise ValueError(f"labels: expected integers in [0, {self.features}), got some outside it "
                             "(their rows added nothing to the loss)")

    _bad = None


class MeanSquaredError(_Loss):
    """``loss = mean((y - t)^2)`` over every element, ``grad = 2 (y - t) / y.size``, in one kernel."""
    _pred_name = "y"

    def _grid(self):
        return _kernels.grid_for(self.batch * self.features)

    def __call__(self, y, target, check=True):
        """Loss (0-d device array) of `y` against `target` (same shape); the gradient goes to
        ``self.grad``. Returns ``self.loss``."""
        self._ready(y)
        if isinstance(target, np.ndarray):
            with self.stream:
                target = cp.asarray(target, dtype=np.float32)
        _check_array(target, "target", (self.batch, self.features))
        if target.strides[1] != 4:
            raise ValueError(f"target: expected unit stride along its last axis, got strides {target.strides}")
        n = self.batch * self.features
        _kernels.mse(y, target, self.grad, 2.0 / n, 1.0 / n, self._partial, self._done, self.loss, self._blocks,
                     self.stream)
        return self.loss

    def check(self):
        """Nothing to check (for the same interface as SoftmaxCrossEntropy)."""


def _check_labels_host(labels, batch, classes):
    if labels.shape != (batch,):
        raise ValueError(f"labels: expected shape ({batch},), got {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"labels: expected integers, got {labels.dtype.name}")
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        bad = labels[(labels < 0) | (labels >= classes)]
        raise ValueError(f"labels: expected integers in [0, {classes}), got {bad[:5].tolist()}")
