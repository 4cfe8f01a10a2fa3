"""CPU: cygemm.stream_pointer resolves every kind of stream object without touching the GPU."""
import pytest

import cygemm


def test_stream_resolution_without_touching_the_gpu():
    class CudaStreamProtocol:
        def __cuda_stream__(self):
            return (0, 1234)

    class HasPtr:
        ptr = 5678

    assert cygemm.stream_pointer(99) == 99
    assert cygemm.stream_pointer(CudaStreamProtocol()) == 1234
    assert cygemm.stream_pointer(HasPtr()) == 5678
    with pytest.raises(TypeError, match="stream:"):
        cygemm.stream_pointer("default")
    with pytest.raises(ValueError, match="stream:"):
        cygemm.stream_pointer(-1)
