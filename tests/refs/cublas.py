"""A NumPy model of what column-major cuBLAS (cublasGemmEx, cublasGemmStridedBatchedEx,
cublasLtMatmul) computes from the arguments it is given: C = op(A) @ op(B), each matrix read
from flat memory at its address with its leading dimension, as cuBLAS's documentation defines
them. The tests run it on the arguments cygemm derives, over host memory that fake device arrays
(tests/fakes.py) point into, and compare with NumPy's row-major product."""
import numpy as np

from fakes import BASE


def load(mem, ptr, ld, rows, cols, *, itemsize=4, base=BASE, offset=0):
    """The column-major ``rows x cols`` matrix at byte address `ptr` with leading dimension `ld`
    (in elements), `offset` elements further on, as float64. `mem` holds one element of
    `itemsize` bytes per entry, its first at address `base`."""
    start = (ptr - base) // itemsize + offset
    idx = start + np.arange(rows)[:, None] + ld * np.arange(cols)[None, :]
    return mem[idx].astype(np.complex128 if np.iscomplexobj(mem) else np.float64)


def _op(x, op):
    """op(X) as cuBLAS defines it: N as is, T transposed, C conjugate-transposed."""
    return x if op == "N" else (x.T if op == "T" else x.conj().T)


def cublas_gemm_model(mem, d, batched=False, *, itemsize=4, c_mem=None, c_itemsize=None, base=BASE):
    """Run the GEMM that the cuBLAS arguments `d` describe on flat memory.

    Parameters
    ----------
    mem : ndarray
        The memory A and B are read from (and C written to, unless `c_mem` is given): one
        element per entry, each `itemsize` bytes, the first at address `base`. For FP8 pass the
        decoded value of each byte (itemsize 1).
    d : dict
        ``opa``, ``opb`` ("N", "T" or "C"), ``m``, ``n``, ``k``, addresses ``a``, ``b``, ``c`` and
        leading dimensions ``lda``, ``ldb``, ``ldc``; batched: also ``batch`` and element
        strides ``stride_a``, ``stride_b``, ``stride_c``.
    batched : bool
        Run ``d["batch"]`` products, matrix i at i * stride further on.
    c_mem, c_itemsize : ndarray, int, optional
        Where C is written when its element size differs from A's and B's (FP8 inputs,
        a float32 result); same addressing, from `base`.
    """
    c_mem = mem if c_mem is None else c_mem
    c_itemsize = itemsize if c_itemsize is None else c_itemsize
    m, n, k = d["m"], d["n"], d["k"]
    for i in range(d["batch"] if batched else 1):
        a = load(mem, d["a"], d["lda"], *((m, k) if d["opa"] == "N" else (k, m)), itemsize=itemsize, base=base,
                 offset=i * d.get("stride_a", 0))
        b = load(mem, d["b"], d["ldb"], *((k, n) if d["opb"] == "N" else (n, k)), itemsize=itemsize, base=base,
                 offset=i * d.get("stride_b", 0))
        a, b = _op(a, d["opa"]), _op(b, d["opb"])
        start = (d["c"] - base) // c_itemsize + i * d.get("stride_c", 0)
        idx = start + np.arange(m)[:, None] + d["ldc"] * np.arange(n)[None, :]
        c_mem[idx] = a @ b
