"""Results in the caller's array type: gemm, gemm_strided_batched (out=None),
gemm_ops.forward/backward and the FP8 functions return torch tensors for torch inputs, as matmul
does, and CuPy arrays for CuPy inputs; entries torch's autograd does not record refuse a tensor
that requires grad rather than lose its gradient (GPU)."""
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


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype, torch_dtype, bound", [
    ("bfloat16", "bfloat16", 1e-2), ("float32", "float32", 4e-4), ("e4m3", "float8_e4m3fn", 6e-2)])
def test_scaled_matmul_of_torch_float8_tensors_returns_a_torch_tensor(gpu, out_dtype, torch_dtype, bound):
    from cygemm import fp8
    M, K, N = 64, 128, 48
    a = (_randn(M, K, seed=14) * 3).to(torch.float8_e4m3fn)
    w = (_randn(N, K, seed=15) * 3).to(torch.float8_e4m3fn)
    sa, sb = torch.tensor([0.5], device="cuda"), torch.tensor([0.25], device="cuda")
    _poison_torch_cache()
    out = fp8.scaled_matmul(a, w.t(), sa, sb, out_dtype=out_dtype)
    assert isinstance(out, torch.Tensor) and out.dtype == getattr(torch, torch_dtype)
    assert out.shape == (M, N) and out.device == a.device and out.is_contiguous()
    torch.cuda.synchronize()
    assert _err(out.float(), 0.125 * (a.double() @ w.double().T)) < bound


@pytest.mark.gpu
@pytest.mark.parametrize("fmt, torch_fp8", [("e4m3", "float8_e4m3fn"), ("e5m2", "float8_e5m2")])
def test_quantize_and_dequantize_of_torch_tensors_return_torch_tensors(gpu, fmt, torch_fp8):
    from cygemm import fp8
    x = _randn(1000, seed=16) * 4
    scale, scale_inv = torch.tensor([2.0], device="cuda"), torch.tensor([0.5], device="cuda")
    _poison_torch_cache()
    q = fp8.quantize(x, scale, format=fmt)
    assert isinstance(q, torch.Tensor) and q.dtype == getattr(torch, torch_fp8) and q.shape == x.shape
    torch.cuda.synchronize()
    assert torch.equal(q.view(torch.uint8), (x * 2).to(q.dtype).view(torch.uint8))   # torch's own cast: RNE, saturating
    y = fp8.dequantize(q, scale_inv, dtype="bfloat16")
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.shape == x.shape
    torch.cuda.synchronize()
    assert torch.equal(y, (q.double() * 0.5).to(torch.bfloat16))


def _requires_grad_cases():
    """(call, argument named) pairs: each entry that torch's autograd does not record, given a
    tensor that requires grad."""
    from cygemm import fp8
    A, W = _randn(32, 16, seed=17), _randn(24, 16, seed=18)
    g = A.clone().requires_grad_()
    a8 = _randn(32, 32, seed=19).to(torch.float8_e4m3fn)
    w8 = _randn(32, 32, seed=20).to(torch.float8_e4m3fn).requires_grad_()
    one = torch.ones(1, device="cuda")
    f32, bf16 = torch.float32, torch.bfloat16
    return [
        (lambda out: cygemm.gemm(g, W, trans_b=True, out=out), "A", (32, 24), f32),
        (lambda out: cygemm.gemm(W, g, trans_b=True, out=out), "B", (24, 32), f32),
        (lambda out: cygemm.gemm_strided_batched(g[None], W[None], trans_b=True, out=out[None]), "A", (32, 24), f32),
        (lambda out: gemm_ops.forward_into(g, W.T, out), "A", (32, 24), f32),
        (lambda out: fp8.scaled_matmul(a8, w8.t(), one, one, out=out), "b", (32, 32), bf16),
    ]


@pytest.mark.gpu
def test_entries_autograd_does_not_record_refuse_a_tensor_that_requires_grad(gpu):
    """gemm, forward and scaled_matmul would drop a gradient silently: they refuse, naming the
    argument and what to use, and write nothing; under no_grad they run."""
    for call, name, shape, dtype in _requires_grad_cases():
        out = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
        with pytest.raises(TypeError, match=rf"^{name}: a torch tensor that requires grad.*cygemm.matmul"):
            call(out)
        torch.cuda.synchronize()
        assert torch.isnan(out).all().item(), "a refused call wrote to out"
        with torch.no_grad():
            call(out)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any().item()
