"""CPU: the row-major -> column-major cuBLAS mapping (rowmajor.describe_gemm), checked against a
NumPy model of what cuBLAS does with the arguments cygemm would pass (tests/refs/cublas.py), and
the batched output's overlap check on fixed cases. No GPU is touched, and nothing here needs
hypothesis: the property tests (the overlap check against brute force among them) are in
tests/engine/test_mapping_properties.py, which skips alone where hypothesis is missing."""
import itertools

import numpy as np
import pytest

import cygemm.rowmajor as cg
from fakes import BASE, FakeDeviceArray as F, fake_view
from refs.cublas import cublas_gemm_model

ITEM = 4  # float32: the buffers' element size, in bytes


def layouts(rows, cols, rng, buf, cursor):
    """Views of logical shape (rows, cols) in every layout cuBLAS can read, carved from buf."""
    def carve(size):
        start = cursor[0]
        cursor[0] += size + 3          # a gap, so that views never touch
        return buf[start:start + size]

    out = {}
    out["C"] = carve(rows * cols).reshape(rows, cols)
    out["F"] = carve(rows * cols).reshape(cols, rows).T
    out["C-padded"] = carve(rows * (cols + 5)).reshape(rows, cols + 5)[:, 2:cols + 2]
    out["F-padded"] = carve(cols * (rows + 4)).reshape(cols, rows + 4)[:, 1:rows + 1].T
    for v in out.values():
        v[...] = rng.standard_normal(v.shape)
    return out


SIZES = [(1, 1, 1), (1, 7, 3), (7, 1, 5), (5, 6, 1), (7, 5, 9), (33, 17, 8)]


@pytest.mark.parametrize("m,k,n", SIZES)
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([False, True], repeat=2)))
def test_mapping_matches_numpy_for_every_layout(m, k, n, trans_a, trans_b):
    rng = np.random.default_rng(hash((m, k, n, trans_a, trans_b)) % 2**32)
    buf = np.zeros(200_000, np.float32)
    cursor = [0]
    a_shape = (k, m) if trans_a else (m, k)
    b_shape = (n, k) if trans_b else (k, n)
    A = layouts(*a_shape, rng, buf, cursor)
    B = layouts(*b_shape, rng, buf, cursor)
    C = layouts(m, n, rng, buf, cursor)
    for (la, a), (lb, b), (lc, c) in itertools.product(A.items(), B.items(), C.items()):
        c[...] = np.nan
        d = cg.describe_gemm(fake_view(buf, a), fake_view(buf, b), fake_view(buf, c),
                             trans_a=trans_a, trans_b=trans_b)
        before = buf.copy()
        cublas_gemm_model(buf, d)
        opa = a.T if trans_a else a
        opb = b.T if trans_b else b
        ref = opa.astype(np.float64) @ opb.astype(np.float64)
        np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5,
                                   err_msg=f"A {la}, B {lb}, out {lc}: {d}")
        # Nothing outside `out` was written.
        mask = np.ones(buf.shape, bool)
        mask[_indices(buf, c)] = False
        np.testing.assert_array_equal(buf[mask], before[mask])


