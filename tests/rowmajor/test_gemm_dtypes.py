"""GPU: float64 and complex GEMMs through every entry point (gemm, gemm_strided_batched,
GemmPlan, matmul) against complex128 / float64 NumPy references on fresh random inputs (real and
imaginary parts both nonzero), outputs poisoned with NaN first: every transpose and conjugate
transpose in C and F order (conjugate copies where cuBLAS has no op), complex alpha and beta,
strict and TF32 complex64, the conversions of matmul's promotion."""
import itertools

import numpy as np
import pytest

import cygemm

pytestmark = pytest.mark.gpu

# relative Frobenius bounds: fp64 ~1e-13 at these K; strict fp32 ~1e-5; TF32 ~1e-3 (sqrt K)
TOL = {("complex128", "fp32"): 1e-12, ("float64", "fp32"): 1e-12, ("complex64", "fp32"): 2e-5,
       ("complex64", "tf32"): 5e-3}


def _rand(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _op(x, trans):
    return x if trans == "N" else (x.T if trans == "T" else x.conj().T)


def _err(got, want):
    got = np.asarray(got)
    assert not np.isnan(got).any(), "elements left unwritten"
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@pytest.mark.parametrize("dtype", ["float64", "complex64", "complex128"])
@pytest.mark.parametrize("oa, ob, oc, ta, tb", [c for c in itertools.product("CF", "CF", "CF", "NTH", "NTH")
                                                 if c[3] == "H" or c[4] == "H" or c[:3] in (("C", "C", "C"),
                                                                                            ("F", "F", "F"))])
def test_gemm_every_order_and_transpose(dtype, oa, ob, oc, ta, tb):
    import cupy as cp
    rng = np.random.default_rng()
    M, K, N = 37, 29, 23
    a = _rand(rng, (M, K) if ta == "N" else (K, M), dtype)
    b = _rand(rng, (K, N) if tb == "N" else (N, K), dtype)
    c0 = _rand(rng, (M, N), dtype)
    alpha, beta = (0.9 - 0.7j, 0.8 - 0.6j) if dtype.startswith("complex") else (1 / 3, 0.1)
    want = alpha * (_op(a, ta).astype(np.complex128) @ _op(b, tb)) + beta * c0
    A = cp.asarray(a, order=oa)
    B = cp.asarray(b, order=ob)
    C = cp.asarray(c0, order=oc)
    cp.cuda.Device().synchronize()      # the copies above ran on the null stream, which s does not wait for
    s = cp.cuda.Stream(non_blocking=True)
    out = cygemm.gemm(A, B, C, trans_a=ta, trans_b=tb, alpha=alpha, beta=beta, math="fp32", stream=s)
    s.synchronize()
    assert out is C
    assert _err(cp.asnumpy(C), want) < TOL[(dtype, "fp32")]
    np.testing.assert_array_equal(cp.asnumpy(A), a)          # a conjugated copy never writes back


@pytest.mark.parametrize("dtype, math", [("complex64", "tf32"), ("complex64", "fp32"), ("complex128", "fp32"),
                                         ("float64", "fp32")])
@pytest.mark.parametrize("M, K, N", [(512, 384, 256), (1, 700, 5)])
def test_large_and_thin_products_run_planned_and_direct(dtype, math, M, K, N):
    import cupy as cp
    rng = np.random.default_rng()
    a, b = _rand(rng, (M, K), dtype), _rand(rng, (N, K), dtype)
    out = cp.full((M, N), np.nan, dtype=dtype)
    cygemm.gemm(cp.asarray(a), cp.asarray(b), out, trans_b="H", math=math)
    want = a.astype(np.complex128) @ b.conj().T
    assert _err(cp.asnumpy(out), want) < TOL[(dtype, math)] * max(1, (K / 256) ** 0.5)


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
def test_strided_batched_and_plans(dtype):
    import cupy as cp
    rng = np.random.default_rng()
    a, b = _rand(rng, (4, 9, 7), dtype), _rand(rng, (7, 5), dtype)
    out = cp.full((4, 9, 5), np.nan, dtype=dtype)
    cygemm.gemm_strided_batched(cp.asarray(a), cp.asarray(b), out, alpha=2.0)
    assert _err(cp.asnumpy(out), 2.0 * np.matmul(a.astype(np.complex128), b)) < 1e-12
    A, B = cp.asarray(a[0]), cp.asarray(b)
    C = cp.full((9, 5), np.nan, dtype=dtype)
    plan = cygemm.GemmPlan(A, B, C, alpha=0.5)
    plan.execute()
    assert _err(cp.asnumpy(C), 0.5 * (a[0].astype(np.complex128) @ b)) < 1e-12
    plan.close()


@pytest.mark.parametrize("ta, tb", [("N", "N"), ("H", "N"), ("N", "T")])
def test_matmul_and_cupys_agree_on_complex_and_promotion(ta, tb):
    import cupy as cp
    rng = np.random.default_rng()
    a = _rand(rng, (3, 20, 11), "complex64")
    b = _rand(rng, (11, 6), "float64")
    got = cygemm.matmul(cp.asarray(a), cp.asarray(b), math="fp32")
    assert got.dtype == np.complex128                           # NumPy's promotion
    assert _err(cp.asnumpy(got), np.matmul(a.astype(np.complex128), b)) < 1e-6
    [d] = cygemm.describe_matmul(cp.asarray(a), cp.asarray(a[0].T.conj().copy()))
    assert d["path"] == "cublas"
    with pytest.raises(TypeError, match="out: the product of complex64 and float64 is complex128"):
        cygemm.matmul(cp.asarray(a), cp.asarray(b), out=cp.empty((3, 20, 6), cp.float64))


def test_torch_complex_tensors_and_the_conjugate_copy_runs_on_the_calls_stream():
    """The conjugated copy is made on the stream the GEMM runs on (gemm's stream=; None is
    CuPy's current stream for torch tensors too), not on torch's current one."""
    torch = pytest.importorskip("torch")
    a = torch.randn(8, 6, dtype=torch.complex64, device="cuda")
    b = torch.randn(5, 6, dtype=torch.complex64, device="cuda").t()      # (6, 5), F-ordered
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    got = cygemm.gemm(a, b, math="fp32", stream=s)
    got_h = cygemm.gemm(b, a.t(), trans_a="H", math="fp32", stream=s)   # b is F-ordered: a conjugated copy
    s.synchronize()
    assert isinstance(got, torch.Tensor) and got.dtype == torch.complex64
    assert torch.allclose(got, a @ b, atol=1e-4)
    assert torch.allclose(got_h, b.conj().t() @ a.t(), atol=1e-4)


def test_torch_lazy_conjugates_are_refused_not_read_raw():
    """x.conj() / x.mH of a torch tensor keep unconjugated memory and a bit: refused by name."""
    torch = pytest.importorskip("torch")
    a = torch.randn(4, 3, dtype=torch.complex64, device="cuda")
    b = torch.randn(3, 5, dtype=torch.complex64, device="cuda")
    for call in (lambda: cygemm.gemm(a.conj(), b), lambda: cygemm.gemm(a, a.mH),
                 lambda: cygemm.matmul(a.conj(), b)):
        with pytest.raises(ValueError, match="conjugate or negative bit"):
            call()


def test_the_conjugated_copy_of_a_plain_cuda_array_interface_object():
    """gemm takes any __cuda_array_interface__ object; its conjugated copy too (cupy.conj
    takes CuPy arrays only)."""
    import cupy as cp

    class CAI:
        def __init__(self, x):
            self.x = x
            self.__cuda_array_interface__ = x.__cuda_array_interface__

    rng = np.random.default_rng()
    a, b = _rand(rng, (6, 4), "complex128"), _rand(rng, (6, 5), "complex128")
    out = cp.full((4, 5), np.nan, dtype=np.complex128)
    cygemm.gemm(CAI(cp.asarray(a, order="F")), CAI(cp.asarray(b)), out, trans_a="H")   # F-ordered A, "H": a copy
    assert _err(cp.asnumpy(out), a.conj().T @ b) < 1e-12
