"""Mixture-of-experts GEMMs in float64 NumPy, from their definitions: tokens sorted by expert,
expert g's rows offs[g]:offs[g+1]."""
import numpy as np


def offsets(counts):
    """The G + 1 offsets of experts of `counts` rows."""
    return [0] + np.cumsum(counts).tolist()


def forward(x, w, offs, layout):
    """out[a:b] = x[a:b] @ w[g] ("kn": w (G, K, N)) or x[a:b] @ w[g].T ("nk": w (G, N, K))."""
    out = np.zeros((x.shape[0], w.shape[2] if layout == "kn" else w.shape[1]))
    for g in range(len(offs) - 1):
        a, b = offs[g], offs[g + 1]
        out[a:b] = x[a:b] @ (w[g] if layout == "kn" else w[g].T)
    return out


def wgrad(x, dy, offs, layout):
    """dw[g] = x[a:b].T @ dy[a:b] ("kn": (K, N)) or dy[a:b].T @ x[a:b] ("nk": (N, K)); zeros for
    an expert without rows."""
    G = len(offs) - 1
    dw = np.zeros((G, x.shape[1], dy.shape[1]) if layout == "kn" else (G, dy.shape[1], x.shape[1]))
    for g in range(G):
        a, b = offs[g], offs[g + 1]
        dw[g] = x[a:b].T @ dy[a:b] if layout == "kn" else dy[a:b].T @ x[a:b]
    return dw
