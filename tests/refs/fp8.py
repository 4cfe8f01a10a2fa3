"""FP8 E4M3 (OCP "fn": no infinities, NaN at 0x7F/0xFF) and E5M2 from their definitions, in
NumPy: every code's value, and float -> code by round-to-nearest-even with saturation. The
tests' references for FP8 data, independent of cygemm's kernels and of torch."""
import numpy as np

_LAYOUT = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}       # exponent bits, mantissa bits, bias


def values(fmt):
    """float64 value of each of the 256 codes (NaN where the code is NaN, inf for E5M2's)."""
    e_bits, m_bits, bias = _LAYOUT[fmt]
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e = (codes >> m_bits) & ((1 << e_bits) - 1)
    m = codes & ((1 << m_bits) - 1)
    frac = m / float(1 << m_bits)
    v = np.where(e == 0, frac * 2.0 ** (1 - bias), (1 + frac) * 2.0 ** (e - bias)) * sign
    top = (1 << e_bits) - 1
    if fmt == "e4m3":
        v = np.where((e == top) & (m == (1 << m_bits) - 1), np.nan, v)
    else:
        v = np.where(e == top, np.where(m == 0, sign * np.inf, np.nan), v)
    return v


def largest(fmt):
    v = values(fmt)
    return float(np.nanmax(v[np.isfinite(v)]))


def to_codes(x, fmt):
    """uint8 codes of x: nearest finite value, ties to the even code, saturating at the largest
    finite value (as CUDA's __NV_SATFINITE conversion); NaN -> a NaN code."""
    x = np.asarray(x, dtype=np.float64)
    v = values(fmt)[:128]                      # non-negative codes, in increasing order of value
    finite = np.isfinite(v)
    mags, codes = v[finite], np.arange(128)[finite]
    a = np.minimum(np.abs(x), mags[-1])
    hi = np.clip(np.searchsorted(mags, a), 0, len(mags) - 1)
    lo = np.clip(hi - 1, 0, len(mags) - 1)
    d_lo, d_hi = a - mags[lo], mags[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0))
    out = np.where(pick_hi, codes[hi], codes[lo]).astype(np.uint8)
    out = np.where(np.signbit(x) & (out != 0), out | 0x80, out).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), out).astype(np.uint8)


def decode(codes, fmt):
    return values(fmt)[np.asarray(codes, dtype=np.uint8)]


# ------------------------------------------------------------------ scaled FP8 products
# Scales as cuBLASLt applies them (cygemm.fp8.args' table): each scale array is its operand's
# grid of blocks; expanded, it is one factor per element of the operand.

def expand_scale(scale, mode, shape, operand):
    """The per-element factors (float64, `shape`) of a scale of `mode` ("tensor", "rowwise",
    "1x128", "128x128") for operand "a" (M, K) or "b" (K, N)."""
    s = np.asarray(scale, dtype=np.float64)
    rows, cols = shape
    i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    if mode == "tensor":
        return np.full(shape, s.reshape(-1)[0])
    if mode == "rowwise":           # a: one per row; b: one per column
        v = s.reshape(-1)
        return v[i] if operand == "a" else v[j]
    if mode == "1x128":             # 128 elements along K: a's columns, b's rows
        return s[i, j // 128] if operand == "a" else s[i // 128, j]
    if mode == "128x128":
        return s[i // 128, j // 128]
    raise ValueError(mode)


def scaled_product(a_values, scale_a, mode_a, b_values, scale_b, mode_b):
    """float64 (a * scale_a) @ (b * scale_b), each scale expanded as cuBLASLt applies it."""
    return ((a_values * expand_scale(scale_a, mode_a, a_values.shape, "a"))
            @ (b_values * expand_scale(scale_b, mode_b, b_values.shape, "b")))


# ------------------------------------------------------------------ quantizing with finer scales
# cygemm.fp8.quantize_scaled's definition (include/cygemm/fp8_scale_kernels.h), in
# float32 arithmetic as the kernels do it.

GROUPS = {"tensor": "all", "rowwise": None, "1x128": (1, 128), "128x128": (128, 128)}


def quantize_scaled(x, mode, fmt, transpose=False, pow2=False):
    """(codes, scales): codes (uint8) of x (or x.T), scales as their grid of groups (float32,
    one per group: (1, 1) tensor, (R, 1) rowwise, (R, ceil(C/128)) 1x128, (ceil(R/128),
    ceil(C/128)) 128x128)."""
    x = np.asarray(x, dtype=np.float32)
    if transpose:
        x = x.T
    rows, cols = x.shape
    group = GROUPS[mode]
    hr, hc = (max(rows, 1), max(cols, 1)) if group == "all" else (group or (1, max(cols, 1)))
    gr, gc = -(-rows // hr), -(-cols // hc)
    if group == "all":                  # one scale, even for an empty x (amax 0: m = 1)
        gr, gc = 1, 1
    elif group is None:                 # one per row, even for empty rows
        gc = 1
    padded = np.zeros((gr * hr, gc * hc), np.float32)
    padded[:rows, :cols] = np.where(np.isnan(x), 0, np.abs(x))
    amax = padded.reshape(gr, hr, gc, hc).max(axis=(1, 3))
    fmax = np.float32(largest(fmt))
    with np.errstate(divide="ignore", over="ignore"):
        m = np.minimum(fmax / np.maximum(amax, np.float32(1e-45)), np.float32(2.0 ** 126)).astype(np.float32)
    m = np.where((amax > 0) & np.isfinite(amax), m, np.float32(1)).astype(np.float32)
    if pow2:
        m = np.ldexp(np.float32(1), np.frexp(m)[1] - 1).astype(np.float32)
    expanded = np.repeat(np.repeat(m, hr, axis=0), hc, axis=1)[:rows, :cols]
    y = (x * expanded).astype(np.float32)
    codes = to_codes(y, fmt)
    codes = np.where(np.signbit(y) & ~np.isnan(y), codes | 0x80, codes).astype(np.uint8)   # -0 keeps its sign
    return codes, (np.float32(1) / m).astype(np.float32)
