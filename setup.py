"""Build cygemm: cythonize the .pyx modules, compile the .cu kernels with nvcc, link
cuBLAS/cuBLASLt and the static CUDA runtime.

Where CUDA is comes from cygemm/bindings/cuda_paths.py (cuda-pathfinder), the same answer the
installed package uses at run time. The build writes no build-machine path into what it
makes: the only RUNPATH is $ORIGIN/../nvidia/cu13/lib (the nvidia-cublas wheel beside an
installed cygemm; one more ../ for a module of a subpackage); elsewhere `import cygemm` loads
cuBLAS through cuda-pathfinder.

Environment:
  NVCC                   the nvcc to use (else CUDA_HOME/CUDA_PATH, PATH, /usr/local/cuda)
  CYGEMM_CUDA_ARCHS      e.g. "80;90" (default: machine code for 75;80;90, which runs on
                         Turing..Hopper (sm_80's on 8.6 and 8.9), and 89 for the FP8 kernels;
                         plus PTX of the newest)
"""
import glob
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time

from setuptools import Extension, setup
from setuptools.command.build_py import build_py
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
# The compiled modules: every cygemm/**/*.pyx ("nn._kernels": cygemm/nn/_kernels.pyx). A module
# that launches kernels of ours names their files on a line of its own, "# kernels: elementwise"
# (cygemm/kernels/elementwise.cu): each .cu is compiled once, its object linked into the modules
# that name it. The headers: every file of include/cygemm/. (Their layering and the absence of
# import cycles are tests/contracts/test_architecture.py's.)
_KERNELS_LINE = re.compile(r"^# kernels: ([\w ]+)$", re.M)


def compiled_modules():
    """{module: [kernel, ...]} of every .pyx under cygemm/, sorted by name."""
    found = {}
    for path in sorted(glob.glob(os.path.join(HERE, "cygemm", "**", "*.pyx"), recursive=True)):
        name = os.path.relpath(path, os.path.join(HERE, "cygemm"))[:-4].replace(os.sep, ".")
        with open(path) as f:
            line = _KERNELS_LINE.search(f.read())
        found[name] = line.group(1).split() if line else []
    return found


MODULES = compiled_modules()
HEADERS = sorted(os.path.relpath(p, HERE).replace(os.sep, "/")
                 for p in glob.glob(os.path.join(HERE, "include", "cygemm", "*")) if os.path.isfile(p))
KERNELS = sorted({k for kernels in MODULES.values() for k in kernels})
CYTHON_DIRECTIVES = {"language_level": 3, "binding": True}
# nvcc's files, longest first (measured: elementwise's 96 template kernels take 3/4 of nvcc's
# time): the longest starts first, and modules that wait on none of them build meanwhile.
KERNELS_LONGEST_FIRST = ["elementwise", "fp8", "fp8_scales", "nn", "backend", "small_batched", "grouped", "timing"]


def kernel_source(name):
    return f"cygemm/kernels/{name}.cu"


def module_source(name):
    return f"cygemm/{name.replace('.', '/')}.pyx"


def runpath(name):
    """The nvidia-cublas wheel's libraries, relative to the module's folder (site-packages/nvidia/)."""
    return "$ORIGIN/" + "../" * (name.count(".") + 1) + "nvidia/cu13/lib"


