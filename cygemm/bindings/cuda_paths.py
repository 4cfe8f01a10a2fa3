"""Where the CUDA runtime and cuBLAS headers and libraries are, as cuda-pathfinder finds them.

One answer for every use: setup.py loads this file by path at build time (it needs nothing
compiled), ``import cygemm`` loads cuBLAS through it before the extensions import, and
``cygemm.get_include()`` asks it for header folders. Nothing here is recorded at build time,
so a wheel works wherever it is installed.

cuda-pathfinder looks in site-packages (the ``nvidia-cublas`` wheel's ``nvidia/cu13``),
conda, the system loader's paths and ``CUDA_HOME``/``CUDA_PATH``, in its documented order.
"""
import os

# cuBLASLt first: libcublas.so.13 needs it.
CUBLAS_LIBS = ("cublasLt", "cublas")
# Headers a module that cimports cygemm compiles against, and the package that supplies them.
_HEADERS = {
    "cudart": (("cuda_runtime_api.h", "library_types.h", "crt/host_defines.h"),
               "the CUDA toolkit (set CUDA_HOME) or: pip install nvidia-cuda-runtime"),
    "cublas": (("cublas_v2.h", "cublasLt.h"),
               "pip install nvidia-cublas (or set CUDA_HOME to a toolkit that has cuBLAS)"),
}
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # cygemm/ (this file: cygemm/engine/)


def _wheel_dirs(sub):
    """`sub` folders of the CUDA 13 wheels' ``nvidia/cu13`` package found through sys.path.

    cuda-pathfinder searches site.getsitepackages(); pip's isolated build environment puts
    the build requirements (nvidia-cublas among them) on sys.path only, so a build needs this.
    """
    import importlib.util
    try:
        spec = importlib.util.find_spec("nvidia.cu13")
    except ImportError:
        return []
    roots = list(spec.submodule_search_locations or []) if spec else []
    return [os.path.join(r, sub) for r in roots if os.path.isdir(os.path.join(r, sub))]


class CudaNotFoundError(FileNotFoundError):
    """A CUDA header folder or library cygemm needs was not found."""


def _pathfinder():
    try:
        from cuda import pathfinder
    except ImportError as exc:   # a dependency of cygemm and of CuPy; say so plainly
        raise CudaNotFoundError("cygemm needs cuda-pathfinder to find CUDA libraries and headers: "
                                "pip install cuda-pathfinder") from exc
    return pathfinder


LOADED: dict = {}     # library name -> the path load_cublas loaded it from (python -m cygemm info)


def load_cublas():
    """Load cuBLASLt and cuBLAS, so the extensions' DT_NEEDED entries resolve to them.

    Returns
    -------
    dict
        Library name -> absolute path it was loaded from.

    Raises
    ------
    CudaNotFoundError
        Neither the pip wheel, conda, the system loader nor CUDA_HOME has cuBLAS 13.
    """
    import ctypes
    pathfinder = _pathfinder()
    loaded = LOADED
    for name in CUBLAS_LIBS:
        try:
            loaded[name] = pathfinder.load_nvidia_dynamic_lib(name).abs_path
            continue
        except pathfinder.DynamicLibNotFoundError as exc:
            error = exc
        found = [os.path.join(d, f"lib{name}.so.13") for d in _wheel_dirs("lib")]
        found = [p for p in found if os.path.isfile(p)]
        if not found:
            raise CudaNotFoundError(f"lib{name}.so.13 not found ({error}): pip install nvidia-cublas, "
                                    "or set CUDA_HOME to a CUDA 13 toolkit that has cuBLAS") from error
        ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
        loaded[name] = found[0]
    return loaded


def header_dir(name):
    """The folder holding the headers of `name` ("cudart" or "cublas"), checked to hold them all.

    Raises
    ------
    CudaNotFoundError
        The headers are missing; the message says which and how to get them.
    """
    files, remedy = _HEADERS[name]
    candidates = [_pathfinder().find_nvidia_header_directory(name)]
    if name == "cublas":
        candidates += _wheel_dirs("include")
    else:
        # The nvidia-cuda-runtime wheel's include folder can lack crt/host_defines.h (it ships
        # in another wheel): then the toolkit's headers, the ones nvcc compiles with.
        try:
            candidates.append(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(find_nvcc()))),
                                           "include"))
        except CudaNotFoundError:
            pass
    candidates = [c for c in candidates if c]
    for found in candidates:
        if all(os.path.isfile(os.path.join(found, f)) for f in files):
            return found
    where = f"in {', '.join(candidates)}" if candidates else "anywhere cuda-pathfinder looks"
    missing = [f for f in files if not any(os.path.isfile(os.path.join(c, f)) for c in candidates)] or files
    raise CudaNotFoundError(f"{', '.join(missing)} not found together {where}: {remedy}")


def include_dirs():
    """Folders for Cython's include_path and the C compiler's include_dirs of a module that
    cimports cygemm: the folder holding the cygemm package (its .pxd files), cygemm's own C
    headers, the CUDA runtime headers and the cuBLAS headers. Only folders that exist."""
    # The C headers: include/ at the top of a source tree (an editable install), or the copy
    # the wheel holds inside the package.
    installed = os.path.join(PACKAGE_DIR, "include")
    headers = installed if os.path.isdir(installed) else os.path.join(os.path.dirname(PACKAGE_DIR), "include")
    dirs = [os.path.dirname(PACKAGE_DIR), headers, header_dir("cudart"), header_dir("cublas")]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def find_nvcc():
    """nvcc: $NVCC, else cuda-pathfinder's search (CUDA_HOME/CUDA_PATH, PATH, the toolkit's
    standard place)."""
    if os.environ.get("NVCC"):
        return os.environ["NVCC"]
    pathfinder = _pathfinder()
    find = getattr(pathfinder, "find_nvidia_binary_utility", None)   # cuda-pathfinder >= 1.3
    nvcc = find("nvcc") if find else None
    if nvcc is None:
        import shutil
        home = pathfinder.get_cuda_path_or_home() if hasattr(pathfinder, "get_cuda_path_or_home") else None
        nvcc = shutil.which("nvcc", path=os.path.join(home, "bin") if home else None) or \
            shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
    if not nvcc:
        raise CudaNotFoundError("nvcc not found: install the CUDA 13 toolkit and set CUDA_HOME (or NVCC)")
    return nvcc
