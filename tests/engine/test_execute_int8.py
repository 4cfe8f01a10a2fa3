"""int8 x int8 GEMMs (int_mm, and gemm / gemm_strided_batched with int8 operands): exact int32
sums against int64 NumPy products on fresh random inputs, extremes included, outputs poisoned
first; int8 outputs against the rounded, saturated float64 product; the layout rules refused
before anything runs, with nothing written. The CPU tests use describe_gemm (no GPU)."""
import numpy as np
import pytest

import cygemm

POISON = np.int32(-0x7ABCDEF1)          # no product here is this value


def _ints(rng, shape, low=-128, high=128):
    return rng.integers(low, high, size=shape, dtype=np.int64).astype(np.int8)


# ------------------------------------------------------------------ CPU: the rules, described

def test_described_int8_call_reads_both_operands_along_k():
    d = cygemm.describe_gemm(((64, 32), "int8"), ((16, 32), "int8"), trans_b=True)
    assert (d["opa"], d["opb"], d["m"], d["n"], d["k"]) == ("T", "N", 16, 64, 32)
    assert "int8" in d["kernels"] and "cublasGemmEx" not in d["kernels"]
    f = cygemm.describe_gemm(np.zeros((64, 32), np.int8), np.asfortranarray(np.zeros((32, 16), np.int8)))
    assert (f["opa"], f["opb"]) == ("T", "N")


def test_a_single_row_or_column_is_read_along_k_whatever_its_strides_say():
    w = np.zeros((1, 32), np.int8)          # N = 1: b = w.T is one column, strides (1, 32)
    d = cygemm.describe_gemm(np.zeros((64, 32), np.int8), w.T)
    assert (d["opa"], d["opb"], d["m"], d["n"], d["k"]) == ("T", "N", 1, 64, 32) and d["lda"] % 4 == 0
    x = np.zeros((1, 36), np.int8)          # M = 1
    d = cygemm.describe_gemm(x, np.asfortranarray(np.zeros((36, 8), np.int8)))
    assert (d["opa"], d["opb"], d["n"], d["k"]) == ("T", "N", 1, 36) and d["ldb"] % 4 == 0


def test_refusals_name_the_operand_and_a_fix_that_fits_the_transpose():
    with pytest.raises(ValueError, match=r"^A: .*with trans_a; pass cupy.asfortranarray\(A\)"):
        cygemm.describe_gemm(((32, 64), "int8"), ((16, 32), "int8"), trans_a=True, trans_b=True)
    with pytest.raises(ValueError, match=r"^B: .*with trans_b; pass cupy.ascontiguousarray\(B\)"):
        cygemm.describe_gemm(((64, 32), "int8"), np.asfortranarray(np.zeros((16, 32), np.int8)), trans_b=True)
    # An F-ordered out is not swapped: cuBLAS's A is the user's A, and the message says so.
    b = np.asfortranarray(np.zeros((30, 8), np.int8))
    a = np.zeros((8, 30), np.int8)
    with pytest.raises(ValueError, match=r"^A: .*multiples of 4 elements.*got 30"):
        cygemm.describe_gemm(a, b, np.asfortranarray(np.zeros((8, 8), np.int32)))
    with pytest.raises(ValueError, match=r"^B: .*multiples of 4 elements.*got 30"):
        cygemm.describe_gemm(np.zeros((8, 32), np.int8)[:, :30], b, ((8, 8), "int32"))     # (A's ld: 32)


def test_a_batch_stride_off_four_bytes_is_refused():
    buf = np.zeros(3 * 66, np.int8)
    a = np.lib.stride_tricks.as_strided(buf, (3, 8, 8), (66, 8, 1))
    w = np.zeros((3, 8, 8), np.int8)
    with pytest.raises(ValueError, match=r"^A: .*batch stride of 66 elements"):
        cygemm.describe_gemm(a, w, trans_b=True, batched=True)
    assert cygemm.describe_gemm(np.zeros((3, 8, 8), np.int8), w, trans_b=True, batched=True)["stride_b"] == 64


@pytest.mark.parametrize("A, B, kw, match", [
    (((64, 32), "int8"), ((32, 16), "int8"), {}, r"^B: cuBLASLt's int8 GEMM reads op\(B\) along K"),
    (((32, 64), "int8"), ((16, 32), "int8"), {"trans_a": True, "trans_b": True},
     r"^A: cuBLASLt's int8 GEMM reads op\(A\) along K"),
    (((64, 30), "int8"), ((16, 30), "int8"), {"trans_b": True}, r"multiples of 4 elements.*got 30"),
    (((64, 0), "int8"), ((16, 0), "int8"), {"trans_b": True}, r"^A: .*K >= 1"),
])
def test_layouts_cublaslt_has_no_int8_kernel_for_are_refused_naming_the_fix(A, B, kw, match):
    with pytest.raises(ValueError, match=match):
        cygemm.describe_gemm(A, B, **kw)


