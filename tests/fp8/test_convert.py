"""FP8 conversions (cygemm.fp8.convert): quantize, dequantize and amax against FP8 defined from
first principles (tests/refs/fp8.py): rounding to nearest even, saturation, NaN; misaligned
inputs; captured and replayed with new scales; bad inputs write nothing. The reference itself is
checked against values any FP8 table gives (CPU)."""
import numpy as np
import pytest

import cygemm
from cygemm import fp8
from refs import fp8 as fp8_ref


def _scalar(cp, v):
    return cp.asarray(np.array([v], dtype=np.float32))


# ------------------------------------------------------------------ CPU

def test_reference_codes_round_to_nearest_even_and_saturate():
    # The test reference itself, against values any FP8 table gives.
    c = fp8_ref.to_codes([1.0, 1.0625, 1.1875, 1e6, -1e6, 0.0], "e4m3")
    assert list(fp8_ref.decode(c, "e4m3")) == [1.0, 1.0, 1.25, 448.0, -448.0, 0.0]
    assert fp8_ref.largest("e5m2") == 57344.0 and fp8.FP8_MAX == {"e4m3": 448.0, "e5m2": 57344.0}


# ------------------------------------------------------------------ GPU

@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n, offset", [(1 << 20, 0), (100_003, 1), (7, 0)])
def test_quantize_matches_the_definition_and_amax_the_host_maximum(fmt, dtype, n, offset):
    import cupy as cp
    rng = np.random.default_rng()
    host = (rng.standard_normal(n + offset) * 50).astype(dtype)
    x = cp.asarray(host)[offset:]              # offset 1: misaligned, the scalar path
    scale = 3.0 if fmt == "e4m3" else 300.0      # pushes the tails past the largest value
    out = cp.full(n, 0x55, dtype=cp.uint8)
    amax = _scalar(cp, np.nan)
    fp8.quantize(x, _scalar(cp, scale), out=out, format=fmt, amax=amax)
    got = cp.asnumpy(out)
    # float32 x * scale is rounded once before the conversion (as the kernel does). Values, not
    # codes, are compared: a tiny negative rounds to -0 or +0, both zero.
    want = fp8_ref.to_codes((host[offset:].astype(np.float32) * np.float32(scale)).astype(np.float64), fmt)
    bad = np.flatnonzero(fp8_ref.decode(got, fmt) != fp8_ref.decode(want, fmt))[:5]
    assert not len(bad), [(float(host[offset:][i]) * scale, int(got[i]), int(want[i])) for i in bad]
    assert float(amax.get()[0]) == float(np.abs(host[offset:].astype(np.float32)).max())
    values = fp8_ref.decode(got, fmt)
    assert np.abs(values).max() <= fp8_ref.largest(fmt)


@pytest.mark.gpu
def test_quantize_saturates_at_the_format_limits_and_keeps_nan():
    import cupy as cp
    x = cp.asarray(np.array([1e9, -1e9, 449.0, 60000.0, np.inf, -np.inf, np.nan, 0.5], np.float32))
    one = _scalar(cp, 1.0)
    e4 = fp8_ref.decode(cp.asnumpy(fp8.quantize(x, one, format="e4m3")), "e4m3")
    e5 = fp8_ref.decode(cp.asnumpy(fp8.quantize(x, one, format="e5m2")), "e5m2")
    assert list(e4[:6]) == [448.0, -448.0, 448.0, 448.0, 448.0, -448.0] and np.isnan(e4[6]) and e4[7] == 0.5
    assert list(e5[:6]) == [57344.0, -57344.0, 448.0, 57344.0, 57344.0, -57344.0] and np.isnan(e5[6])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_dequantize_is_code_value_times_scale(dtype):
    import cupy as cp
    codes = np.arange(256, dtype=np.uint8).repeat(41)[: 256 * 41 - 3]
    q = cp.asarray(codes)
    out = cp.full(codes.shape, cp.nan, dtype=dtype)
    fp8.dequantize(q, _scalar(cp, 0.5), out=out, format="e4m3")
    want = (fp8_ref.decode(codes, "e4m3") * 0.5).astype(dtype)
    got = cp.asnumpy(out)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite], want[finite])


@pytest.mark.gpu
def test_amax_alone_and_bad_inputs_write_nothing():
    import cupy as cp
    x = cp.asarray(np.random.default_rng().standard_normal((333, 77)).astype(np.float32))
    out = _scalar(cp, -1.0)
    fp8.amax(x, out)
    assert float(out.get()[0]) == float(cp.abs(x).max().get())
    q = cp.full(10, 7, dtype=cp.uint8)
    with pytest.raises(ValueError, match="C-contiguous"):
        fp8.quantize(x[:, ::2], _scalar(cp, 1.0), out=cp.zeros(333 * 39, cp.uint8).reshape(333, 39))
    with pytest.raises(ValueError, match="out: expected shape"):
        fp8.quantize(x[:2], _scalar(cp, 1.0), out=q)
    with pytest.raises(TypeError, match="format"):
        fp8.dequantize(q, _scalar(cp, 1.0))
    assert (q == 7).all()


@pytest.mark.gpu
def test_quantize_and_dequantize_capture_and_replay_with_new_scales():
    import cupy as cp
    rng = np.random.default_rng()
    host = rng.standard_normal(4099).astype(np.float32)
    x = cp.asarray(host)
    scale, inv = _scalar(cp, 1.0), _scalar(cp, 1.0)
    q, amax = cp.zeros(4099, cp.uint8), _scalar(cp, -1.0)
    y = cp.full(4099, cp.nan, cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    with cygemm.graph.capture(s) as g:
        fp8.quantize(x, scale, out=q, format="e4m3", amax=amax, stream=s)
        fp8.dequantize(q, inv, out=y, format="e4m3", stream=s)
    scale.set(np.array([8.0], np.float32))
    inv.set(np.array([0.125], np.float32))
    g.launch(s)
    s.synchronize()
    want = fp8_ref.decode(fp8_ref.to_codes(host * np.float32(8.0), "e4m3"), "e4m3")
    assert np.array_equal(fp8_ref.decode(cp.asnumpy(q), "e4m3"), want)
    assert np.array_equal(cp.asnumpy(y), (want * 0.125).astype(np.float32))
    assert float(amax.get()[0]) == float(np.abs(host).max())
