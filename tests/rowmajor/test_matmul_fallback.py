"""matmul for dtypes cygemm's GEMMs do not take (cygemm.rowmajor.matmul_fallback): CuPy's matmul on the
call's stream, NumPy's promotion and exact results, described as such (CPU: which path a call
takes and its description; GPU: results against NumPy, streams, torch tensors, out)."""
import numpy as np
import pytest

import cygemm
from cygemm.rowmajor import matmul_fallback as _matmul_fallback
from fakes import FakeDeviceArray
from fakes import DESCRIBE_KEYS as COMMON


# ------------------------------------------------------------------ CPU: which path

@pytest.mark.parametrize("ta, tb, fallback", [
    ("float32", "float32", False), ("float64", "float64", False), ("bfloat16", "float32", False),
    ("int32", "int32", True), ("int8", "float32", True), ("bool", "bool", True), ("uint8", "int64", True),
    ("complex64", "complex64", False), ("complex128", "complex128", False), ("complex64", "int32", True)])
def test_the_path_follows_the_dtypes(ta, tb, fallback):
    typestr = {"float32": "<f4", "float16": "<f2", "float64": "<f8", "int32": "<i4", "int8": "|i1", "bool": "|b1",
               "uint8": "|u1", "int64": "<i8", "complex64": "<c8", "complex128": "<c16"}
    a, b = ((4, 3), ta), ((3, 5), tb)
    [d] = cygemm.describe_matmul(a, b) if ta != "bfloat16" else cygemm.describe_matmul(a, ((3, 5), "bfloat16"))
    assert d["path"] == ("cupy.matmul" if fallback else "cublas")
    assert list(d) == COMMON + ["route", "path"]
    if ta != "bfloat16":
        fakes = FakeDeviceArray((4, 3), typestr[ta]), FakeDeviceArray((3, 5), typestr[tb])
        assert _matmul_fallback.takes(*fakes) == fallback


def test_a_fallback_description_gives_the_problem_and_no_cublas_call():
    [d] = cygemm.describe_matmul(((6, 1, 4, 3), "int16"), ((5, 3, 2), "float32"))
    assert (d["M"], d["N"], d["K"], d["batch"]) == (4, 2, 3, 30)
    assert all(d[k] is None for k in ("opa", "opb", "m", "n", "k", "lda", "a", "b", "c", "swapped"))
    assert "int16" in d["why"] and "float32" in d["why"] and "CuPy's matmul" in d["why"]
    [v] = cygemm.describe_matmul(((3,), "int32"), ((3,), "int32"))       # 1-D: a row times a column
    assert (v["M"], v["N"], v["K"], v["batch"]) == (1, 1, 3, 1)


def test_host_arrays_stay_refused_and_unknown_dtypes_stay_on_the_gemm_path():
    with pytest.raises(TypeError, match="a: .*NumPy array in host memory"):
        cygemm.matmul(np.ones((2, 2), np.int32), FakeDeviceArray((2, 2), "<i4"))
    assert not _matmul_fallback.takes(np.ones((2, 2), np.int32), np.ones((2, 2), np.int32))
    assert _matmul_fallback.dtype_name(FakeDeviceArray((2, 2), "<V2")) in (None, "void16")
    with pytest.raises(ValueError, match="a's last axis"):
        cygemm.describe_matmul(((3, 4), "int8"), ((5, 2), "int8"))


# ------------------------------------------------------------------ GPU: results

