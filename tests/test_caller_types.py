"""Results in the caller's array type: gemm, gemm_strided_batched (out=None) and
gemm_ops.forward/backward return torch tensors for torch inputs, as matmul does, and CuPy
arrays for CuPy inputs (GPU)."""
import numpy as np
import pytest

import cygemm
from cygemm import gemm_ops

torch = pytest.importorskip("torch")
cp = None


@pytest.fixture
def gpu():
    global cp
    cp = pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")


def _poison_torch_cache():
    """Fill blocks of torch's caching allocator with NaN and free them, so that a new small
    result gets NaN memory and an element a call leaves unwritten shows."""
    for n in (1 << 10, 1 << 14, (1 << 18) - 1024):
        torch.full((n,), float("nan"), device="cuda")
    torch.cuda.synchronize()


def _err(x, ref):
    x = x.detach().double()
    assert not torch.isnan(x).any().item(), "output has NaN: some elements were not written"
    return ((x - ref).norm() / ref.norm()).item()


def _randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,bound", [(torch.float32, 1e-5), (torch.float16, 1e-2), (torch.bfloat16, 2e-2)])
def test_gemm_of_torch_tensors_returns_a_torch_tensor(gpu, dtype, bound):
    A, B = _randn(48, 40, dtype=dtype, seed=1), _randn(24, 40, dtype=dtype, seed=2)
    _poison_torch_cache()
    out = cygemm.gemm(A, B, trans_b=True, math="fp32")
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device == A.device
    assert out.shape == (48, 24) and out.is_contiguous()
    torch.cuda.synchronize()
    assert _err(out, A.double() @ B.double().T) < bound


@pytest.mark.gpu
def test_gemm_with_one_torch_operand_and_one_cupy_returns_a_torch_tensor(gpu):
    A = _randn(16, 32, seed=3)
    B = cp.asarray(np.random.default_rng(4).standard_normal((32, 8)).astype(np.float32))
    out = cygemm.gemm(A, B, math="fp32")
    torch.cuda.synchronize()
    assert isinstance(out, torch.Tensor)
    assert _err(out, A.double() @ torch.as_tensor(cp.asnumpy(B), device="cuda").double()) < 1e-5
    both_cupy = cygemm.gemm(cp.asarray(A.cpu().numpy()), B, math="fp32")
    assert isinstance(both_cupy, cp.ndarray)                    # CuPy inputs: CuPy, as before


@pytest.mark.gpu
def test_gemm_strided_batched_of_torch_tensors_returns_a_torch_tensor(gpu):
    A, B = _randn(5, 12, 20, seed=5), _randn(20, 9, seed=6)    # B broadcast over the batch
    _poison_torch_cache()
    out = cygemm.gemm_strided_batched(A, B, math="fp32")
    assert isinstance(out, torch.Tensor) and out.shape == (5, 12, 9) and out.dtype == torch.float32
    torch.cuda.synchronize()
    assert _err(out, A.double() @ B.double()) < 1e-5


@pytest.mark.gpu
def test_gemm_on_a_torch_stream_runs_there_and_returns_a_torch_tensor(gpu):
    A_src, B = _randn(64, 64, seed=7), _randn(64, 64, seed=8)
    A = torch.full((64, 64), float("nan"), device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)      # ~0.05 s: a GEMM not ordered after the copy reads NaN
        A.copy_(A_src)
    out = cygemm.gemm(A, B, math="fp32", stream=s)
    s.synchronize()
    assert isinstance(out, torch.Tensor)
    assert _err(out, A_src.double() @ B.double()) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
def test_forward_and_backward_of_torch_tensors_return_torch_tensors(gpu, act):
    import torch.nn.functional as Fn
    M, K, N = 40, 56, 24
    A, W, bias, gY = _randn(M, K, seed=9), _randn(N, K, seed=10), _randn(N, seed=11), _randn(M, N, seed=12)
    _poison_torch_cache()
    Y, Z = gemm_ops.forward(A, W.T, bias, act=act, save_z=True, math="fp32")
    assert all(isinstance(t, torch.Tensor) and t.shape == (M, N) and t.dtype == torch.float32 for t in (Y, Z))
    gA, gB, gBias = gemm_ops.backward(A, W.T, gY, Z, act=act, math="fp32")
    assert isinstance(gA, torch.Tensor) and gA.shape == (M, K)
    assert isinstance(gB, torch.Tensor) and gB.shape == (K, N)          # B's shape: W's gradient is gB.T
    assert isinstance(gBias, torch.Tensor) and gBias.shape == (N,)
    torch.cuda.synchronize()
    fn = {"none": lambda z: z, "relu": torch.relu, "gelu": lambda z: Fn.gelu(z, approximate="tanh")}[act]
    t = [x.double().requires_grad_() for x in (A, W, bias)]
    ref = fn(Fn.linear(*t))
    ref.backward(gY.double())
    assert _err(Y, ref.detach()) < 4e-5
    assert _err(Z, Fn.linear(*(x.detach() for x in t))) < 4e-5
    assert _err(gA, t[0].grad) < 4e-5
    assert _err(gB.T, t[1].grad) < 4e-5
    assert _err(gBias, t[2].grad) < 4e-5


@pytest.mark.gpu
def test_forward_and_backward_of_cupy_arrays_still_return_cupy_arrays(gpu):
    rng = np.random.default_rng(13)
    A, B = (cp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((16, 8), (8, 4)))
    Y, Z = gemm_ops.forward(A, B, act="relu", save_z=True, math="fp32")
    gA, gB, gBias = gemm_ops.backward(A, B, cp.ones_like(Y), Z, act="relu", math="fp32")
    assert all(isinstance(x, cp.ndarray) for x in (Y, Z, gA, gB, gBias))
    ref = np.maximum(cp.asnumpy(A).astype(np.float64) @ cp.asnumpy(B).astype(np.float64), 0)
    assert np.linalg.norm(cp.asnumpy(Y) - ref) / np.linalg.norm(ref) < 1e-5
