"""Dense layers on cygemm's fused forward and backward (chains of them: cygemm/nn/mlp.py).

A layer's parameters and their gradients are views into flat buffers (one for parameters, one
for gradients, at the same offsets): an optimizer updates a whole model in one launch. After
``bind(batch)`` every buffer a step needs exists, and ``forward``/``backward`` allocate
nothing, so a step can be captured into a CUDA graph. ``precision="bf16-mixed"`` trains with
bfloat16 GEMMs on float32 master parameters (see cygemm/nn/_storage.py).
"""
from typing import Literal, Optional, Union

import cupy as cp
import numpy as np

from cygemm.elementwise import act_backward, bias_act
from cygemm.dense import activation_table, parse_activation
from cygemm.gemm_ops import backward_into, forward, forward_into
from cygemm.nn import _fp8, _kernels, serialization
from cygemm.nn._gpu import require_gpu
from cygemm.typing import Activation
from cygemm.nn._storage import FlatStorage, Precision, compute_dtype, parse_precision

__all__ = ["Dense"]

_FROM_OUTPUT = {row["name"] for row in activation_table() if row["grad_from_output"]}
_CANONICAL = {row["code"]: row["name"] for row in activation_table()}


def _activation(act, name="act"):
    if act is None:
        return "none"
    try:
        return _CANONICAL[parse_activation(act)]
    except ValueError as exc:
        raise ValueError(f"{name}: {str(exc).split(': ', 1)[1]}") from None


def _float32(dtype):
    if np.dtype(dtype) != np.float32:
        raise TypeError(f"dtype: cygemm.nn trains in float32, got {np.dtype(dtype).name}")
    return np.float32


def _math(math_):
    if math_ not in ("tf32", "fp32"):
        raise ValueError(f"math: expected 'tf32' or 'fp32', got {math_!r}")
    return math_


def _stream_of(stream):
    if stream is None:
        return cp.cuda.get_current_stream()
    if isinstance(stream, cp.cuda.Stream) or isinstance(stream, cp.cuda.ExternalStream):
        return stream
    return cp.cuda.ExternalStream(int(stream))


def _check_array(x, name, shape, dtype=np.float32):
    """x: a CuPy array of `shape` and `dtype` (or of any dtype in the tuple `dtype`)."""
    if not isinstance(x, cp.ndarray):
        raise TypeError(f"{name}: expected a CuPy array of shape {shape}, got {type(x).__name__} "
                        "(move host data with cp.asarray, or pass it to the compiled step)")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    allowed = tuple(dict.fromkeys(np.dtype(d) for d in (dtype if isinstance(dtype, tuple) else (dtype,))))
    if x.dtype not in allowed:
        raise TypeError(f"{name}: expected {' or '.join(np.dtype(d).name for d in allowed)}, got {x.dtype.name}")


def _to_compute(x, buffer, stream):
    """x itself if it is in the compute dtype already, else x (float32, contiguous) converted
    into `buffer` (bf16-mixed), on `stream`."""
    if buffer is None or x.dtype == buffer.dtype:
        return x
    return _kernels.f32_to_bf16(x, buffer, stream)


