"""The FP8 mixture-of-experts GEMM (cygemm.grouped.moe_fp8): on the CPU, every refusal before
anything runs and the route describe_moe_scaled names for each cuBLAS, GPU and format; on the GPU,
both routes of device offsets and host offsets against a float64 reference of the dequantized
operands, fresh seeded inputs, NaN-poisoned outputs, empty experts, one scale per expert or one
for all, and a captured graph replayed with new offsets."""
import numpy as np
import pytest

import cygemm
from cygemm import grouped
from cygemm.engine import lt_features
from fakes import FakeDeviceArray
from refs import moe as moe_ref
from refs.fp8 import expand_scale
from gpu_util import poisoned, rel_err, skip_without_lt_grouped

B = 0x7F0000000000
HOPPER_13_10 = dict(version=131000, major=9)


def fp8_fakes(T=40, K=64, N=48, G=4, out="<f2", scales_w=None, offsets="<i4"):
    x = FakeDeviceArray((T, K), "|u1", None, B)
    w = FakeDeviceArray((G, N, K), "|u1", None, B + 0x1000000)
    sx = FakeDeviceArray((1,), "<f4", None, B + 0x2000000)
    sw = FakeDeviceArray((G if scales_w is None else scales_w,), "<f4", None, B + 0x2000100)
    offs = FakeDeviceArray((G + 1,), offsets, None, B + 0x3000000)
    o = FakeDeviceArray((T, N), out, None, B + 0x4000000)
    return x, w, sx, sw, offs, o


FMT = dict(format_x="e4m3", format_w="e4m3")


# ---------------------------------------------------------------- CPU: refusals before anything runs

def test_operands_that_are_not_fp8_are_refused():
    x, w, sx, sw, offs, out = fp8_fakes()
    with pytest.raises(TypeError, match="x:"):
        grouped.moe_scaled_gemm(FakeDeviceArray((40, 64), "<f2", None, B), w, sx, sw, offs, out, **FMT)
    with pytest.raises(ValueError, match="format_w: expected 'e4m3' or 'e5m2', got 'e3m4'"):
        grouped.moe_scaled_gemm(x, w, sx, sw, offs, out, format_x="e4m3", format_w="e3m4")


def test_shapes_scales_and_outputs_that_do_not_fit_are_refused():
    x, w, sx, sw, offs, out = fp8_fakes()
    with pytest.raises(ValueError, match=r"w: x is \(40, 64\) so w must be \(G, N, 64\)"):
        grouped.moe_scaled_gemm(x, FakeDeviceArray((4, 48, 32), "|u1", None, B + 0x1000000), sx, sw, offs, out, **FMT)
    with pytest.raises(ValueError, match=r"scale_w: expected G = 4 scales \(one per expert\) or one, got 3"):
        grouped.moe_scaled_gemm(x, w, sx, fp8_fakes(scales_w=3)[3], offs, out, **FMT)
    with pytest.raises(TypeError, match="scale_w: expected float32 scales, got float16"):
        grouped.moe_scaled_gemm(x, w, sx, FakeDeviceArray((4,), "<f2", None, B + 0x2000100), offs, out, **FMT)
    with pytest.raises(TypeError, match="scale_w: expected float32 scales, got int32"):
        grouped.moe_scaled_gemm(x, w, sx, FakeDeviceArray((4,), "<i4", None, B + 0x2000100), offs, out, **FMT)
    with pytest.raises(ValueError, match="group_offsets: expected its start aligned to its 4-byte elements"):
        grouped.moe_scaled_gemm(x, w, sx, sw, FakeDeviceArray((5,), "<i4", None, B + 0x3000002), out, **FMT)
    with pytest.raises(ValueError, match="scale_x: expected a device float32 scalar"):
        grouped.moe_scaled_gemm(x, w, sw, sw, offs, out, **FMT)
    with pytest.raises(TypeError, match="scale_x: expected a device float32 scalar .* got a host number"):
        grouped.moe_scaled_gemm(x, w, 1.0, sw, offs, out, **FMT)
    with pytest.raises(TypeError, match="out: expected float16, bfloat16 or float32, got float64"):
        grouped.moe_scaled_gemm(x, w, sx, sw, offs, fp8_fakes(out="<f8")[5], **FMT)
    with pytest.raises(ValueError, match=r"out: expected shape \(40, 48\), got \(40, 40\)"):
        grouped.moe_scaled_gemm(x, w, sx, sw, offs, FakeDeviceArray((40, 40), "<f2", None, B + 0x4000000), **FMT)
    with pytest.raises(ValueError, match=r"group_offsets: expected G \+ 1 = 5 offsets"):
        grouped.moe_scaled_gemm(x, w, sx, sw, FakeDeviceArray((4,), "<i4", None, B + 0x3000000), out, **FMT)
    with pytest.raises(ValueError, match="group_offsets: expected the last offset to be T = 40"):
        grouped.moe_scaled_gemm(x, w, sx, sw, [0, 10, 10, 30, 39], out, **FMT)
    with pytest.raises(ValueError, match="out: its memory overlaps x"):
        grouped.moe_scaled_gemm(x, w, sx, sw, offs, FakeDeviceArray((40, 48), "<f2", None, B + 64), **FMT)