def test_int8_dtype_rules():
    with pytest.raises(TypeError, match=r"^A: expected .* or int8, got int32 \(cuBLAS multiplies int8 into int32"):
        cygemm.describe_gemm(((8, 8), "int32"), ((8, 8), "int32"))
    with pytest.raises(TypeError, match=r"^B: expected the dtype of A \(int8\), got float32"):
        cygemm.describe_gemm(((8, 8), "int8"), ((8, 8), "float32"))
    with pytest.raises(TypeError, match="^out: int8 operands write an int32 out .* got float32"):
        cygemm.describe_gemm(((8, 8), "int8"), ((8, 8), "int8"), ((8, 8), "float32"), trans_b=True)
    # out's leading dimension is free (an int32 out of 6 columns reads as cuBLAS's ldc 6)
    assert cygemm.describe_gemm(((8, 8), "int8"), ((6, 8), "int8"), ((8, 6), "int32"), trans_b=True)["ldc"] == 6


# ------------------------------------------------------------------ GPU

def _exact(a, b):
    return (a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(64, 64, 64), (63, 61, 64), (1, 8, 16), (37, 1, 96), (17, 4096, 4096),
                                     (256, 512, 1024), (1024, 768, 2048)])
def test_int_mm_is_exact(M, N, K):
    import cupy as cp
    rng = np.random.default_rng()
    a, w = _ints(rng, (M, K)), _ints(rng, (N, K))
    A, W = cp.asarray(a), cp.asarray(w)
    out = cp.full((M, N), POISON, cp.int32)
    got = cygemm.int_mm(A, W.T, out)
    assert got is out
    np.testing.assert_array_equal(cp.asnumpy(out), _exact(a, w.T).astype(np.int32))
    new = cygemm.int_mm(A, W.T)                 # out=None: a new C-ordered int32 array
    assert new.dtype == cp.int32 and new.flags.c_contiguous
    np.testing.assert_array_equal(cp.asnumpy(new), cp.asnumpy(out))


