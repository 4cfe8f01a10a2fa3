"""cygemm.autograd: torch's autograd through cygemm.matmul and the dense layer. CPU: when
matmul routes a call to autograd (and that CuPy inputs are never asked), the errors for CPU
tensors and out=. GPU: gradients against torch's own autograd in float64 (gradcheck for
matmul; torch float64 on float32 inputs for the dense layer), one input requiring grad,
no_grad, a non-default torch stream in both directions."""
import importlib

import numpy as np
import pytest

import cygemm
from fakes import FakeDeviceArray

torch = pytest.importorskip("torch")
autograd = importlib.import_module("cygemm.autograd")
matmul_module = importlib.import_module("cygemm.rowmajor.matmul")


@pytest.fixture
def grad_path_calls():
    """The calls matmul routes to autograd, recorded instead of run (no GPU needed)."""
    calls = []
    matmul_module._set_grad_path(lambda *args: calls.append(args) or "recorded")
    yield calls
    matmul_module._set_grad_path(autograd._recorded_matmul)


# ------------------------------------------------------------------ CPU

def test_importing_cygemm_autograd_names_its_functions():
    assert cygemm.autograd is autograd
    assert issubclass(autograd.MatmulFunction, torch.autograd.Function)
    assert issubclass(autograd.LinearFunction, torch.autograd.Function)
    assert callable(autograd.linear)


@pytest.mark.parametrize("which", ["a", "b", "both"])
def test_matmul_routes_to_autograd_when_a_torch_input_requires_grad(grad_path_calls, which):
    a = torch.ones(2, 3, requires_grad=which in ("a", "both"))
    b = torch.ones(3, 4, requires_grad=which in ("b", "both"))
    assert cygemm.matmul(a, b, math="fp32") == "recorded"
    assert len(grad_path_calls) == 1
    got_a, got_b, out, math, stream, autotune, determinism = grad_path_calls[0]
    assert got_a is a and got_b is b and out is None and math == "fp32" and stream is None and autotune is None
    assert determinism is None


def test_matmul_does_not_route_under_no_grad_or_without_requires_grad(grad_path_calls):
    a, b = torch.ones(2, 3, requires_grad=True), torch.ones(3, 4)
    with torch.no_grad():
        with pytest.raises(TypeError, match="a: expected a CUDA tensor"):
            cygemm.matmul(a, b)
    with pytest.raises(TypeError, match="a: expected a CUDA tensor"):
        cygemm.matmul(a.detach(), b)
    assert grad_path_calls == []


class _AskedArray(FakeDeviceArray):
    """A CUDA-array-interface object that fails the test if its requires_grad is read."""

    @property
    def requires_grad(self):
        raise AssertionError("matmul read requires_grad of an input that is not a torch tensor")


def test_matmul_never_asks_non_torch_inputs_for_requires_grad(grad_path_calls):
    # Shapes that do not multiply: the call stops at the argument check, GPU or not.
    with pytest.raises(ValueError, match="b: matmul needs b's second-to-last axis"):
        cygemm.matmul(_AskedArray((2, 3)), _AskedArray((4, 5)))
    assert grad_path_calls == []


def test_cpu_tensors_are_refused_naming_the_argument_with_or_without_grad():
    for requires_grad in (False, True):
        a = torch.ones(2, 3, requires_grad=requires_grad)
        with pytest.raises(TypeError, match=r"a: expected a CUDA tensor, got a torch tensor on cpu \(a CPU "
                                            r"tensor is not a CUDA array: move it with \.cuda\(\)\)"):
            cygemm.matmul(a, torch.ones(3, 4))
    b = torch.ones(3, 4, requires_grad=True)
    with pytest.raises(TypeError, match="b: expected a CUDA tensor, got a torch tensor on cpu"):
        cygemm.matmul(FakeDeviceArray((2, 3)), b)             # routed to autograd: b named first
    with pytest.raises(TypeError, match="b: expected a CUDA tensor, got a torch tensor on cpu"):
        cygemm.matmul(FakeDeviceArray((2, 3)), b.detach())    # not routed: the same words
    with pytest.raises(TypeError, match="A: expected a CUDA tensor, got a torch tensor on cpu"):
        cygemm.gemm_ops.forward(torch.ones(2, 3), torch.ones(3, 4))
    with pytest.raises(TypeError, match="x: expected a CUDA tensor, got a torch tensor on cpu"):
        autograd.linear(torch.ones(2, 3), torch.ones(4, 3))


