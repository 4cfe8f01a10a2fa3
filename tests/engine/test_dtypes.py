"""The dtype table (CPU): each row agrees with NumPy, ml_dtypes and DLPack's spec, the levels nest,
and the readers' and allocators' lists are derived from it."""
import ml_dtypes
import numpy as np
import pytest

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