def _ints(rng, shape, dtype, lo=-50, hi=50):
    return rng.integers(lo, hi, shape).astype(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("ta, tb", [("int32", "int32"), ("int8", "int8"), ("int16", "float32"), ("uint8", "int64"),
                                    ("bool", "bool"), ("int64", "float64")])
@pytest.mark.parametrize("shapes", [((7, 5), (5, 3)), ((4, 6, 5), (5, 2)), ((5,), (2, 5, 3))])
def test_results_are_numpys_on_a_stream_of_their_own(ta, tb, shapes):
    import cupy as cp
    rng = np.random.default_rng()
    a = _ints(rng, shapes[0], ta) if ta != "bool" else rng.integers(0, 2, shapes[0]).astype(bool)
    b = _ints(rng, shapes[1], tb) if tb != "bool" else rng.integers(0, 2, shapes[1]).astype(bool)
    ref = np.matmul(a, b)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        A, B = cp.asarray(a), cp.asarray(b)
    got = cygemm.matmul(A, B, stream=s)
    s.synchronize()
    assert got.dtype == ref.dtype and got.shape == ref.shape
    if ref.dtype.kind in "iub":
        np.testing.assert_array_equal(cp.asnumpy(got), ref)
    else:
        np.testing.assert_allclose(cp.asnumpy(got), ref, rtol=1e-6)
    # out=: written in place (filled with a sentinel first), returned as given
    with s:
        out = cp.full(ref.shape, 77, dtype=ref.dtype)
    assert cygemm.matmul(A, B, out=out, stream=s) is out
    s.synchronize()
    np.testing.assert_allclose(cp.asnumpy(out), ref, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tol", [("complex64", 1e-5), ("complex128", 1e-12)])
def test_complex_products_match_complex128(dtype, tol):
    import cupy as cp
    from gpu_util import rel_err
    rng = np.random.default_rng()
    a = (rng.standard_normal((3, 33, 17)) + 1j * rng.standard_normal((3, 33, 17))).astype(dtype)
    b = (rng.standard_normal((17, 9)) + 1j * rng.standard_normal((17, 9))).astype(dtype)
    got = cygemm.matmul(cp.asarray(a), cp.asarray(b), math="fp32")      # (complex64: strict, not TF32)
    ref = a.astype(np.complex128) @ b.astype(np.complex128)
    assert got.dtype == np.dtype(dtype)
    diff = np.linalg.norm(cp.asnumpy(got) - ref) / np.linalg.norm(ref)
    assert diff < tol
    assert rel_err(np.abs(cp.asnumpy(got)), np.abs(ref)) < 10 * tol      # (NaN-free)


@pytest.mark.gpu
def test_torch_integer_tensors_give_a_torch_result_and_gradients_are_not_lost_silently():
    torch = pytest.importorskip("torch")
    a = torch.randint(-9, 9, (6, 4), device="cuda", dtype=torch.int32)
    b = torch.randint(-9, 9, (4, 5), device="cuda", dtype=torch.int32)
    got = cygemm.matmul(a, b)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int32
    assert torch.equal(got.cpu(), (a.cpu().long() @ b.cpu().long()).int())   # torch has no CUDA int64 matmul
    x = torch.randn(6, 4, device="cuda", requires_grad=True)       # float @ int: CuPy's path
    with pytest.raises(TypeError, match="use torch.matmul for tensors that require grad"):
        cygemm.matmul(x, b)
    with torch.no_grad():
        assert torch.allclose(cygemm.matmul(x, b), x.double() @ b.double(), atol=1e-4)
    z = torch.randn(4, 4, device="cuda", dtype=torch.complex64, requires_grad=True)   # cuBLAS: recorded
    assert cygemm.matmul(z, z).grad_fn is not None


@pytest.mark.gpu
def test_device_arrays_are_described_as_cupys_path():
    import cupy as cp
    [d] = cygemm.describe_matmul(cp.ones((4, 3), cp.int32), cp.ones((3, 2), cp.int32))
    assert d["path"] == "cupy.matmul" and (d["M"], d["N"], d["K"]) == (4, 2, 3)


def test_float_operands_are_answered_without_naming_dtypes(monkeypatch):
    """matmul asks on every call: float operands (NumPy/CuPy dtypes, torch floating dtypes)
    must not pay for naming their dtypes (microseconds a call)."""
    def no(x):
        raise AssertionError("dtype_name called on the float path")
    monkeypatch.setattr(_matmul_fallback, "dtype_name", no)
    for dtype in ("float16", "float32", "float64"):
        x = np.ones((2, 2), dtype)
        assert _matmul_fallback.takes(x, x) is False
    torch = pytest.importorskip("torch")
    t = torch.ones(2, 2, dtype=torch.bfloat16)
    assert _matmul_fallback.takes(t, t) is False