class Dense:
    """A dense layer: ``y = act(x @ weight.T + bias)``, trained through cygemm's fused kernels.

    Parameters
    ----------
    in_features, out_features : int
        Sizes of the input and output rows.
    act : str or None
        The activation after the bias: "relu" (default), "none" (or None), "leaky_relu",
        "gelu", "gelu_erf", "sigmoid", "tanh", "silu".
    bias : bool
        Whether the layer has a bias.
    dtype : str
        "float32": the parameters' dtype (the master parameters' under bf16-mixed).
    math : {"tf32", "fp32"}
        The GEMMs' math mode under fp32 precision (bf16-mixed GEMMs accumulate in fp32).
    seed : int, numpy.random.Generator or None
        Seeds the initialisation: torch's default for ``nn.Linear``, weight and bias uniform in
        ±1/sqrt(in_features).
    precision : {"fp32", "bf16-mixed", "fp8-tensor", "fp8-rowwise", "fp8-block"}
        "bf16-mixed" (as torch's bfloat16 autocast, with no loss scaling: bfloat16 has
        float32's range): the GEMMs read a bfloat16 copy of the float32 parameters and write
        bfloat16 activations and gradients; the optimizer updates the float32 parameters and
        rewrites the copy in the same launch. ``forward`` and ``backward`` take float32 or
        bfloat16 (a float32 argument, contiguous, is converted first). The "fp8" precisions: stored and
        computed as bf16-mixed, but the three GEMMs of a step run in FP8 with current scaling
        (each quantizes what it reads with this step's amax): one scale per tensor (gradients in
        E5M2), per row, or DeepSeek-V3's blocks (activations and gradients 1 x 128, weights
        128 x 128); bias and activation in cygemm's elementwise kernels. in_features,
        out_features and the batch must be multiples of 16 (FP8 GEMMs read 16-byte rows);
        :class:`MLP` runs a layer whose sizes are not in bf16-mixed instead.

    Attributes
    ----------
    y : cupy.ndarray (batch, out_features)
        The output of the last ``forward`` (after ``bind``; bfloat16 under bf16-mixed).

    Examples
    --------
    >>> layer = cygemm.nn.Dense(64, 32, act="relu", seed=0)   # doctest: +SKIP
    >>> layer.bind(128)                                      # doctest: +SKIP
    >>> y = layer.forward(x)                                 # doctest: +SKIP
    >>> gx = layer.backward(gy)                              # doctest: +SKIP
    """

    def __init__(self, in_features: int, out_features: int, act: Optional[Activation] = "relu", bias: bool = True,
                 dtype: object = "float32", math: Literal["tf32", "fp32"] = "tf32",
                 seed: Union[None, int, np.random.Generator] = None, precision: Precision = "fp32") -> None:
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.act = _activation(act)
        self.has_bias = bool(bias)
        self.dtype = _float32(dtype)
        self.math = _math(math)
        self.precision = parse_precision(precision)
        if self.precision in _fp8.RECIPES and not _fp8.fits(self.in_features, self.out_features):
            raise ValueError(f"precision: {self.precision!r} needs in_features and out_features that are "
                             f"multiples of {_fp8.ALIGN} (FP8 GEMMs read 16-byte rows), got "
                             f"{self.in_features} and {self.out_features}")
        require_gpu()           # (after the arguments: their checks need no GPU)
        self.compute_dtype = compute_dtype(self.precision)
        self.needs_input_grad = True
        self.batch = None
        self.stream = None
        self.n_params = self.out_features * self.in_features + (self.out_features if self.has_bias else 0)
        self._home(FlatStorage(self.n_params, self.precision), 0)
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        bound = 1.0 / np.sqrt(self.in_features)
        self.weight[...] = cp.asarray(rng.uniform(-bound, bound, (self.out_features, self.in_features))
                                      .astype(np.float32))
        if self.has_bias:
            self.bias[...] = cp.asarray(rng.uniform(-bound, bound, self.out_features).astype(np.float32))
        self.storage.refresh(cp.cuda.get_current_stream())

    # ---------------------------------------------------------------- parameters

    def _home(self, storage, offset):
        """Place the parameters at `offset` of `storage` (keeping their values if any)."""
        old = (self._weight, self._bias) if hasattr(self, "_weight") else None
        nw = self.out_features * self.in_features
        shape = (self.out_features, self.in_features)
        self.storage, self.offset = storage, offset
        compute = storage.compute_params
        self._weight = storage.params[offset:offset + nw].reshape(shape)
        self._weight_c = compute[offset:offset + nw].reshape(shape)        # what the GEMMs read
        self._weight_grad = storage.grads[offset:offset + nw].reshape(shape)
        if self.has_bias:
            self._bias = storage.params[offset + nw:offset + nw + self.out_features]
            self._bias_c = compute[offset + nw:offset + nw + self.out_features]
            self._bias_grad = storage.grads[offset + nw:offset + nw + self.out_features]
        else:
            self._bias = self._bias_c = self._bias_grad = None
        if old is not None:
            self._weight[...] = old[0]
            if self.has_bias:
                self._bias[...] = old[1]

    @property
    def weight(self):
        """The weight (out_features, in_features) float32, stored as ``torch.nn.Linear.weight`` is,
        a view of the flat parameters; assigning copies the values in (any array
        ``cupy.asarray`` takes, of that shape)."""
        return self._weight

    @weight.setter
    def weight(self, value):
        self._weight[...] = self._as_param(value, "weight", self._weight.shape)
        self.storage.refresh(cp.cuda.get_current_stream())      # the stream the copy ran on

    @property
    def bias(self):
        """The bias (out_features,) float32 (None without a bias), a view of the flat parameters;
        assigning copies the values in."""
        return self._bias

    @bias.setter
    def bias(self, value):
        if not self.has_bias:
            raise ValueError("bias: this layer was made with bias=False")
        self._bias[...] = self._as_param(value, "bias", self._bias.shape)
        self.storage.refresh(cp.cuda.get_current_stream())      # the stream the copy ran on

    @property
    def weight_grad(self):
        """The weight's gradient (out_features, in_features), written by the last :meth:`backward`."""
        return self._weight_grad

    @property
    def bias_grad(self):
        """The bias's gradient (out_features,), written by the last :meth:`backward` (None without
        a bias)."""
        return self._bias_grad

    @staticmethod
    def _as_param(value, name, shape):
        arr = cp.asarray(value, dtype=np.float32)
        if arr.shape != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {arr.shape}")
        return arr

    @property
    def flat_parameters(self):
        """The parameters as one flat array (a view of the storage), for an optimizer."""
        return self.storage.params[self.offset:self.offset + self.n_params]

    @property
    def flat_gradients(self):
        """The gradients as one flat array, at the offsets of :attr:`flat_parameters`."""
        return self.storage.grads[self.offset:self.offset + self.n_params]

    @property
    def flat_parameters_bf16(self):
        """Under bf16-mixed, the bfloat16 copy of ``flat_parameters`` the GEMMs read (the
        optimizer rewrites it); None under fp32."""
        bf16 = self.storage.params_bf16
        return None if bf16 is None else bf16[self.offset:self.offset + self.n_params]

    def refresh_bf16(self, stream=None):
        """Under bf16-mixed, rewrite the bfloat16 copy the GEMMs read from the float32
        parameters (one launch; needed only after writing ``weight`` or ``bias`` in place:
        assignment, loading and the optimizers do it). Nothing under fp32."""
        self.storage.refresh(_stream_of(stream if stream is not None else self.stream))

    def _named_parameters(self, prefix=""):
        yield prefix + "weight", self._weight
        if self.has_bias:
            yield prefix + "bias", self._bias

    def state_dict(self):
        """The parameters as NumPy float32 copies, ``{"weight": (out, in), "bias": (out,)}``
        (torch's ``nn.Linear`` names and layout; float32 masters under bf16-mixed). Waits for
        the layer's stream."""
        return serialization.model_state(self)

    def load_state_dict(self, state):
        """Copy `state` (as :meth:`state_dict` gives; NumPy, CuPy or torch arrays) into the
        parameters, in place: no new device buffer, so a compiled step keeps reading them.
        Every key and shape is checked before anything is written."""
        serialization.load_model_state(self, state)

    def torch_state_dict(self):
        """The parameters as CPU torch tensors for ``torch.nn.Linear.load_state_dict``."""
        return serialization.torch_state(self.state_dict(), [("", self.act)], sequential=False)

    def load_torch(self, linear):
        """Copy a ``torch.nn.Linear``'s weight and bias (same shapes) into this layer."""
        if self.has_bias and linear.bias is None:
            raise ValueError("linear: has no bias, this layer has one")
        # The tensors stay referenced until the copies from them have finished.
        w = linear.weight.detach().contiguous().float()
        b = linear.bias.detach().contiguous().float() if self.has_bias else None
        import torch
        torch.cuda.synchronize()
        self.weight = cp.from_dlpack(w)
        if self.has_bias:
            self.bias = cp.from_dlpack(b)
        cp.cuda.Device().synchronize()

    # ---------------------------------------------------------------- buffers

    def bind(self, batch, stream=None):
        """Allocate every buffer of a step for `batch` rows, on `stream` (which forward and
        backward then use). Rebinding to another batch size or stream allocates anew.

        Parameters
        ----------
        batch : int
            Rows of every ``forward`` and ``backward`` after this (a multiple of 16 under an
            FP8 precision).
        stream : cupy.cuda.Stream, cupy.cuda.ExternalStream, int or None
            Where the buffers are allocated and forward, backward (and by default
            :meth:`predict`) run; an int is a raw ``cudaStream_t``. None: CuPy's current
            stream.

        Returns
        -------
        Dense
            The layer itself.

        Raises
        ------
        ValueError
            A batch that is not a positive int, or not a multiple of 16 under an FP8 precision.
        """
        if not isinstance(batch, (int, np.integer)) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"batch: expected a positive int, got {batch!r}")
        self.batch, self.stream = int(batch), _stream_of(stream)
        M, N, K, dt = self.batch, self.out_features, self.in_features, self.compute_dtype
        self._save_z = self.act not in _FROM_OUTPUT and self.act != "none"
        with self.stream:
            self.y = cp.empty((M, N), dt)
            self.z = cp.empty((M, N), dt) if self._save_z else None
            self.dz = cp.empty((M, N), dt) if self.act != "none" else None
            self.gx = cp.empty((M, K), dt) if self.needs_input_grad else None
            mixed = self.precision != "fp32"        # where float32 x and gy are converted
            self._x_c = cp.empty((M, K), dt) if mixed else None
            self._gy_c = cp.empty((M, N), dt) if mixed else None
            self._fp8 = _fp8.FP8Gemms(self.precision, M, K, N) if self.precision in _fp8.RECIPES else None
        self._x = None
        return self

    def _require_bound(self, what):
        if self.batch is None:
            raise RuntimeError(f"{what}: call bind(batch) first (it allocates the layer's buffers)")

    def forward(self, x):
        """``y = act(x @ weight.T + bias)`` into ``self.y``; x is (batch, in_features) float32.
        Keeps a reference to x for backward. Returns ``self.y``."""
        self._require_bound("forward")
        _check_array(x, "x", (self.batch, self.in_features), self._accepted())
        x = _to_compute(x, self._x_c, self.stream)
        if self._fp8 is not None:
            # z = x @ W.T in FP8, then act(z + bias) (z + bias kept where the backward needs it)
            lin = self.z if self._save_z else self.y
            self._fp8.forward(x, self._weight_c, lin, self.stream.ptr)
            if self.has_bias or self.act != "none":
                bias_act(lin, self._bias_c if self.has_bias else None, out=self.y, act=self.act,
                         z_out=self.z if self._save_z else None, stream=self.stream.ptr)
        else:
            forward_into(x, self._weight_c.T, self.y, self._bias_c, with_bias=self.has_bias, act=self.act,
                         save_z=self._save_z, z_out=self.z, math=self.math, stream=self.stream.ptr)
        self._x = x
        return self.y

    def _accepted(self):
        return (np.dtype(np.float32), self.compute_dtype)

    def predict(self, x, stream=None):
        """The layer's output for any number of rows, in a new float32 array (for evaluation:
        it allocates, and keeps nothing for backward).

        Parameters
        ----------
        x : cupy.ndarray (rows, in_features)
            float32 (or, under bf16-mixed and FP8, bfloat16); any number of rows.
        stream : optional
            Where it runs, as :meth:`bind` takes it. None: the stream of the last :meth:`bind`
            (CuPy's current stream before any).

        Returns
        -------
        cupy.ndarray (rows, out_features)
            A new float32 array.

        Raises
        ------
        ValueError
            x not a 2-D CuPy array of in_features columns.
        TypeError
            x of another dtype.
        """
        self._check_rows(x)
        s = _stream_of(stream if stream is not None else self.stream)
        return _predict_chain([self], x, s)

    def _check_rows(self, x):
        if not isinstance(x, cp.ndarray) or x.ndim != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"x: expected a CuPy array (rows, {self.in_features}), got "
                             f"{getattr(x, 'shape', type(x).__name__)}")

    def _predict_compute(self, x, s):
        """The output for x in the compute dtype (x in it too), in a new array."""
        if self.precision in _fp8.RECIPES:
            y = _fp8.predict(self.precision, x, self._weight_c, s)
            if self.has_bias or self.act != "none":
                with s:
                    y = cp.ascontiguousarray(y)
                bias_act(y, self._bias_c if self.has_bias else None, out=y, act=self.act, stream=s.ptr)
            return y
        return forward(x, self._weight_c.T, self._bias_c, with_bias=self.has_bias, act=self.act, math=self.math,
                       stream=s.ptr)[0]

    def backward(self, gy, bias_grad_done=False):
        """Gradients for ``gy`` = dL/dy: writes ``weight_grad``, ``bias_grad`` (unless
        `bias_grad_done`: a loss already wrote it) and (unless ``needs_input_grad`` is False)
        dL/dx, which it returns (else None).

        Parameters
        ----------
        gy : cupy.ndarray (batch, out_features)
            dL/dy for the last :meth:`forward`'s output: float32, or under bf16-mixed and FP8
            bfloat16 (a float32 gy, contiguous, is converted first).
        bias_grad_done : bool
            True where ``bias_grad`` already holds this step's bias gradient (as
            :class:`SoftmaxCrossEntropy` writes it with ``bias_grad=``): it is not computed
            again. Default False.

        Returns
        -------
        cupy.ndarray (batch, in_features) or None
            dL/dx, the layer's ``gx`` buffer (the compute dtype; overwritten by the next
            backward); None where ``needs_input_grad`` was False at :meth:`bind`.

        Raises
        ------
        RuntimeError
            Before :meth:`bind`, or before a :meth:`forward`.
        TypeError, ValueError
            gy not a CuPy array, or of another dtype (TypeError) or shape (ValueError).
        """
        self._require_bound("backward")
        if self._x is None:
            raise RuntimeError("backward: call forward first (backward reads its input and output)")
        _check_array(gy, "gy", (self.batch, self.out_features), self._accepted())
        gy = _to_compute(gy, self._gy_c, self.stream)
        if self._fp8 is not None:
            return self._backward_fp8(gy, bias_grad_done)
        backward_into(self._x, self._weight_c.T, gy, self.z, y=None if self._save_z else
                      (self.y if self.act != "none" else None),
                      with_bias=self.has_bias, act=self.act, gA_out=self.gx, gB_out=self._weight_grad.T,
                      gBias_out=None if bias_grad_done else self._bias_grad, work_dZ=self.dz, math=self.math, stream=self.stream.ptr)
        return self.gx

    def _backward_fp8(self, gy, bias_grad_done):
        """dz = gy * act'(z) and the bias gradient in one elementwise pass, then the data and weight
        gradients as FP8 GEMMs."""
        s = self.stream.ptr
        db = None if bias_grad_done or not self.has_bias else self._bias_grad
        dz = gy                         # (act none: the GEMMs quantize gy itself)
        if self.act != "none":
            z, from_output = (self.z, False) if self._save_z else (self.y, True)
            dz = act_backward(gy, z, dz_out=self.dz, dbias_out=db, act=self.act, z_is_output=from_output,
                              stream=s)[0]
        elif db is not None:
            act_backward(gy, None, dbias_out=db, act="none", stream=s)
        self._fp8.backward(dz, self._x, self._weight_c, self.gx, self._weight_grad, s)
        return self.gx

    def __repr__(self):
        extra = f", precision={self.precision!r}" if self.precision != "fp32" else ""
        return (f"Dense({self.in_features}, {self.out_features}, act={self.act!r}, bias={self.has_bias}, "
                f"math={self.math!r}{extra})")


def _predict_chain(layers, x, s):
    """The output of `layers` in turn for x (float32, or the compute dtype), as float32: under
    bf16-mixed, converted once on the way in and once on the way out."""
    dt = layers[0].compute_dtype
    _check_array(x, "x", x.shape, (np.dtype(np.float32), dt))
    if x.dtype != dt:
        with s:
            x = _kernels.f32_to_bf16(cp.ascontiguousarray(x), cp.empty(x.shape, dt), s)
    for layer in layers:
        x = layer._predict_compute(x, s)
    if x.dtype != np.float32:
        with s:
            x = _kernels.bf16_to_f32(x, cp.empty(x.shape, np.float32), s)
    return x
