"""Build cygemm: cythonize the .pyx modules, compile the .cu kernels with nvcc,
link cuBLAS/cuBLASLt (toolkit or pip wheel) and the static CUDA runtime.

Environment:
  CUDA_HOME / CUDA_PATH  the toolkit (else nvcc on PATH, else /usr/local/cuda)
  NVCC                   the nvcc to use
  CYGEMM_CUDA_ARCHS      e.g. "80;90" (default: Turing..Hopper, plus PTX of the newest)
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def find_cuda_home():
    """First of NVCC, CUDA_HOME/CUDA_PATH, nvcc on PATH, /usr/local/cuda that holds a toolkit."""
    candidates = []
    if os.environ.get("NVCC"):
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(os.environ["NVCC"]))))
    candidates += [os.environ[v] for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    if shutil.which("nvcc"):
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(shutil.which("nvcc")))))
    candidates.append("/usr/local/cuda")
    for home in candidates:
        # A wrapper script on PATH does not sit in its toolkit: require the headers.
        if os.path.exists(os.path.join(home, "include", "cuda_runtime_api.h")):
            return home
    sys.exit(f"cygemm: CUDA toolkit not found (tried {candidates}): set CUDA_HOME")


def _site_dirs():
    import site
    dirs = list(site.getsitepackages()) + [site.getusersitepackages()]
    dirs += [p for p in sys.path if p.endswith("site-packages")]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def find_cublas(cuda_home):
    """(include dir, lib dir) holding cublas_v2.h and libcublas.so*: the toolkit first, then pip wheels."""
    candidates = [(os.path.join(cuda_home, "include"), os.path.join(cuda_home, d))
                  for d in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib")]
    for site_dir in _site_dirs():
        for sub in ("nvidia/cu13", "nvidia/cublas"):   # CUDA 13 wheels, then CUDA 12 wheels
            root = os.path.join(site_dir, sub)
            candidates.append((os.path.join(root, "include"), os.path.join(root, "lib")))
    for inc, lib in candidates:
        if os.path.exists(os.path.join(inc, "cublas_v2.h")) and glob.glob(os.path.join(lib, "libcublasLt.so*")):
            return inc, lib
    sys.exit("cygemm: cuBLAS headers/libraries not found in the toolkit or in pip wheels: "
             "pip install nvidia-cublas")


def shared_lib(lib_dir, name):
    """Prefer the versioned soname file: wheels ship only libcublas.so.13."""
    found = sorted(glob.glob(os.path.join(lib_dir, f"lib{name}.so.*")), key=len)
    if not found:
        found = glob.glob(os.path.join(lib_dir, f"lib{name}.so"))
    if not found:
        sys.exit(f"cygemm: lib{name}.so not found in {lib_dir}")
    return found[0]


def nvcc_version(nvcc):
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    release = out.split("release ")[1].split(",")[0]
    return tuple(int(x) for x in release.split("."))


def gencode_flags(nvcc):
    archs = os.environ.get("CYGEMM_CUDA_ARCHS")
    if archs:
        archs = [a.strip() for a in archs.replace(",", ";").split(";") if a.strip()]
    else:
        # CUDA 13 dropped Volta (sm_70); older toolkits still build it.
        archs = ["75", "80", "86", "89", "90"]
        if nvcc_version(nvcc) < (13, 0):
            archs.insert(0, "70")
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    flags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    return flags


CUDA_HOME = find_cuda_home()
NVCC = os.environ.get("NVCC") or os.path.join(CUDA_HOME, "bin", "nvcc")
CUBLAS_INC, CUBLAS_LIB = find_cublas(CUDA_HOME)
CUDA_INC = os.path.join(CUDA_HOME, "include")
CUDART_STATIC = next((p for p in glob.glob(os.path.join(CUDA_HOME, "lib*", "libcudart_static.a"))
                      + glob.glob(os.path.join(CUDA_HOME, "targets", "*", "lib", "libcudart_static.a"))), None)
if CUDART_STATIC is None:
    sys.exit(f"cygemm: libcudart_static.a not found under {CUDA_HOME}")

INCLUDE_DIRS = [os.path.join(HERE, "include"), CUDA_INC, CUBLAS_INC]
# Static cudart: no runtime library to find at import. cuBLAS is found through
# the rpath of the build, the wheel layout next to the package, or (see
# cygemm/_libs.py) a search of site-packages at import.
LINK_ARGS = [shared_lib(CUBLAS_LIB, "cublas"), shared_lib(CUBLAS_LIB, "cublasLt"), CUDART_STATIC,
             "-ldl", "-lpthread", "-lrt",
             f"-Wl,-rpath,{CUBLAS_LIB}", "-Wl,-rpath,$ORIGIN/../nvidia/cu13/lib"]


def write_build_config():
    """Record the include folders, so cimport users (and tests) can compile against cygemm."""
    with open(os.path.join(HERE, "cygemm", "_build_config.py"), "w") as f:
        f.write("# Written by setup.py at build time.\n")
        f.write(f"CUDA_INCLUDE = {CUDA_INC!r}\nCUBLAS_INCLUDE = {CUBLAS_INC!r}\n")
        f.write(f"CUBLAS_LIB = {CUBLAS_LIB!r}\n")


class BuildExt(build_ext):
    """Compile each extension's .cu sources with nvcc into objects, then link as usual."""

    def build_extension(self, ext):
        cu_sources = [s for s in ext.sources if s.endswith(".cu")]
        ext.sources = [s for s in ext.sources if not s.endswith(".cu")]
        objects = []
        for src in cu_sources:
            obj = os.path.join(self.build_temp, os.path.splitext(src)[0] + ".o")
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            cmd = [NVCC, "-c", src, "-o", obj, "-O3", "-std=c++17", "-Xcompiler", "-fPIC",
                   "--expt-relaxed-constexpr", *[f"-I{d}" for d in INCLUDE_DIRS], *gencode_flags(NVCC)]
            print(" ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
            objects.append(obj)
        ext.extra_objects = objects + list(ext.extra_objects or [])
        super().build_extension(ext)


def extension(name, extra_sources=()):
    # nvcc objects are C++: their runtime support comes from libstdc++.
    cxx = ["-lstdc++"] if any(s.endswith(".cu") for s in extra_sources) else []
    return Extension(f"cygemm.{name}", [f"cygemm/{name}.pyx", *extra_sources],
                     include_dirs=INCLUDE_DIRS, extra_link_args=LINK_ARGS + cxx,
                     extra_compile_args=["-O2", "-Wno-unused-function"])


def ext_modules():
    from Cython.Build import cythonize
    exts = [extension("_core"), extension("rowmajor"), extension("fused", ["cygemm/kernels.cu"]),
            extension("graph")]
    exts = [e for e in exts if os.path.exists(e.sources[0])]
    return cythonize(exts, compiler_directives={"language_level": 3, "embedsignature": True},
                     include_path=[HERE])


write_build_config()
setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExt})