def test_out_with_an_input_that_requires_grad_is_refused_naming_out():
    a, b, out = torch.ones(2, 3, requires_grad=True), torch.ones(3, 4), torch.empty(2, 4)
    with pytest.raises(RuntimeError, match=r"out: matmul\(\.\.\., out=\.\.\.\) cannot record gradients"):
        cygemm.matmul(a, b, out)



MIXED_COMPLEX = [(torch.complex64, torch.complex64), (torch.float32, torch.complex64),
                 (torch.complex128, torch.float64), (torch.float64, torch.float64)]


@pytest.mark.parametrize("da, db", MIXED_COMPLEX)
@pytest.mark.parametrize("shape_a, shape_b", [((4, 3), (3, 5)), ((2, 4, 3), (3, 5)), ((3,), (3, 5)), ((4, 3), (3,))])
def test_matmul_backward_formula_conjugates_complex_operands(monkeypatch, da, db, shape_a, shape_b):
    """CPU: the backward's products (torch.matmul standing in for cygemm.matmul, which reads
    memory and so must never get a lazily conjugated tensor) against torch's own autograd:
    g @ b^H and a^H @ g, a real operand's gradient the real part, a conjugate-bit g resolved."""
    def plain_matmul(x, y, **kwargs):
        assert not (x.is_conj() or y.is_conj() or x.is_neg() or y.is_neg()), "a lazy view reached cygemm.matmul"
        t = torch.promote_types(x.dtype, y.dtype)
        return torch.matmul(x.to(t), y.to(t))
    gen = torch.Generator().manual_seed(6)
    a = torch.randn(shape_a, dtype=da, generator=gen, requires_grad=True)
    b = torch.randn(shape_b, dtype=db, generator=gen, requires_grad=True)
    t = torch.promote_types(da, db)
    out = torch.matmul(a.to(t), b.to(t))
    gy = torch.randn(out.shape, dtype=out.dtype, generator=gen)
    ref_a, ref_b = torch.autograd.grad(out, (a, b), gy)
    lazy = gy.conj().resolve_conj().conj() if gy.is_complex() else gy     # gy's values, conjugate bit set
    for g in (gy, lazy):
        ga, gb = autograd._matrix_grads(a.detach(), b.detach(), g, True, True, plain_matmul)
        assert ga.dtype == da and gb.dtype == db
        torch.testing.assert_close(ga, ref_a)
        torch.testing.assert_close(gb, ref_b)


# ------------------------------------------------------------------ GPU

@pytest.fixture
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")


def _poison_torch_cache(device="cuda"):
    """Fill blocks of torch's caching allocator with NaN and free them, so that the next
    torch.empty of a small size gets NaN memory and an element a call leaves unwritten shows."""
    for n in (1 << 10, 1 << 14, (1 << 18) - 1024):
        torch.full((n,), float("nan"), device=device)
    torch.cuda.synchronize()


def _err(x, ref):
    """||x - ref|| / ||ref|| in float64; NaN (an unwritten element) fails."""
    x = x.detach().double()
    assert not torch.isnan(x).any().item(), "output has NaN: some elements were not written"
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


MATMUL_SHAPES = [((5, 7), (7, 3)), ((2, 1, 4, 6), (3, 6, 5)), ((6,), (6, 4)), ((4, 6), (6,)), ((6,), (6,)),
                 ((6,), (2, 6, 3)), ((2, 4, 6), (6,)), ((3, 4, 6), (6, 5))]


