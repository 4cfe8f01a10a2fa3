"""The epilogue table (CPU): each cuBLASLt epilogue cygemm applies, as data, agrees with the
activation rows and with cuBLASLt's enum values; the messages list what the table holds."""
import pytest

from cygemm.engine.epilogues import (ACTIVATIONS, EPILOGUE_ACTS, EPILOGUE_NAMES, EPILOGUES, activation_table,
                                     parse_activation)

# cuBLASLt's cublasLtEpilogue_t values (cublasLt.h, CUDA 13)
LT = {"default": 1, "relu": 2, "bias": 4, "relu_bias": 6, "gelu": 32, "gelu_bias": 36, "gelu_aux": 160,
      "gelu_aux_bias": 164}


def test_each_epilogue_row_has_cublaslts_value_and_its_inputs_and_outputs():
    assert {r["name"]: r["epilogue"] for r in EPILOGUES} == LT
    for r in EPILOGUES:
        assert ("bias" in r["inputs"]) == r["name"].endswith("bias")
        assert ("z" in r["outputs"]) == ("aux" in r["name"])
        assert (r["z_ld_multiple"], r["z_alignment"]) == ((8, 16) if "aux" in r["name"] else (None, None))
        assert r["act"] in ACTIVATIONS
    assert EPILOGUE_NAMES == {v: k for k, v in LT.items()}


def test_the_activations_with_an_epilogue_are_listed_from_the_table():
    with_epilogue = sorted({r["act"] for r in EPILOGUES})
    assert with_epilogue == ["gelu", "none", "relu"]
    assert EPILOGUE_ACTS == "'none', 'relu' or 'gelu'"
    slope = [row["name"] for row in activation_table() if row["takes_slope"]]
    assert slope == ["leaky_relu"]


def test_parse_activation_lists_every_name_on_a_bad_one():
    with pytest.raises(ValueError, match="act: expected one of .*'silu'.*got 'swish'"):
        parse_activation("swish")
    assert parse_activation("IDENTITY") == parse_activation("none")