def test_routes_are_checked():
    x, w, sx, sw, offs, out = fp8_fakes()
    with pytest.raises(ValueError, match="route: expected None or one of 'loop', 'lt_grouped', 'host_offsets', got 'grouped'"):
        grouped.moe_scaled_gemm(x, w, sx, sw, offs, out, route="grouped", **FMT)


# ---------------------------------------------------------------- CPU: the route, and why

@pytest.mark.parametrize("scales_w", [None, 1])
@pytest.mark.parametrize("out", ["<f2", "<f4"])
def test_hopper_and_cublas_13_10_take_the_fp8_grouped_matmul(scales_w, out):
    with lt_features._pretend(**HOPPER_13_10):
        d = grouped.describe_moe_scaled(*fp8_fakes(out=out, scales_w=scales_w), **FMT)
    assert d["chosen"] == "lt_grouped" and d["syncs"] is False


@pytest.mark.parametrize("kw,exc,words", [
    (dict(format_x="e5m2", format_w="e5m2"), TypeError, "cuBLASLt has no E5M2 x E5M2 GEMM"),
    (dict(format_x="e4m3", format_w="e5m2", K=72), ValueError, "K to be a multiple of 16, got K = 72; pad K to 80"),
])
def test_what_no_fp8_gemm_takes_is_refused_whatever_the_route(kw, exc, words):
    fmts = {k: kw.pop(k) for k in ("format_x", "format_w")}
    for offsets in (None, "host"):
        args = list(fp8_fakes(**kw))
        if offsets == "host":
            args[4] = [0, 10, 10, 30, 40]
        with pytest.raises(exc, match=words):
            grouped.describe_moe_scaled(*args, **fmts)


def test_an_output_of_unit_stride_rows_only_takes_the_grouped_matmul():
    x, w, sx, sw, offs, _ = fp8_fakes()
    out = FakeDeviceArray((40, 48), "<f2", (2, 80), B + 0x4000000)           # column-major
    with lt_features._pretend(**HOPPER_13_10):
        d = grouped.describe_moe_scaled(x, w, sx, sw, offs, out, **FMT)
    assert d["chosen"] == "host_offsets" and "unit stride" in d["not_applicable"]["lt_grouped"]


def test_host_offsets_refuse_the_routes_of_device_offsets_and_unsliceable_arrays():
    x, w, sx, sw, _, out = fp8_fakes()
    with pytest.raises(ValueError, match="route: 'lt_grouped' does not apply: it reads the group offsets from a device"):
        grouped.moe_scaled_gemm(x, w, sx, sw, [0, 10, 10, 30, 40], out, route="lt_grouped", **FMT)
    with pytest.raises(TypeError, match="x: the route of host offsets runs fp8.scaled_matmul per expert"):
        grouped.moe_scaled_gemm(x, w, sx, sw, [0, 10, 10, 30, 40], out, **FMT)


def test_host_offsets_run_per_expert():
    x, w, sx, sw, _, out = fp8_fakes()
    d = grouped.describe_moe_scaled(x, w, sx, sw, [0, 10, 10, 30, 40], out, **FMT)
    assert d["offsets"] == "host" and d["chosen"] == "loop"


# ---------------------------------------------------------------- GPU: against float64

