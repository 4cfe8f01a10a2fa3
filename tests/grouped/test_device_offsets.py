"""The calls whose group offsets are a device array (cygemm.grouped.device_offsets): on the CPU,
which route the one chooser names and why (an older cuBLAS or GPU reads the offsets once, a
determinism mode does, a capture admits only the sync-free route, a forced route is followed),
as describe_moe reports it; on the GPU, check_offsets refuses wrong offsets, and offsets on the
GPU inside a capture where the sync-free route does not apply raise CaptureError saying why."""
import re

import pytest

import cygemm
from cygemm import grouped
from cygemm.engine import lt_features
from fakes import moe_fakes
from gpu_util import poisoned, rand

HOPPER_13_10 = dict(version=131000, major=9)


def moe(**kw):
    return moe_fakes(**kw)


def _cp():
    import cupy as cp
    return cp


@pytest.mark.parametrize("pretend,words", [
    (dict(version=130100, major=9), "needs cuBLASLt 13.8.1 or newer"),
    (dict(version=130800, major=9), "needs cuBLASLt 13.8.1 or newer"),
    (dict(version=131000, major=8), "compute capability 9.0 (Hopper), 10.x or 11.0 (Blackwell); device 0 is 8.x"),
    (dict(version=131000, major=9, grouped=False), "does not export cublasLtGroupedMatrixLayoutCreate"),
])
def test_an_older_cublas_or_gpu_reads_the_offsets_once_and_says_why(pretend, words):
    with lt_features._pretend(**pretend):
        d = grouped.describe_moe(*moe())
    assert d["chosen"] == "host_offsets" and d["syncs"] is True
    assert words in d["not_applicable"]["lt_grouped"]


def test_a_determinism_mode_reads_the_offsets():
    with lt_features._pretend(**HOPPER_13_10):
        d = grouped.describe_moe(*moe(), determinism="batch_invariant")
    assert d["chosen"] == "host_offsets" and "determinism mode" in d["not_applicable"]["lt_grouped"]


def test_inside_a_capture_only_the_sync_free_route_applies():
    with lt_features._pretend(**HOPPER_13_10):
        d = grouped.describe_moe(*moe(), capturing=True)
    assert d["routes"] == ["lt_grouped"] and d["chosen"] == "lt_grouped"
    assert "sync" in d["not_applicable"]["host_offsets"]
    with lt_features._pretend(version=130100, major=9):
        d = grouped.describe_moe(*moe(), capturing=True)
    assert d["routes"] == [] and d["chosen"] is None
    assert "CaptureError" in d["why_chosen"] and "13.8.1" in d["why_chosen"]


def test_a_forced_route_is_what_describe_moe_chooses():
    from cygemm.engine import tuning
    tuning.force_routes(moe_offsets="host_offsets")
    try:
        with lt_features._pretend(**HOPPER_13_10):
            d = grouped.describe_moe(*moe())
        assert d["chosen"] == "host_offsets" and d["decided_by"] == "forced"
    finally:
        tuning.force_routes()


@pytest.mark.gpu
def test_check_offsets_refuses_wrong_device_offsets():
    cp = _cp()
    T, K, N, G = 20, 16, 8, 3
    x, w, out = rand(cp, (T, K)), rand(cp, (G, K, N)), poisoned(cp, (T, N))
    with pytest.raises(ValueError, match="group_offsets: expected non-decreasing offsets"):
        grouped.moe_gemm(x, w, cp.asarray([0, 12, 4, 20], dtype=cp.int32), out, check_offsets=True)
    with pytest.raises(ValueError, match="group_offsets: expected the last offset to be T = 20"):
        grouped.moe_gemm(x, w, cp.asarray([0, 4, 8, 19], dtype=cp.int32), out, check_offsets=True)


@pytest.mark.gpu
def test_device_offsets_inside_a_capture_without_the_grouped_matmul_raise_capture_error():
    cp = _cp()
    T, K, N, G = 16, 16, 16, 2
    x, w, out = rand(cp, (T, K)), rand(cp, (G, K, N)), poisoned(cp, (T, N))     # float32: no lt_grouped
    dev = cp.asarray([0, 8, 16], dtype=cp.int32)
    s = cp.cuda.Stream(non_blocking=True)
    # The reason lt_grouped does not apply: the loaded cuBLAS's or GPU's, where the gate shuts it
    # (the image's 13.1), else float32's.
    gate = lt_features.feature_gate("grouped_gemm")
    with pytest.raises(cygemm.CaptureError, match=re.escape(gate) if gate else "takes bfloat16 and float16"):
        with cygemm.graph.capture(s):
            grouped.moe_gemm(x, w, dev, out, stream=s)
