"""cygemm.fp8.quantize_scaled (cygemm.fp8.scales): FP8 codes and scales per row, per 1 x 128 tile
and per 128 x 128 block, plain and transposed, bitwise against the NumPy definition
(tests/refs/fp8.py) with saturation, NaN and zero groups; written into given arrays, captured
and replayed, and read by scaled_matmul as they are written (GPU). Refusals (CPU)."""
import numpy as np
import pytest

import cygemm
from cygemm import fp8
from fakes import FakeDeviceArray, BASE
from refs import fp8 as fp8_ref
from gpu_util import rel_err


def fake(shape, typestr="<f4", strides=None, ptr=BASE):
    item = int(typestr[2:])
    return FakeDeviceArray(shape, typestr, None if strides is None else tuple(s * item for s in strides), ptr)


# ------------------------------------------------------------------ CPU: refusals

@pytest.mark.parametrize("args, kw, exc, words", [
    ((fake((64, 256)), "blockwise"), {}, ValueError, ["mode:", "'tensor'", "'1x128'"]),
    ((fake((64, 256)), "1x128"), dict(format="fp8"), ValueError, ["format:", "'e4m3' or 'e5m2'"]),
    ((fake((2, 64, 256)), "1x128"), {}, ValueError, ["x:", "x.reshape(-1, C)"]),
    ((fake((64, 256), "<i4"), "1x128"), {}, TypeError, ["x:", "int32"]),
    ((fake((64, 256), strides=(1, 64)), "1x128"), {}, ValueError, ["x:", "C-contiguous"]),
    ((fake((64, 256)), "1x128"), dict(out=fake((64, 256), "|u1", ptr=BASE + 0x100000), transpose=True), ValueError,
     ["out:", "(256, 64)"]),
    ((fake((64, 256)), "1x128"), dict(out=fake((64, 256), ptr=BASE + 0x100000)), TypeError, ["out:", "float32"]),
    ((fake((64, 256)), "1x128"), dict(scale=fake((64, 2), ptr=BASE + 0x200000)), ValueError,
     ["scale:", "(64, 2) float32 stored M-contiguous", "got shape (64, 2) with element strides (2, 1)"]),
    ((fake((256, 1024)), "128x128"), dict(scale=fake((2, 8), strides=(12, 1), ptr=BASE + 0x200000)), ValueError,
     ["scale:", "rows 8 apart"]),
    ((fake((64, 256)), "rowwise"), dict(scale=fake((64, 1), "<f2", ptr=BASE + 0x200000)), TypeError,
     ["scale:", "float32", "float16"]),
])
def test_bad_arguments_are_refused_before_anything_runs(args, kw, exc, words):
    with pytest.raises(exc) as info:
        fp8.quantize_scaled(*args, **kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_the_reference_scales_each_group_by_its_own_amax():
    x = np.zeros((2, 300), np.float32)
    x[0, :128] = 4.0
    x[0, 128:256] = 0.25
    x[1, 5] = np.nan                     # NaN ignored; the rest of its group is zero: m = 1
    codes, scales = fp8_ref.quantize_scaled(x, "1x128", "e4m3")
    assert scales.shape == (2, 3)
    assert scales[0, 0] == np.float32(4.0) / np.float32(448.0) or scales[0, 0] == np.float32(1) / (
        np.float32(448.0) / np.float32(4.0))
    assert fp8_ref.decode(codes[0, :1], "e4m3")[0] == 448.0 and scales[1, 0] == 1.0 and scales[0, 2] == 1.0
    assert np.isnan(fp8_ref.decode(codes[1, 5:6], "e4m3")[0])
    _, s2 = fp8_ref.quantize_scaled(x, "1x128", "e4m3", pow2=True)
    assert s2[0, 0] == 2.0 ** -6 and s2[0, 1] == 2.0 ** -10     # 448/4 = 112 -> 64; 448/0.25 -> 1024


# ------------------------------------------------------------------ GPU: against the definition

def _input(rng, rows, cols):
    """Random values over several magnitudes, with a zero row, a NaN, and values past E4M3's range."""
    x = rng.standard_normal((rows, cols)) * np.exp(rng.uniform(-4, 4, (rows, 1)))
    x[min(3, rows - 1)] = 0.0
    x[0, min(7, cols - 1)] = np.nan
    x[-1, 0] = 1e6
    return x.astype(np.float32)


def _device(cp, x, dtype):
    if dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        t = torch.from_numpy(x).to("cuda", torch.bfloat16)
        return t, t.float().cpu().numpy()
    d = cp.asarray(x.astype(dtype))
    return d, cp.asnumpy(d).astype(np.float32)


def _host(a):
    if hasattr(a, "detach"):
        import torch
        a = a.detach()
        return a.view(torch.uint8).cpu().numpy() if a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else a.cpu().numpy()
    import cupy as cp
    return cp.asnumpy(a)


def _same_codes(got, want, fmt):
    gv, wv = fp8_ref.decode(got, fmt), fp8_ref.decode(want, fmt)
    assert (np.isnan(gv) == np.isnan(wv)).all()
    np.testing.assert_array_equal(got[~np.isnan(wv)], want[~np.isnan(wv)])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["tensor", "rowwise", "1x128", "128x128"])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("dtype, fmt, pow2", [("float32", "e4m3", False), ("bfloat16", "e4m3", True),
                                              ("float16", "e5m2", False)])
