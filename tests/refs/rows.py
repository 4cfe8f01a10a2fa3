"""Reductions along an axis from their definitions, in float64 NumPy: log-sum-exp with its
maximum taken out (exact for |x| up to float64's range), softmax, log-softmax and the L2
normalisation."""
import numpy as np


def logsumexp(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=axis, keepdims=True)
    return m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def log_softmax(x, axis=-1):
    return np.asarray(x, dtype=np.float64) - logsumexp(x, axis)


def softmax(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def l2_normalize(x, axis=-1):
    """x / ||x||_2 along `axis` (rows of zeros are not this reference's business)."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt((x * x).sum(axis=axis, keepdims=True))
