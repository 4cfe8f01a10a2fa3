"""cygemm/kernels/fp8.cu on the CPU (tests/kernels/emulator): quantize (scale, saturate, cast to
E4M3 or E5M2, with the input's amax: a warp shuffle and an atomic max per block), dequantize,
and amax alone, called as cygemm.fp8 calls them, from float32, float16 and bfloat16, on sizes
from empty to several grid-strided waves, with NaN and values past the format's range. Against
references written from the formats' definitions (tests/refs/fp8.py: nearest code, ties to
even, saturating), on outputs poisoned beforehand inside margins that must stay as they were. The
GPU tests through cygemm are tests/fp8/test_convert.py."""
import ctypes

import ml_dtypes
import numpy as np
import pytest

import emulator
from cygemm.engine.dtypes import BY_ANY_NAME
from refs import fp8 as fp8_ref

STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
FORMATS = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
SIZES = (0, 1, 7, 1000, 40961)
MARGIN = 64


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emulator.build_or_skip("fp8", tmp_path_factory)
    i64, p = ctypes.c_longlong, ctypes.c_void_p
    lib.cygemm_fp8_quantize.argtypes = [ctypes.c_int, ctypes.c_int, i64, p, p, p, p, p]
    lib.cygemm_fp8_dequantize.argtypes = [ctypes.c_int, ctypes.c_int, i64, p, p, p, p]
    lib.cygemm_amax.argtypes = [ctypes.c_int, i64, p, p, p]
    for f in (lib.cygemm_fp8_quantize, lib.cygemm_fp8_dequantize, lib.cygemm_amax):
        f.restype = ctypes.c_int
    return lib


def code(name):
    return BY_ANY_NAME[name]["cuda"]


class Span:
    """n elements of `dtype` with MARGIN poisoned elements on either side."""

    def __init__(self, dtype, n, values=None, poison=None):
        if poison is None:
            poison = 0xA5 if np.dtype(dtype).kind == "u" else np.nan
        self.mem = np.full(n + 2 * MARGIN, poison, dtype)
        if values is not None:
            self.mem[MARGIN:MARGIN + n] = values
        self.n = n
        self.before = self.mem.copy()

    @property
    def ptr(self):
        return self.mem.ctypes.data + MARGIN * self.mem.itemsize

    @property
    def body(self):
        return self.mem[MARGIN:MARGIN + self.n]

    def margins_unchanged(self):
        bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[self.mem.itemsize]
        keep = np.r_[0:MARGIN, MARGIN + self.n:self.mem.size]
        return np.array_equal(self.mem.view(bits)[keep], self.before.view(bits)[keep])


def inputs(n, fmt, seed):
    """Normal values scaled to reach past the format's largest value, with NaNs among them."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * fp8_ref.largest(fmt) / 2
    x[::97] = np.nan
    x[5::131] *= 40                     # past the range: saturated
    return np.clip(x, -60000, 60000)    # (finite in float16 too)


def same_values(codes, want, fmt):
    """The codes decode to the wanted codes' values (a zero's sign aside), NaN where NaN."""
    got, ref = fp8_ref.decode(codes, fmt), fp8_ref.decode(want, fmt)
    return np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(got[~np.isnan(got)], ref[~np.isnan(ref)])


@pytest.mark.parametrize("dtype", list(STORAGE))
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("n", SIZES)
def test_quantize_scales_saturates_and_takes_the_amax(lib, dtype, fmt, n):
    x = Span(STORAGE[dtype], n, inputs(n, fmt, [n, len(dtype), len(fmt)]).astype(STORAGE[dtype]))
    scale = np.array([0.75], np.float32)
    q = Span(np.uint8, n)
    amax = np.full(1, np.nan, np.float32)
    assert lib.cygemm_fp8_quantize(code(dtype), code(FORMATS[fmt]), n, x.ptr, scale.ctypes.data, q.ptr,
                                   amax.ctypes.data, None) == 0
    held = x.body.astype(np.float32)
    want = fp8_ref.to_codes(held * np.float32(0.75), fmt)       # the product in float32, as the kernel
    assert same_values(q.body, want, fmt)
    assert amax[0] == (np.nanmax(np.abs(held)) if n and not np.isnan(held).all() else 0.0)
    assert q.margins_unchanged() and x.margins_unchanged()


@pytest.mark.parametrize("dtype", list(STORAGE))
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("n", SIZES)
def test_dequantize_against_the_formats_values(lib, dtype, fmt, n):
    rng = np.random.default_rng([n, 3, len(dtype), len(fmt)])
    codes = rng.integers(0, 256, n).astype(np.uint8)
    q = Span(np.uint8, n, codes)
    scale_inv = np.array([1.5], np.float32)
    y = Span(STORAGE[dtype], n)
    assert lib.cygemm_fp8_dequantize(code(FORMATS[fmt]), code(dtype), n, q.ptr, scale_inv.ctypes.data, y.ptr,
                                     None) == 0
    with np.errstate(over="ignore"):        # (E5M2's largest times 1.5 is past float16's: inf, as the cast)
        ref = (fp8_ref.decode(codes, fmt).astype(np.float32) * np.float32(1.5)).astype(STORAGE[dtype])
    got = y.body
    assert np.array_equal(np.isnan(got.astype(np.float32)), np.isnan(ref.astype(np.float32)))
    finite = ~np.isnan(ref.astype(np.float32))
    assert np.array_equal(got[finite].astype(np.float32), ref[finite].astype(np.float32))
    assert y.margins_unchanged()


@pytest.mark.parametrize("dtype", list(STORAGE))
@pytest.mark.parametrize("n", SIZES)
def test_amax_alone_writes_the_amax_and_nothing_else(lib, dtype, n):
    x = Span(STORAGE[dtype], n, inputs(n, "e5m2", [n, 9]).astype(STORAGE[dtype]))
    amax = np.full(3, np.nan, np.float32)
    assert lib.cygemm_amax(code(dtype), n, x.ptr, amax[1:].ctypes.data, None) == 0
    held = x.body.astype(np.float32)
    assert amax[1] == (np.nanmax(np.abs(held)) if n and not np.isnan(held).all() else 0.0)
    assert np.isnan(amax[0]) and np.isnan(amax[2])
    assert x.margins_unchanged()
