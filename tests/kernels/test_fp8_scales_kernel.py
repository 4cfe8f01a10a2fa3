"""cygemm/kernels/fp8_scales.cu on the CPU (tests/kernels/emulator): quantizing to FP8 with one
scale for the tensor, per row, per 1 x 128 tile or per 128 x 128 block, transposed or not, scales
rounded to powers of two or not, from float32, float16 and bfloat16, called as
cygemm.fp8.quantize_scaled calls it. Codes and scales bit for bit against the definition in
tests/refs/fp8.py (the group's amax, m = fmax / amax, q = saturate(x m), scale = 1 / m), scales
read where the header says cuBLASLt reads them; sizes that leave partial groups and blocks; the
margins around q and the scales (and the 128x128 padding) left as they were. The GPU tests through
cygemm are tests/fp8/test_scales.py."""
import ctypes

import ml_dtypes
import numpy as np
import pytest

import emulator
from cygemm.engine.dtypes import BY_ANY_NAME
from refs import fp8 as fp8_ref

STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
FORMATS = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
MODES = {"tensor": 0, "rowwise": 3, "1x128": 4, "128x128": 5}
SHAPES = ((1, 1), (3, 130), (130, 257), (129, 128))
MARGIN = 64


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emulator.build_or_skip("fp8_scales", tmp_path_factory)
    i64, p, i = ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int
    lib.cygemm_fp8_quantize_scaled.argtypes = [i, i, i, i, i, i64, i64, p, p, p, p]
    lib.cygemm_fp8_quantize_scaled.restype = ctypes.c_int
    return lib


def scale_floats(mode, q_rows, q_cols):
    """Floats the scale array spans, and the (index of each group in the grid) -> offset rule."""
    g = -(-q_cols // 128)
    if mode == "tensor":
        return 1, lambda r, c: 0
    if mode == "rowwise":
        return q_rows, lambda r, c: r
    if mode == "1x128":
        return g * q_rows, lambda r, c: c * q_rows + r
    ld = -(-g // 4) * 4
    return -(-q_rows // 128) * ld, lambda r, c: r * ld + c


def code(name):
    return BY_ANY_NAME[name]["cuda"]


@pytest.mark.parametrize("dtype", list(STORAGE))
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_codes_and_scales_bit_for_bit(lib, dtype, fmt, mode, transpose, pow2, rows, cols):
    _check(lib, dtype, fmt, mode, transpose, pow2, rows, cols)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", ["tensor", "rowwise", "1x128"])
@pytest.mark.parametrize("rows,cols", [(40, 1000), (40, 4100), (20, 20000)])
def test_wide_rows_take_the_block_per_row_kernels(lib, dtype, mode, rows, cols):
    """Rows a block reduces (a block-wide maximum per row), held in registers or read twice when
    too long to hold; on a device of one SM, so that each block takes several rows in turn and
    reuses its shared memory."""
    lib.cuda_on_cpu_set_sm_count(1)
    try:
        _check(lib, dtype, "e4m3", mode, False, False, rows, cols)
    finally:
        lib.cuda_on_cpu_set_sm_count(4)


def _check(lib, dtype, fmt, mode, transpose, pow2, rows, cols):
    rng = np.random.default_rng([rows, cols, MODES[mode], transpose, pow2, len(dtype), len(fmt)])
    x = (rng.standard_normal((rows, cols)) * np.exp(rng.uniform(-4, 4, (rows, 1)))).astype(STORAGE[dtype])
    x[::7, ::11] = np.nan
    q_rows, q_cols = (cols, rows) if transpose else (rows, cols)
    q_mem = np.full(q_rows * q_cols + 2 * MARGIN, 0xA5, np.uint8)
    n_scale, at = scale_floats(mode, q_rows, q_cols)
    s_mem = np.full(n_scale + 2 * MARGIN, np.nan, np.float32)
    q_before, s_before = q_mem.copy(), s_mem.copy()
    st = lib.cygemm_fp8_quantize_scaled(code(dtype), code(FORMATS[fmt]), MODES[mode], int(transpose), int(pow2),
                                        rows, cols, x.ctypes.data, q_mem[MARGIN:].ctypes.data,
                                        s_mem[MARGIN:].ctypes.data, None)
    assert st == 0
    codes, scales = fp8_ref.quantize_scaled(x.astype(np.float32), mode, fmt, transpose, pow2)
    q = q_mem[MARGIN:MARGIN + q_rows * q_cols].reshape(q_rows, q_cols)
    assert np.array_equal(q, codes), f"{int((q != codes).sum())} codes differ"
    s = s_mem[MARGIN:MARGIN + n_scale]
    written = np.zeros(n_scale, bool)
    for r in range(scales.shape[0]):
        for c in range(scales.shape[1]):
            assert s[at(r, c)].view(np.uint32) == scales[r, c].view(np.uint32), (r, c, s[at(r, c)], scales[r, c])
            written[at(r, c)] = True
    # Nothing else is written: the margins and the 128x128 grid's padding keep their bytes.
    keep_q = np.r_[0:MARGIN, MARGIN + q_rows * q_cols:q_mem.size]
    assert np.array_equal(q_mem[keep_q], q_before[keep_q])
    untouched = np.ones(s_mem.size, bool)
    untouched[MARGIN:MARGIN + n_scale][written] = False
    assert np.array_equal(s_mem.view(np.uint32)[untouched], s_before.view(np.uint32)[untouched])
