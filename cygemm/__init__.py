"""cygemm: cuBLAS and cuBLASLt GEMMs on CuPy (or any CUDA) arrays, with no avoidable overhead."""
from cygemm.bindings import cuda_paths as _cuda_paths

# The extensions need libcublas.so.13 and libcublasLt.so.13: load them where cuda-pathfinder
# finds them (the nvidia-cublas wheel, conda, the system, CUDA_HOME), so no LD_LIBRARY_PATH
# and no path recorded at build time is needed.
try:
    _cuda_paths.load_cublas()
except _cuda_paths.CudaNotFoundError as exc:
    raise ImportError(f"cygemm: {exc}") from exc

try:
    from cygemm.engine.errors import (CygemmError, CudaError, CudaDriverError, CublasError, CaptureError, NoGpuError,
                                      require_gpu)
except ModuleNotFoundError as exc:      # a source tree whose compiled modules are not built
    import os as _os
    _here = _os.path.dirname(_os.path.abspath(__file__))
    if exc.name and exc.name.startswith("cygemm.") and _os.path.isfile(_os.path.join(_here, "engine", "errors.pyx")):
        raise ImportError(
            f"cygemm: imported from the source tree {_here}, whose compiled modules are not built (Python puts "
            "the current folder first). Run from another folder to use the installed cygemm, or build this "
            "tree: pip install -e .") from exc
    raise
from cygemm.engine.context import device_count, release_workspaces, versions
from cygemm.engine.streams import stream_pointer
from cygemm.engine.settings import get_options, set_options
from cygemm.engine.tuning import load_tuning, save_tuning
from cygemm.rowmajor import gemm, gemm_strided_batched, describe_gemm, int_mm
from cygemm.rowmajor.plan import GemmPlan
from cygemm.rowmajor.matmul import matmul, describe_matmul, _set_grad_path
from cygemm.grouped import (grouped_gemm, moe_gemm, moe_gemm_wgrad, moe_scaled_gemm, describe_grouped, describe_moe,
                            describe_moe_scaled)
from cygemm import dense, elementwise, fp8, gemm_ops, graph, grouped, plans, tuning

# The one place the version is written: pyproject.toml reads it from here (a literal, read
# without importing cygemm).
__version__ = "0.2.0.dev0"


def _record_matmul(*args):
    # matmul on torch tensors that require grad (grad mode on): through cygemm.autograd, which
    # imports torch and, once imported, is called directly.
    from cygemm.autograd import _recorded_matmul
    return _recorded_matmul(*args)


_set_grad_path(_record_matmul)
del _set_grad_path

__all__ = ["nn", "backend", "matmul", "describe_matmul", "grouped_gemm", "moe_gemm", "moe_gemm_wgrad",
           "moe_scaled_gemm", "describe_grouped", "describe_moe", "describe_moe_scaled", "gemm", "gemm_strided_batched", "describe_gemm", "int_mm", "GemmPlan", "gemm_ops", "graph", "plans", "tuning",
           "fp8", "elementwise", "grouped", "dense",
           "load_tuning", "save_tuning", "get_options", "set_options", "CygemmError", "CudaError",
           "CudaDriverError", "CublasError", "CaptureError", "NoGpuError", "device_count", "release_workspaces",
           "stream_pointer", "versions", "get_include", "gpu_unavailable_reason", "require_gpu"]


def __getattr__(name):
    # cygemm.nn, cygemm.backend and cygemm.autograd (which imports torch) load on first use:
    # `import cygemm` stays light.
    if name in ("nn", "backend", "autograd"):
        import importlib
        return importlib.import_module(f"cygemm.{name}")
    raise AttributeError(f"module 'cygemm' has no attribute {name!r}")


