"""A whole training step (forward, loss, backward, update) captured once into a CUDA graph."""
import cupy as cp
import numpy as np

import cygemm.graph
from cygemm import tuning
from cygemm.nn import _kernels
from cygemm.nn._gpu import require_gpu
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
        Where the step runs. Default: a new blocking stream (CuPy's default stream waits for
        it, so ``float(step(x, y))`` reads the finished step's loss).
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
    at compile time. It is captured twice, with the layers' backward GEMMs in sequence and on
    two branches, and the graph whose replays are faster is kept (a forced backward route,
    :func:`cygemm.tuning.force_routes`, is captured alone). All of this works on a copy of the
    parameters and optimizer state, which are then restored: compiling changes nothing. Like
    ``force_routes``, it clears the calling thread's cached plans (not the tuning).

    Under ``precision="bf16-mixed"`` the step also converts its float32 inputs to bfloat16,
    the bfloat16 logits to float32 for the loss and the loss's gradient back (three small
    launches in the same graph); the optimizer rewrites the bfloat16 parameters. Still one
    graph, with no host synchronisation.
    """
    return TrainStep(model, loss, optimizer, batch, stream=stream, eager=eager)


class TrainStep:
    """A compiled training step; see :func:`compile_step`.

    Parameters
    ----------
    model, loss, optimizer, batch, stream, eager
        As :func:`compile_step`, which makes a TrainStep with them (``TrainStep(...)`` is the
        same call): it binds them and, unless ``eager``, runs the step once and captures it.

    Raises
    ------
    ValueError
        An optimizer made for another model.

    Attributes
    ----------
    x, target : cupy.ndarray
        The static inputs the step reads: (batch, in_features) float32 and labels (batch,)
        int32 or targets (batch, out_features) float32.
    loss : cupy.ndarray
        The 0-d device array the step writes its loss to.
    graph : cygemm.graph.Graph or None
        The captured step (None with ``eager=True``).
    backward_route : str or None
        The layers' backward route in the graph, "serial" or "branches" (the weight gradient on
        a forked stream): the faster of the two captured, unless one was forced.
    """

    def __init__(self, model, loss, optimizer, batch, *, stream=None, eager=False):
        require_gpu()
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
            # bf16-mixed: the loss reads float32 logits, converted from the model's bfloat16 output
            self._out32 = (cp.empty((self.batch, model.out_features), np.float32)
                           if model.compute_dtype != np.float32 else None)
        self.loss = loss.loss
        last = model.layers[-1] if hasattr(model, "layers") else model
        # (Under bf16-mixed the bias gradient is bfloat16, which the loss's kernel does not write.)
        self._fused_bias = (last.bias_grad if self.classification and last.has_bias and last.act == "none"
                            and model.out_features <= loss.MAX_FUSED_BIAS_CLASSES and self._out32 is None
                            else None)
        self._bias_done = {"last_bias_grad_done" if hasattr(model, "layers") else "bias_grad_done": True}
        self.graph = None
        self.eager = bool(eager)
        self.backward_route = None
        cp.cuda.Device().synchronize()           # parameters and state were written on other streams
        if not self.eager:
            self.graph, self.backward_route = self._capture()

    def _capture(self):
        """Capture the step. Unless a backward route is forced (cygemm.tuning.force_routes),
        capture it with each route and keep the graph whose replays are fastest: a route's
        eager timing pays for the events that fork and join its branches, which a graph turns
        into free edges. Every run here works on a copy of the state, restored at the end."""
        state = self.optimizer.state()
        with self.stream:
            saved = [a.copy() for a in state]
        forced = tuning.forced_routes()
        routes = [forced["backward"]] if "backward" in forced else ["serial", "branches"]
        graphs = []
        try:
            for route in routes:
                if len(routes) > 1:
                    tuning.force_routes(**dict(forced, backward=route))
                with self.stream:
                    self._run()              # the route's plans and workspaces, before capture
                self.stream.synchronize()
                with cygemm.graph.capture(self.stream) as g:
                    self._run()
                graphs.append((g, route))
        finally:
            if len(routes) > 1:
                tuning.force_routes(**forced)
        best = graphs[0] if len(graphs) == 1 else graphs[int(np.argmin([self._replay_ms(g) for g, _ in graphs]))]
        with self.stream:
            for a, s in zip(state, saved):
                a[...] = s
        self.model.refresh_bf16(self.stream)      # the bfloat16 copy of the restored parameters
        self.stream.synchronize()
        return best

    def _replay_ms(self, graph, warmup=3, reps=20):
        """GPU time of `reps` back-to-back replays of `graph`, in ms."""
        for _ in range(warmup):
            graph.launch(self.stream)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(self.stream)
        for _ in range(reps):
            graph.launch(self.stream)
        end.record(self.stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end)

    def _run(self):
        out = self.model.forward(self.x)
        if self._out32 is not None:
            out = _kernels.bf16_to_f32(out, self._out32, self.stream)
        if self._fused_bias is not None:        # the loss's kernel sums the last bias gradient too
            self.loss_fn(out, self.target, check=False, bias_grad=self._fused_bias)
            self.model.backward(self.loss_fn.grad, **self._bias_done)
        else:
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
