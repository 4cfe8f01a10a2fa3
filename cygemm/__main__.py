"""python -m cygemm: a short self-check. Without a GPU it says so and checks the build only."""
import sys
import time

import numpy as np

import cygemm


def main():
    print(f"cygemm {cygemm.__version__}; built against {cygemm.versions()}")
    reason = cygemm.gpu_unavailable_reason()
    if reason:
        print(f"No GPU check here: {reason}.")
        print("What works without a GPU: the build, `import cygemm`, cygemm.get_include() and "
              "Cython modules that cimport cygemm (they compile), argument checking; every GEMM needs a GPU.")
        print("include folders:", *cygemm.get_include(), sep="\n  ")
        return 0
    import cupy as cp
    n = cp.cuda.runtime.getDeviceCount()
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    print(f"GPU: {name} ({n} device(s)), CuPy {cp.__version__}")
    rng = np.random.default_rng()
    ok = True
    for dtype, math, bound in [("float32", "tf32", 2e-3), ("float32", "fp32", 1e-5), ("float16", "tf32", 1e-2)]:
        a = rng.standard_normal((257, 129)).astype(dtype)
        b = rng.standard_normal((129, 65)).astype(dtype)
        out = cp.full((257, 65), cp.nan, dtype)
        cygemm.gemm(cp.asarray(a), cp.asarray(b), out, math=math)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        err = np.linalg.norm(out.get() - ref) / np.linalg.norm(ref)
        ok &= bool(err < bound)
        print(f"  gemm {dtype:8s} {math}: rel. error {err:.1e} (bound {bound:.0e}) {'ok' if err < bound else 'FAIL'}")
    a = rng.standard_normal((64, 33, 17)).astype(np.float32)
    b = rng.standard_normal((17, 9)).astype(np.float32)
    out = cygemm.gemm_strided_batched(cp.asarray(a), cp.asarray(b), math="fp32")
    err = np.linalg.norm(out.get() - a.astype(np.float64) @ b) / np.linalg.norm(a.astype(np.float64) @ b)
    ok &= bool(err < 1e-5)
    print(f"  gemm_strided_batched (B broadcast): rel. error {err:.1e} {'ok' if err < 1e-5 else 'FAIL'}")

    A, B, C = (cp.asarray(rng.standard_normal((64, 64)).astype(np.float32)) for _ in range(3))
    for name, fn in [("cygemm.gemm", lambda: cygemm.gemm(A, B, C)), ("cp.matmul", lambda: cp.matmul(A, B, out=C))]:
        for _ in range(200):
            fn()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(3000):
            fn()
        cp.cuda.Device().synchronize()
        print(f"  64x64x64 float32, host time per call: {name:12s} {(time.perf_counter() - t0) / 3000 * 1e6:6.2f} us")
    print("self-check", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