def _indices(buf, view):
    start = (view.__array_interface__["data"][0] - buf.__array_interface__["data"][0]) // ITEM
    s0, s1 = (s // ITEM for s in view.strides)
    return (start + s0 * np.arange(view.shape[0])[:, None] + s1 * np.arange(view.shape[1])[None, :]).ravel()


def test_no_transposes_is_the_textbook_swap():
    buf = np.zeros(10_000, np.float32)
    a = buf[:6].reshape(2, 3)
    b = buf[100:112].reshape(3, 4)
    c = buf[200:208].reshape(2, 4)
    d = cg.describe_gemm(fake_view(buf, a), fake_view(buf, b), fake_view(buf, c))
    # C^T = B^T A^T: cuBLAS gets (N, N, n=4, m=2, k=3, B, ldb=4, A, lda=3, C, ldc=4).
    assert (d["opa"], d["opb"], d["m"], d["n"], d["k"]) == ("N", "N", 4, 2, 3)
    assert (d["a"], d["lda"], d["b"], d["ldb"], d["c"], d["ldc"]) == (
        BASE + 400, 4, BASE, 3, BASE + 800, 4)


@pytest.mark.parametrize("bcast", ["none", "A-stride0", "B-2d", "A-batch1"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_batched_mapping_matches_numpy(bcast, trans_a, trans_b):
    rng = np.random.default_rng(7)
    batch, m, k, n = 3, 5, 4, 6
    buf = rng.standard_normal(50_000).astype(np.float32)
    a_shape = (k, m) if trans_a else (m, k)
    b_shape = (n, k) if trans_b else (k, n)
    A = buf[:batch * 40].reshape(batch, 40)[:, :a_shape[0] * a_shape[1]].reshape(batch, *a_shape)
    B = buf[1000:1000 + batch * b_shape[0] * b_shape[1]].reshape(batch, *b_shape)
    if bcast == "A-stride0":
        A = np.broadcast_to(A[0], (batch, *a_shape))
    elif bcast == "B-2d":
        B = B[0]
    elif bcast == "A-batch1":
        A = A[:1]
    C = buf[5000:5000 + batch * 50].reshape(batch, 50)[:, 3:3 + m * n].reshape(batch, m, n)
    C[...] = np.nan
    d = cg.describe_gemm(fake_view(buf, A), fake_view(buf, B), fake_view(buf, C),
                         trans_a=trans_a, trans_b=trans_b, batched=True)
    assert d["strided_batched"] and d["batch"] == batch
    cublas_gemm_model(buf, d, batched=True)
    A3 = np.broadcast_to(A, (batch, *a_shape))
    B3 = np.broadcast_to(B, (batch, *b_shape))
    opa = np.swapaxes(A3, 1, 2) if trans_a else A3
    opb = np.swapaxes(B3, 1, 2) if trans_b else B3
    np.testing.assert_allclose(C, opa.astype(np.float64) @ opb, rtol=1e-5, atol=1e-5)


def test_sizes_past_int32_take_the_64bit_api():
    n = 2**31 + 5
    d = cg.describe_gemm(F((n, 1)), F((1, 2)), F((n, 2), ptr=BASE + 2**40))
    assert (d["m"], d["n"], d["k"], d["ldc"]) == (2, n, 1, 2) and d["int64_api"]
    small = cg.describe_gemm(F((64, 64)), F((64, 64)), F((64, 64), ptr=BASE + 2**20))
    assert not small["int64_api"]


def test_empty_arrays_with_zero_strides_are_accepted():
    # CuPy and NumPy give empty arrays strides of 0; the layout check must not refuse them.
    d = cg.describe_gemm(F((0, 5), strides=(0, 0)), F((5, 4)), F((0, 4), strides=(0, 0), ptr=BASE + 2**20))
    assert (d["m"], d["n"], d["k"]) == (4, 0, 5)
    d = cg.describe_gemm(F((3, 5, 0), strides=(0, 0, 0)), F((3, 0, 6), strides=(0, 0, 0)),
                         F((3, 5, 6), ptr=BASE + 2**20), batched=True)
    assert d["k"] == 0 and d["batch"] == 3


# ---- a batched output's matrices must not overlap: exact for any batch stride (issue 10, item 4)
# (against brute force over many strides: test_mapping_properties.py, with hypothesis)

def test_interleaved_heads_in_one_buffer_are_accepted():
    S, H, D, K = 96, 4, 32, 48
    buf = np.zeros((S, H * D), np.float32)
    out = fake_view(buf, buf.reshape(S, H, D).transpose(1, 0, 2))     # batch stride D < rows * ld
    # A and B elsewhere: describe_gemm refuses an out overlapping them, as gemm does
    d = cg.describe_gemm(F((H, S, K), ptr=BASE + 2**25), F((H, K, D), ptr=BASE + 2**24), out, batched=True)
    assert (d["stride_c"], d["ldc"], d["batch"]) == (D, H * D, H)