# The shapes reach each kernel's paths: 16-byte loads with full and partial groups, element loads
# (cols % 8 != 0), rows held in registers by a warp or a block (up to 8192 and 16384 elements)
# and rows read twice (longer).
@pytest.mark.parametrize("rows, cols", [(256, 1024), (300, 520), (5, 36), (4, 9000), (3, 16392)])
def test_codes_and_scales_are_the_definitions(mode, transpose, dtype, fmt, pow2, rows, cols):
    import cupy as cp
    x_host = _input(np.random.default_rng(), rows, cols)
    x, x_read = _device(cp, x_host, dtype)
    q, scale = fp8.quantize_scaled(x, mode, format=fmt, transpose=transpose, pow2=pow2)
    codes, scales = fp8_ref.quantize_scaled(x_read, mode, fmt, transpose=transpose, pow2=pow2)
    q_rows, q_cols = (cols, rows) if transpose else (rows, cols)
    assert tuple(q.shape) == (q_rows, q_cols)
    _same_codes(_host(q), codes, fmt)
    np.testing.assert_array_equal(_host(scale).reshape(scales.shape), scales)
    # The layout scaled_matmul reads: describing with q as a, its scale as scale_a, says the mode.
    if q_rows % 4 == 0 and q_cols % 16 == 0 and mode in ("1x128", "128x128"):
        d = fp8.describe_scaled_matmul(((q_rows, q_cols), fmt), np.zeros((16, q_cols), np.uint8).T, scale,
                                       np.ones((q_cols + 127) // 128 * 16, np.float32).reshape(-1, 16),
                                       format_b="e4m3", scale_mode=(mode, "1x128"))
        assert d["scale_modes"]["a"] == mode


@pytest.mark.gpu
def test_given_arrays_are_written_and_a_captured_graph_requantizes_new_values():
    import cupy as cp
    rng = np.random.default_rng()
    rows, cols = 256, 512
    x = cp.asarray(_input(rng, rows, cols))
    q = cp.full((rows, cols), 0x7F, cp.uint8)
    holder = cp.full((2, 4), cp.nan, cp.float32)             # 128x128: rows round_up(4, 4) = 4 apart
    scale = holder[:, :4]
    s = cp.cuda.Stream(non_blocking=True)
    got_q, got_s = fp8.quantize_scaled(x, "128x128", out=q, scale=scale, stream=s)
    assert got_q is q and got_s is scale
    with cygemm.graph.capture(s) as g:
        fp8.quantize_scaled(x, "128x128", out=q, scale=scale, stream=s)
    x_new = _input(rng, rows, cols)
    with s:                                 # (ordered before the replay)
        x.set(x_new, stream=s)
        q.fill(0x7F)
    g.launch(s)
    s.synchronize()
    codes, scales = fp8_ref.quantize_scaled(x_new, "128x128", "e4m3")
    _same_codes(cp.asnumpy(q), codes, "e4m3")
    np.testing.assert_array_equal(cp.asnumpy(scale), scales)


@pytest.mark.gpu
@pytest.mark.parametrize("mode_a, mode_b", [("1x128", "128x128"), ("1x128", "1x128"), ("rowwise", "rowwise"),
                                            ("tensor", "tensor")])
def test_quantized_operands_and_scales_go_straight_into_scaled_matmul(mode_a, mode_b):
    import cupy as cp
    rng = np.random.default_rng()
    m, k, n = 256, 768, 384
    x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
    w = cp.asarray(rng.standard_normal((n, k)).astype(np.float32))          # a weight (N, K)
    qx, sx = fp8.quantize_scaled(x, mode_a)
    qw, sw = fp8.quantize_scaled(w, mode_b)
    out = cp.full((m, n), cp.nan, cp.float32)
    fp8.scaled_matmul(qx, qw.T, sx, sw.T, out=out, format_a="e4m3", format_b="e4m3")
    a64 = fp8_ref.decode(cp.asnumpy(qx), "e4m3")
    b64 = fp8_ref.decode(cp.asnumpy(qw), "e4m3").T
    ref = fp8_ref.scaled_product(a64, cp.asnumpy(sx), mode_a, b64, cp.asnumpy(sw).T, mode_b)
    assert rel_err(cp.asnumpy(out), ref) < 5e-4
    assert rel_err(cp.asnumpy(out), cp.asnumpy(x).astype(np.float64) @ cp.asnumpy(w).astype(np.float64).T) < 0.08


# ------------------------------------------------------------------ empty_scale

@pytest.mark.parametrize("args, kw, exc, words", [
    (("blocky", 4, 4), {}, ValueError, r"^mode: expected 'tensor', 'rowwise', '1x128' or '128x128', got 'blocky'$"),
    (("rowwise", -1, 4), {}, ValueError, r"^rows: expected an int >= 0, got -1$"),
    (("rowwise", 4, 2.5), {}, TypeError, r"^cols: expected an int, got float$"),
    (("rowwise", 4, 4), {"stream": -3}, ValueError, r"^stream: expected a cudaStream_t handle"),
])
def test_empty_scale_refuses_bad_arguments_before_allocating(args, kw, exc, words):
    with pytest.raises(exc, match=words):
        fp8.empty_scale(*args, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["tensor", "rowwise", "1x128", "128x128"])
@pytest.mark.parametrize("rows, cols", [(256, 512), (300, 520), (5, 36)])
def test_empty_scale_is_the_layout_quantize_scaled_writes(mode, rows, cols):
    """Given as scale=, it is written in place: the scales of quantize_scaled's own new array."""
    import cupy as cp
    x = cp.asarray(_input(np.random.default_rng(3), rows, cols))
    _, want = fp8.quantize_scaled(x, mode)
    s = cp.cuda.Stream(non_blocking=True)
    scale = fp8.empty_scale(mode, np.int64(rows), cols, stream=s)
    assert scale.dtype == cp.float32 and scale.shape == want.shape and scale.strides == want.strides
    with s:
        scale.fill(cp.nan)
    _, got = fp8.quantize_scaled(x, mode, scale=scale, stream=s)
    s.synchronize()
    assert got is scale
    np.testing.assert_array_equal(cp.asnumpy(got), cp.asnumpy(want))


@pytest.mark.parametrize("flag", ["transpose", "pow2"])
def test_flags_take_booleans_only(flag):
    """CPU: a flag given anything but True or False is refused, naming it, before x is read."""
    from cygemm import fp8
    with pytest.raises(TypeError, match=rf"{flag}: expected True or False, got 'yes'"):
        fp8.quantize_scaled(None, "tensor", **{flag: "yes"})
