"""Saving and loading cygemm.nn models and optimizers: state dicts of NumPy arrays, ``.npz``
files (``numpy.load`` reads them), and export to torch.

A model's state is its float32 parameters (the masters under bf16-mixed), named as torch names
them: ``weight`` (out, in) and ``bias`` of a Dense, ``layers.{k}.weight`` of an MLP. Loading
writes into the existing device buffers: a compiled step, whose graph holds their addresses,
continues from the loaded state.

    cygemm.nn.save("run.npz", model, optimizer)
    cygemm.nn.load("run.npz", model, optimizer)      # after compile_step too
"""
import collections
import collections.abc

import cupy as cp
import numpy as np

__all__ = ["save", "load"]

FORMAT = "cygemm.nn/1"

# cygemm's activations as torch modules (gelu is the tanh approximation, as cuBLASLt's).
_TORCH_ACTIVATIONS = {"relu": ("ReLU", {}), "leaky_relu": ("LeakyReLU", {"negative_slope": 0.01}),
                      "gelu": ("GELU", {"approximate": "tanh"}), "gelu_erf": ("GELU", {}),
                      "sigmoid": ("Sigmoid", {}), "tanh": ("Tanh", {}), "silu": ("SiLU", {})}


def host_float32(value, name, shape):
    """`value` (NumPy, CuPy, torch, nested lists) as a NumPy float32 array of `shape`; TypeError
    or ValueError naming `name` otherwise."""
    if hasattr(value, "detach"):                                  # torch
        value = value.detach().float().cpu().numpy()
    elif isinstance(value, cp.ndarray):
        value = value.get()
    arr = np.asarray(value)
    if arr.dtype.kind not in "fiu" and arr.dtype.name != "bfloat16":
        raise TypeError(f"{name}: expected real numbers, got dtype {arr.dtype}")
    if arr.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {arr.shape}")
    return arr.astype(np.float32)


def check_keys(state, expected, what):
    """KeyError naming the keys of `state` missing from, or not in, `expected`."""
    if not isinstance(state, collections.abc.Mapping):
        raise TypeError(f"state: expected a mapping of names to arrays, got {type(state).__name__}")
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise KeyError(f"state: does not fit this {what}: missing {missing}, unexpected {unexpected}")


def _stream(model):
    return model.stream if model.stream is not None else cp.cuda.get_current_stream()


def model_state(model):
    """The state dict of a Dense or MLP (NumPy float32 copies; one wait for its stream)."""
    flat = model.flat_parameters
    host = flat.get(stream=_stream(model))
    out = {}
    for name, view in model._named_parameters():
        start = (view.data.ptr - flat.data.ptr) // 4
        out[name] = host[start:start + view.size].reshape(view.shape).copy()
    return out


def checked_model_state(model, state):
    """The flat float32 host array `state` gives `model`'s parameters (checked, nothing written)."""
    named = list(model._named_parameters())
    check_keys(state, [n for n, _ in named], type(model).__name__)
    flat = model.flat_parameters
    host = np.empty(flat.size, np.float32)
    for name, view in named:
        start = (view.data.ptr - flat.data.ptr) // 4
        host[start:start + view.size] = host_float32(state[name], name, view.shape).ravel()
    return host


def write_model_state(model, host):
    """Copy the flat host parameters into the model's buffer, in place, and refresh its bf16 copy."""
    s = _stream(model)
    model.flat_parameters.set(host, stream=s)
    model.refresh_bf16(s)


def load_model_state(model, state):
    write_model_state(model, checked_model_state(model, state))


def torch_state(state, layers, sequential=True):
    """A model's `state` as CPU torch tensors. `layers`: (key prefix, activation) in order; with
    `sequential`, named as the layers' ``nn.Sequential`` (each Linear, then its activation
    module unless "none"), else as one ``nn.Linear`` (a single layer)."""
    import torch
    out = collections.OrderedDict()
    index = 0
    for prefix, act in layers:
        head = f"{index}." if sequential else ""
        for part in ("weight", "bias"):
            if prefix + part in state:
                out[head + part] = torch.from_numpy(np.ascontiguousarray(state[prefix + part], np.float32))
        index += 1 if act == "none" else 2
    return out


def to_torch(torch_state_dict, sizes, acts, bias):
    """The ``torch.nn.Sequential`` that `torch_state_dict` (from :func:`torch_state`) fits,
    with those parameters loaded."""
    import torch
    modules = []
    for i, o, act in zip(sizes[:-1], sizes[1:], acts):
        modules.append(torch.nn.Linear(i, o, bias=bias))
        if act != "none":
            cls, kwargs = _TORCH_ACTIVATIONS[act]
            modules.append(getattr(torch.nn, cls)(**kwargs))
    seq = torch.nn.Sequential(*modules)
    seq.load_state_dict(torch_state_dict)
    return seq


def save(path, model, optimizer=None):
    """Write `model`'s state (and `optimizer`'s) to an ``.npz`` file.

    Parameters
    ----------
    path : str or os.PathLike
        The file; NumPy adds ``.npz`` when the name lacks it.
    model : cygemm.nn.MLP or cygemm.nn.Dense
    optimizer : cygemm.nn.SGD, Adam or AdamW, optional

    Notes
    -----
    The file holds ``model.<name>`` for each entry of ``model.state_dict()``, ``optimizer.<name>``
    for each of ``optimizer.state_dict()``, and ``format``: ``numpy.load`` reads it, without
    pickles.
    """
    arrays = {"format": np.array(FORMAT)}
    arrays.update({f"model.{k}": v for k, v in model.state_dict().items()})
    if optimizer is not None:
        arrays.update({f"optimizer.{k}": v for k, v in optimizer.state_dict().items()})
    np.savez(path, **arrays)


def load(path, model, optimizer=None):
    """Load a file :func:`save` wrote into `model` (and `optimizer`), in place.

    Every entry is checked (names, shapes, the optimizer's kind and settings) before anything
    is written; the device buffers keep their addresses, so a step compiled for `model`
    continues from the loaded state.

    Parameters
    ----------
    path : str or os.PathLike
        A file :func:`save` wrote (the full name, ``.npz`` included).
    model : cygemm.nn.MLP or cygemm.nn.Dense
        Of the saved model's sizes and bias; its parameters are overwritten.
    optimizer : cygemm.nn.SGD, Adam or AdamW, optional
        Of the saved optimizer's class and settings; its state (step count, learning rate,
        buffers) is overwritten. None: the file's optimizer state, if any, is ignored.

    Raises
    ------
    ValueError
        A file :func:`save` did not write, an ``optimizer`` where the file holds no optimizer
        state, a shape, class or setting that differs from the saved one.
    KeyError
        Parameter or state names that differ from the saved ones.
    TypeError
        An entry that does not hold real numbers.
    """
    with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    fmt = str(arrays.pop("format", ""))
    if fmt != FORMAT:
        raise ValueError(f"path: expected a file cygemm.nn.save wrote (format {FORMAT!r}), got format {fmt!r}")
    parts = {"model": {}, "optimizer": {}}
    for key, value in arrays.items():
        head, _, name = key.partition(".")
        if head not in parts:
            raise ValueError(f"path: unexpected entry {key!r}")
        parts[head][name] = value
    if optimizer is not None and not parts["optimizer"]:
        raise ValueError("optimizer: the file holds no optimizer state (it was saved without one)")
    params = checked_model_state(model, parts["model"])
    opt_state = optimizer._checked_state(parts["optimizer"]) if optimizer is not None else None
    write_model_state(model, params)
    if optimizer is not None:
        optimizer._write_state(opt_state)
