"""cygemm's torch custom operators (cygemm.autograd.ops): registered, with fake implementations
that give the real results' shapes and dtypes (CPU, on fake CUDA tensors); on the GPU,
torch.library.opcheck for each, a model compiled with fullgraph=True giving the eager bits and
gradients, and the operators captured by torch.cuda.graph."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from cygemm.autograd import ops  # noqa: E402
import cygemm.autograd  # noqa: E402
from cygemm.engine import release  # noqa: E402

OPS = ("matmul", "linear", "linear_backward", "int_mm", "scaled_matmul", "moe_gemm", "moe_gemm_dev", "moe_gemm_wgrad",
       "moe_scaled_gemm")


def test_every_operator_is_registered_under_cygemm():
    for name in OPS:
        op = getattr(torch.ops.cygemm, name)
        assert op.default._schema.name == f"cygemm::{name}"


@pytest.mark.parametrize("sa, sb, want", [((4, 3), (3, 5), (4, 5)), ((2, 4, 3), (3, 5), (2, 4, 5)),
                                          ((3,), (2, 3, 5), (2, 5)), ((2, 1, 4, 3), (6, 3, 1), (2, 6, 4, 1)),
                                          ((3,), (3,), ())])
def test_the_fake_matmul_has_numpys_result_shape_and_promoted_dtype(sa, sb, want):
    with FakeTensorMode():
        a = torch.empty(sa, device="cuda", dtype=torch.float16)
        b = torch.empty(sb, device="cuda", dtype=torch.float32)
        y = torch.ops.cygemm.matmul(a, b, "tf32", None, None)
    assert tuple(y.shape) == want and y.dtype == torch.float32 and y.device.type == "cuda"


@pytest.mark.parametrize("act, kept", [("none", (0,)), ("relu", (2, 3, 6)), ("gelu", (6, 6)), ("leaky_relu", (2, 3, 6))])
def test_the_fake_linear_gives_y_and_what_its_backward_reads(act, kept):
    with FakeTensorMode():
        x = torch.empty((2, 3, 5), device="cuda", dtype=torch.bfloat16)
        w = torch.empty((6, 5), device="cuda", dtype=torch.bfloat16)
        y, k = torch.ops.cygemm.linear(x, w, None, act, 0.01, "tf32", None)
        gx, gw, gb = torch.ops.cygemm.linear_backward(x, w, y, k, False, act, 0.01, "tf32", None)
    assert tuple(y.shape) == (2, 3, 6) and y.dtype == torch.bfloat16
    assert tuple(k.shape) == kept
    assert tuple(gx.shape) == (2, 3, 5) and tuple(gw.shape) == (6, 5) and tuple(gb.shape) == (0,)


def test_the_fake_int8_fp8_and_moe_operators_give_their_results_shapes():
    with FakeTensorMode():
        a8, b8 = (torch.empty(s, device="cuda", dtype=torch.int8) for s in ((32, 64), (64, 16)))
        assert torch.ops.cygemm.int_mm(a8, b8).dtype == torch.int32
        f8 = torch.float8_e4m3fn
        a, b = torch.empty((32, 64), device="cuda", dtype=f8), torch.empty((16, 64), device="cuda", dtype=f8).t()
        s = torch.empty((1,), device="cuda")
        y = torch.ops.cygemm.scaled_matmul(a, b, s, s, None, "float16", "relu", False)
        assert tuple(y.shape) == (32, 16) and y.dtype == torch.float16
        x, w = torch.empty((40, 8), device="cuda"), torch.empty((3, 8, 12), device="cuda")
        assert tuple(torch.ops.cygemm.moe_gemm(x, w, [0, 10, 25, 40], "kn", "tf32").shape) == (40, 12)
        assert tuple(torch.ops.cygemm.moe_gemm(x, w.transpose(1, 2), [0, 10, 25, 40], "nk", "tf32").shape) == (40, 12)


def test_the_fake_device_offset_moe_operators_give_their_results_shapes():
    with FakeTensorMode():
        x, w = torch.empty((40, 8), device="cuda"), torch.empty((3, 8, 12), device="cuda")
        offs = torch.empty((4,), device="cuda", dtype=torch.int32)
        assert tuple(torch.ops.cygemm.moe_gemm_dev(x, w, offs, "kn", "tf32").shape) == (40, 12)
        assert tuple(torch.ops.cygemm.moe_gemm_dev(x, w.transpose(1, 2), offs, "nk", "tf32").shape) == (40, 12)
        dy = torch.empty((40, 12), device="cuda")
        assert tuple(torch.ops.cygemm.moe_gemm_wgrad(x, dy, offs, "kn", "tf32").shape) == (3, 8, 12)
        assert tuple(torch.ops.cygemm.moe_gemm_wgrad(x, dy, offs, "nk", "tf32").shape) == (3, 12, 8)
        # ops.moe_gemm takes the device-offset operator for a CUDA tensor of offsets, the other for ints
        assert tuple(ops.moe_gemm(x, w, offs).shape) == (40, 12)
        f8 = torch.float8_e4m3fn
        xq, wq = torch.empty((40, 64), device="cuda", dtype=f8), torch.empty((3, 16, 64), device="cuda", dtype=f8)
        s1, s3 = torch.empty((1,), device="cuda"), torch.empty((3,), device="cuda")
        y = ops.moe_scaled_gemm(xq, wq, s1, s3, offs, out_dtype="float32")
        assert tuple(y.shape) == (40, 16) and y.dtype == torch.float32


def test_scaled_matmul_refuses_an_out_dtype_it_does_not_make():
    with pytest.raises(ValueError, match=r"^out_dtype: expected one of \['bfloat16', 'float16', 'float32'\], "
                                         r"got 'e4m3'$"):
        ops.scaled_matmul(None, None, None, None, out_dtype="e4m3")


# ------------------------------------------------------------------ GPU

def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, device="cuda", dtype=dtype, generator=g)


@pytest.mark.gpu
def test_opcheck_passes_for_matmul_and_linear(cuda):
    a, b = _rand(3, 8, 16, seed=1).requires_grad_(), _rand(16, 12, seed=2).requires_grad_()
    torch.library.opcheck(torch.ops.cygemm.matmul.default, (a, b, "fp32", None, None))
    for act, bias in (("relu", True), ("gelu", True), ("none", False)):
        x = _rand(24, 16, seed=3).requires_grad_()
        w = _rand(8, 16, seed=4).requires_grad_()
        bb = _rand(8, seed=5).requires_grad_() if bias else None
        torch.library.opcheck(torch.ops.cygemm.linear.default, (x, w, bb, act, 0.01, "fp32", None))


@pytest.mark.gpu
def test_opcheck_passes_for_int_mm_and_moe_gemm(cuda):
    g = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randint(-128, 128, (32, 64), device="cuda", dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (16, 64), device="cuda", dtype=torch.int8, generator=g)
    torch.library.opcheck(torch.ops.cygemm.int_mm.default, (a, w.t()))
    x, wm = _rand(40, 16, seed=8), _rand(3, 16, 8, seed=9)
    torch.library.opcheck(torch.ops.cygemm.moe_gemm.default, (x, wm, [0, 10, 25, 40], "kn", "fp32"))


@pytest.mark.gpu
def test_opcheck_passes_for_scaled_matmul(cuda):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 GEMMs need compute capability 8.9 or later")
    a = (_rand(32, 64, seed=10) * 3).to(torch.float8_e4m3fn)
    w = (_rand(16, 64, seed=11) * 3).to(torch.float8_e4m3fn)
    s = torch.tensor([0.5], device="cuda")
    args = (a, w.t(), s, s, None, "bfloat16", "none", False)
    # Every check but test_schema, which compares the inputs before and after with allclose:
    # torch has no FP8 kernel for that ("mul_cuda" not implemented for 'Float8_e4m3fn'). The
    # inputs' bits are compared here instead: the operator must not write them.
    before = [x.view(torch.uint8).clone() for x in (a, w)]
    torch.library.opcheck(torch.ops.cygemm.scaled_matmul.default, args,
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_static",
                                      "test_aot_dispatch_dynamic"))
    torch.ops.cygemm.scaled_matmul(*args)
    assert all(torch.equal(x.view(torch.uint8), b) for x, b in zip((a, w), before))


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(_rand(64, 32, seed=12) / 8)
        self.b1 = torch.nn.Parameter(_rand(64, seed=13) / 8)
        self.w2 = torch.nn.Parameter(_rand(64, 16, seed=14) / 8)

    def forward(self, x):
        h = cygemm.autograd.linear(x, self.w1, self.b1, act="gelu", math="fp32")
        return ops.matmul(h, self.w2, math="fp32")


@pytest.mark.gpu
def test_a_fullgraph_compiled_model_gives_the_eager_bits_and_gradients(cuda):
    x = _rand(4, 8, 32, seed=15)
    eager, compiled = _Model(), _Model()
    y_eager = eager(x)
    y_eager.square().sum().backward()
    fn = torch.compile(compiled, fullgraph=True)
    y = fn(x)
    y.square().sum().backward()
    assert torch.equal(y, y_eager)
    for p, q in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    ref = torch.nn.functional.gelu(x.double() @ eager.w1.double().T + eager.b1.double(), approximate="tanh")
    ref = ref @ eager.w2.double()
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.gpu
def test_the_operators_are_captured_by_torch_cuda_graph(cuda):
    x, w, b = _rand(64, 32, seed=16), _rand(48, 32, seed=17), _rand(48, seed=18)
    m = _rand(48, 24, seed=19)
    want = torch.ops.cygemm.matmul(torch.ops.cygemm.linear(x, w, b, "relu", 0.01, "fp32", None)[0], m,
                                   "fp32", None, None)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):          # (warm-up: plans made before the capture)
        torch.ops.cygemm.matmul(torch.ops.cygemm.linear(x, w, b, "relu", 0.01, "fp32", None)[0], m, "fp32", None, None)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):     # (captured on the stream the plans and workspace were made for)
        got = torch.ops.cygemm.matmul(torch.ops.cygemm.linear(x, w, b, "relu", 0.01, "fp32", None)[0], m,
                                      "fp32", None, None)
    # cygemm cannot see a torch capture end: its next call on the stream shows it over, so
    # that releases held back for the capture may go (docs/torch.rst).
    with torch.cuda.stream(s):
        torch.ops.cygemm.matmul(m.T.contiguous(), m, "fp32", None, None)
    assert release.open_capture_count() == 0
    got.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    ref = torch.relu(x.double() @ w.double().T + b.double()) @ m.double()
    assert float((got.double() - ref).norm() / ref.norm()) < 1e-5
    assert np.isfinite(got.cpu().numpy()).all()


# ------------------------------------------------------------------ CPU: the operators' wiring
# torch.library.opcheck runs an operator for real. On the CPU, torch's own products stand in
# for cygemm's GPU calls (patched where the operators call them), so that the schema, the fake
# implementations against the real results, the autograd registration and AOT dispatch are
# checked here; the GPU tests above check them with cygemm's kernels.

@pytest.fixture
def cpu_standins(monkeypatch):
    import torch.nn.functional as F

    def fake_matmul(a, b, out=None, **kw):
        out.copy_(torch.matmul(a.to(out.dtype), b.to(out.dtype)))
        return out

    def act(name, z):
        return {"none": lambda t: t, "relu": torch.relu, "gelu": lambda t: F.gelu(t, approximate="tanh")}[name](z)

    def dense_forward(x, weight, bias, name, slope, math, autotune, save_z):
        z = x.reshape(-1, weight.shape[1]) @ weight.T + (bias if bias is not None else 0)
        return act(name, z).reshape(*x.shape[:-1], weight.shape[0]), (z.contiguous() if save_z else None)

    def linear_backward(x, weight, gy, saved, saves, has_bias, name, slope, math, autotune, nx, nw, nb):
        n, k = weight.shape
        x2, gy2 = x.reshape(-1, k), gy.reshape(-1, n)
        if saves == "y":
            dz = gy2 * (saved.reshape(-1, n) > 0)
        elif saves == "z":          # gelu (tanh form): its derivative written out
            z = saved.reshape(-1, n)
            c = (2 / torch.pi) ** 0.5
            t = torch.tanh(c * (z + 0.044715 * z ** 3))
            dz = gy2 * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * 0.044715 * z * z))
        else:
            dz = gy2
        return (dz @ weight).reshape(x.shape), dz.T @ x2, (dz.sum(0) if has_bias else None)

    def fake_moe(x, w, offsets, out, w_layout="kn", **kw):
        o = offsets.tolist()
        for g in range(len(o) - 1):
            out[o[g]:o[g + 1]] = x[o[g]:o[g + 1]] @ (w[g] if w_layout == "kn" else w[g].T)
        return out

    def fake_wgrad(x, dy, offsets, dw, dw_layout="kn", **kw):
        o = offsets.tolist()
        for g in range(len(o) - 1):
            xs, ds = x[o[g]:o[g + 1]], dy[o[g]:o[g + 1]]
            dw[g] = xs.T @ ds if dw_layout == "kn" else ds.T @ xs
        return dw

    monkeypatch.setattr(cygemm.grouped, "moe_gemm", fake_moe)
    monkeypatch.setattr(cygemm.grouped, "moe_gemm_wgrad", fake_wgrad)
    monkeypatch.setattr(ops.cygemm, "matmul", fake_matmul)
    monkeypatch.setattr(ops, "_stream_of", lambda x: 0)
    monkeypatch.setattr(ops, "_dense_forward", dense_forward)
    monkeypatch.setattr(ops, "linear_backward", linear_backward)


def _cpu(*shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_opcheck_of_matmuls_wiring_on_the_cpu(cpu_standins):
    for sa, sb in (((3, 8, 5), (5, 4)), ((5,), (2, 5, 3)), ((6, 5), (5,))):
        a, b = _cpu(*sa, seed=1).requires_grad_(), _cpu(*sb, seed=2).requires_grad_()
        torch.library.opcheck(torch.ops.cygemm.matmul.default, (a, b, "fp32", None, None))
        assert torch.autograd.gradcheck(lambda x, y: torch.ops.cygemm.matmul(x, y, "fp32", None, None), (a, b))


@pytest.mark.parametrize("act, bias", [("relu", True), ("gelu", True), ("none", False)])
def test_opcheck_of_linears_wiring_on_the_cpu(cpu_standins, act, bias):
    x = _cpu(2, 6, 5, seed=3).requires_grad_()
    w = _cpu(4, 5, seed=4).requires_grad_()
    b = _cpu(4, seed=5).requires_grad_() if bias else None
    torch.library.opcheck(torch.ops.cygemm.linear.default, (x, w, b, act, 0.01, "fp32", None))
    inputs = (x, w) + ((b,) if bias else ())
    assert torch.autograd.gradcheck(lambda *t: ops.linear(t[0], t[1], t[2] if bias else None, act=act), inputs)


def test_a_model_on_the_operators_compiles_with_fullgraph_on_the_cpu(cpu_standins):
    """Dynamo traces cygemm.autograd.linear and ops.matmul into their operators: no graph break
    (fullgraph=True raises on one), the compiled forward and gradients equal the eager ones."""
    torch._dynamo.reset()
    w1, b1, w2 = _cpu(6, 5, seed=6), _cpu(6, seed=7), _cpu(6, 3, seed=8)
    params = [t.clone().requires_grad_() for t in (w1, b1, w2)]

    def model(x, w1, b1, w2):
        return ops.matmul(cygemm.autograd.linear(x, w1, b1, act="gelu"), w2)

    x = _cpu(4, 5, seed=9)
    # (eagerly, linear checks for CUDA tensors: the operators themselves, as Dynamo records them)
    eager = torch.ops.cygemm.matmul(torch.ops.cygemm.linear(x, params[0], params[1], "gelu", 0.01, "tf32", None)[0],
                                    params[2], "tf32", None, None)
    ge = torch.autograd.grad(eager.square().sum(), params)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = compiled(x, *params)
    gc = torch.autograd.grad(got.square().sum(), params)
    torch.testing.assert_close(got, eager)
    for p, q in zip(gc, ge):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize("w_layout", ["kn", "nk"])
def test_opcheck_and_gradients_of_the_device_offset_moe_operators_on_the_cpu(cpu_standins, w_layout):
    """The operator's schema, fake implementation and autograd formula (dx through the other
    layout, dw through the weight-gradient operator) against torch's own gradients."""
    offs = torch.tensor([0, 3, 3, 9, 11], dtype=torch.int64)       # an empty expert
    x = _cpu(11, 5, seed=10).requires_grad_()
    w = _cpu(*((4, 5, 6) if w_layout == "kn" else (4, 6, 5)), seed=11).requires_grad_()
    torch.library.opcheck(torch.ops.cygemm.moe_gemm_dev.default, (x, w, offs, w_layout, "fp32"))
    assert torch.autograd.gradcheck(lambda a, b: torch.ops.cygemm.moe_gemm_dev(a, b, offs, w_layout, "fp32"), (x, w))
    dy = _cpu(11, 6, seed=12)
    torch.library.opcheck(torch.ops.cygemm.moe_gemm_wgrad.default, (x.detach(), dy, offs, w_layout, "fp32"))
    dw = torch.ops.cygemm.moe_gemm_wgrad(x.detach(), dy, offs, w_layout, "fp32")
    assert torch.equal(dw[1], torch.zeros_like(dw[1]))


def test_cpu_tensors_get_cygemms_error_naming_the_argument_not_torchs():
    """CPU: the operators on CPU tensors raise cygemm's TypeError naming the tensor (before, torch's
    'Torch not compiled with CUDA enabled', from asking for a CUDA stream first)."""
    a, b = torch.ones(4, 8), torch.ones(8, 3)
    with pytest.raises(TypeError, match="a: expected a CUDA tensor, got a torch tensor on cpu"):
        torch.ops.cygemm.matmul(a, b, "tf32", None, None)
    with pytest.raises(TypeError, match="expected a CUDA tensor, got a torch tensor on cpu"):
        cygemm.autograd.linear(a, torch.ones(3, 8))


def test_the_operators_exist_once_cygemm_is_imported_after_torch():
    """CPU: `import torch, cygemm` is enough for torch.ops.cygemm.* (no import of cygemm.autograd)."""
    import subprocess
    import sys
    code = "import torch, cygemm; print(torch.ops.cygemm.matmul.default.name())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "cygemm::matmul" in done.stdout, done.stderr[-2000:]
