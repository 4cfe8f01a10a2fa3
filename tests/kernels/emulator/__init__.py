"""cygemm's CUDA kernel files compiled for the CPU (cuda_on_cpu.h beside this file): their launch
logic and kernels run on host memory, so their index arithmetic is tested without a GPU.

``build(name)`` compiles ``cygemm/kernels/<name>.cu`` with the host C++ compiler into a shared
library loaded by ctypes, its ``extern "C"`` functions as they are. Three rewrites make the file C++:
each ``kernel<<<grid, block, smem, stream>>>(args)`` becomes ``cuda_on_cpu::launch(kernel, grid,
block, smem, stream, args)``; an ``extern __shared__ T name[];`` a pointer to the emulator's
shared memory; a static ``__shared__ T name[n];`` a static that each block refills with 0xFF bytes.

Floating point is contracted as nvcc contracts it by default (``--fmad=true``): the host compiler
may fuse a multiply and an add into one FMA (``-ffp-contract=fast``, with the CPU's FMA
instructions). Which pairs either compiler fuses is its own choice, so where a kernel promises
bits it writes its FMAs out (``fmaf``), and those bits are the GPU's; a kernel that leaves the
choice to the compiler gets the GPU's bits only where both choose alike. The tensor cores' sums
(``mma``) are emulated in K order, in fp32: their order and rounding inside the instruction are
the hardware's, so those tiles promise no bits across machines. Built once per source text, in a folder of the caller's choosing.
"""
import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
KERNELS = os.path.join(ROOT, "cygemm", "kernels")

_LAUNCH = re.compile(r"([\w:]+(?:<[^;<>]*>)?)<<<(.+?)>>>\((.*?)\);", re.S)
_DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w:][\w:\s]*?)\s+(\w+)\[\];")
# A static one: `__shared__ [__align__(n)] T name[...]...;` (one variable a declaration).
_STATIC_SHARED = re.compile(r"(?<!extern )__shared__[ \t]+((?:__align__\(\d+\)[ \t]+)?[\w:][\w: \t]*?[ \t]+(\w+)(?:\[[^\];\n]+\])*)[ \t]*;")


class Unavailable(RuntimeError):
    """No kernel source, host C++ compiler or CUDA headers to build with (the reason is the message)."""


def _compiler():
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise Unavailable("no host C++ compiler (g++ or c++ on PATH, or $CXX)")
    return cxx


def _cuda_include():
    from cygemm.bindings import cuda_paths
    try:
        nvcc = cuda_paths.find_nvcc()
    except Exception as e:                  # (its own error type names what is missing)
        raise Unavailable(f"the CUDA toolkit's headers: {e}") from e
    include = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include")
    if not os.path.isfile(os.path.join(include, "cuda_fp16.h")):
        raise Unavailable(f"cuda_fp16.h not found in {include}")
    return include


def _contraction():
    """The host compiler's flags that contract a * b + c into an FMA, as nvcc does by default:
    -ffp-contract=fast, and on x86 the FMA instructions where this CPU has them (else a fused
    multiply-add would be a library call, or none). GCC fuses in a pass that -O1 leaves out:
    -fexpensive-optimizations turns it on."""
    flags = ["-ffp-contract=fast", "-fexpensive-optimizations"]
    if platform.machine() in ("x86_64", "AMD64"):
        try:
            with open("/proc/cpuinfo") as f:
                has_fma = " fma " in f.read().replace("\n", " ")
        except OSError:
            has_fma = False
        if has_fma:
            flags.append("-mfma")
    return flags


def translate(source):
    """The kernel file's text as C++ for the emulator (the three rewrites)."""
    source = _DYNAMIC_SHARED.sub(lambda m: f"{m[1]}* {m[2]} = reinterpret_cast<{m[1]}*>(cuda_on_cpu::shared);",
                                 source)
    source = _STATIC_SHARED.sub(
        lambda m: f"static {m[1]}; cuda_on_cpu::fresh_static_shared(&{m[2]}, sizeof({m[2]}));", source)
    return _LAUNCH.sub(lambda m: f"cuda_on_cpu::launch({m[1]}, {m[2]}, {m[3]});", source)


HARNESS = """#include "cuda_on_cpu.h"
{defines}
{source}
extern "C" void cuda_on_cpu_set_sm_count(int n) {{ cuda_on_cpu::sm_count = n; }}
extern "C" long long cuda_on_cpu_launches() {{ return cuda_on_cpu::launches; }}
extern "C" long long cuda_on_cpu_async_copies() {{ return cuda_on_cpu::async_copies; }}
extern "C" void cuda_on_cpu_copies_land(int at_issue) {{ cuda_on_cpu::copies_land_at_issue = at_issue; }}
"""


def build(name, folder, defines=(), source=None):
    """``cygemm/kernels/<name>.cu`` built for the CPU in `folder` with the macros `defines` (names,
    each defined as 1), loaded: a ctypes.CDLL. source: CUDA text to build instead of the file
    (the emulator's own tests)."""
    if source is None:
        path = os.path.join(KERNELS, f"{name}.cu")
        if not os.path.isfile(path):            # (the tests run against an installed wheel, which has no .cu)
            raise Unavailable(f"the kernel's source {path} is not in this tree")
        with open(path) as f:
            source = f.read()
    text = HARNESS.format(defines="".join(f"#define {d} 1\n" for d in defines), source=translate(source))
    with open(os.path.join(HERE, "cuda_on_cpu.h")) as f:
        digest = hashlib.sha256((text + f.read() + " ".join(_contraction())).encode()).hexdigest()[:16]
    lib = os.path.join(folder, f"{name}_{digest}.so")
    if not os.path.exists(lib):
        cxx, include = _compiler(), _cuda_include()
        src = os.path.join(folder, f"{name}_{digest}.cpp")
        with open(src, "w") as f:
            f.write(text)
        # -fno-gnu-unique: two builds loaded in one process keep their own inline statics.
        # -Bsymbolic: the kernel's calls of the runtime (cudaGetLastError, ...) bind to the
        # emulator's own, not to a CUDA runtime that torch or CuPy loaded into the global scope.
        cmd = [cxx, "-std=c++20", "-O1", "-g0", "-shared", "-fPIC", "-w", "-fno-gnu-unique", "-Wl,-Bsymbolic",
               *_contraction(), "-I", HERE,
               "-I", os.path.join(ROOT, "include"), "-I", include, src, "-o", lib + ".tmp"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"building {name}.cu for the CPU failed:\n{' '.join(cmd)}\n{done.stderr[-4000:]}")
        os.replace(lib + ".tmp", lib)
    return ctypes.CDLL(lib)


def build_or_skip(name, tmp_path_factory, source=None):
    """build() into a fresh folder of pytest's tmp_path_factory, or skip the calling test (module
    fixture) with the reason where it cannot be built here (no compiler, headers or source)."""
    import pytest
    try:
        return build(name, str(tmp_path_factory.mktemp(f"{name}_cpu")), source=source)
    except Unavailable as e:
        pytest.skip(f"{name} cannot be built for the CPU here: {e}")