@pytest.mark.gpu
@pytest.mark.parametrize("shape_a,shape_b", MATMUL_SHAPES)
def test_matmul_gradcheck_in_float64(gpu, shape_a, shape_b):
    g = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(*shape_a, device="cuda", dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(*shape_b, device="cuda", dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y: cygemm.matmul(x, y), (a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("da, db", [(torch.complex128, torch.complex128), (torch.float64, torch.complex128)])
def test_matmul_gradcheck_in_complex128(gpu, da, db):
    g = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(2, 4, 6, device="cuda", dtype=da, generator=g, requires_grad=True)
    b = torch.randn(6, 5, device="cuda", dtype=db, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y: cygemm.matmul(x, y), (a, b))


@pytest.mark.gpu
def test_matmul_is_differentiable_twice(gpu):
    g = torch.Generator(device="cuda").manual_seed(4)
    a = torch.randn(2, 3, 4, device="cuda", dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(4, 5, device="cuda", dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x, y: cygemm.matmul(x, y), (a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("shape_a,shape_b", MATMUL_SHAPES)
def test_matmul_gradients_match_torch_autograd_in_float64(gpu, shape_a, shape_b):
    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(*shape_a, device="cuda", dtype=torch.float64, generator=g)
    b = torch.randn(*shape_b, device="cuda", dtype=torch.float64, generator=g)
    ta, tb = a.clone().requires_grad_(), b.clone().requires_grad_()
    ref = torch.matmul(ta, tb)
    gy = torch.randn(ref.shape, device="cuda", dtype=torch.float64, generator=g)
    ref.backward(gy)
    _poison_torch_cache()
    ca, cb = a.clone().requires_grad_(), b.clone().requires_grad_()
    y = cygemm.matmul(ca, cb)
    assert y.grad_fn is not None and y.shape == ref.shape
    y.backward(gy)
    assert _err(y, ref.detach()) < 1e-12
    assert _err(ca.grad, ta.grad) < 1e-12 and ca.grad.shape == a.shape
    assert _err(cb.grad, tb.grad) < 1e-12 and cb.grad.shape == b.shape


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("which", ["a", "b"])
def test_matmul_with_one_input_requiring_grad(gpu, dtype, which):
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(6)
    a = torch.randn(3, 40, 56, device="cuda", generator=g).to(dt).requires_grad_(which == "a")
    b = torch.randn(56, 24, device="cuda", generator=g).to(dt).requires_grad_(which == "b")
    gy = torch.randn(3, 40, 24, device="cuda", generator=g).to(dt)
    _poison_torch_cache()
    y = cygemm.matmul(a, b, math="fp32")
    assert y.grad_fn is not None and y.dtype == dt
    y.backward(gy)
    a64, b64, g64 = a.detach().double(), b.detach().double(), gy.double()
    bound = 1e-5 if dtype == "float32" else 2e-2
    if which == "a":
        assert b.grad is None and a.grad.dtype == dt
        assert _err(a.grad, g64 @ b64.T) < bound
    else:
        assert a.grad is None and b.grad.dtype == dt
        assert _err(b.grad, torch.einsum("bmk,bmn->kn", a64, g64)) < bound       # summed over the broadcast batch


@pytest.mark.gpu
def test_matmul_mixed_dtypes_give_gradients_in_each_inputs_dtype(gpu):
    g = torch.Generator(device="cuda").manual_seed(8)
    a = torch.randn(16, 24, device="cuda", generator=g).half().requires_grad_()
    b = torch.randn(24, 8, device="cuda", generator=g).requires_grad_()
    y = cygemm.matmul(a, b, math="fp32")                 # promoted to float32, as torch does
    assert y.dtype == torch.float32
    gy = torch.randn(16, 8, device="cuda", generator=g)
    y.backward(gy)
    assert a.grad.dtype == torch.float16 and b.grad.dtype == torch.float32
    assert _err(a.grad, gy.double() @ b.detach().double().T) < 1e-2
    assert _err(b.grad, a.detach().double().T @ gy.double()) < 1e-5


@pytest.mark.gpu
def test_matmul_with_a_cupy_operand_records_the_torch_ones_gradient(gpu):
    cp = pytest.importorskip("cupy")
    x = cp.asarray(np.random.default_rng(9).standard_normal((12, 20)).astype(np.float32))
    w = torch.randn(20, 6, device="cuda", requires_grad=True)
    y = cygemm.matmul(x, w, math="fp32")
    assert isinstance(y, torch.Tensor) and y.grad_fn is not None
    y.sum().backward()
    ref = cp.asnumpy(x).astype(np.float64).T @ np.ones((12, 6))
    assert _err(w.grad, torch.as_tensor(ref, device="cuda")) < 1e-5


@pytest.mark.gpu
def test_no_grad_gives_a_tensor_without_grad_fn_and_takes_the_plain_path(gpu):
    calls = []
    matmul_module._set_grad_path(lambda *args: calls.append(args) or autograd._recorded_matmul(*args))
    try:
        a = torch.randn(8, 16, device="cuda", requires_grad=True)
        b = torch.randn(16, 4, device="cuda", requires_grad=True)
        with torch.no_grad():
            y = cygemm.matmul(a, b, math="fp32")
        assert y.grad_fn is None and not y.requires_grad
        y2 = cygemm.matmul(a.detach(), b.detach(), math="fp32")
        assert y2.grad_fn is None and not y2.requires_grad
        assert calls == []                                # neither call went through autograd
        y3 = cygemm.matmul(a, b, math="fp32")
        assert len(calls) == 1 and y3.grad_fn is not None
        ref = a.detach().double() @ b.detach().double()
        for out in (y, y2, y3):
            assert _err(out, ref) < 1e-5
    finally:
        matmul_module._set_grad_path(autograd._recorded_matmul)


def _delayed_copy(dst, src, stream):
    """dst.copy_(src) on `stream` after a ~0.05 s spin there: work on another stream that does
    not wait for it reads dst's old contents (NaN)."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)
        dst.copy_(src)


@pytest.mark.gpu
def test_matmul_forward_and_backward_run_on_torchs_current_stream(gpu):
    g = torch.Generator(device="cuda").manual_seed(10)
    a_src, b_src = torch.randn(64, 48, device="cuda", generator=g), torch.randn(48, 32, device="cuda", generator=g)
    gy_src = torch.randn(64, 32, device="cuda", generator=g)
    a = torch.full((64, 48), float("nan"), device="cuda", requires_grad=True)
    b = torch.full((48, 32), float("nan"), device="cuda", requires_grad=True)
    gy = torch.full((64, 32), float("nan"), device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.no_grad():
        _delayed_copy(a, a_src, s)
        _delayed_copy(b, b_src, s)
    with torch.cuda.stream(s):
        y = cygemm.matmul(a, b, math="fp32")
    _delayed_copy(gy, gy_src, s)
    with torch.cuda.stream(s):
        y.backward(gy)
    torch.cuda.synchronize()
    a64, b64, g64 = a_src.double(), b_src.double(), gy_src.double()
    assert _err(y, a64 @ b64) < 1e-5
    assert _err(a.grad, g64 @ b64.T) < 1e-5
    assert _err(b.grad, a64.T @ g64) < 1e-5


# ---------------------------------------------------------------- the dense layer

ACTS = ["none", "relu", "leaky_relu", "gelu", "gelu_erf", "sigmoid", "tanh", "silu"]
SLOPE = 0.1


def _torch_act(act):
    import torch.nn.functional as Fn
    return {"none": lambda z: z, "relu": torch.relu, "leaky_relu": lambda z: Fn.leaky_relu(z, SLOPE),
            "gelu": lambda z: Fn.gelu(z, approximate="tanh"), "gelu_erf": lambda z: Fn.gelu(z, approximate="none"),
            "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": Fn.silu}[act]


@pytest.mark.gpu
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("act", ACTS)
def test_linear_gradients_match_torch_float64_on_float32_inputs(gpu, act, with_bias):
    import torch.nn.functional as Fn
    g = torch.Generator(device="cuda").manual_seed(12)
    x, w = torch.randn(2, 24, 96, device="cuda", generator=g), torch.randn(40, 96, device="cuda", generator=g)
    bias = torch.randn(40, device="cuda", generator=g) if with_bias else None
    gy = torch.randn(2, 24, 40, device="cuda", generator=g)
    inputs = [t for t in (x, w, bias) if t is not None]
    ref_in = [t.double().requires_grad_() for t in inputs]
    ref = _torch_act(act)(Fn.linear(*ref_in))
    ref.backward(gy.double())
    _poison_torch_cache()
    ours_in = [t.clone().requires_grad_() for t in inputs]
    y = autograd.linear(ours_in[0], ours_in[1], ours_in[2] if with_bias else None, act=act, leaky_slope=SLOPE,
                        math="fp32")
    assert y.grad_fn is not None and y.shape == (2, 24, 40) and y.dtype == torch.float32
    y.backward(gy)
    assert _err(y, ref.detach()) < 4e-5
    for ours, theirs in zip(ours_in, ref_in):
        assert ours.grad.shape == theirs.shape
        assert _err(ours.grad, theirs.grad) < 4e-5


@pytest.mark.gpu
@pytest.mark.parametrize("needs", ["x", "weight", "bias"])
def test_linear_with_one_input_requiring_grad(gpu, needs):
    import torch.nn.functional as Fn
    g = torch.Generator(device="cuda").manual_seed(13)
    x, w, bias = (torch.randn(*s, device="cuda", generator=g) for s in ((32, 48), (24, 48), (24,)))
    gy = torch.randn(32, 24, device="cuda", generator=g)
    x.requires_grad_(needs == "x")
    w.requires_grad_(needs == "weight")
    bias.requires_grad_(needs == "bias")
    y = autograd.linear(x, w, bias, act="gelu", math="fp32")
    y.backward(gy)
    t = [v.detach().double().requires_grad_() for v in (x, w, bias)]
    _torch_act("gelu")(Fn.linear(*t)).backward(gy.double())
    for name, ours, theirs in (("x", x, t[0]), ("weight", w, t[1]), ("bias", bias, t[2])):
        if name == needs:
            assert _err(ours.grad, theirs.grad) < 4e-5
        else:
            assert ours.grad is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_linear_in_half_precision(gpu, dtype):
    import torch.nn.functional as Fn
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(14)
    x, w, bias, gy = (torch.randn(*s, device="cuda", generator=g).to(dt) for s in ((64, 96), (40, 96), (40,), (64, 40)))
    ours = [v.clone().requires_grad_() for v in (x, w, bias)]
    y = autograd.linear(*ours, act="silu")
    y.backward(gy)
    t = [v.double().requires_grad_() for v in (x, w, bias)]
    ref = Fn.silu(Fn.linear(*t))
    ref.backward(gy.double())
    assert y.dtype == dt and _err(y, ref.detach()) < 2e-2
    for o, r in zip(ours, t):
        assert o.grad.dtype == dt and _err(o.grad, r.grad) < 2e-2


@pytest.mark.gpu
def test_linear_under_no_grad_has_no_grad_fn(gpu):
    x = torch.randn(8, 16, device="cuda", requires_grad=True)
    w = torch.randn(4, 16, device="cuda", requires_grad=True)
    with torch.no_grad():
        y = autograd.linear(x, w, act="relu", math="fp32")
    assert y.grad_fn is None and not y.requires_grad
    assert _err(y, torch.relu(x.detach().double() @ w.detach().double().T)) < 1e-5


@pytest.mark.gpu
def test_linear_forward_and_backward_run_on_torchs_current_stream(gpu):
    g = torch.Generator(device="cuda").manual_seed(15)
    x_src, w_src = torch.randn(64, 48, device="cuda", generator=g), torch.randn(32, 48, device="cuda", generator=g)
    gy_src = torch.randn(64, 32, device="cuda", generator=g)
    x = torch.full((64, 48), float("nan"), device="cuda", requires_grad=True)
    w = torch.full((32, 48), float("nan"), device="cuda", requires_grad=True)
    gy = torch.full((64, 32), float("nan"), device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.no_grad():
        _delayed_copy(x, x_src, s)
        _delayed_copy(w, w_src, s)
    with torch.cuda.stream(s):
        y = autograd.linear(x, w, act="tanh", math="fp32")
    _delayed_copy(gy, gy_src, s)
    with torch.cuda.stream(s):
        y.backward(gy)
    torch.cuda.synchronize()
    x64, w64, g64 = x_src.double(), w_src.double(), gy_src.double()
    y64 = torch.tanh(x64 @ w64.T)
    dz = g64 * (1 - y64 ** 2)
    assert _err(y, y64) < 1e-5
    assert _err(x.grad, dz @ w64) < 4e-5
    assert _err(w.grad, dz.T @ x64) < 4e-5


@pytest.mark.gpu
def test_linear_refuses_float64_and_mismatched_shapes_naming_the_argument(gpu):
    x, w = torch.ones(4, 8, device="cuda", dtype=torch.float64), torch.ones(3, 8, device="cuda", dtype=torch.float64)
    with pytest.raises(TypeError, match="x: expected float16, bfloat16 or float32 .*cygemm.matmul has"):
        autograd.linear(x, w)
    with pytest.raises(ValueError, match=r"x: expected a last axis of weight's in_features \(7\)"):
        autograd.linear(x.float(), torch.ones(3, 7, device="cuda"))
    with pytest.raises(ValueError, match=r"bias: expected shape \(3,\), got \(4,\)"):
        autograd.linear(x.float(), w.float(), torch.ones(4, device="cuda"))
    with pytest.raises(TypeError, match="weight: expected x's dtype float32, got float16"):
        autograd.linear(x.float(), w.half())
