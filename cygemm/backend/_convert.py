"""Turning user data into one floating dtype, shared by both backends: lists, NumPy arrays
(object arrays of numbers included), CuPy arrays, torch tensors."""
import numbers

import numpy as np

FLOAT_DTYPES = ("float32", "float64")


def float_dtype(dtype, allowed=FLOAT_DTYPES):
    try:
        d = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype: expected one of {list(allowed)}, got {dtype!r}") from None
    if d.name not in allowed:
        raise TypeError(f"dtype: expected one of {list(allowed)}, got {d.name}")
    return d


def host_numbers(x, dtype, name="x"):
    """A NumPy array of `dtype` from host data; TypeError naming the first element that is not
    a real number (bool, str, None, complex, an object that is not a number)."""
    arr = x if isinstance(x, np.ndarray) else np.asarray(x, dtype=object if _ragged_or_mixed(x) else None)
    if arr.dtype == object:
        flat = arr.reshape(-1)
        for i, v in enumerate(flat):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.number)) \
                    or isinstance(v, (complex, np.complexfloating)):
                where = np.unravel_index(i, arr.shape) if arr.ndim else ()
                raise TypeError(f"{name}: element {tuple(int(k) for k in where)} is {v!r} "
                                f"({type(v).__name__}), not a real number")
        return np.array(flat.tolist(), dtype=dtype).reshape(arr.shape)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name}: expected real numbers, got dtype {arr.dtype.name}")
    return arr.astype(dtype, copy=False)


def _ragged_or_mixed(x):
    if isinstance(x, (list, tuple)):
        try:
            a = np.asarray(x)
        except ValueError:
            raise ValueError("x: a ragged nested sequence (rows of different lengths)") from None
        return a.dtype.kind not in "fiu"
    return False


def is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "__dlpack__")
