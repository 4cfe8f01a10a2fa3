"""What only a GPU runs still compiles in CI: every kernel file's branches that the library build
leaves out (a macro the build does not define: the launch options under measurement, compiled for
the probe and the emulator) compiled by nvcc for Hopper, so that a broken asm operand or a
candidate path that no longer compiles fails here, not in a user's build or on a lent GPU. The
library build itself compiles every file, its asm for each architecture it targets."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNELS = os.path.join(ROOT, "cygemm", "kernels")
# Macros a kernel file tests that are not the build's: the emulator's own, and the compiler's.
NOT_BRANCHES = {"CYGEMM_CUDA_ON_CPU", "__CUDA_ARCH__", "__cplusplus"}


def _branches():
    found = []
    if not os.path.isdir(KERNELS):
        return found
    for name in sorted(os.listdir(KERNELS)):
        if not name.endswith(".cu"):
            continue
        text = open(os.path.join(KERNELS, name)).read()
        macros = set(re.findall(r"^#\s*(?:if|ifdef|ifndef|elif)\s+(?:defined\()?(\w+)", text, re.M)) - NOT_BRANCHES
        found += [(name, m) for m in sorted(macros)]
    return found


def test_the_branches_are_found():
    if not os.path.isdir(KERNELS) or not any(n.endswith(".cu") for n in os.listdir(KERNELS)):
        pytest.skip("the kernels' sources are not in this tree (an installed wheel)")
    assert ("small_batched.cu", "CYGEMM_SMALL_BATCHED_CANDIDATES") in _branches()


@pytest.mark.parametrize("kernel,macro", _branches())
def test_the_branch_compiles_for_hopper(kernel, macro, tmp_path):
    from cygemm.bindings import cuda_paths
    try:
        nvcc = cuda_paths.find_nvcc()
        cublas = cuda_paths.header_dir("cublas")
    except Exception as e:
        pytest.skip(f"nvcc or the cuBLAS headers are not here: {e}")
    done = subprocess.run([nvcc, "-c", "-std=c++17", "-O3", "-gencode", "arch=compute_90,code=sm_90",
                           f"-D{macro}=1", "-I", os.path.join(ROOT, "include"), "-I", cublas,
                           os.path.join(KERNELS, kernel), "-o", str(tmp_path / "k.o")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
