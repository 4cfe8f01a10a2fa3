"""cygemm's activations and their derivatives from their definitions, in float64 NumPy: the one
place the tests write them. ``gelu`` is the tanh approximation (cuBLASLt's GELU), ``gelu_erf``
the exact one; ``leaky_relu`` is ``z`` for ``z > 0`` and ``slope * z`` otherwise."""
import math

import numpy as np

NAMES = ("none", "relu", "leaky_relu", "gelu", "gelu_erf", "sigmoid", "tanh", "silu")

_GELU_C = 0.044715
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def sigmoid(z):
    """1 / (1 + exp(-z)), without overflow for large |z|."""
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1 / (1 + e), e / (1 + e))


def act(name, z, slope=0.01):
    """act(z) for cygemm's activation `name`."""
    z = np.asarray(z, dtype=np.float64)
    if name == "none":
        return z
    if name == "relu":
        return np.maximum(z, 0)
    if name == "leaky_relu":
        return np.where(z > 0, z, slope * z)
    if name == "gelu":
        return 0.5 * z * (1 + np.tanh(_SQRT_2_OVER_PI * (z + _GELU_C * z ** 3)))
    if name == "gelu_erf":
        return 0.5 * z * (1 + _erf(z / math.sqrt(2)))
    if name == "sigmoid":
        return sigmoid(z)
    if name == "tanh":
        return np.tanh(z)
    if name == "silu":
        return z * sigmoid(z)
    raise ValueError(f"unknown activation {name!r}")


def act_grad(name, z, slope=0.01):
    """d act(z) / dz, from the derivative's formula (relu's and leaky_relu's: 0 and `slope`
    at z <= 0, as cygemm defines them at the kink)."""
    z = np.asarray(z, dtype=np.float64)
    if name == "none":
        return np.ones_like(z)
    if name == "relu":
        return (z > 0).astype(np.float64)
    if name == "leaky_relu":
        return np.where(z > 0, 1.0, slope)
    if name == "gelu":
        t = np.tanh(_SQRT_2_OVER_PI * (z + _GELU_C * z ** 3))
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * _GELU_C * z * z)
    if name == "gelu_erf":
        return 0.5 * (1 + _erf(z / math.sqrt(2))) + z * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    if name == "sigmoid":
        s = sigmoid(z)
        return s * (1 - s)
    if name == "tanh":
        return 1 - np.tanh(z) ** 2
    if name == "silu":
        s = sigmoid(z)
        return s * (1 + z * (1 - s))
    raise ValueError(f"unknown activation {name!r}")
