"""CPU: cygemm.gemm_ops's activation parsing (against the codes kernels.h defines), attributes
and the deprecated helpers it re-exports (the arrays are fakes never dereferenced). The dense
layer's argument checks are in properties/test_bad_input.py."""
import os
import re

import numpy as np
import pytest

import cygemm
from cygemm import gemm_ops
from cygemm.engine.epilogues import activation_table
from cygemm.gemm_ops import ActAttrs, parse_activation
from fakes import BASE, FakeDeviceArray as F


def _header_activation_codes():
    """{name: code} of the cygemm_act_t enum, read from kernels.h where get_include() says it is
    (the codes the kernels switch on)."""
    for folder in cygemm.get_include():
        path = os.path.join(folder, "cygemm", "kernels.h")
        if os.path.isfile(path):
            text = open(path).read()
            enum = re.search(r"typedef enum \{(.*?)\} cygemm_act_t;", text, re.S)
            assert enum, f"{path}: no cygemm_act_t enum"
            return {name.lower(): int(code) for name, code in re.findall(r"CYGEMM_ACT_(\w+)\s*=\s*(\d+)", enum.group(1))}
    raise AssertionError(f"cygemm/kernels.h is in none of {cygemm.get_include()}")


def test_parse_activation_gives_the_kernels_codes():
    codes = _header_activation_codes()
    assert len(codes) >= 8 and len(set(codes.values())) == len(codes), codes
    # Every activation of the epilogue table, and nothing else, is a code of the kernels.
    assert {row["name"]: row["code"] for row in activation_table()} == codes
    for name, code in codes.items():
        assert parse_activation(name) == code
        assert parse_activation(name.upper()) == code          # names are case-insensitive
    assert set(gemm_ops.ACTIVATIONS) == set(codes) | {"identity"}
    assert parse_activation("identity") == codes["none"]        # the one alias


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


# The seed's helpers: deprecated, re-exported from gemm_ops for one release, each warning when
# called (never when imported) and naming itself.
DEPRECATED_HELPERS = ["TensorDesc", "as_tensor_2d", "assert_f32_2d", "empty_2d", "empty_like_2d",
                      "get_stream_ptr", "to_voidp_capsule", "ensure_cuda_dlls"]


def _warns(name):
    return pytest.warns(DeprecationWarning, match=rf"cygemm\.gemm_ops\.{name} is deprecated")


def test_tensor_descriptors():
    with _warns("as_tensor_2d"):
        d = gemm_ops.as_tensor_2d(F((5, 7), strides=(40, 4), ptr=BASE + 16))
    assert tuple(d) == (BASE + 16, 5, 7, 10, "float32") and type(d) is gemm_ops.TensorDesc
    assert (d.ptr, d.rows, d.cols, d.ld, d.dtype) == (BASE + 16, 5, 7, 10, "float32")
    with _warns("TensorDesc"):
        assert d == gemm_ops.TensorDesc(BASE + 16, 5, 7, 10, "float32")
    with _warns("assert_f32_2d"):
        assert gemm_ops.assert_f32_2d(F((3, 4))) == (3, 4)
    with _warns("assert_f32_2d"), pytest.raises(TypeError, match="float32"):
        gemm_ops.assert_f32_2d(F((3, 4), "<f2"))
    with _warns("as_tensor_2d"), pytest.raises(ValueError, match="2-D"):
        gemm_ops.as_tensor_2d(F((2, 3, 4)))
    with _warns("as_tensor_2d"), pytest.raises(ValueError, match="unit stride"):
        gemm_ops.as_tensor_2d(F((3, 4), strides=(4, 12)))
    with _warns("as_tensor_2d"), pytest.raises(TypeError):
        gemm_ops.as_tensor_2d(np.zeros((2, 2), np.float32))


def test_voidp_capsule_and_stream_ptr_and_dlls():
    import ctypes
    with _warns("to_voidp_capsule"):
        cap = gemm_ops.to_voidp_capsule(0x1234)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    assert get(cap, None) == 0x1234
    with _warns("to_voidp_capsule"), pytest.raises(ValueError, match="ptr"):
        gemm_ops.to_voidp_capsule(0)
    with _warns("get_stream_ptr"):
        assert gemm_ops.get_stream_ptr(77) == 77
    with _warns("ensure_cuda_dlls"):
        assert gemm_ops.ensure_cuda_dlls() == []   # a documented no-op: cygemm is Linux-only


def test_deprecated_helpers_are_the_compat_modules_and_public_for_one_release():
    from cygemm.engine import seed_helpers as _seed_helpers
    for name in DEPRECATED_HELPERS:
        assert getattr(gemm_ops, name) is getattr(_seed_helpers, name), name
        assert name not in gemm_ops.__all__, name     # deprecated: importable, not exported
    # The warning points at the caller's line, not at the compat module.
    with pytest.warns(DeprecationWarning) as record:
        gemm_ops.get_stream_ptr(5)
    assert [w.filename for w in record] == [__file__]


def test_importing_gemm_ops_and_its_helpers_does_not_warn():
    import subprocess
    import sys
    code = ("import cygemm.gemm_ops\n"
            "from cygemm.gemm_ops import *\n"
            f"from cygemm.gemm_ops import {', '.join(DEPRECATED_HELPERS)}\n")
    # cygemm's deprecation messages start with the deprecated name, "cygemm.".
    proc = subprocess.run([sys.executable, "-W", "error:cygemm:DeprecationWarning", "-c", code],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
