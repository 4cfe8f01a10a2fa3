"""SGD, Adam and AdamW, each one kernel launch for all of a model's parameters (they live in
one flat buffer), with the learning rate and the step count on the device: a schedule moves
the rate inside a CUDA graph, and writing ``optimizer.lr`` changes it for later replays.
Under bf16-mixed precision they read the bfloat16 gradients and rewrite the model's bfloat16
parameter copy in the same launch."""
import cupy as cp
import numpy as np

from cygemm.nn import _kernels
from cygemm.nn._gpu import require_gpu
from cygemm.nn.layers import _stream_of
from cygemm.nn.serialization import check_keys, host_float32

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
        require_gpu()
        params, grads = getattr(model, "flat_parameters", None), getattr(model, "flat_gradients", None)
        if not isinstance(params, cp.ndarray) or not isinstance(grads, cp.ndarray):
            raise TypeError(f"model: expected a cygemm.nn model (flat_parameters and flat_gradients), "
                            f"got {type(model).__name__}")
        if schedule not in _SCHEDULES:
            raise ValueError(f"schedule: expected one of None, 'constant', 'linear', 'cosine', got {schedule!r}")
        self.model, self.params, self.grads = model, params, grads
        self.params_bf16 = getattr(model, "flat_parameters_bf16", None)    # rewritten by each step
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
        """The float32/int32 device arrays the optimizer updates (for saving or restoring a step;
        under bf16-mixed the model's bfloat16 copy follows from the parameters: refresh it)."""
        return [self.params, self.steps] + self._state

    def step(self):
        """Update every parameter from its gradient: one kernel launch, nothing allocated."""
        self._launch()

    # ---------------------------------------------------------------- saving and loading

    def _settings(self):
        """What the launches bake in (a captured step keeps them): a loaded state must agree."""
        kind, warmup, total, final = self._schedule
        return dict(self._hyper(), schedule=kind, warmup_steps=warmup, total_steps=total,
                    final_lr_factor=final)

    def _buffers(self):
        return dict(zip(self._state_names, self._state))

    def state_dict(self):
        """The optimizer's state as NumPy arrays (one wait for its stream).

        ``type`` (the class name), ``step`` (steps taken: the schedule's position), ``lr`` (the
        base rate), its buffers (``momentum_buffer`` of SGD with momentum; ``exp_avg`` and
        ``exp_avg_sq`` of Adam/AdamW: flat float32, in the model's parameter order) and its
        settings (``momentum``, ``betas``, ``schedule``, ...), which loading checks.
        """
        s = self.stream
        out = {"type": np.array(type(self).__name__), "step": self.steps.get(stream=s),
               "lr": self.lr.get(stream=s)}
        out.update({k: v.get(stream=s) for k, v in self._buffers().items()})
        out.update({k: np.array(v, np.float64) for k, v in self._settings().items()})
        return out

    def load_state_dict(self, state):
        """Copy `state` (as :meth:`state_dict` gives) into the optimizer's device arrays, in
        place (a compiled step continues from it). Every entry is checked first: the type and
        the settings must be this optimizer's (a captured step bakes them in)."""
        self._write_state(self._checked_state(state))

    def _checked_state(self, state):
        settings, buffers = self._settings(), self._buffers()
        check_keys(state, ["type", "step", "lr", *buffers, *settings], type(self).__name__)
        saved_type = str(np.asarray(state["type"]))
        if saved_type != type(self).__name__:
            raise ValueError(f"state: saved by {saved_type}, loading into {type(self).__name__}")
        for name, mine in settings.items():
            saved = np.asarray(state[name], np.float64)
            if saved.shape != np.shape(mine) or not np.array_equal(saved, np.asarray(mine, np.float64)):
                raise ValueError(f"{name}: the state was saved with {saved.tolist()}, this optimizer has "
                                 f"{mine} (its launches bake it in: make the optimizer with the saved value)")
        step = np.asarray(state["step"])
        if step.shape != () or step.dtype.kind not in "iu" or not 0 <= int(step) <= np.iinfo(np.int32).max:
            raise ValueError(f"step: expected a step count (a 0-d integer >= 0), got {step!r}")
        lr = host_float32(state["lr"], "lr", ())
        return dict({k: host_float32(state[k], k, v.shape) for k, v in buffers.items()},
                    step=np.asarray(step, np.int32), lr=lr)

    def _write_state(self, host):
        s = self.stream
        self.steps.set(host["step"], stream=s)
        self.lr.set(host["lr"], stream=s)
        for k, v in self._buffers().items():
            v.set(host[k], stream=s)


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
        self._state_names = ["momentum_buffer"] if self.momentum else []

    def _hyper(self):
        return dict(momentum=self.momentum, dampening=self.dampening, weight_decay=self.weight_decay,
                    nesterov=float(self.nesterov))

    def _launch(self):
        buf = self.momentum_buffer if self.momentum_buffer is not None else self.params   # unread
        _kernels.sgd(self.params, self.grads, buf, self.lr, self.steps, self._done, self.momentum, self.dampening,
                     self.weight_decay, self.nesterov, *self._schedule, self._blocks, self.stream,
                     params_bf16=self.params_bf16)


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
        self._state_names = ["exp_avg", "exp_avg_sq"]

    def _hyper(self):
        return dict(betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)

    def _launch(self):
        _kernels.adam(self.params, self.grads, self.exp_avg, self.exp_avg_sq, self.lr, self.steps, self._done,
                      self.betas[0], self.betas[1], self.eps, self.weight_decay, self._decoupled, *self._schedule,
                      self._blocks, self.stream, params_bf16=self.params_bf16)


class AdamW(Adam):
    """AdamW as ``torch.optim.AdamW``: decoupled weight decay (``p *= 1 - lr * weight_decay``).

    Parameters
    ----------
    model, lr, betas, eps
        As :class:`Adam`.
    weight_decay : float
        The decoupled decay (default 0.01, torch's): each step multiplies every parameter by
        ``1 - lr * weight_decay`` instead of adding the decay to the gradient.
    **kwargs
        Keyword-only: schedule, total_steps, warmup_steps, final_lr_factor, stream, as
        :class:`SGD`.
    """
    _decoupled = 1

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, **kwargs):
        super().__init__(model, lr, betas, eps, weight_decay, **kwargs)
