"""cygemm.engine.lt_features: what the loaded cuBLASLt offers beyond 13.1, decided from the library
(no GPU needed): the functions resolve from the installed library, the batch-invariance attribute
is probed, and each feature's gate gives its reason where it is shut (a test hook stands in for an
older library or another GPU)."""
import ctypes

import pytest

import cygemm
from cygemm.bindings import cuda_paths
from cygemm.engine import lt_features


def _installed_version():
    return cygemm.versions()["cublasLt"]


def test_every_feature_is_named_with_a_verdict_and_a_reason_where_shut():
    found = lt_features.features()
    assert list(found) == list(lt_features.FEATURES)
    for name, verdict in found.items():
        assert set(verdict) == {"usable", "why_not"}
        assert verdict["usable"] is (verdict["why_not"] is None), name


@pytest.mark.skipif(_installed_version() < 131000, reason="needs the cuBLASLt 13.10 that pip installs")
def test_the_installed_cublaslt_13_10_exports_and_accepts_what_13_10_added():
    f = lt_features.features()
    assert f["batch_invariance"]["usable"], f["batch_invariance"]
    assert f["stream_heuristic"]["usable"], f["stream_heuristic"]
    assert f["ktail_fixed"]["usable"], f["ktail_fixed"]
    why = f["grouped_gemm"]["why_not"]           # the library is new enough; only a GPU can be missing
    assert why is None or "compute capability" in why


def test_an_older_library_shuts_every_feature_with_its_reason():
    with lt_features._pretend(130100, grouped=False, stream_heuristic=False, batch_invariance=False, major=9):
        f = lt_features.features()
    assert not any(v["usable"] for v in f.values())
    assert f["grouped_gemm"]["why_not"] == ("needs cuBLASLt 13.8.1 or newer (grouped matmul on Hopper, with its known "
                                            "defects fixed); the loaded cuBLASLt is 13.1.0")
    assert "does not take CUBLASLT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS" in f["batch_invariance"]["why_not"]
    assert "cublasLtMatmulAlgoGetHeuristicForStream" in f["stream_heuristic"]["why_not"]
    assert "13.8.0.4" in f["ktail_fixed"]["why_not"] and "13.1.0" in f["ktail_fixed"]["why_not"]


@pytest.mark.parametrize("version,major,words", [
    (130800, 9, "needs cuBLASLt 13.8.1 or newer"),          # 13.8.0: its builds cannot be told apart
    (131000, 8, "needs a GPU of compute capability 9.0 (Hopper), 10.x or 11.0 (Blackwell); device 0 is 8.x"),
    (130801, 9, None),
    (131000, 10, None),
])
def test_grouped_gemm_needs_13_8_1_and_hopper(version, major, words):
    with lt_features._pretend(version, major=major):
        why = lt_features.feature_gate("grouped_gemm")
    assert (why is None) if words is None else (words in why), why


def test_grouped_gemm_needs_the_exported_function():
    with lt_features._pretend(131000, grouped=False, major=9):
        assert "does not export cublasLtGroupedMatrixLayoutCreate" in lt_features.feature_gate("grouped_gemm")


def test_the_hook_restores_the_loaded_library_and_does_not_nest():
    before = lt_features.features()
    with lt_features._pretend(130100):
        with pytest.raises(RuntimeError, match="do not nest"):
            with lt_features._pretend(130200):
                pass
    assert lt_features.features() == before


def test_an_unknown_feature_is_refused():
    with pytest.raises(ValueError, match=r"name: expected one of 'grouped_gemm', .* got 'fp4'"):
        lt_features.feature_gate("fp4")


def test_versions_reports_the_features():
    v = cygemm.versions()
    assert v["features"] == lt_features.features()


# ---------------------------------------------------------------- the library's own rules, on the CPU
# cuBLASLt's descriptors are host objects: what the grouped route sets on them is checked here
# against the installed library (values from cygemm/bindings/cublaslt.pxd's last section).

@pytest.fixture(scope="module")
def lt():
    if _installed_version() < 131000:
        pytest.skip("needs the cuBLASLt 13.10 that pip installs")
    return ctypes.CDLL(cuda_paths.LOADED["cublasLt"])


def test_the_grouped_hints_are_8_bytes_though_the_header_says_uint32(lt):
    pref = ctypes.c_void_p()
    assert lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)) == 0
    value = ctypes.c_int64(1000)
    try:
        for attr in (13, 14, 15):
            assert lt.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(value), 8) == 0
            assert lt.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(value), 4) != 0
    finally:
        lt.cublasLtMatmulPreferenceDestroy(pref)


def test_a_grouped_layout_is_made_without_a_gpu_and_is_in_grouped_mode(lt):
    layout = ctypes.c_void_p()
    assert lt.cublasLtGroupedMatrixLayoutCreate(ctypes.byref(layout), 14, 8, ctypes.c_void_p(0x1000),
                                                ctypes.c_void_p(0x2000), ctypes.c_void_p(0x3000)) == 0
    try:
        mode, written = ctypes.c_uint32(), ctypes.c_size_t()
        assert lt.cublasLtMatrixLayoutGetAttribute(layout, 8, ctypes.byref(mode), 4, ctypes.byref(written)) == 0
        assert mode.value == 2                      # CUBLASLT_BATCH_MODE_GROUPED
    finally:
        lt.cublasLtMatrixLayoutDestroy(layout)
