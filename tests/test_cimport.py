"""A separate Cython extension cimports cygemm's C API and calls GEMM without Python objects.
Compiling it runs everywhere (CI too); calling it needs a GPU."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cygemm

USER_PYX = textwrap.dedent("""
    from libc.stdint cimport int64_t, uintptr_t
    from cygemm.cudart cimport cudaStream_t, CUDA_R_32F
    from cygemm.cublas cimport CUBLAS_COMPUTE_32F
    from cygemm._core cimport GemmContext, current_context
    from cygemm.rowmajor cimport gemm_rowmajor, gemm_rowmajor_strided_batched

    def sgemm(uintptr_t a, uintptr_t b, uintptr_t c, int64_t m, int64_t n, int64_t k,
              float alpha, float beta, uintptr_t stream):
        cdef GemmContext* ctx = current_context()
        with nogil:
            gemm_rowmajor(ctx, <cudaStream_t>stream, CUDA_R_32F, CUBLAS_COMPUTE_32F,
                          False, True, m, n, k, alpha, <void*>a, k, <void*>b, k,
                          beta, <void*>c, n)

    def sgemm_batched(uintptr_t a, uintptr_t b, uintptr_t c, int64_t m, int64_t n, int64_t k,
                      int64_t batch, uintptr_t stream):
        cdef GemmContext* ctx = current_context()
        with nogil:
            gemm_rowmajor_strided_batched(ctx, <cudaStream_t>stream, CUDA_R_32F, CUBLAS_COMPUTE_32F,
                                          False, False, m, n, k, 1.0, <void*>a, k, m * k,
                                          <void*>b, n, 0, 0.0, <void*>c, n, m * n, batch)
""")

SETUP_PY = textwrap.dedent("""
    import cygemm
    from setuptools import Extension, setup
    from Cython.Build import cythonize
    inc = cygemm.get_include()
    setup(ext_modules=cythonize([Extension("gemm_user", ["gemm_user.pyx"], include_dirs=inc)],
                                include_path=inc, language_level=3), script_args=["build_ext", "--inplace"])
""")


@pytest.fixture(scope="module")
def gemm_user(tmp_path_factory):
    d = tmp_path_factory.mktemp("cimport_user")
    (d / "gemm_user.pyx").write_text(USER_PYX)
    (d / "setup.py").write_text(SETUP_PY)
    proc = subprocess.run([sys.executable, "setup.py"], cwd=d, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sys.path.insert(0, str(d))
    try:
        import gemm_user
        yield gemm_user
    finally:
        sys.path.remove(str(d))


def test_cimport_user_module_compiles_and_imports(gemm_user):
    assert callable(gemm_user.sgemm) and callable(gemm_user.sgemm_batched)


@pytest.mark.gpu
def test_cimport_user_module_computes_gemm(gemm_user):
    import cupy as cp
    rng = np.random.default_rng()
    m, n, k = 33, 17, 40
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32)          # used transposed
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    A, B, C = cp.asarray(a), cp.asarray(b), cp.asarray(c0)
    stream = cp.cuda.Stream(non_blocking=True)
    gemm_user.sgemm(A.data.ptr, B.data.ptr, C.data.ptr, m, n, k, 0.5, 2.0, stream.ptr)
    stream.synchronize()
    ref = 0.5 * a.astype(np.float64) @ b.T.astype(np.float64) + 2.0 * c0
    assert np.linalg.norm(C.get() - ref) / np.linalg.norm(ref) < 1e-5

    batch = 5
    a3 = rng.standard_normal((batch, m, k)).astype(np.float32)
    A3, C3 = cp.asarray(a3), cp.full((batch, m, n), cp.nan, cp.float32)
    Bb = cp.asarray(rng.standard_normal((k, n)).astype(np.float32))   # broadcast, stride 0
    gemm_user.sgemm_batched(A3.data.ptr, Bb.data.ptr, C3.data.ptr, m, n, k, batch, stream.ptr)
    stream.synchronize()
    ref3 = a3.astype(np.float64) @ Bb.get().astype(np.float64)
    assert np.linalg.norm(C3.get() - ref3) / np.linalg.norm(ref3) < 1e-5
