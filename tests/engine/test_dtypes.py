"""The dtype table (CPU): each row agrees with NumPy, ml_dtypes and DLPack's spec, the levels nest,
and the readers' and allocators' lists are derived from it."""
import os

import ml_dtypes
import numpy as np
import pytest

import cygemm
from cygemm.engine import dtypes

ROWS = dtypes.ROWS


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_each_row_agrees_with_numpy_and_ml_dtypes(row):
    dt = dtypes.numpy_dtype(row["name"])
    assert dt.itemsize == row["size"]
    assert dt == np.dtype(getattr(ml_dtypes, row["name"], None) or row["name"])
    if row["typestr"] is not None:
        assert np.dtype(row["typestr"]) == dt
    if row["dlpack"] is not None:      # DLPack's codes: 0 int, 1 uint, 2 float, 4 bfloat, 5 complex
        code = {"i": 0, "u": 1, "f": 4 if row["name"] == "bfloat16" else 2, "c": 5}[row["kind"]]
        assert row["dlpack"] == (code, 8 * row["size"])
    if row["kind"] == "8":
        assert row["max_finite"] == float(ml_dtypes.finfo(dt).max)


def test_names_are_unique_and_each_resolves_to_its_row():
    seen = [r["name"] for r in ROWS] + [r["alias"] for r in ROWS if r["alias"]]
    assert len(seen) == len(set(seen))
    for r in ROWS:
        assert dtypes.row_of_name(r["name"]) is r
        assert dtypes.name_of(r["cuda"]) == r["name"]
    assert dtypes.name_of(12345) == "cudaDataType 12345"


def test_levels_nest_and_errors_list_what_a_level_takes():
    lv = dtypes.LEVELS
    floats, wide, gemm = (set(dtypes.names(lv[k])) for k in ("float", "wide", "gemm"))
    assert floats < wide < gemm
    assert floats == {"float16", "bfloat16", "float32"}
    assert wide - floats == {"float64", "complex64", "complex128"}
    assert dtypes.expected(lv["float"]) == "float16, bfloat16 or float32"
    assert dtypes.expected(lv["gemm"]).endswith("complex128 or int8")      # int32: a result only
    assert set(dtypes.FP8_FORMATS) == {"e4m3", "e5m2"}
    assert dtypes.FORMATS_EXPECTED == "'e4m3' or 'e5m2'"


def test_the_readers_and_allocators_derive_from_the_table():
    from cygemm.engine.alloc import RESULT_DTYPES
    from cygemm.fp8.args import OUT_DTYPES
    from cygemm.rowmajor.matmul_fallback import GEMM_DTYPES
    from cygemm.fp8 import FP8_MAX
    assert RESULT_DTYPES == dtypes.names(dtypes.LEVELS["gemm"])
    assert GEMM_DTYPES == set(dtypes.names(dtypes.LEVELS["wide"]))
    assert set(OUT_DTYPES) == set(dtypes.names(dtypes.LEVELS["float"])) | set(dtypes.FP8_FORMATS)
    assert FP8_MAX == {"e4m3": 448.0, "e5m2": 57344.0}


# ---- the facts the table carries beyond storage: promotion, FP8 outputs' C and bias, the K-tail guard

PROMOTED = ["float16", "bfloat16", "float32", "float64", "complex64", "complex128"]


@pytest.mark.parametrize("a", PROMOTED)
@pytest.mark.parametrize("b", PROMOTED)
def test_matmul_promotes_mixed_dtypes_as_torch_does(a, b):
    """The table's promotion ranks reproduce torch.promote_types (an independent reference),
    read from what describe_matmul says matmul would cast both operands to."""
    torch = pytest.importorskip("torch")
    if a == b:
        return
    with pytest.raises(ValueError) as info:
        cygemm.describe_matmul(((4, 8), a), ((8, 3), b))
    want = str(torch.promote_types(getattr(torch, a), getattr(torch, b))).replace("torch.", "")
    assert f"cast both to {want} first" in str(info.value), str(info.value)


def test_fp8_output_types_and_guarded_types_come_from_the_table():
    rows = {r["name"]: r for r in ROWS}
    assert {n for n, r in rows.items() if r["kind"] == "f" and r["size"] == 2} == {"float16", "bfloat16"}
    src = open(os.path.join(os.path.dirname(cygemm.__file__), "engine", "dtypes.pxd")).read()
    # cuBLASLt's FP8 rule: C is bfloat16 for an FP8 output, else the output's type; the bias is
    # float16 for a float16 output, else bfloat16; the guard covers the 16-bit floats.
    # An FP8 GEMM pairs E4M3 with itself, never E5M2 (cuBLASLt has no E5M2 x E5M2 kernel).
    for name, c, bias, ktail, alone in (("float16", "CUDA_R_16F", "CUDA_R_16F", 1, 0),
                                        ("bfloat16", "CUDA_R_16BF", "CUDA_R_16BF", 1, 0),
                                        ("float32", "CUDA_R_32F", "CUDA_R_16BF", 0, 0),
                                        ("float8_e4m3fn", "CUDA_R_16BF", "CUDA_R_16BF", 0, 1),
                                        ("float8_e5m2", "CUDA_R_16BF", "CUDA_R_16BF", 0, 0)):
        row = next(line for line in src.splitlines() if f'"{name}"' in line and line.strip().startswith("{CUDA"))
        assert f"{c}, {bias}, {ktail}, {alone}, {rows[name]['xla']}}}," in row, row      # (then XLA's code)