def _cp():
    import cupy as cp
    return cp


def _operands(cp, T, K, N, G, seed):
    """FP8 tokens and weights (E4M3, tensor-wide scales from fp8.quantize_scaled) and their
    dequantized float64 values."""
    rng = np.random.default_rng(seed)
    x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
    w = cp.asarray(rng.standard_normal((G, N, K)).astype(np.float32))
    xq, sx = cygemm.fp8.quantize_scaled(x, "tensor")
    wqs = [cygemm.fp8.quantize_scaled(w[g], "tensor") for g in range(G)]
    wq = cp.stack([q for q, _ in wqs])
    sw = cp.concatenate([s.reshape(1) for _, s in wqs])
    deq = lambda q: cp.asnumpy(cygemm.fp8.dequantize(q, cp.ones(1, cp.float32), format="e4m3")).astype(np.float64)
    return xq, wq, sx.reshape(1), sw, deq(xq) * float(sx.get().reshape(-1)[0]), np.stack(
        [deq(wq[g]) * float(sw[g].get()) for g in range(G)])


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["lt_grouped", "host_offsets", "loop", None])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_fp8_moe_matches_the_dequantized_float64_product(route, dtype):
    cp = _cp()
    if route == "lt_grouped":
        skip_without_lt_grouped()
    counts = [0, 24, 8, 0, 40, 16]
    offs = moe_ref.offsets(counts)
    T, K, N, G = offs[-1], 128, 64, len(counts)
    xq, wq, sx, sw, x64, w64 = _operands(cp, T, K, N, G, 11)
    out = poisoned(cp, (T, N), dtype)
    dev = cp.asarray(offs, dtype=cp.int32)
    grouped.moe_scaled_gemm(xq, wq, sx, sw, dev, out, format_x="e4m3", format_w="e4m3", route=route)
    cp.cuda.Device().synchronize()
    assert rel_err(cp.asnumpy(out.astype(cp.float32)), moe_ref.forward(x64, w64, offs, "nk")) < 1e-2


@pytest.mark.gpu
def test_a_captured_fp8_graph_replays_with_new_offsets():
    cp = _cp()
    skip_without_lt_grouped()
    T, K, N, G = 96, 128, 64, 4
    xq, wq, sx, sw, x64, w64 = _operands(cp, T, K, N, G, 12)
    out = poisoned(cp, (T, N), "bfloat16")
    dev = cp.asarray([0, 24, 48, 72, 96], dtype=cp.int32)
    s = cp.cuda.Stream(non_blocking=True)
    grouped.moe_scaled_gemm(xq, wq, sx, sw, dev, out, format_x="e4m3", format_w="e4m3", stream=s)
    s.synchronize()
    with cygemm.graph.capture(s) as g:
        grouped.moe_scaled_gemm(xq, wq, sx, sw, dev, out, format_x="e4m3", format_w="e4m3", stream=s)
    for offs in ([0, 0, 50, 50, 96], [0, 96, 96, 96, 96], [0, 10, 20, 30, 96]):
        dev[...] = cp.asarray(offs, dtype=cp.int32)
        out[...] = cp.nan
        cp.cuda.Device().synchronize()
        g.launch(s)
        s.synchronize()
        assert rel_err(cp.asnumpy(out.astype(cp.float32)), moe_ref.forward(x64, w64, offs, "nk")) < 1e-2


# ---------------------------------------------------------------- DeepSeek-V3's block scales

