"""A whole training step (forward, loss, backward, update) captured once into a CUDA graph."""
import cupy as cp
import numpy as np

import cygemm.graph
from cygemm.nn.layers import _stream_of
from cygemm.nn.losses import SoftmaxCrossEntropy, _check_labels_host

__all__ = ["compile_step", "TrainStep"]


def compile_step(model, loss, optimizer, batch, *, stream=None, eager=False):
    """Bind `model`, `loss` and `optimizer` to `batch` rows and capture one training step.

    Parameters
    ----------
    model : cygemm.nn.MLP or cygemm.nn.Dense
    loss : cygemm.nn.SoftmaxCrossEntropy or cygemm.nn.MeanSquaredError
    optimizer : cygemm.nn.SGD, Adam or AdamW
        Made for `model`.
    batch : int
        Rows per step; every call takes exactly that many.
    stream : optional
        Where the step runs (default: a new non-blocking stream).
    eager : bool
        Run the same calls without a graph (for debugging; each call launches every kernel).

    Returns
    -------
    TrainStep
        ``step(x, target)`` copies a batch into the step's inputs, runs it and returns the loss
        (a 0-d device array: no synchronisation).

    Notes
    -----
    Capturing needs the step's plans and workspaces made first, so the step runs once eagerly
    at compile time on a copy of the parameters and optimizer state, which are then restored:
    compiling changes nothing.
    """
    return TrainStep(model, loss, optimizer, batch, stream=stream, eager=eager)


class TrainStep:
    """A compiled training step; see :func:`compile_step`.

    Attributes
    ----------
    x, target : cupy.ndarray
        The static inputs the step reads: (batch, in_features) float32 and labels (batch,)
        int32 or targets (batch, out_features) float32.
    loss : cupy.ndarray
        The 0-d device array the step writes its loss to.
    graph : cygemm.graph.Graph or None
        The captured step (None with ``eager=True``).
    """

    def __init__(self, model, loss, optimizer, batch, *, stream=None, eager=False):
        if optimizer.model is not model:
            raise ValueError("optimizer: was made for another model")
        self.model, self.loss_fn, self.optimizer = model, loss, optimizer
        self.stream = _stream_of(stream) if stream is not None else cp.cuda.Stream(non_blocking=False)
        self.batch = int(batch)
        self.classification = isinstance(loss, SoftmaxCrossEntropy)
        model.bind(batch, self.stream)
        loss.bind(batch, model.out_features, self.stream)
        optimizer.stream = self.stream
        with self.stream:
            self.x = cp.zeros((self.batch, model.in_features), np.float32)
            self.target = (cp.zeros(self.batch, np.int32) if self.classification
                           else cp.zeros((self.batch, model.out_features), np.float32))
        self.loss = loss.loss
        self.graph = None
        self.eager = bool(eager)
        cp.cuda.Device().synchronize()           # parameters and state were written on other streams
        if not self.eager:
            with self.stream:
                saved = [a.copy() for a in optimizer.state()]      # the warm-up must change nothing
                self._run()
                for a, s in zip(optimizer.state(), saved):
                    a[...] = s
            self.stream.synchronize()
            with cygemm.graph.capture(self.stream) as g:
                self._run()
            self.graph = g
            self.stream.synchronize()

    def _run(self):
        out = self.model.forward(self.x)
        self.loss_fn(out, self.target, check=False)
        self.model.backward(self.loss_fn.grad)
        self.optimizer.step()

    def _load(self, x, target):
        if isinstance(x, np.ndarray) or isinstance(x, cp.ndarray):
            if x.shape != self.x.shape:
                raise ValueError(f"x: expected shape {self.x.shape} (the step was compiled for batch "
                                 f"{self.batch}), got {x.shape}")
            if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(x.dtype, np.integer):
                raise TypeError(f"x: expected numbers, got {x.dtype.name}")
        else:
            raise TypeError(f"x: expected a NumPy or CuPy array, got {type(x).__name__}")
        if self.classification:
            if not isinstance(target, (np.ndarray, cp.ndarray)) or target.shape != (self.batch,):
                raise ValueError(f"target: expected labels of shape ({self.batch},), got "
                                 f"{getattr(target, 'shape', type(target).__name__)}")
            if isinstance(target, np.ndarray):
                _check_labels_host(target, self.batch, self.model.out_features)   # before any write
            elif not np.issubdtype(target.dtype, np.integer):
                raise TypeError(f"target: expected integer labels, got {target.dtype.name}")
        elif not isinstance(target, (np.ndarray, cp.ndarray)) or target.shape != self.target.shape:
            raise ValueError(f"target: expected shape {self.target.shape}, got "
                             f"{getattr(target, 'shape', type(target).__name__)}")
        with self.stream:
            for src, dst in ((x, self.x), (target, self.target)):
                if isinstance(src, np.ndarray):
                    dst.set(np.ascontiguousarray(src, dtype=dst.dtype), stream=self.stream)
                else:
                    dst[...] = src

    def __call__(self, x, target):
        """Copy (x, target) into the step's inputs and run one step; returns the loss (0-d
        device array, overwritten by the next step)."""
        self._load(x, target)
        self.replay()
        return self.loss

    def replay(self):
        """Run one step on what ``x`` and ``target`` hold now."""
        if self.graph is not None:
            self.graph.launch(self.stream)
        else:
            self._run()

    def check(self):
        """Raise ValueError if a device label outside [0, C) reached a step since the last check
        (one synchronisation)."""
        self.loss_fn.check()
