"""CPU without a GPU: cygemm says so in plain words (its own CudaError naming the call, not
CuPy's), and counts no device. Skipped where a GPU is present."""
import pytest

import cygemm
from fakes import FakeDeviceArray


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
