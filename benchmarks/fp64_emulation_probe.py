"""Probe: what the loaded cuBLAS does with CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT (79) on this GPU.
cublasGemmEx on the same float64 operands with CUBLAS_COMPUTE_64F (70) and with 79; prints the
status, the median time of each and the relative difference from the native product (0 and the
same time: cuBLAS ran native FP64). CUDA events after warm-up.
    python benchmarks/fp64_emulation_probe.py [N ...]"""
import statistics
import sys

import cupy as cp
import numpy as np
from cupy_backends.cuda.libs import cublas

CUDA_R_64F, COMPUTE_64F, COMPUTE_64F_EMULATED = 1, 70, 79


def gemm(handle, a, b, c, compute, alpha, beta):
    n = a.shape[0]
    cublas.gemmEx(handle, 0, 0, n, n, n, alpha.ctypes.data, a.data.ptr, CUDA_R_64F, n, b.data.ptr, CUDA_R_64F, n,
                  beta.ctypes.data, c.data.ptr, CUDA_R_64F, n, compute, -1)


def main(sizes):
    handle = cp.cuda.device.get_cublas_handle()
    alpha, beta = np.array(1.0), np.array(0.0)
    print("cuBLAS", cublas.getVersion(handle), "device", cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    for n in sizes:
        rng = np.random.default_rng(3)
        a = cp.asarray(rng.standard_normal((n, n)))
        b = cp.asarray(rng.standard_normal((n, n)))
        native = cp.empty((n, n))
        gemm(handle, a, b, native, COMPUTE_64F, alpha, beta)
        for name, compute in (("native 64F", COMPUTE_64F), ("64F_EMULATED_FIXEDPOINT", COMPUTE_64F_EMULATED)):
            c = cp.full((n, n), cp.nan)
            try:
                gemm(handle, a, b, c, compute, alpha, beta)
                cp.cuda.Device().synchronize()
            except Exception as e:          # noqa: BLE001 (the probe reports any refusal)
                print(f"{n}^3 {name}: refused: {e}")
                continue
            times = []
            for _ in range(7):
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record()
                for _ in range(3):
                    gemm(handle, a, b, c, compute, alpha, beta)
                e1.record()
                e1.synchronize()
                times.append(cp.cuda.get_elapsed_time(e0, e1) / 3)
            diff = float(cp.linalg.norm(c - native) / cp.linalg.norm(native))
            ms = statistics.median(times)
            print(f"{n}^3 {name}: {ms:.3f} ms, {2 * n ** 3 / ms / 1e9:.1f} TFLOP/s, rel. diff from native {diff:.2e}, "
                  f"bit-identical {bool(cp.array_equal(c, native))}")


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [4096, 8192])
