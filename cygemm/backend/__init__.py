"""A small array backend for classical models: the same code on the CPU (NumPy) and the GPU
(CuPy and cygemm), with GEMMs through cygemm, stable fused softmax/sigmoid kernels, SPD
solves through cuSOLVER, and no host synchronisation inside an iteration.

    be = cygemm.backend.CUDABackend()            # or NumPyBackend()
    coef, intercept = be.ridge(be.asarray(X), be.asarray(y), alpha=1.0)
"""
from typing import TYPE_CHECKING

from cygemm.backend.protocol import Backend
from cygemm.backend.numpy_backend import NumPyBackend

if TYPE_CHECKING:           # (loaded on first use at run time: see __getattr__)
    from cygemm.backend.cuda_backend import CUDABackend

__all__ = ["Backend", "NumPyBackend", "CUDABackend"]


def __getattr__(name):
    # CUDABackend imports cupyx.scipy; a CPU-only user of NumPyBackend need not pay for it.
    if name == "CUDABackend":
        from cygemm.backend.cuda_backend import CUDABackend
        return CUDABackend
    raise AttributeError(f"module 'cygemm.backend' has no attribute {name!r}")
