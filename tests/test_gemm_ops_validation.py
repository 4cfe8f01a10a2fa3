"""CPU: activation parsing, attributes, helpers, and the fused API's argument checks
(raised before anything touches the GPU; the arrays are fakes never dereferenced)."""
import numpy as np
import pytest

from cygemm import gemm_ops
from cygemm.gemm_ops import ActAttrs, backward_into, forward_into, parse_activation
from fakes import BASE, FakeDeviceArray as F


@pytest.mark.parametrize("name,code", [("none", 0), ("identity", 0), ("relu", 1), ("leaky_relu", 2),
                                       ("gelu", 3), ("gelu_erf", 4), ("sigmoid", 5), ("tanh", 6),
                                       ("silu", 7), ("ReLU", 1)])
def test_parse_activation(name, code):
    assert parse_activation(name) == code


@pytest.mark.parametrize("bad", ["swish", "", None, 3])
def test_parse_activation_lists_valid_names(bad):
    with pytest.raises(ValueError) as info:
        parse_activation(bad)
    assert "act:" in str(info.value) and "leaky_relu" in str(info.value) and "gelu_erf" in str(info.value)


def test_act_attrs():
    a = ActAttrs.make("GELU", with_bias=False, leaky_slope=0.2)
    assert a == ActAttrs("gelu", False, 0.2)
    assert a.kwargs() == {"act": "gelu", "with_bias": False, "leaky_slope": 0.2}
    for slope in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="leaky_slope"):
            ActAttrs.make("leaky_relu", leaky_slope=slope)
    with pytest.raises(ValueError, match="act:"):
        ActAttrs.make("mish")


def test_tensor_descriptors():
    d = gemm_ops.as_tensor_2d(F((5, 7), strides=(40, 4), ptr=BASE + 16))
    assert d == gemm_ops.TensorDesc(BASE + 16, 5, 7, 10, "float32")
    assert gemm_ops.assert_f32_2d(F((3, 4))) == (3, 4)
    with pytest.raises(TypeError, match="float32"):
        gemm_ops.assert_f32_2d(F((3, 4), "<f2"))
    with pytest.raises(ValueError, match="2-D"):
        gemm_ops.as_tensor_2d(F((2, 3, 4)))
    with pytest.raises(ValueError, match="unit stride"):
        gemm_ops.as_tensor_2d(F((3, 4), strides=(4, 12)))
    with pytest.raises(TypeError):
        gemm_ops.as_tensor_2d(np.zeros((2, 2), np.float32))


def test_voidp_capsule_and_stream_ptr_and_dlls():
    import ctypes
    cap = gemm_ops.to_voidp_capsule(0x1234)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    assert get(cap, None) == 0x1234
    with pytest.raises(ValueError, match="ptr"):
        gemm_ops.to_voidp_capsule(0)
    assert gemm_ops.get_stream_ptr(77) == 77
    assert gemm_ops.ensure_cuda_dlls() == []   # a no-op off Windows


M, K, N = 6, 5, 4
A, B, Y = F((M, K)), F((K, N)), F((M, N))

FORWARD_CASES = [
    ((np.ones((M, K), np.float32), B, Y), {}, TypeError, "A:"),
    ((A, F((K + 1, N)), Y), {}, ValueError, "B:"),
    ((A, B, F((M, N + 1))), {}, ValueError, "out:"),
    ((A, B, F((M, N), "<f2")), {}, TypeError, "out:"),
    ((A, B, F((M, N), strides=(4, 4 * M))), {}, ValueError, "out:"),     # column-major out
    ((A, B, Y, F((N + 1,))), {}, ValueError, "bias:"),
    ((A, B, Y, F((2, N))), {}, ValueError, "bias:"),
    ((A, B, Y, F((N,), "<f2")), {}, TypeError, "bias:"),
    ((A, B, Y), {"save_z": True}, ValueError, "z_out:"),
    ((A, B, Y), {"z_out": F((M, N))}, ValueError, "z_out:"),
    ((A, B, Y), {"save_z": True, "z_out": F((M + 1, N))}, ValueError, "z_out:"),
    ((A, B, Y), {"act": "swish"}, ValueError, "act:"),
    ((A, B, Y), {"act": "leaky_relu", "leaky_slope": -1.0}, ValueError, "leaky_slope:"),
    ((A, B, Y), {"math": "fp64"}, ValueError, "math:"),
    ((A, B, Y), {"lt_workspace": bytearray(16)}, TypeError, "lt_workspace:"),
    ((A, B, Y), {"stream": 1.5}, TypeError, "stream:"),
]


@pytest.mark.parametrize("args,kwargs,exc,word", FORWARD_CASES, ids=[c[3] + str(i) for i, c in enumerate(FORWARD_CASES)])
def test_forward_into_rejects(args, kwargs, exc, word):
    with pytest.raises(exc) as info:
        forward_into(*args, **kwargs)
    assert word in str(info.value)


BACKWARD_CASES = [
    ((A, B, F((M, N + 1)), None), {}, ValueError, "gY:"),
    ((A, B, Y, None), {"act": "relu"}, ValueError, "Z:"),
    ((A, B, Y, F((M, 1))), {"act": "relu"}, ValueError, "Z:"),
    ((A, B, Y, Y), {"act": "relu", "gA_out": F((M, K))}, ValueError, "work_dZ:"),
    ((A, B, Y, Y), {"act": "relu", "gA_out": F((M, K)), "work_dZ": F((M, N + 1))}, ValueError, "work_dZ:"),
    ((A, B, Y, None), {"gA_out": F((M, K + 1))}, ValueError, "gA_out:"),
    ((A, B, Y, None), {"gB_out": F((K, N), "<f2")}, TypeError, "gB_out:"),
    ((A, B, Y, None), {"gB_out": F((K, N), strides=(16, 8))}, ValueError, "gB_out:"),
    ((A, B, Y, None), {"gBias_out": F((N - 1,))}, ValueError, "gBias_out:"),
    ((A, B, Y, None), {"act": "elu"}, ValueError, "act:"),
    ((A, B, Y, None), {"act": "gelu", "y": Y}, ValueError, "y:"),
    ((A, B, Y, None), {"act": "leaky_relu", "leaky_slope": 0.0, "y": Y}, ValueError, "y:"),
    ((A, B, Y, None), {"act": "relu", "y": F((M, N + 2))}, ValueError, "y:"),
]


@pytest.mark.parametrize("args,kwargs,exc,word", BACKWARD_CASES, ids=[c[3] + str(i) for i, c in enumerate(BACKWARD_CASES)])
def test_backward_into_rejects(args, kwargs, exc, word):
    with pytest.raises(exc) as info:
        backward_into(*args, **kwargs)
    assert word in str(info.value)
