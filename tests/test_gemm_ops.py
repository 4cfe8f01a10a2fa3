"""CPU: cygemm.gemm_ops's activation parsing (against the codes kernels.h defines), attributes,
and the helpers removed in 0.2. The dense layer's argument checks are in
properties/test_bad_input.py."""
import os
import re

import pytest

import cygemm
from cygemm import gemm_ops
from cygemm.engine.epilogues import activation_table
from cygemm.gemm_ops import ActAttrs, parse_activation


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


# The seed's helpers were deprecated in 0.1 and are gone in 0.2, as is cygemm.fused (the dense
# layer's old name).
REMOVED_HELPERS = ["TensorDesc", "as_tensor_2d", "assert_f32_2d", "empty_2d", "empty_like_2d",
                   "get_stream_ptr", "to_voidp_capsule", "ensure_cuda_dlls"]


@pytest.mark.parametrize("name", REMOVED_HELPERS)
def test_the_removed_helpers_are_gone(name):
    assert not hasattr(gemm_ops, name)
    with pytest.raises(ImportError):
        exec(f"from cygemm.gemm_ops import {name}", {})


def test_the_old_name_of_the_dense_layer_is_gone():
    import cygemm
    with pytest.raises(ModuleNotFoundError):
        import cygemm.fused  # noqa: F401
    with pytest.raises(AttributeError):
        cygemm.fused
