"""stream=None means one thing in every entry point: torch's current stream when an array of
the call is a torch tensor, else CuPy's current stream.

On the CPU, each entry point is called with stand-ins for CUDA tensors (CPU tensors that say
they are CUDA tensors) while torch's current_stream raises: the call must ask
torch for its stream, which happens before anything touches the GPU. On the GPU, each entry
point's inputs are written on a torch side stream after a sleep, and the call made with
stream=None inside ``torch.cuda.stream(s)`` must read the written values (torch's streams are
non-blocking: a call on CuPy's stream reads the NaNs that were there before).
"""
import pytest

torch = pytest.importorskip("torch")

import cygemm  # noqa: E402
import cygemm.elementwise as ew  # noqa: E402
import cygemm.fp8 as fp8  # noqa: E402
from cygemm import gemm_ops  # noqa: E402


class AskedTorchStream(Exception):
    pass


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that says it is a CUDA tensor: its host address stands for a device address
    (distinct arrays never overlap; nothing reads it, the stream being asked first)."""

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return 0


def fake(shape, dtype=torch.float32, fill=None):        # (fill: the GPU test's)
    return torch.zeros(shape, dtype=dtype).as_subclass(FakeCudaTensor)


# Each case: (name, build) where build(mk, host) returns (call, outputs, check): call(stream=None)
# runs the entry point; mk(shape, dtype, fill) makes an input (filled with `fill` later on the side
# stream) or an output (fill None: NaN first); check(outputs) -> None or what is wrong.
def _finite(*outs):
    def check():
        for o in outs:
            v = o.float() if o.dtype in (torch.float16, torch.bfloat16) or "float8" in str(o.dtype) else o
            if not torch.isfinite(v).all():
                return "an output holds NaN: the call read the inputs before the side stream wrote them"
        return None
    return check


def _gemm(mk):
    A, B, C = mk((32, 48), fill=1), mk((48, 40), fill=2), mk((32, 40))
    return lambda stream=None: cygemm.gemm(A, B, C, math="fp32", stream=stream), _finite(C)


def _gemm_strided_batched(mk):
    A, B, C = mk((3, 16, 24), fill=1), mk((3, 24, 8), fill=2), mk((3, 16, 8))
    return lambda stream=None: cygemm.gemm_strided_batched(A, B, C, math="fp32", stream=stream), _finite(C)


def _matmul(mk):
    A, B, C = mk((32, 48), fill=1), mk((48, 40), fill=2), mk((32, 40))
    return lambda stream=None: cygemm.matmul(A, B, C, math="fp32", stream=stream), _finite(C)


def _grouped_gemm(mk):
    As, Bs = [mk((16, 24), fill=1), mk((8, 24), fill=2)], [mk((24, 8), fill=3), mk((24, 16), fill=4)]
    outs = [mk((16, 8)), mk((8, 16))]
    return lambda stream=None: cygemm.grouped_gemm(As, Bs, outs, math="fp32", stream=stream), _finite(*outs)


def _moe_gemm(mk):
    x, w, out = mk((40, 32), fill=1), mk((3, 32, 16), fill=2), mk((40, 16))
    offs = [0, 8, 24, 40]
    return lambda stream=None: cygemm.moe_gemm(x, w, offs, out, math="fp32", stream=stream), _finite(out)


def _moe_gemm_wgrad(mk):
    x, dy, dw = mk((40, 32), fill=1), mk((40, 16), fill=2), mk((3, 32, 16))
    offs = [0, 8, 24, 40]
    return lambda stream=None: cygemm.moe_gemm_wgrad(x, dy, offs, dw, math="fp32", stream=stream), _finite(dw)


def _plan_execute(mk):
    A, B, C = mk((32, 48), fill=1), mk((48, 40), fill=2), mk((32, 40))
    plan = cygemm.GemmPlan(A, B, C, math="fp32")
    return lambda stream=None: plan.execute(stream=stream), _finite(C)


def _forward_into(mk):
    A, B, bias, Y = mk((32, 48), fill=1), mk((48, 40), fill=2), mk((40,), fill=3), mk((32, 40))
    return (lambda stream=None: gemm_ops.forward_into(A, B, Y, bias, math="fp32", stream=stream)), _finite(Y)


def _forward(mk):
    A, B, bias = mk((32, 48), fill=1), mk((48, 40), fill=2), mk((40,), fill=3)
    got = []

    def call(stream=None):
        got.append(gemm_ops.forward(A, B, bias, math="fp32", stream=stream)[0])

    return call, lambda: _finite(*got)()


def _backward_into(mk):
    A, B, gY, Z = mk((32, 48), fill=1), mk((48, 40), fill=2), mk((32, 40), fill=3), mk((32, 40), fill=4)
    gA, gB, gb, dZ = mk((32, 48)), mk((48, 40)), mk((40,)), mk((32, 40))
    return (lambda stream=None: gemm_ops.backward_into(A, B, gY, Z, gA_out=gA, gB_out=gB, gBias_out=gb, work_dZ=dZ,
                                                       math="fp32", stream=stream)), _finite(gA, gB, gb)


def _bias_act(mk):
    x, bias, y = mk((32, 40), fill=1), mk((40,), fill=2), mk((32, 40))
    return lambda stream=None: ew.bias_act(x, bias, out=y, stream=stream), _finite(y)


def _act_backward(mk):
    gy, z, dz = mk((32, 40), fill=1), mk((32, 40), fill=2), mk((32, 40))
    return lambda stream=None: ew.act_backward(gy, z, dz_out=dz, act="gelu", stream=stream), _finite(dz)


def _quantize(mk):
    x, scale, q = mk((32, 64), fill=1), mk((1,), fill="one"), mk((32, 64), torch.float8_e4m3fn)
    return lambda stream=None: fp8.quantize(x, scale, out=q, stream=stream), _finite(q)


def _dequantize(mk):
    q, scale, y = mk((32, 64), torch.float8_e4m3fn, fill=1), mk((1,), fill="one"), mk((32, 64))
    return lambda stream=None: fp8.dequantize(q, scale, out=y, stream=stream), _finite(y)


def _amax(mk):
    x, out = mk((32, 64), fill=1), mk((1,))
    # amax ignores NaN: a call that read x before the side stream wrote it gives 0.
    return (lambda stream=None: fp8.amax(x, out, stream=stream)), (
        lambda: None if float(out.item()) > 0 else f"amax {float(out.item())}: x read before it was written")


def _quantize_scaled(mk):
    x = mk((32, 256), fill=1)
    got = []
    return (lambda stream=None: got.extend(fp8.quantize_scaled(x, "1x128", stream=stream))), lambda: _finite(*got)()


def _scaled_matmul(mk):
    a, w = mk((32, 64), torch.float8_e4m3fn, fill=1), mk((48, 64), torch.float8_e4m3fn, fill=2)
    sa, sb, out = mk((1,), fill="one"), mk((1,), fill="one"), mk((32, 48), torch.bfloat16)
    return (lambda stream=None: fp8.scaled_matmul(a, w.T, sa, sb, out=out, stream=stream)), _finite(out)


def _moe_scaled_gemm(mk):
    x, w = mk((40, 64), torch.float8_e4m3fn, fill=1), mk((3, 32, 64), torch.float8_e4m3fn, fill=2)
    sx, sw, out = mk((1,), fill="one"), mk((3,), fill="one"), mk((40, 32), torch.bfloat16)
    offs = [0, 8, 24, 40]
    return (lambda stream=None: cygemm.moe_scaled_gemm(x, w, sx, sw, offs, out, format_x="e4m3", format_w="e4m3",
                                                       stream=stream)), _finite(out)


ENTRY_POINTS = {
    "gemm": _gemm, "gemm_strided_batched": _gemm_strided_batched, "matmul": _matmul,
    "grouped_gemm": _grouped_gemm, "moe_gemm": _moe_gemm, "moe_gemm_wgrad": _moe_gemm_wgrad,
    "GemmPlan.execute": _plan_execute, "forward_into": _forward_into, "forward": _forward,
    "backward_into": _backward_into, "bias_act": _bias_act, "act_backward": _act_backward,
    "quantize": _quantize, "dequantize": _dequantize, "amax": _amax, "quantize_scaled": _quantize_scaled,
    "scaled_matmul": _scaled_matmul, "moe_scaled_gemm": _moe_scaled_gemm,
}


def test_stream_pointer_resolves_none_by_the_arrays_library(monkeypatch):
    import types
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: types.SimpleNamespace(cuda_stream=1234))
    assert cygemm.stream_pointer(None, torch.zeros(1)) == 1234
    assert cygemm.stream_pointer(None, object(), torch.zeros(1)) == 1234
    assert cygemm.stream_pointer(77, torch.zeros(1)) == 77           # a named stream is that stream


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_stream_none_with_torch_tensors_asks_torch_for_its_stream(name, monkeypatch):
    def asked(*args):
        raise AskedTorchStream
    call, _ = ENTRY_POINTS[name](fake)
    monkeypatch.setattr(torch.cuda, "current_stream", asked)
    with pytest.raises(AskedTorchStream):
        call()


# ---- on the GPU: ordered after the work on the caller's torch stream

@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_stream_none_with_torch_tensors_is_ordered_after_the_current_torch_stream(name):
    if name in ("quantize_scaled", "scaled_matmul", "moe_scaled_gemm") and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("FP8 GEMMs and block scales need compute capability 9.0 or newer")
    gen = torch.Generator(device="cpu").manual_seed(1234)
    writes = []

    def mk(shape, dtype=torch.float32, fill=None):
        t = torch.full(shape, float("nan"), dtype=torch.float32, device="cuda").to(dtype)
        if fill is not None:
            src = (torch.ones(shape) if fill == "one" else torch.randn(shape, generator=gen) * 0.5).to("cuda")
            writes.append((t, src.to(dtype)))
        return t

    call, check = ENTRY_POINTS[name](mk)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)      # ~0.05 s: a call not ordered after these copies reads NaN
        for t, src in writes:
            t.copy_(src)
        call()
    s.synchronize()
    torch.cuda.synchronize()
    assert check() is None, check()
