"""The emulator itself (tests/kernels/emulator): what makes it stricter than one GPU schedule
fails a kernel that depends on luck. CPU."""
import ctypes

import numpy as np
import pytest

import emulator

FAILURE = 719                   # cudaErrorLaunchFailure

# `variant` picks a kernel with a defect the emulator must show, or a rule it must keep.
SOURCE = r"""
#include <cuda_runtime_api.h>
__global__ void two_barriers(float* out) {
    if (threadIdx.x < 16) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1.f;
}
__global__ void missing_barrier(float* out, int rounds) {
    __shared__ float last[2];
    for (int r = 0; r < rounds; ++r) {
        if (threadIdx.x % 32 == 0) last[threadIdx.x / 32] = float(r * 2 + threadIdx.x / 32);
        __syncthreads();
        const float seen = last[0] + last[1];
        out[r * 64 + threadIdx.x] = seen;       // no barrier before last is written again
    }
}
__global__ void shuffle_sum(float* out) {
    float v = float(threadIdx.x);
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    out[threadIdx.x] = v;
}
__global__ void stale_static(float* out) {
    __shared__ float kept[32];
    if (blockIdx.x == 0) kept[threadIdx.x] = 1.f;      // (block 1 reads what it never wrote)
    __syncthreads();
    out[blockIdx.x * 32 + threadIdx.x] = kept[threadIdx.x];
}
__global__ void multiply_add(float* out) {
    if (threadIdx.x == 0) out[3] = out[0] * out[1] + out[2];
}
extern "C" int run(int variant, float* out, int rounds) {
    if (variant == 0) two_barriers<<<dim3(1), dim3(64), 0, nullptr>>>(out);
    else if (variant == 1) missing_barrier<<<dim3(1), dim3(64), 0, nullptr>>>(out, rounds);
    else if (variant == 2) shuffle_sum<<<dim3(1), dim3(64), 0, nullptr>>>(out);
    else if (variant == 3) stale_static<<<dim3(2), dim3(32), 0, nullptr>>>(out);
    else multiply_add<<<dim3(1), dim3(32), 0, nullptr>>>(out);
    return cudaGetLastError();
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emulator.build_or_skip("emulator_check", tmp_path_factory, source=SOURCE)
    lib.run.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    lib.run.restype = ctypes.c_int
    return lib


def test_threads_at_different_barriers_fail_the_launch(lib):
    out = np.full(64, np.nan, np.float32)
    assert lib.run(0, out.ctypes.data, 0) == FAILURE


def test_a_missing_barrier_before_shared_memory_is_reused_shows_under_some_schedule(lib):
    """Launch after launch the block takes another of the schedules; under the warp-at-a-time one,
    warp 0 writes the next round's value before warp 1 has read this round's."""
    rounds = 3
    wrong = 0
    for _ in range(3):
        out = np.full(64 * rounds, np.nan, np.float32)
        assert lib.run(1, out.ctypes.data, rounds) == 0
        want = np.repeat([4.0 * r + 1 for r in range(rounds)], 64)
        wrong += int(np.sum(out != want))
    assert wrong > 0


def test_a_shuffle_exchanges_within_each_warp(lib):
    out = np.full(64, np.nan, np.float32)
    assert lib.run(2, out.ctypes.data, 0) == 0
    assert np.array_equal(out, np.r_[np.full(32, sum(range(32))), np.full(32, sum(range(32, 64)))].astype(np.float32))


IMPOSTOR = r"""
extern "C" int cudaGetLastError() { return 0; }
extern "C" int cudaPeekAtLastError() { return 0; }
"""

IN_A_PROCESS_WITH_THE_CUDA_RUNTIME = r"""
import ctypes, os, subprocess, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import emulator
folder = sys.argv[2]
impostor = os.path.join(folder, "libimpostor.so")
with open(impostor + ".cpp", "w") as f:
    f.write(sys.argv[3])
subprocess.run([emulator._compiler(), "-shared", "-fPIC", impostor + ".cpp", "-o", impostor], check=True)
ctypes.CDLL(impostor, mode=ctypes.RTLD_GLOBAL)        # as torch and CuPy load the CUDA runtime
lib = emulator.build("emulator_check", folder, source=sys.argv[4])
lib.run.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
out = np.full(64, np.nan, np.float32)
print(lib.run(0, out.ctypes.data, 0))
"""


def test_the_emulators_runtime_is_its_own_beside_a_globally_loaded_cuda_runtime(lib, tmp_path):
    """torch and CuPy load the CUDA runtime into the process's global scope; an emulated kernel's
    calls of cudaGetLastError() must still reach the emulator's, not theirs (the GPU's suite runs
    the emulator tests after torch's). In a child process: the stand-in stays out of this one."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(emulator.__file__))
    done = subprocess.run([sys.executable, "-c", IN_A_PROCESS_WITH_THE_CUDA_RUNTIME, os.path.dirname(here),
                           str(tmp_path), IMPOSTOR, SOURCE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == str(FAILURE)


def test_each_block_finds_its_static_shared_memory_filled_with_nan(lib):
    """A static __shared__ array written only by block 0 reads as NaN in block 1, whichever of the
    two runs first (on a GPU it would hold whatever was there)."""
    for launch in range(2):                     # (launches alternate the blocks' order)
        out = np.zeros(64, np.float32)
        assert lib.run(3, out.ctypes.data, 0) == 0
        assert (out[:32] == 1).all() and np.isnan(out[32:]).all(), launch


def test_a_multiply_add_is_contracted_into_one_fma_as_nvcc_does(lib):
    """a * b + c rounds once, as nvcc's default --fmad=true makes it on the GPU."""
    if "-mfma" not in emulator._contraction() and emulator.platform.machine() in ("x86_64", "AMD64"):
        pytest.skip("this CPU has no FMA instructions: the emulator cannot contract as nvcc does")
    a = np.float32(1 + 2.0 ** -12)
    out = np.array([a, a, -1, np.nan], np.float32)
    assert lib.run(4, out.ctypes.data, 0) == 0
    fused = np.float32(float(a) * float(a) - 1)         # (exact in float64, then rounded once)
    separate = np.float32(np.float32(a * a) - np.float32(1))
    assert fused != separate
    assert out[3] == fused, (out[3], fused, separate)
