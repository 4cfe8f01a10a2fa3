"""CPU without a GPU: cygemm says so in plain words (its own CudaError naming the call, not
CuPy's), and counts no device. Skipped where a GPU is present."""
import pytest

import cygemm
from fakes import BASE, FakeDeviceArray


@pytest.mark.nogpu
def test_stream_none_without_gpu_raises_cygemms_cuda_error_not_cupys():
    a = FakeDeviceArray((4, 4))
    out = FakeDeviceArray((4, 4), ptr=a.__cuda_array_interface__["data"][0] + 4096)
    for call in (lambda: cygemm.gemm(a, a, out), lambda: cygemm.matmul(a, a, out)):
        with pytest.raises(cygemm.CudaError) as info:
            call()
        assert info.value.name.startswith("cuda") and "stream=None" in info.value.call


@pytest.mark.nogpu
def test_gemm_without_gpu_raises_cuda_error_naming_the_call_in_plain_words():
    a = FakeDeviceArray((4, 4))
    with pytest.raises(cygemm.CudaError) as info:
        cygemm.gemm(a, a, FakeDeviceArray((4, 4), ptr=a.__cuda_array_interface__["data"][0] + 4096), stream=0)
    assert info.value.call in ("cudaGetDevice", "cudaGetDeviceCount", "cublasCreate")
    assert info.value.name.startswith("cuda")
    # Not only "CUDA driver version is insufficient": what gpu_unavailable_reason says too.
    assert cygemm.gpu_unavailable_reason() in str(info.value)


@pytest.mark.nogpu
def test_device_count_is_zero_without_a_gpu():
    assert cygemm.device_count() == 0


@pytest.mark.nogpu
def test_no_gpu_reason_is_plain_words():
    import ctypes
    reason = cygemm.gpu_unavailable_reason()
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        assert reason.startswith("no NVIDIA GPU/driver found")
    else:
        assert reason and "NVIDIA" in reason


def _fake(shape, typestr="<f4", i=0, strides=None):
    """A fake device array at its own address (slot i): no two entries' operands overlap."""
    return FakeDeviceArray(shape, typestr, strides, BASE + i * (1 << 24))


def _core_entries():
    """Every core entry on valid operands, as a function of its stream argument."""
    from cygemm import dense, elementwise, fp8
    from cygemm.fp8 import convert as fp8_convert
    a, b, o = _fake((16, 16)), _fake((16, 16), i=1), _fake((16, 16), i=2)
    a3, b3, o3 = _fake((2, 16, 16), i=3), _fake((2, 16, 16), i=4), _fake((2, 16, 16), i=5)
    bias, z = _fake((16,), i=6), _fake((16, 16), i=7)
    qa = _fake((16, 16), "|u1", i=8)
    qb = _fake((16, 16), "|u1", i=9, strides=(1, 16))         # K-major b, as FP8 GEMMs take it
    sa, sb = _fake((), i=10), _fake((), i=11)
    fp8_kw = dict(format_a="e4m3", format_b="e4m3")
    return {
        "gemm": lambda s: cygemm.gemm(a, b, o, stream=s),
        "gemm out=None": lambda s: cygemm.gemm(a, b, stream=s),
        "gemm_strided_batched": lambda s: cygemm.gemm_strided_batched(a3, b3, o3, stream=s),
        "matmul": lambda s: cygemm.matmul(a, b, o, stream=s),
        "matmul out=None": lambda s: cygemm.matmul(a3, b, stream=s),
        "dense.forward_into": lambda s: dense.forward_into(a, b, o, bias, act="relu", stream=s),
        "dense.backward_into": lambda s: dense.backward_into(a, b, o, z, act="relu", gA_out=_fake((16, 16), i=13),
                                                             work_dZ=_fake((16, 16), i=15), stream=s),
        "grouped_gemm": lambda s: cygemm.grouped_gemm([a, z], [b, b], [o, _fake((16, 16), i=14)],
                                                      stream=s),
        "moe_gemm": lambda s: cygemm.moe_gemm(a, b3, [0, 8, 16], o, stream=s),
        "fp8.scaled_matmul": lambda s: fp8.scaled_matmul(qa, qb, sa, sb, out=o, stream=s, **fp8_kw),
        "fp8.ScaledMatmulPlan.plan": lambda s: fp8.ScaledMatmulPlan(qa, qb, sa, sb, out=o, **fp8_kw).plan(stream=s),
        "fp8_convert.quantize": lambda s: fp8_convert.quantize(a, sa, out=qa, stream=s),
        "elementwise.bias_act": lambda s: elementwise.bias_act(a, bias, out=o, act="relu", stream=s),
        "elementwise.act_backward": lambda s: elementwise.act_backward(a, z, dz_out=o, act="relu", stream=s),
        "GemmPlan.plan": lambda s: cygemm.GemmPlan(a, b, o).plan(stream=s),
        "GemmPlan.execute": lambda s: cygemm.GemmPlan(a, b, o).execute(stream=s),
    }


@pytest.mark.nogpu
@pytest.mark.parametrize("stream", [None, 0], ids=["stream=None", "stream=0"])
@pytest.mark.parametrize("entry", ["gemm", "gemm out=None", "gemm_strided_batched", "matmul", "matmul out=None",
                                   "dense.forward_into", "dense.backward_into", "grouped_gemm", "moe_gemm",
                                   "fp8.scaled_matmul", "fp8.ScaledMatmulPlan.plan", "fp8_convert.quantize",
                                   "elementwise.bias_act", "elementwise.act_backward", "GemmPlan.plan",
                                   "GemmPlan.execute"])
def test_core_entries_say_only_cygemms_no_gpu_reason(entry, stream):
    """The message is gpu_unavailable_reason()'s and only that: not CuPy's or the CUDA runtime's
    "CUDA driver version is insufficient" before it (a CudaError still, for callers that catch one)."""
    reason = cygemm.gpu_unavailable_reason()
    with pytest.raises(cygemm.CudaError) as info:
        _core_entries()[entry](stream)
    message = str(info.value)
    assert message == reason
    assert "insufficient" not in message and "cudaError" not in message
    assert info.value.__cause__ is None and (info.value.__suppress_context__ or info.value.__context__ is None)


@pytest.mark.nogpu
def test_no_gpu_reason_starts_with_no_nvidia_gpu_driver_found_where_libcuda_is_missing():
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        pass
    else:
        pytest.skip("a driver library is installed: the reason names what else is missing")
    with pytest.raises(cygemm.CygemmError) as info:
        cygemm.gemm(_fake((4, 4)), _fake((4, 4), i=1), _fake((4, 4), i=2))
    assert str(info.value).splitlines()[0].startswith("no NVIDIA GPU/driver found")


@pytest.mark.nogpu
def test_nn_and_core_share_one_no_gpu_check():
    from cygemm.engine import context as _context
    from cygemm.nn import _gpu
    assert _gpu.require_gpu is _context.require_gpu
    with pytest.raises(cygemm.CudaError) as info:
        _context.require_gpu()
    assert str(info.value) == cygemm.gpu_unavailable_reason()
