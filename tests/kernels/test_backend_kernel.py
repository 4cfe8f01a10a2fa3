"""cygemm/kernels/backend.cu on the CPU (tests/kernels/emulator): the CUDABackend's row-wise softmax
and log-softmax (a warp per row: a shuffle reduction of the maximum and of the sum) and its
sigmoid, dense and over a strided layout, in float32 and float64, called as cygemm.backend calls
them. Against float64 references (tests/refs/rows.py), on rows from one element to many warps'
worth, with values whose exp overflows where not shifted, in place, outputs poisoned with NaN in
margins that must stay. The layout struct's ctypes mirror is checked against the header's size.
The GPU tests through cygemm are tests/backend/."""
import ctypes
import os

import numpy as np
import pytest

import emulator
from cygemm.engine.dtypes import BY_ANY_NAME
from refs import rows as rows_ref

MAX_DIMS = 32
DTYPES = {"float32": (np.float32, 2e-6), "float64": (np.float64, 1e-13)}
MARGIN = 32


class Layout(ctypes.Structure):
    _fields_ = [("ndim", ctypes.c_int), ("shape", ctypes.c_longlong * MAX_DIMS),
                ("x_strides", ctypes.c_longlong * MAX_DIMS), ("y_strides", ctypes.c_longlong * MAX_DIMS)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emulator.build_or_skip("backend", tmp_path_factory)
    i64, p, i = ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int
    lib.cygemm_row_op.argtypes = [i, i, p, p, i64, i64, p]
    lib.cygemm_sigmoid.argtypes = [i, p, p, i64, p]
    lib.cygemm_sigmoid_strided.argtypes = [i, p, p, i64, ctypes.POINTER(Layout), p]
    for f in (lib.cygemm_row_op, lib.cygemm_sigmoid, lib.cygemm_sigmoid_strided):
        f.restype = ctypes.c_int
    return lib


def test_the_layout_mirror_matches_the_header():
    """The header gives the struct's size (776 bytes, passed by value) and its fields' order."""
    header = open(os.path.join(emulator.ROOT, "include", "cygemm", "backend_kernels.h")).read()
    assert f"#define CYGEMM_SIGMOID_MAX_DIMS {MAX_DIMS}" in header
    assert "(776 bytes)" in header and ctypes.sizeof(Layout) == 776
    body = header[header.index("typedef struct {"):header.index("} cygemm_strided_layout;")]
    assert [w for w in ("ndim", "shape", "x_strides", "y_strides") if w in body] == [f[0] for f in Layout._fields_]


def padded(values, dtype):
    mem = np.full(values.size + 2 * MARGIN, np.nan, dtype)
    mem[MARGIN:MARGIN + values.size] = values.ravel()
    return mem


def body(mem, n):
    return mem[MARGIN:MARGIN + n]


def margins_nan(mem, n):
    return np.isnan(mem[:MARGIN]).all() and np.isnan(mem[MARGIN + n:]).all()


def ptr(mem):
    return mem.ctypes.data + MARGIN * mem.itemsize


def sigmoid64(x):
    x = np.asarray(x, np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 5), (7, 33), (5, 100), (2, 1000), (40, 64)])
@pytest.mark.parametrize("in_place", [False, True])
def test_row_ops_against_float64(lib, dtype, op, rows, cols, in_place):
    np_dtype, tol = DTYPES[dtype]
    rng = np.random.default_rng([rows, cols, len(op), in_place])
    x = rng.standard_normal((rows, cols)) * 30
    x[:, ::7] += 500                    # exp overflows where the row's maximum is not subtracted
    x = x.astype(np_dtype)
    xm = padded(x, np_dtype)
    ym = xm if in_place else padded(np.full(x.size, np.nan), np_dtype)
    assert lib.cygemm_row_op(BY_ANY_NAME[dtype]["cuda"], 0 if op == "softmax" else 1, ptr(xm), ptr(ym),
                             rows, cols, None) == 0
    ref = getattr(rows_ref, op)(x.astype(np.float64))
    got = body(ym, x.size).reshape(rows, cols).astype(np.float64)
    assert not np.isnan(got).any()
    assert np.max(np.abs(got - ref)) <= tol * max(1.0, float(np.max(np.abs(ref)))) * np.sqrt(cols)
    assert margins_nan(ym, x.size)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n", [0, 1, 31, 1000, 70001])
def test_sigmoid_never_overflows(lib, dtype, n):
    np_dtype, tol = DTYPES[dtype]
    rng = np.random.default_rng([n, 2])
    x = (rng.standard_normal(n) * 40).astype(np_dtype)
    x[::5] = np.array([1000, -1000, 88.8, -104, 0])[np.arange(len(x[::5])) % 5]
    xm, ym = padded(x, np_dtype), padded(np.full(n, np.nan), np_dtype)
    assert lib.cygemm_sigmoid(BY_ANY_NAME[dtype]["cuda"], ptr(xm), ptr(ym), n, None) == 0
    got = body(ym, n).astype(np.float64)
    assert not np.isnan(got).any()
    assert np.max(np.abs(got - sigmoid64(x)), initial=0.0) <= 4 * tol
    assert margins_nan(ym, n)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_strided_sigmoid_reads_transposed_and_broadcast_x(lib, dtype):
    np_dtype, tol = DTYPES[dtype]
    item = np.dtype(np_dtype).itemsize
    rng = np.random.default_rng(3)
    base = (rng.standard_normal((5, 7)) * 10).astype(np_dtype)       # y[i, j, k] = sigmoid(base[k, j])
    shape = (3, 7, 5)
    layout = Layout()
    layout.ndim = 3
    for d, (s, xs, ys) in enumerate(zip(shape, (0, item, 7 * item), (35 * item, 5 * item, item))):
        layout.shape[d], layout.x_strides[d], layout.y_strides[d] = s, xs, ys
    xm = padded(base, np_dtype)
    ym = padded(np.full(105, np.nan), np_dtype)
    assert lib.cygemm_sigmoid_strided(BY_ANY_NAME[dtype]["cuda"], ptr(xm), ptr(ym), 105, ctypes.byref(layout),
                                      None) == 0
    got = body(ym, 105).reshape(shape).astype(np.float64)
    ref = np.broadcast_to(sigmoid64(base.T)[None], shape)
    assert np.max(np.abs(got - ref)) <= 4 * tol
    assert margins_nan(ym, 105)


def test_a_dtype_the_kernels_do_not_take_is_refused_and_nothing_written(lib):
    y = padded(np.full(4, np.nan), np.float32)
    assert lib.cygemm_sigmoid(BY_ANY_NAME["float16"]["cuda"], ptr(y), ptr(y), 4, None) != 0
    assert np.isnan(y).all()
