"""CPU: complex operands and conjugate transposes through the one mapping (cygemm.engine.mapping's
conjugate_ops, read by rowmajor's argument path): every memory order of A, B and out with
trans "N", "T" and "H", described by describe_gemm and run by the NumPy model of cuBLAS
(tests/refs/cublas.py, op "C" included) over the host arrays' own memory, against NumPy's
product. Where cuBLAS has no op for a conjugate (conj without a transpose), describe_gemm
refuses, naming the operand, and gemm reads a conjugated copy instead (GPU tests)."""
import itertools

import numpy as np
import pytest

import cygemm
from refs.cublas import cublas_gemm_model


def _place(mem, at, shape, order):
    """A view into mem at element `at`, of `shape`, C- or F-ordered."""
    n = shape[0] * shape[1]
    flat = mem[at:at + n]
    return flat.reshape(shape) if order == "C" else flat.reshape(shape[::-1]).T


def _op(x, trans):
    return x if trans == "N" else (x.T if trans == "T" else x.conj().T)


CASES = list(itertools.product("CF", "CF", "CF", "NTH", "NTH"))


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("oa, ob, oc, ta, tb", CASES)
def test_every_order_and_conjugate_maps_to_cublas_or_is_refused_by_name(dtype, oa, ob, oc, ta, tb):
    M, K, N = 5, 4, 3
    rng = np.random.default_rng(hash((oa, ob, oc, ta, tb)) % 2**32)
    mem = np.zeros(400, dtype)
    a = _place(mem, 0, (M, K) if ta == "N" else (K, M), oa)
    b = _place(mem, 100, (K, N) if tb == "N" else (N, K), ob)
    c = _place(mem, 200, (M, N), oc)
    a[...] = rng.integers(-3, 4, a.shape) + 1j * rng.integers(-3, 4, a.shape)
    b[...] = rng.integers(-3, 4, b.shape) + 1j * rng.integers(-3, 4, b.shape)
    c[...] = np.nan
    want = _op(a, ta).astype(np.complex128) @ _op(b, tb)
    try:
        d = cygemm.describe_gemm(a, b, c, trans_a=ta, trans_b=tb)
    except ValueError as e:
        # Only a conjugated operand can be refused, and only where its op would be N.
        assert "H" in (ta, tb), str(e)
        name = str(e).split(":")[0]
        assert name in ("A", "B") and (ta if name == "A" else tb) == "H"
        assert "conj(" in str(e) and "without a transpose" in str(e)
        return
    assert ("C" in (d["opa"], d["opb"])) == ("H" in (ta, tb))
    cublas_gemm_model(mem, d, base=mem.__array_interface__["data"][0], itemsize=mem.itemsize)
    np.testing.assert_array_equal(c, want, err_msg=str(d))


def test_each_conjugate_is_refused_in_exactly_one_memory_order():
    """conj without a transpose arises in one of A's two orders for a given out order: the
    other order maps, so a copy in that order (or gemm's conjugated copy) always runs."""
    for oc, which in itertools.product("CF", ("A", "B")):
        refused = []
        for order in "CF":
            shape_a, shape_b = ((4, 5), (4, 3))
            mem = np.zeros(100, np.complex64)
            a = _place(mem, 0, shape_a if which == "A" else (5, 4), order if which == "A" else "C")
            b = _place(mem, 40, (3, 4) if which == "B" else (4, 3), order if which == "B" else "C")
            c = _place(mem, 70, (5, 3), oc)
            try:
                cygemm.describe_gemm(a, b, c, trans_a="H" if which == "A" else "N",
                                     trans_b="H" if which == "B" else "N")
            except ValueError:
                refused.append(order)
        assert len(refused) == 1, (oc, which, refused)


@pytest.mark.parametrize("trans", [True, "T", "t", "H", "C", "h"])
def test_real_operands_take_every_transpose_name_and_ignore_conjugation(trans):
    d = cygemm.describe_gemm(((4, 3), "float64"), ((5, 3), "float64"), trans_b=trans)
    assert d["opa"] in ("N", "T") and d["opb"] in ("N", "T") and d["K"] == 3


@pytest.mark.parametrize("value", ["X", 2, None, "NT"])
def test_a_bad_transpose_name_is_refused(value):
    with pytest.raises(ValueError, match=r"trans_b: expected False/True or 'N', 'T', 'H'"):
        cygemm.describe_gemm(((4, 3), "complex64"), ((3, 5), "complex64"), trans_b=value)


def test_complex_alpha_needs_complex_operands():
    from fakes import FakeDeviceArray
    A, B, C = FakeDeviceArray((4, 3)), FakeDeviceArray((3, 5)), FakeDeviceArray((4, 5))
    with pytest.raises(ValueError, match=r"alpha: a complex value \(\(1\+2j\)\) needs complex operands, got float32"):
        cygemm.gemm(A, B, C, alpha=1 + 2j)
    with pytest.raises(TypeError, match="beta: expected a number, got str"):
        cygemm.gemm(A, B, C, beta="x")


def test_matmul_describes_complex_products_on_cublas_and_promotes_with_reals():
    [d] = cygemm.describe_matmul(((4, 3), "complex128"), ((3, 2), "complex128"))
    assert d["path"] == "cublas" and d["opa"] == "N"
    with pytest.raises(ValueError, match="matmul would cast both to complex128"):
        cygemm.describe_matmul(((4, 3), "complex64"), ((3, 2), "float64"))


@pytest.mark.parametrize("value, words", [("N", None), ("T", None), ("X", "trans_a: expected")])
def test_grouped_takes_the_same_transpose_names_and_refuses_others(value, words):
    a, b = ((4, 3), "float32"), ((3, 5), "float32")
    if value == "T":
        a = ((3, 4), "float32")
    if words:
        with pytest.raises(ValueError, match=words):
            cygemm.describe_grouped([a], [b], [((4, 5), "float32")], trans_a=value)
        return
    d = cygemm.describe_grouped([a], [b], [((4, 5), "float32")], trans_a=value)
    assert d["per_group"][0]["K"] == 3           # "N" is not read as a truthy flag
