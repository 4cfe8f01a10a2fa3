"""SGD, Adam and AdamW, each one kernel launch for all of a model's parameters (they live in
one flat buffer), with the learning rate and the step count on the device: a schedule moves
the rate inside a CUDA graph, and writing ``optimizer.lr`` changes it for later replays."""
import cupy as cp
import numpy as np

from cygemm.nn import _kernels
from cygemm.nn.layers import _stream_of

__all__ = ["SGD", "Adam", "AdamW"]

_SCHEDULES = {None: 0, "constant": 0, "linear": 1, "cosine": 2}


def _number(value, name, low=0.0, high=None, low_open=False):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a number, got {value!r}") from None
    if not np.isfinite(v) or v < low or (low_open and v == low) or (high is not None and v >= high):
        bound = f"in [{low}, {high})" if high is not None else (f"> {low}" if low_open else f">= {low}")
        raise ValueError(f"{name}: expected a finite number {bound}, got {value!r}")
    return v


class _Optimizer:
    def __init__(self, model, lr, schedule, total_steps, warmup_steps, final_lr_factor, stream):
        params, grads = getattr(model, "flat_parameters", None), getattr(model, "flat_gradients", None)
        if not isinstance(params, cp.ndarray) or not isinstance(grads, cp.ndarray):
            raise TypeError(f"model: expected a cygemm.nn model (flat_parameters and flat_gradients), "
                            f"got {type(model).__name__}")
        if schedule not in _SCHEDULES:
            raise ValueError(f"schedule: expected one of None, 'constant', 'linear', 'cosine', got {schedule!r}")
        self.model, self.params, self.grads = model, params, grads
        self.stream = _stream_of(stream if stream is not None else getattr(model, "stream", None))
        self._schedule = (_SCHEDULES[schedule], int(warmup_steps), int(total_steps or 0),
                          _number(final_lr_factor, "final_lr_factor"))
        if schedule in ("linear", "cosine") and not total_steps:
            raise ValueError(f"total_steps: schedule={schedule!r} needs total_steps, got {total_steps!r}")
        with self.stream:
            self.lr = cp.full((), _number(lr, "lr"), np.float32)    # device: schedules read it in a graph
            self.steps = cp.zeros((), np.int32)
            self._done = cp.zeros((), np.uint32)
        self._blocks = _kernels.grid_for(params.size)

    def set_lr(self, value):
        """Set the base learning rate (an asynchronous write on the optimizer's stream)."""
        with self.stream:
            self.lr.fill(_number(value, "value"))

    def state(self):
        """The device arrays the optimizer updates (for saving or restoring a step)."""
        return [self.params, self.steps] + self._state

    def step(self):
        """Update every parameter from its gradient: one kernel launch, nothing allocated."""
        self._launch()


class SGD(_Optimizer):
    """Stochastic gradient descent as ``torch.optim.SGD``: momentum, dampening, Nesterov,
    weight decay (added to the gradient).

    Parameters
    ----------
    model : cygemm.nn.Dense or cygemm.nn.MLP
        Whose ``flat_parameters`` are updated from ``flat_gradients``.
    lr, momentum, dampening, nesterov, weight_decay
        As torch's.
    schedule : {None, "constant", "linear", "cosine"}
        The rate at step t: a linear warm-up over ``warmup_steps``, then constant, or decaying
        linearly or along a half cosine to ``final_lr_factor * lr`` at ``total_steps``.
    stream : optional
        Where the update runs (default: the model's).
    """

    def __init__(self, model, lr=0.01, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0, *,
                 schedule=None, total_steps=None, warmup_steps=0, final_lr_factor=0.0, stream=None):
        super().__init__(model, lr, schedule, total_steps, warmup_steps, final_lr_factor, stream)
        self.momentum = _number(momentum, "momentum")
        self.dampening = _number(dampening, "dampening")
        self.weight_decay = _number(weight_decay, "weight_decay")
        self.nesterov = bool(nesterov)
        if self.nesterov and (self.momentum == 0 or self.dampening != 0):
            raise ValueError("nesterov: needs momentum > 0 and dampening 0")
        with self.stream:
            self.momentum_buffer = cp.zeros_like(self.params) if self.momentum else None
        self._state = [self.momentum_buffer] if self.momentum else []

    def _launch(self):
        buf = self.momentum_buffer if self.momentum_buffer is not None else self.params   # unread
        _kernels.sgd(self.params, self.grads, buf, self.lr, self.steps, self._done, self.momentum, self.dampening,
                     self.weight_decay, self.nesterov, *self._schedule, self._blocks, self.stream)


class Adam(_Optimizer):
    """Adam as ``torch.optim.Adam`` (weight decay added to the gradient).

    Parameters
    ----------
    model, schedule, total_steps, warmup_steps, final_lr_factor, stream
        As :class:`SGD`.
    lr, betas, eps, weight_decay
        As torch's.
    """
    _decoupled = 0

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, schedule=None,
                 total_steps=None, warmup_steps=0, final_lr_factor=0.0, stream=None):
        super().__init__(model, lr, schedule, total_steps, warmup_steps, final_lr_factor, stream)
        if len(tuple(betas)) != 2:
            raise ValueError(f"betas: expected two numbers, got {betas!r}")
        self.betas = (_number(betas[0], "betas[0]", 0.0, 1.0), _number(betas[1], "betas[1]", 0.0, 1.0))
        self.eps = _number(eps, "eps")
        self.weight_decay = _number(weight_decay, "weight_decay")
        with self.stream:
            self.exp_avg = cp.zeros_like(self.params)
            self.exp_avg_sq = cp.zeros_like(self.params)
        self._state = [self.exp_avg, self.exp_avg_sq]

    def _launch(self):
        _kernels.adam(self.params, self.grads, self.exp_avg, self.exp_avg_sq, self.lr, self.steps, self._done,
                      self.betas[0], self.betas[1], self.eps, self.weight_decay, self._decoupled, *self._schedule,
                      self._blocks, self.stream)


class AdamW(Adam):
    """AdamW as ``torch.optim.AdamW``: decoupled weight decay (``p *= 1 - lr * weight_decay``)."""
    _decoupled = 1

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, **kwargs):
        super().__init__(model, lr, betas, eps, weight_decay, **kwargs)
