"""A chain of dense layers sharing one flat buffer of parameters (cygemm/nn/layers.py's Dense)."""
from typing import Literal, Optional, Sequence

import cupy as cp
import numpy as np

from cygemm.nn import _fp8, serialization
from cygemm.nn._gpu import require_gpu
from cygemm.typing import Activation
from cygemm.nn._storage import FlatStorage, Precision, parse_precision
from cygemm.nn.layers import Dense, _activation, _float32, _math, _predict_chain, _stream_of

__all__ = ["MLP"]


def _sizes(sizes):
    """The layer sizes as a list of positive ints, at least two (one layer)."""
    if isinstance(sizes, (str, bytes)):
        raise TypeError(f"sizes: expected a sequence of positive ints, got {type(sizes).__name__}")
    try:
        sizes = list(sizes)
    except TypeError:
        raise TypeError(f"sizes: expected a sequence of positive ints, got {type(sizes).__name__}") from None
    if len(sizes) < 2:
        raise ValueError(f"sizes: expected at least two sizes (one layer), got {sizes}")
    for i, v in enumerate(sizes):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"sizes[{i}]: expected a positive int, got {v!r}")
    return [int(v) for v in sizes]


class MLP:
    """A chain of :class:`Dense` layers whose parameters share one flat buffer.

    Parameters
    ----------
    sizes : sequence of int
        ``[d0, d1, ..., dn]``: n layers, di -> d(i+1).
    act : str
        The activation of every layer but the last.
    out_act : str or None
        The last layer's activation (None: none, as logits for a loss).
    bias, dtype, math, precision : as :class:`Dense`
        (under an FP8 precision, a layer whose sizes are not multiples of 16 runs in
        bf16-mixed, as its ``repr`` says)
    seed : int or None
        One generator initialises the layers in order.

    Examples
    --------
    >>> model = cygemm.nn.MLP([64, 128, 10], act="relu", seed=0)   # doctest: +SKIP
    >>> model.bind(32)                                            # doctest: +SKIP
    >>> logits = model.forward(x)                                 # doctest: +SKIP
    """

    def __init__(self, sizes: Sequence[int], act: Optional[Activation] = "relu", out_act: Optional[Activation] = None,
                 bias: bool = True, dtype: object = "float32", math: Literal["tf32", "fp32"] = "tf32",
                 seed: Optional[int] = None, precision: Precision = "fp32") -> None:
        sizes = _sizes(sizes)
        _activation(act)
        _activation(out_act, "out_act")
        _float32(dtype)
        _math(math)
        parse_precision(precision)
        require_gpu()           # (after the arguments: their checks need no GPU)
        rng = np.random.default_rng(seed)
        self.precision = parse_precision(precision)
        def layer_precision(i, o):     # FP8 where the sizes allow it, else bf16-mixed (same storage)
            return "bf16-mixed" if self.precision in _fp8.RECIPES and not _fp8.fits(i, o) else self.precision
        self.layers = [Dense(i, o, act=act if k < len(sizes) - 2 else out_act, bias=bias, dtype=dtype,
                             math=math, seed=rng, precision=layer_precision(i, o))
                       for k, (i, o) in enumerate(zip(sizes[:-1], sizes[1:]))]
        self.layers[0].needs_input_grad = False
        self.sizes = sizes
        storage = FlatStorage(sum(layer.n_params for layer in self.layers), self.precision)
        offset = 0
        for layer in self.layers:
            layer._home(storage, offset)
            offset += layer.n_params
        self.storage = storage
        storage.refresh(cp.cuda.get_current_stream())
        self.batch = None
        self.stream = None

    @property
    def in_features(self):
        """Inputs of the first layer."""
        return self.sizes[0]

    @property
    def out_features(self):
        """Outputs of the last layer."""
        return self.sizes[-1]

    @property
    def flat_parameters(self):
        """Every parameter, as one flat float32 array (layer by layer: weight, then bias)."""
        return self.storage.params

    @property
    def flat_gradients(self):
        """Every gradient, as one flat float32 array at the offsets of :attr:`flat_parameters`."""
        return self.storage.grads

    @property
    def flat_parameters_bf16(self):
        """Under bf16-mixed, the bfloat16 copy of ``flat_parameters`` the GEMMs read; None under fp32."""
        return self.storage.params_bf16

    @property
    def compute_dtype(self):
        """The dtype the GEMMs compute in: float32, or bfloat16 under bf16-mixed."""
        return self.layers[0].compute_dtype

    def refresh_bf16(self, stream=None):
        """As :meth:`Dense.refresh_bf16`, for every layer (one launch)."""
        self.storage.refresh(_stream_of(stream if stream is not None else self.stream))

    def _named_parameters(self, prefix=""):
        for k, layer in enumerate(self.layers):
            yield from layer._named_parameters(f"{prefix}layers.{k}.")

    def state_dict(self):
        """The parameters as NumPy float32 copies: ``layers.{k}.weight`` (out, in) and
        ``layers.{k}.bias`` (float32 masters under bf16-mixed). Waits for the model's stream."""
        return serialization.model_state(self)

    def load_state_dict(self, state):
        """As :meth:`Dense.load_state_dict`: into the existing buffers, after checking every
        key and shape."""
        serialization.load_model_state(self, state)

    def torch_state_dict(self):
        """The parameters as CPU torch tensors named for :meth:`to_torch`'s ``nn.Sequential``
        (``"0.weight"``, ``"0.bias"``, ``"2.weight"``, ...: the activations sit between)."""
        return serialization.torch_state(self.state_dict(), [(f"layers.{k}.", layer.act)
                                                             for k, layer in enumerate(self.layers)])

    def to_torch(self):
        """A CPU ``torch.nn.Sequential`` of ``Linear`` and activation modules computing what
        this model does (gelu as ``GELU(approximate="tanh")``), holding its parameters."""
        return serialization.to_torch(self.torch_state_dict(), self.sizes,
                                      [layer.act for layer in self.layers], self.layers[0].has_bias)

    def bind(self, batch, stream=None):
        """Bind every layer to `batch` rows on `stream` (see :meth:`Dense.bind`).

        Parameters
        ----------
        batch, stream
            As :meth:`Dense.bind`.

        Returns
        -------
        MLP
            The model itself.

        Raises
        ------
        ValueError
            As :meth:`Dense.bind`.
        """
        for layer in self.layers:
            layer.bind(batch, stream)
        self.batch, self.stream = self.layers[0].batch, self.layers[0].stream
        return self

    def forward(self, x):
        """The output of the last layer (its ``y`` buffer)."""
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def predict(self, x, stream=None):
        """The model's output for any number of rows, in a new float32 array (for evaluation).

        Parameters
        ----------
        x : cupy.ndarray (rows, in_features)
            float32 (or, under bf16-mixed and FP8, bfloat16); any number of rows.
        stream : optional
            As :meth:`Dense.predict`.

        Returns
        -------
        cupy.ndarray (rows, out_features)
            A new float32 array.

        Raises
        ------
        ValueError, TypeError
            As :meth:`Dense.predict`.
        """
        self.layers[0]._check_rows(x)
        return _predict_chain(self.layers, x, _stream_of(stream if stream is not None else self.stream))

    def backward(self, gy, last_bias_grad_done=False):
        """Back-propagate dL/d(output) through every layer, writing every gradient (but the last
        layer's bias gradient with `last_bias_grad_done`: a loss already wrote it).

        Parameters
        ----------
        gy : cupy.ndarray (batch, out_features)
            dL/d(output) for the last :meth:`forward`, as :meth:`Dense.backward` takes it.
        last_bias_grad_done : bool
            True where the last layer's ``bias_grad`` already holds this step's bias gradient
            (as :class:`SoftmaxCrossEntropy` writes it with ``bias_grad=``). Default False.

        Returns
        -------
        cupy.ndarray (batch, in_features) or None
            The first layer's :meth:`Dense.backward` result: None, since an MLP's first layer
            has ``needs_input_grad`` False (set it True before :meth:`bind` to get dL/dx).

        Raises
        ------
        RuntimeError, TypeError, ValueError
            As :meth:`Dense.backward`.
        """
        for k, layer in enumerate(reversed(self.layers)):
            gy = layer.backward(gy, bias_grad_done=last_bias_grad_done and k == 0)
        return gy

    def load_torch(self, linears):
        """Copy the weights of a sequence of ``torch.nn.Linear`` (or an ``nn.Sequential``, whose
        Linear modules are taken in order) into the layers."""
        linears = [m for m in linears if type(m).__name__ == "Linear"]
        if len(linears) != len(self.layers):
            raise ValueError(f"linears: expected {len(self.layers)} Linear modules, got {len(linears)}")
        for layer, lin in zip(self.layers, linears):
            layer.load_torch(lin)

    def __repr__(self):
        return "MLP(" + ", ".join(repr(layer) for layer in self.layers) + ")"
