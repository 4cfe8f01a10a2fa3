"""cygemm: cuBLAS and cuBLASLt GEMMs on CuPy (or any CUDA) arrays, with no avoidable overhead."""
try:
    from cygemm import _core
except ImportError as exc:  # cuBLAS not on the rpath: load it from the pip wheel and retry
    if "libcublas" not in str(exc):
        raise
    from cygemm._libs import preload_cublas
    if preload_cublas() is None:
        raise ImportError(f"{exc}; install the cuBLAS wheel: pip install nvidia-cublas") from exc
    from cygemm import _core

from cygemm._core import CygemmError, CudaError, CublasError, device_count, stream_pointer, versions
from cygemm.rowmajor import gemm, gemm_strided_batched
from cygemm import gemm_ops, graph

__version__ = "0.1.0"

__all__ = ["gemm", "gemm_strided_batched", "gemm_ops", "graph", "CygemmError", "CudaError", "CublasError",
           "device_count", "stream_pointer", "versions", "get_include"]


def get_include():
    """Folders a Cython extension that cimports cygemm needs: for Cython's include_path
    (the folder holding the cygemm package's .pxd files) and for the C compiler
    (the CUDA and cuBLAS headers found at build time)."""
    import os
    from cygemm import _build_config
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = [os.path.dirname(here), os.path.join(os.path.dirname(here), "include"),
            _build_config.CUDA_INCLUDE, _build_config.CUBLAS_INCLUDE]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]
