"""GPU: gemm and gemm_strided_batched against float64 NumPy references, on fresh random
inputs with NaN-poisoned outputs."""
import itertools
import threading

import numpy as np
import pytest

import cygemm
from gpu_util import f64, poisoned, rand, rel_err, tol

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

SIZES = [(1, 1, 1), (7, 33, 1), (1, 1000, 7), (33, 7, 1000), (1000, 1, 33), (64, 64, 64), (1000, 1000, 33)]
DT_MATH = [("float32", "tf32"), ("float32", "fp32"), ("float16", "tf32")]


def operand(shape, trans, dtype, layout="C"):
    """A random device array whose op() has `shape`, stored as asked: C, F, or a padded slice."""
    stored = shape[::-1] if trans else shape
    if layout == "C":
        return rand(cp, stored, dtype)
    if layout == "F":
        return cp.asfortranarray(rand(cp, stored, dtype))
    big = rand(cp, (stored[0] + 3, stored[1] + 5), dtype)   # a slice with padding around it
    return big[2:2 + stored[0], 1:1 + stored[1]]


@pytest.mark.parametrize("m,n,k", SIZES)
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("dtype,math", DT_MATH)
def test_gemm_matches_float64(m, n, k, trans_a, trans_b, dtype, math):
    A = operand((m, k), trans_a, dtype)
    B = operand((k, n), trans_b, dtype)
    out = poisoned(cp, (m, n), dtype)
    res = cygemm.gemm(A, B, out, trans_a=trans_a, trans_b=trans_b, math=math)
    assert res is out
    a, b = f64(cp, A), f64(cp, B)
    ref = (a.T if trans_a else a) @ (b.T if trans_b else b)
    assert rel_err(out.get(), ref) < tol(dtype, math, k)


@pytest.mark.parametrize("la,lb,lc", list(itertools.product(["C", "F", "slice"], repeat=3)))
def test_gemm_views_are_read_in_place(la, lb, lc):
    m, n, k = 37, 29, 45
    A, B = operand((m, k), False, "float32", la), operand((k, n), True, "float32", lb)
    out = operand((m, n), False, "float32", lc)
    out[...] = cp.nan
    cygemm.gemm(A, B, out, trans_b=True, math="fp32")
    ref = f64(cp, A) @ f64(cp, B).T
    assert rel_err(out.get(), ref) < 1e-5


def test_gemm_alpha_beta_accumulate():
    m, n, k = 50, 70, 90
    A, B = rand(cp, (m, k)), rand(cp, (k, n))
    C0 = rand(cp, (m, n))
    out = C0.copy()
    cygemm.gemm(A, B, out, alpha=-0.75, beta=1.5, math="fp32")
    ref = -0.75 * f64(cp, A) @ f64(cp, B) + 1.5 * f64(cp, C0)
    assert rel_err(out.get(), ref) < 1e-5


def test_gemm_allocates_when_out_is_none():
    A, B = rand(cp, (20, 30)), rand(cp, (30, 10))
    out = cygemm.gemm(A, B, math="fp32")
    assert isinstance(out, cp.ndarray) and out.shape == (20, 10) and out.dtype == cp.float32
    assert rel_err(out.get(), f64(cp, A) @ f64(cp, B)) < 1e-5


def test_gemm_k_zero_gives_beta_times_out():
    A, B = cp.empty((5, 0), cp.float32), cp.empty((0, 6), cp.float32)
    C0 = rand(cp, (5, 6))
    out = C0.copy()
    cygemm.gemm(A, B, out, beta=0.5)
    np.testing.assert_allclose(out.get(), 0.5 * C0.get(), rtol=1e-6)