def block_fakes(T=64, K=256, N=256, G=4, sx_strides=None, sw_strides=None, workspace=True):
    kb = -(-K // 128)
    x = FakeDeviceArray((T, K), "|u1", None, B)
    w = FakeDeviceArray((G, N, K), "|u1", None, B + 0x1000000)
    sx = FakeDeviceArray((T, kb), "<f4", sx_strides or (4, 4 * T), B + 0x2000000)
    sw = FakeDeviceArray((G * N // 128, kb), "<f4", sw_strides or (16 * -(-kb // 4), 4), B + 0x2100000)
    offs = FakeDeviceArray((G + 1,), "<i4", None, B + 0x3000000)
    out = FakeDeviceArray((T, N), "<f2", None, B + 0x4000000)
    ws = FakeDeviceArray((kb * (-(-T // 4) * 4 + 4 * G),), "<f4", None, B + 0x5000000) if workspace else None
    return (x, w, sx, sw, offs, out), ws


def test_block_scales_on_hopper_take_the_grouped_matmul_with_a_workspace():
    args, ws = block_fakes()
    with lt_features._pretend(**HOPPER_13_10):
        d = grouped.describe_moe_scaled(*args, workspace=ws, **FMT)
    assert d["chosen"] == "lt_grouped"
    with lt_features._pretend(version=131000, major=10):
        d = grouped.describe_moe_scaled(*args, workspace=ws, **FMT)
    assert "Hopper (compute capability 9.0) only" in d["not_applicable"]["lt_grouped"]


@pytest.mark.parametrize("change,exc,words", [
    (dict(workspace=False), ValueError, r"workspace: block scales with offsets on the GPU need .* = 160 elements"),
    (dict(sx_strides=(8, 4)), ValueError, "scale_x: expected 1x128 token scales of shape \\(64, 2\\) with the tokens "
                                          "contiguous"),
    (dict(sw_strides=(8, 4)), ValueError, "scale_w: expected 128x128 weight scales of shape \\(8, 2\\) with rows 4 "
                                          "apart"),
    (dict(N=192), ValueError, "w: 128x128 weight scales need N to be a multiple of 128"),
])
def test_block_scales_of_another_layout_are_refused(change, exc, words):
    n = change.pop("N", 256)
    args, ws = block_fakes(N=n if n % 128 == 0 else 256, **change)
    if n % 128:
        args = (args[0], FakeDeviceArray((4, n, 256), "|u1", None, B + 0x1000000), args[2],
                FakeDeviceArray((4 * 2, 2), "<f4", (16, 4), B + 0x2100000), args[4],
                FakeDeviceArray((64, n), "<f2", None, B + 0x4000000))
    with pytest.raises(exc, match=words):
        grouped.describe_moe_scaled(*args, workspace=ws, **FMT)


def _block_operands(cp, T, K, N, G, seed):
    rng = np.random.default_rng(seed)
    x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
    w = cp.asarray(rng.standard_normal((G, N, K)).astype(np.float32))
    xq, sx = cygemm.fp8.quantize_scaled(x, "1x128")
    wq, sw = cygemm.fp8.quantize_scaled(w.reshape(G * N, K), "128x128")
    one = cp.ones(1, cp.float32)
    deq = lambda q: cp.asnumpy(cygemm.fp8.dequantize(q, one, format="e4m3")).astype(np.float64)
    sx_full = expand_scale(cp.asnumpy(sx), "1x128", (T, K), "a")
    sw_full = expand_scale(cp.asnumpy(sw), "128x128", (G * N, K), "a")       # (each expert's (N, K) rows)
    return xq, wq.reshape(G, N, K), sx, sw, deq(xq) * sx_full, (deq(wq) * sw_full).reshape(G, N, K)


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["lt_grouped", "host_offsets", None])
def test_block_scaled_fp8_moe_matches_the_dequantized_float64_product(route):
    cp = _cp()
    if route == "lt_grouped" and (lt_features.feature_gate("grouped_gemm") or lt_features.major() != 9):
        pytest.skip("block-scaled grouped FP8 needs cuBLASLt's grouped matmul on Hopper")
    counts = [15, 0, 41, 8, 64]          # (rows not in fours: padded on the per-expert route)
    offs = moe_ref.offsets(counts)
    T, K, N, G = offs[-1], 384, 256, len(counts)
    xq, wq, sx, sw, x64, w64 = _block_operands(cp, T, K, N, G, 13)
    out = poisoned(cp, (T, N), "bfloat16")
    ws = cp.full(3 * (-(-T // 4) * 4 + 4 * G), cp.nan, cp.float32)
    grouped.moe_scaled_gemm(xq, wq, sx, sw, cp.asarray(offs, dtype=cp.int32), out, format_x="e4m3", format_w="e4m3",
                            workspace=ws, route=route)
    cp.cuda.Device().synchronize()
    assert rel_err(cp.asnumpy(out.astype(cp.float32)), moe_ref.forward(x64, w64, offs, "nk")) < 1e-2