def _cuda_paths():
    spec = importlib.util.spec_from_file_location("_cygemm_cuda_paths",
                                                  os.path.join(HERE, "cygemm", "bindings", "cuda_paths.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_sources():
    """A missing source is a build error, never a smaller wheel."""
    needed = [module_source(m) for m in MODULES] + [kernel_source(k) for k in KERNELS] + HEADERS
    # Every compiled module has its stub: a stub with neither .py nor .pyx beside it is a lost source.
    for stub in glob.glob(os.path.join(HERE, "cygemm", "**", "*.pyi"), recursive=True):
        if not os.path.isfile(stub[:-4] + ".py") and not os.path.isdir(stub[:-4]):
            needed.append(os.path.relpath(stub[:-4] + ".pyx", HERE))
    missing = [p for p in needed if not os.path.isfile(os.path.join(HERE, p))]
    if missing:
        raise SystemExit(f"cygemm: sources missing from this source tree: {', '.join(missing)}")


def progress(message):
    """A line of build progress. pip shows a build's own output only with -v, so the line also
    goes to the terminal the user ran pip from, when there is one."""
    print(message, flush=True)
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(f"  {message}\n")
    except OSError:
        pass


def cudart_static(nvcc):
    root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    for pattern in ("lib64", "lib", "targets/*/lib"):
        found = glob.glob(os.path.join(root, pattern, "libcudart_static.a"))
        if found:
            return found[0]
    raise SystemExit(f"cygemm: libcudart_static.a not found in the toolkit of {nvcc}")


def nvcc_version(nvcc):
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    return tuple(int(x) for x in out.split("release ")[1].split(",")[0].split("."))


def gencode_flags(nvcc, kernel):
    """nvcc's -gencode flags for kernel file `kernel` (its name, e.g. "fp8")."""
    archs = os.environ.get("CYGEMM_CUDA_ARCHS")
    if archs:
        archs = [a.strip() for a in archs.replace(",", ";").split(";") if a.strip()]
    else:
        # Machine code runs on its major version's later minors (sm_80's on 8.6 and 8.9): the
        # memory-bound passes need no more. FP8's conversions are instructions from sm_89 on.
        # The finer-scale quantization (fp8_scales) serves FP8 GEMMs, which need 8.9: it is built
        # for 8.9 and 9.0 alone (emulating FP8 on older GPUs made it 4x as long to compile, a
        # minute of the build). CUDA 13 dropped Volta (sm_70); older toolkits still build it.
        if kernel == "fp8_scales":
            archs = ["89", "90"]
        else:
            archs = ["75", "80", "89", "90"] if kernel == "fp8" else ["75", "80", "90"]
            if nvcc_version(nvcc) < (13, 0):
                archs.insert(0, "70")
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    flags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    return flags


class BuildExt(build_ext):
    """Compile every kernel file once with nvcc, while the extensions build (in parallel: -j,
    every core by default, see setup() below); an extension that links a kernel's object waits
    for that one file only."""

    def run(self):
        cythonize_changed(self.extensions)
        super().run()

    def build_extensions(self):
        from concurrent.futures import ThreadPoolExecutor
        # Python's own LDSHARED may carry -Wl,-rpath,<its lib folder> (pyenv, conda): a path
        # of the build machine that must not reach the wheel. Our RUNPATH is added per extension.
        self.compiler.linker_so = [a for a in self.compiler.linker_so if not a.startswith("-Wl,-rpath")]
        start = time.monotonic()
        jobs = int(self.parallel or 0) or os.cpu_count() or 1
        progress(f"cygemm: building {len(self.extensions)} compiled modules, {jobs} at a time")
        needed = {s for ext in self.extensions for s in ext.sources if s.endswith(".cu")}
        missing = [s for s in map(kernel_source, KERNELS_LONGEST_FIRST)
                   if s in needed and not self._cached(ext_for_source(self.extensions, s))]
        missing += sorted(needed - set(missing) - set(map(kernel_source, KERNELS_LONGEST_FIRST)))
        self._kernel_objects = {}
        with ThreadPoolExecutor(max(1, min(len(missing), jobs))) as pool:
            if missing:
                progress(f"cygemm: compiling {len(missing)} kernel files with nvcc, for GPU architectures "
                         f"{os.environ.get('CYGEMM_CUDA_ARCHS') or 'default (75;80;90, and 89 for FP8)'}; "
                         "CYGEMM_CUDA_ARCHS=90 (your GPU's) builds faster")
            for src in missing:
                self._kernel_objects[src] = pool.submit(self._compile_kernel, src)
            # Modules that link the slowest kernels last, so that the others fill the wait.
            rank = {kernel_source(k): i for i, k in enumerate(KERNELS_LONGEST_FIRST)}
            self.extensions.sort(key=lambda e: -min([rank.get(s, 0) for s in e.sources if s.endswith(".cu")],
                                                     default=len(rank)))
            super().build_extensions()
        progress(f"cygemm: built in {time.monotonic() - start:.0f} s")

    def _cached(self, exts):
        return all(os.path.isfile(self._cache_path(e, [s for s in e.sources if s.endswith(".cu")]))
                   for e in exts)

    def _compile_kernel(self, src):
        obj = os.path.join(self.build_temp, os.path.splitext(src)[0] + ".o")
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        # --threads 0: one thread per GPU architecture, on every core.
        cmd = [NVCC, "-c", src, "-o", obj, "-O3", "-std=c++17", "-Xcompiler", "-fPIC,-g0", "--threads", "0",
               "--expt-relaxed-constexpr", *[f"-I{d}" for d in INCLUDE_DIRS],
               *gencode_flags(NVCC, os.path.basename(src)[:-3])]
        start = time.monotonic()
        subprocess.run(cmd, check=True)
        progress(f"cygemm: nvcc {src}: {time.monotonic() - start:.0f} s")
        return obj

    def _kernel_object(self, src):
        """The object of kernel file src: compiled now if no job was started for it (an
        extension built alone, e.g. after a cache miss), else that job's, once it is done."""
        if src not in self._kernel_objects:
            return self._compile_kernel(src)
        job = self._kernel_objects[src]
        return job if isinstance(job, str) else job.result()

    def build_extension(self, ext):
        cu_sources = [s for s in ext.sources if s.endswith(".cu")]
        ext.sources = [s for s in ext.sources if not s.endswith(".cu")]
        target = self.get_ext_fullpath(ext.name)
        cached = self._cache_path(ext, cu_sources)
        if os.path.isfile(cached):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(cached, target)
            print(f"{ext.name}: unchanged, copied from build/ext-cache", flush=True)
            return
        ext.extra_objects = [self._kernel_object(s) for s in cu_sources] + list(ext.extra_objects or [])
        start = time.monotonic()
        super().build_extension(ext)
        progress(f"cygemm: {ext.name} built in {time.monotonic() - start:.0f} s")
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        shutil.copy2(target, cached + ".tmp")
        os.replace(cached + ".tmp", cached)
        with open(cached[:-3] + ".key", "w") as f:
            f.write("\n".join(self._key_parts(ext, cu_sources)) + "\n")

    def _cache_path(self, ext, cu_sources):
        key = hashlib.sha256("\n".join(self._key_parts(ext, cu_sources)).encode()).hexdigest()[:24]
        return os.path.join(HERE, "build", "ext-cache", f"{ext.name}-{key}.so")

    def _key_parts(self, ext, cu_sources):
        """What goes into the extension: its sources' contents, the headers, the flags, the
        compilers, Python's ABI (link paths by name only: they move with the build env).
        Written beside the cached extension: what a miss differed in."""
        parts = []
        sources = [s for s in ext.sources if not s.endswith(".cu")]
        for path in sorted(sources + cu_sources + HEADERS) + CUBLAS_HEADERS:
            with open(os.path.join(HERE, path), "rb") as f:        # (cuBLAS's: absolute paths)
                text = f.read()
            # Cython's metadata block names the build env's folders (pip makes a new one each time).
            start, end = text.find(b"/* BEGIN: Cython Metadata"), text.find(b"END: Cython Metadata */")
            if start >= 0 and end > start:
                text = text[:start] + text[end:]
            parts.append(f"{os.path.basename(path)} {hashlib.sha256(text).hexdigest()}")
        parts += [*ext.extra_compile_args, *[os.path.basename(a) for a in ext.extra_link_args],
                  *[f for s in cu_sources for f in gencode_flags(NVCC, os.path.basename(s)[:-3])],
                  " ".join(self.compiler.compiler_so), sys.version,
                  sysconfig.get_config_var("EXT_SUFFIX") or "", str(nvcc_version(NVCC))]
        return parts


def ext_for_source(extensions, src):
    return [e for e in extensions if src in e.sources]


def extension(name, kernels):
    # nvcc objects are C++: their runtime support comes from libstdc++.
    cxx = ["-lstdc++"] if kernels else []
    # -g0: Python's CFLAGS often say -g, and debug info names the build folder.
    return Extension(f"cygemm.{name}", [module_source(name)[:-4] + ".c", *map(kernel_source, kernels)],
                     include_dirs=INCLUDE_DIRS, extra_link_args=LINK_ARGS + [f"-Wl,-rpath,{runpath(name)}"] + cxx,
                     extra_compile_args=["-O2", "-g0", "-Wno-unused-function"])


check_sources()
paths = _cuda_paths()
NVCC = paths.find_nvcc()
INCLUDE_DIRS = ["include", paths.header_dir("cudart"), paths.header_dir("cublas")]
CUBLAS_HEADERS = [os.path.join(paths.header_dir("cublas"), h) for h in ("cublas_api.h", "cublasLt.h")]
CUBLAS = paths.load_cublas()
# Linked by path; the DT_NEEDED entries are the sonames (libcublas.so.13), not paths.
LINK_ARGS = [CUBLAS["cublas"], CUBLAS["cublasLt"], cudart_static(NVCC), "-ldl", "-lpthread", "-lrt"]


def cythonize_changed(extensions):
    """Generate the C of each module whose Cython sources changed (or whose C is missing).
    cythonize's own check compares file times, and pip installs Cython afresh for every build,
    newer than any generated file, so it would translate all 32 modules every time; here a
    module's key is the contents of its .pyx, of every .pxd and Cython's version."""
    from Cython import __version__ as cython_version
    from Cython.Build import cythonize
    pxds = sorted(glob.glob(os.path.join(HERE, "cygemm", "**", "*.pxd"), recursive=True))
    shared = hashlib.sha256(cython_version.encode() + repr(CYTHON_DIRECTIVES).encode())
    for path in pxds:
        with open(path, "rb") as f:
            shared.update(path.encode() + f.read())
    stale, keys = [], {}
    for ext in extensions:
        pyx = module_source(ext.name[len("cygemm."):])
        key = shared.copy()
        with open(os.path.join(HERE, pyx), "rb") as f:
            key.update(f.read())
        keys[ext.name] = key.hexdigest()
        stamp = os.path.join(HERE, "build", "cython", ext.name + ".key")
        if not (os.path.isfile(os.path.join(HERE, pyx[:-4] + ".c")) and os.path.isfile(stamp)
                and open(stamp).read() == keys[ext.name]):
            stale.append(ext)
    if stale:
        progress(f"cygemm: Cython translating {len(stale)} changed modules")
        cythonize([Extension(e.name, [module_source(e.name[len("cygemm."):])]) for e in stale],
                  compiler_directives=CYTHON_DIRECTIVES, nthreads=os.cpu_count() or 1, force=True, quiet=True)
        os.makedirs(os.path.join(HERE, "build", "cython"), exist_ok=True)
        for ext in stale:
            with open(os.path.join(HERE, "build", "cython", ext.name + ".key"), "w") as f:
                f.write(keys[ext.name])


class BuildPy(build_py):
    """The kernels' C headers (include/cygemm/ at the top of the tree) go into the wheel as
    cygemm/include/cygemm/, where cygemm.get_include() finds them in an installed package."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "cygemm", "include", "cygemm")
        os.makedirs(target, exist_ok=True)
        for header in HEADERS:
            self.copy_file(os.path.join(HERE, header), os.path.join(target, os.path.basename(header)))


# The extensions name the C that cythonize_changed generates when build_ext runs (not when pip
# asks for metadata). build_ext -j: they compile in parallel on every core (pip passes no -j).
setup(ext_modules=[extension(name, kernels) for name, kernels in MODULES.items()],
      cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
      options={"build_ext": {"parallel": os.cpu_count() or 1}})