def test_bfloat16_torch_tensors():
    torch = pytest.importorskip("torch")
    A = torch.randn(40, 70, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(70, 30, device="cuda", dtype=torch.bfloat16)
    out = torch.full((40, 30), float("nan"), device="cuda", dtype=torch.bfloat16)
    cygemm.gemm(A, B, out, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    ref = A.double().cpu().numpy() @ B.double().cpu().numpy()
    assert rel_err(out.float().cpu().numpy(), ref) < tol("bfloat16")


def test_torch_float32_tensors():
    torch = pytest.importorskip("torch")
    A = torch.randn(64, 48, device="cuda")
    B = torch.randn(32, 48, device="cuda")
    out = torch.full((64, 32), float("nan"), device="cuda")
    cygemm.gemm(A, B.T, out, math="fp32", stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    ref = A.double().cpu().numpy() @ B.double().cpu().numpy().T
    assert rel_err(out.cpu().numpy(), ref) < 1e-5


def test_torch_tensors_read_from_attributes_requires_grad_and_errors():
    torch = pytest.importorskip("torch")
    A = torch.randn(20, 30, device="cuda", requires_grad=True)    # torch's CAI refuses these
    B = torch.randn(30, 10, device="cuda", dtype=torch.float32)[:, ::1]
    out = torch.full((20, 10), float("nan"), device="cuda")
    with pytest.raises(TypeError, match="^A: a torch tensor that requires grad"):
        cygemm.gemm(A, B, out, math="fp32")         # gemm is not recorded: its gradient would be lost
    with torch.no_grad():
        cygemm.gemm(A, B, out, math="fp32", stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    ref = A.detach().double().cpu().numpy() @ B.double().cpu().numpy()
    assert rel_err(out.cpu().numpy(), ref) < 1e-5
    with pytest.raises(TypeError, match="A: expected a CUDA tensor"):
        cygemm.gemm(torch.ones(2, 2), B[:2, :2], out[:2, :2])
    with pytest.raises(TypeError, match=r"^B: expected the dtype of A \(float32\), got int32"):
        cygemm.gemm(A.detach(), torch.ones(30, 10, device="cuda", dtype=torch.int32), out)
    assert rel_err(out.cpu().numpy(), ref) < 1e-5            # the refused calls wrote nothing


BATCH_CASES = ["plain", "A-stride0", "B-stride0", "A-2d", "B-batch1", "padded"]


@pytest.mark.parametrize("case", BATCH_CASES)
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("dtype,math", DT_MATH)
def test_gemm_strided_batched_matches_float64(case, trans_a, trans_b, dtype, math):
    batch, m, n, k = 9, 33, 7, 20
    a_shape = (k, m) if trans_a else (m, k)
    b_shape = (n, k) if trans_b else (k, n)
    A, B = rand(cp, (batch, *a_shape), dtype), rand(cp, (batch, *b_shape), dtype)
    if case == "A-stride0":
        A = cp.broadcast_to(A[0], A.shape)
    elif case == "B-stride0":
        B = cp.broadcast_to(B[0], B.shape)
    elif case == "A-2d":
        A = A[0]
    elif case == "B-batch1":
        B = B[:1]
    elif case == "padded":
        A = rand(cp, (batch, a_shape[0] + 2, a_shape[1] + 3), dtype)[:, 1:-1, :a_shape[1]]
    out = poisoned(cp, (batch, m, n), dtype)
    cygemm.gemm_strided_batched(A, B, out, trans_a=trans_a, trans_b=trans_b, math=math)
    a = np.broadcast_to(f64(cp, A), (batch, *a_shape))
    b = np.broadcast_to(f64(cp, B), (batch, *b_shape))
    ref = (a.swapaxes(1, 2) if trans_a else a) @ (b.swapaxes(1, 2) if trans_b else b)
    assert rel_err(out.get(), ref) < tol(dtype, math, k)


def test_several_streams_each_result_right():
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(4)]
    jobs = []
    for i, s in enumerate(streams):
        A, B = rand(cp, (200 + i, 300)), rand(cp, (300, 100 + i))
        cp.cuda.Device().synchronize()                 # inputs ready before other streams read them
        out = poisoned(cp, (200 + i, 100 + i))
        cp.cuda.Device().synchronize()
        cygemm.gemm(A, B, out, math="fp32", stream=s)
        cygemm.gemm(A, B, out, math="fp32", stream=s.ptr, alpha=2.0, beta=-1.0)   # raw int handle
        jobs.append((s, A, B, out))
    for s, A, B, out in jobs:
        s.synchronize()
        assert rel_err(out.get(), f64(cp, A) @ f64(cp, B)) < 1e-5


def test_stream_none_follows_cupy_current_stream():
    s = cp.cuda.Stream(non_blocking=True)
    A, B = rand(cp, (128, 128)), rand(cp, (128, 128))
    out = poisoned(cp, (128, 128))
    cp.cuda.Device().synchronize()
    with s:
        cygemm.gemm(A, B, out, math="fp32")
        s.synchronize()
    assert rel_err(out.get(), f64(cp, A) @ f64(cp, B)) < 1e-5


def test_two_threads_have_their_own_handles_and_right_results():
    errors, contexts = [], {}

    def work(tid):
        try:
            cp.cuda.Device(0).use()
            s = cp.cuda.Stream(non_blocking=True)
            with s:
                for i in range(50):
                    A, B = rand(cp, (64 + tid, 96)), rand(cp, (96, 80 + i))
                    out = poisoned(cp, (64 + tid, 80 + i))
                    cygemm.gemm(A, B, out, math="fp32")
                    s.synchronize()
                    err = rel_err(out.get(), f64(cp, A) @ f64(cp, B))
                    assert err < 1e-5, err
            contexts[tid] = cygemm.engine.context.context_info()
        except Exception as exc:  # reported below, from the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert set(contexts) == {0, 1}
    assert contexts[0]["blas"] != contexts[1]["blas"]
    # Created once per thread and reused: the main thread's handle is stable across calls.
    first = cygemm.engine.context.context_info()
    cygemm.gemm(rand(cp, (8, 8)), rand(cp, (8, 8)))
    assert cygemm.engine.context.context_info()["blas"] == first["blas"]
