"""Make cuBLAS loadable before the extensions import, without LD_LIBRARY_PATH.

The build records an rpath to the cuBLAS it linked; where that is gone (an
isolated build environment, a moved wheel) the libraries of the installed
`nvidia-cublas` wheel are loaded by path, so the extensions' DT_NEEDED entries
(libcublas.so.13, libcublasLt.so.13) resolve to them.
"""
import ctypes
import os
import site
import sys

_NAMES = ("libcublasLt.so.13", "libcublas.so.13")


def _candidate_dirs():
    roots = list(sys.path) + list(site.getsitepackages()) + [site.getusersitepackages()]
    for root in dict.fromkeys(roots):
        yield os.path.join(root, "nvidia", "cu13", "lib")
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            yield os.path.join(os.environ[var], "lib64")
    yield "/usr/local/cuda/lib64"


def preload_cublas():
    """Load cuBLASLt then cuBLAS from the first folder that has both; return that folder."""
    for lib_dir in _candidate_dirs():
        paths = [os.path.join(lib_dir, name) for name in _NAMES]
        if all(os.path.exists(p) for p in paths):
            for p in paths:
                ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
            return lib_dir
    return None