@pytest.mark.gpu
def test_extremes_sum_exactly_without_saturating():
    import cupy as cp
    rng = np.random.default_rng()
    M, N, K = 96, 80, 8192          # |sum| up to 128 * 128 * 8192 = 2**27
    a = rng.choice(np.array([-128, 127], np.int8), size=(M, K))
    w = rng.choice(np.array([-128, 127], np.int8), size=(N, K))
    a[0], w[0] = -128, -128          # the largest sum: 2**27
    a[1], w[1] = 127, -128
    out = cp.full((M, N), POISON, cp.int32)
    cygemm.int_mm(cp.asarray(a), cp.asarray(w).T, out)
    want = _exact(a, w.T)
    assert want[0, 0] == 128 * 128 * K and want[1, 1] == -127 * 128 * K
    np.testing.assert_array_equal(cp.asnumpy(out), want.astype(np.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("order_out", ["C", "F"])
def test_gemm_int8_with_integer_alpha_beta_and_transposes(order_out):
    import cupy as cp
    rng = np.random.default_rng()
    M, N, K = 72, 40, 96
    at = _ints(rng, (K, M))                     # A given as an F-ordered (K, M), read with trans_a
    w = _ints(rng, (N, K))                      # B given as the C-ordered (N, K), read with trans_b
    c0 = rng.integers(-1000, 1000, size=(M, N)).astype(np.int32)
    A = cp.asfortranarray(cp.asarray(at))
    C = cp.asarray(c0, order=order_out)
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    cygemm.gemm(A, cp.asarray(w), C, trans_a=True, trans_b=True, alpha=3, beta=-2, stream=s)
    s.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(C), (3 * _exact(at.T, w.T) - 2 * c0).astype(np.int32))


@pytest.mark.gpu
def test_gemm_int8_into_int8_rounds_and_saturates():
    import cupy as cp
    rng = np.random.default_rng()
    M, N, K = 64, 48, 256
    a, w = _ints(rng, (M, K)), _ints(rng, (N, K))
    out = cp.full((M, N), 99, cp.int8)        # (no product rounds to 99 here)
    alpha = 1 / 8000        # sums have a std of ~87000 here: |alpha * sum| ~ 11
    cygemm.gemm(cp.asarray(a), cp.asarray(w).T, out, alpha=alpha)
    want = np.clip(np.rint(alpha * _exact(a, w.T).astype(np.float64)), -128, 127)
    got = cp.asnumpy(out).astype(np.float64)
    assert np.abs(want).max() < 90
    assert np.abs(got - want).max() <= 1        # (cuBLASLt's rounding of a float32 scale)
    big = cp.full((M, N), 5, cp.int8)
    cygemm.gemm(cp.asarray(a), cp.asarray(w).T, big, alpha=1.0)     # saturates at +-127/-128
    want_big = np.clip(_exact(a, w.T), -128, 127)
    assert np.abs(cp.asnumpy(big).astype(np.int64) - want_big).max() <= 1
    assert (np.abs(want_big) >= 127).mean() > 0.5


@pytest.mark.gpu
def test_gemm_strided_batched_int8_in_order_and_broadcast():
    import cupy as cp
    rng = np.random.default_rng()
    batch, M, N, K = 3, 40, 24, 64
    a = _ints(rng, (batch, M, K))
    w = _ints(rng, (batch, N, K))
    out = cp.full((batch, M, N), POISON, cp.int32)
    cygemm.gemm_strided_batched(cp.asarray(a), cp.asarray(w), out, trans_b=True)
    np.testing.assert_array_equal(cp.asnumpy(out), np.einsum("bmk,bnk->bmn", a.astype(np.int64), w.astype(np.int64)))
    w1 = _ints(rng, (N, K))                     # one weight broadcast over the batch
    out2 = cp.full((batch, M, N), POISON, cp.int32)
    cygemm.gemm_strided_batched(cp.asarray(a), cp.asarray(w1), out2, trans_b=True)
    np.testing.assert_array_equal(cp.asnumpy(out2), (a.astype(np.int64) @ w1.T.astype(np.int64)))


@pytest.mark.gpu
def test_refusals_write_nothing():
    import cupy as cp
    rng = np.random.default_rng()
    M, N, K = 32, 16, 64
    a, w = _ints(rng, (M, K)), _ints(rng, (N, K))
    A, W = cp.asarray(a), cp.asarray(w)
    out = cp.full((M, N), POISON, cp.int32)
    with pytest.raises(ValueError, match=r"^B: cuBLASLt's int8 GEMM reads op\(B\) along K"):
        cygemm.int_mm(A, cp.ascontiguousarray(W.T), out)
    big = cp.asarray(_ints(rng, (M, K + 4)))
    with pytest.raises(ValueError, match=r"^A: cuBLASLt's int8 GEMM needs data aligned to 4 bytes"):
        cygemm.int_mm(big[:, 1:K + 1], W.T, out)
    with pytest.raises(ValueError, match=r"^alpha: an int32 out takes integer alpha"):
        cygemm.gemm(A, W.T, out, alpha=0.5)
    with pytest.raises(ValueError, match=r"^alpha: a complex value"):
        cygemm.gemm(A, W.T, out, alpha=1j)
    with pytest.raises(TypeError, match=r"^out: int_mm writes int32, got int8"):
        cygemm.int_mm(A, W.T, cp.zeros((M, N), cp.int8))
    with pytest.raises(TypeError, match=r"^A: int_mm multiplies int8 matrices, got float32"):
        cygemm.int_mm(A.astype(cp.float32), W.T.astype(cp.float32))
    with pytest.raises(TypeError, match=r"int_mm multiply int8 into int32"):
        cygemm.GemmPlan(A, W.T, out)
    cp.cuda.Device().synchronize()
    assert bool(cp.all(out == POISON)), "a refused call wrote to out"


@pytest.mark.gpu
def test_torch_int8_tensors_match_torch_int_mm():
    torch = pytest.importorskip("torch")
    a = torch.randint(-128, 128, (64, 256), dtype=torch.int8, device="cuda")
    w = torch.randint(-128, 128, (96, 256), dtype=torch.int8, device="cuda")
    got = cygemm.int_mm(a, w.t())
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int32
    want = (a.cpu().long() @ w.cpu().long().t()).int()
    assert torch.equal(got.cpu(), want)
    assert torch.equal(got, torch._int_mm(a, w.t()))


@pytest.mark.gpu
def test_int_mm_captures_into_a_graph_and_replays_with_new_inputs():
    import cupy as cp
    rng = np.random.default_rng()
    M, N, K = 128, 128, 256
    A, W = cp.asarray(_ints(rng, (M, K))), cp.asarray(_ints(rng, (N, K)))
    out = cp.full((M, N), POISON, cp.int32)
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    cygemm.int_mm(A, W.T, out, stream=s)        # plan made eagerly first
    with cygemm.graph.capture(s) as g:
        cygemm.int_mm(A, W.T, out, stream=s)
    a2, w2 = _ints(rng, (M, K)), _ints(rng, (N, K))
    A.set(a2)
    W.set(w2)
    out.fill(POISON)
    cp.cuda.Device().synchronize()
    g.launch(s)
    s.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out), _exact(a2, w2.T).astype(np.int32))


@pytest.mark.gpu
def test_one_array_as_both_operands_and_an_int8_out_under_determinism():
    import cupy as cp
    rng = np.random.default_rng()
    x = _ints(rng, (48, 64))
    X = cp.asarray(x)
    out = cp.full((48, 48), POISON, cp.int32)
    cygemm.int_mm(X, X.T, out)
    np.testing.assert_array_equal(cp.asnumpy(out), _exact(x, x.T).astype(np.int32))
    small = cp.full((48, 48), 7, cp.int8)
    with pytest.raises(ValueError, match=r"^determinism: an int8 out"):
        cygemm.gemm(X, X.T, small, alpha=1 / 4096, determinism="run_to_run")
    out.fill(POISON)                            # (it held the answer from int_mm above)
    cygemm.gemm(X, X.T, out, determinism="batch_invariant")          # int32: exact whatever the kernel
    np.testing.assert_array_equal(cp.asnumpy(out), _exact(x, x.T).astype(np.int32))
    assert bool(cp.all(small == 7))