def get_include() -> "list[str]":
    """Folders a Cython extension that cimports cygemm compiles against.

    Pass the list both as cythonize's ``include_path`` (it finds ``cygemm/*.pxd`` there) and as
    the Extension's ``include_dirs`` (the C compiler finds ``cygemm/kernels.h``, the CUDA
    runtime headers and the cuBLAS headers there). Computed when called, from where this
    package and CUDA are installed now.

    Returns
    -------
    list of str
        Existing folders: the one holding the ``cygemm`` package, cygemm's ``include``
        folder, the CUDA runtime headers' folder and the cuBLAS headers' folder.

    Raises
    ------
    FileNotFoundError
        (``cygemm.bindings.cuda_paths.CudaNotFoundError``) The CUDA runtime or cuBLAS headers were not
        found; the message names the missing header and how to get it.
    """
    return _cuda_paths.include_dirs()


def gpu_unavailable_reason() -> "str | None":
    """Why cygemm cannot run on a GPU here, in plain words, or None when a GPU is usable.

    Needs no GPU: without a driver it says "no NVIDIA GPU/driver found" rather than a CUDA
    error code.
    """
    from cygemm.engine import context as _context
    return _context.gpu_unavailable_reason()


# ---------------------------------------------------------------- torch, in either order of imports
# cygemm's torch integration loads once torch is imported, whichever of the two comes first:
# torch imported, cygemm.autograd (torch's operators, torch.ops.cygemm.*); torch._dynamo
# imported (torch.compile and torch._dynamo.explain import it), cygemm.autograd.traced
# (Dynamo's stand-ins for the public functions). A module imported already is followed at
# once. For one not imported yet, a finder on sys.meta_path lets the usual finders find it and
# hands the import a loader of its own that runs the module, puts the module's own loader back
# and then loads cygemm's follower; a module whose run fails (or whose spec is only asked for,
# as find_spec does) stays watched. The finder leaves sys.meta_path once both are loaded. So
# import cygemm never imports torch, nor Dynamo (about a second).
import importlib as _importlib
import importlib.abc as _abc
import sys as _sys
import threading as _threading
import warnings as _warnings

# torch's module -> cygemm's module that follows it.
_FOLLOWERS = {"torch": "cygemm.autograd", "torch._dynamo": "cygemm.autograd.traced"}
_pending = {}
_lock = _threading.Lock()
_finding = _threading.local()       # (a finder that asks the others must not be asked back)


def _follow(name):
    try:
        _importlib.import_module(name)
    except Exception as exc:        # a torch cygemm cannot extend must still import
        _warnings.warn(f"cygemm: {name} could not be loaded, so torch runs without it ({type(exc).__name__}: {exc})",
                       RuntimeWarning, stacklevel=2)


class _Following(_abc.Loader):
    """The loader of a watched module's import: runs the module with its own loader (put back
    on the module first), then, once it ran, cygemm's follower."""

    def __init__(self, loader, name):
        self.loader, self.name = loader, name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        with _lock:
            follower = _pending.pop(self.name, None)
            if not _pending and _torch_finder in _sys.meta_path:
                _sys.meta_path.remove(_torch_finder)
        if follower is not None:
            _follow(follower)


class _Follower(_abc.MetaPathFinder):
    """Finds nothing itself: for a watched module, the spec the finders after it give, with a
    loader that runs cygemm's follower once the module has run."""

    cygemm_follower = True

    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending or getattr(_finding, "busy", False):
            return None
        _finding.busy = True
        try:
            spec = None
            for finder in list(_sys.meta_path):
                find = getattr(finder, "find_spec", None) if not getattr(finder, "cygemm_follower", False) else None
                if find is not None and (spec := find(fullname, path, target)) is not None:
                    break
        finally:
            _finding.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Following(spec.loader, fullname)
        return spec


# (a reloaded cygemm keeps the finder already installed)
_torch_finder = next((f for f in _sys.meta_path if getattr(f, "cygemm_follower", False)), None) or _Follower()


def _follow_torch():
    """Load each follower whose torch module is imported; watch for the others."""
    for name, follower in _FOLLOWERS.items():
        if name in _sys.modules:
            _follow(follower)
        else:
            with _lock:
                _pending[name] = follower
    with _lock:
        if _pending and _torch_finder not in _sys.meta_path:
            _sys.meta_path.insert(0, _torch_finder)


_follow_torch()
