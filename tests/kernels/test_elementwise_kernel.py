"""cygemm/kernels/elementwise.cu on the CPU (tests/kernels/emulator): the dense layer's bias plus
activation forward (y = act(x + bias), z = x + bias) and its backward (dz = gy * act'(z), the bias
gradient as a deterministic column sum), called as cygemm.dense calls them, in float32, float16
and bfloat16, every activation, with and without bias, z and dbias, on sizes that leave partial
blocks and vectors, starts off 16 bytes (the scalar path), leading dimensions past the columns,
in place, and the backward from the forward's output. Against float64 references written from the
activations' definitions (tests/refs/activations.py), on NaN-poisoned outputs inside buffers whose
margins must be left as they were. The GPU tests of the same kernels through cygemm are
tests/dense/test_layer.py and tests/dense/test_elementwise.py."""
import ctypes

import ml_dtypes
import numpy as np
import pytest

import emulator
from cygemm.engine.dtypes import BY_ANY_NAME
from refs import activations

ACTS = {"none": 0, "relu": 1, "leaky_relu": 2, "gelu": 3, "gelu_erf": 4, "sigmoid": 5, "tanh": 6, "silu": 7}
STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
TOL = {"float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}      # relative to the result's size
SLOPE = 0.07                    # not leaky_relu's default: a kernel that ignores the slope fails
MARGIN = 24                     # elements of poison before and after every output
FROM_OUTPUT = ("none", "relu", "leaky_relu", "sigmoid", "tanh")   # act' is fixed by y = act(z)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emulator.build_or_skip("elementwise", tmp_path_factory)
    i64, p, f = ctypes.c_longlong, ctypes.c_void_p, ctypes.c_float
    lib.cygemm_bias_act_forward.argtypes = [ctypes.c_int, i64, i64, p, i64, p, p, i64, p, i64, ctypes.c_int, f, p]
    lib.cygemm_bias_act_forward.restype = ctypes.c_int
    lib.cygemm_act_backward_scratch_floats.argtypes = [i64, i64]
    lib.cygemm_act_backward_scratch_floats.restype = i64
    lib.cygemm_act_backward.argtypes = [ctypes.c_int, i64, i64, p, i64, p, i64, p, i64, p, f, p,
                                        ctypes.c_int, f, ctypes.c_int, p]
    lib.cygemm_act_backward.restype = ctypes.c_int
    return lib


class Buffer:
    """A matrix of `rows` x `cols` at leading dimension `ld`, `offset` elements into a buffer with
    MARGIN poisoned elements on either side: what the kernel may write is the matrix only."""

    def __init__(self, dtype, rows, cols, ld=None, offset=0, values=None):
        self.ld = ld or cols
        self.rows, self.cols, self.offset = rows, cols, offset
        size = MARGIN + offset + (rows - 1) * self.ld + cols + MARGIN if rows and cols else 2 * MARGIN + offset
        self.mem = np.full(size, np.nan, STORAGE[dtype])
        self.start = MARGIN + offset
        if values is not None:
            self.view()[...] = values.astype(STORAGE[dtype])
        self.before = self.mem.copy()

    def view(self):
        if not (self.rows and self.cols):
            return np.zeros((self.rows, self.cols), self.mem.dtype)
        return np.lib.stride_tricks.as_strided(self.mem[self.start:], (self.rows, self.cols),
                                               (self.ld * self.mem.itemsize, self.mem.itemsize))

    @property
    def ptr(self):
        return self.mem.ctypes.data + self.start * self.mem.itemsize

    def outside_unchanged(self):
        """Every element outside the matrix still has its first bits (the margins, the gaps
        between rows)."""
        inside = np.zeros(self.mem.size, bool)
        for r in range(self.rows):
            inside[self.start + r * self.ld:self.start + r * self.ld + self.cols] = True
        bits = np.uint32 if self.mem.itemsize == 4 else np.uint16
        return np.array_equal(self.mem.view(bits)[~inside], self.before.view(bits)[~inside])


def rand(rng, shape, scale=1.5):
    return rng.standard_normal(shape) * scale


def rel_err(got, ref):
    got = np.asarray(got, np.float64)
    assert not np.isnan(got).any(), "a NaN is left: some element was not written"
    return float(np.max(np.abs(got - ref)) / max(1.0, float(np.max(np.abs(ref))))) if ref.size else 0.0


def code(dtype):
    return BY_ANY_NAME[dtype]["cuda"]


SHAPES = ((1, 1), (3, 5), (7, 33), (16, 64), (33, 130))


@pytest.mark.parametrize("dtype", list(STORAGE))
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("m,n", SHAPES)
def test_the_forward_against_float64(lib, dtype, act, m, n):
    rng = np.random.default_rng([m, n, ACTS[act], len(dtype)])
    x = Buffer(dtype, m, n, values=rand(rng, (m, n)))
    bias = Buffer(dtype, 1, n, values=rand(rng, (1, n)))
    y, z = Buffer(dtype, m, n), Buffer(dtype, m, n)
    st = lib.cygemm_bias_act_forward(code(dtype), m, n, x.ptr, x.ld, bias.ptr, y.ptr, y.ld, z.ptr, z.ld,
                                     ACTS[act], SLOPE, None)
    assert st == 0
    z64 = x.view().astype(np.float64) + bias.view().astype(np.float64)
    assert rel_err(z.view(), z64) <= TOL[dtype]
    # y from z as stored (the kernel applies act to x + bias in float32, then rounds once)
    assert rel_err(y.view(), activations.act(act, z64, SLOPE)) <= 2 * TOL[dtype]
    assert y.outside_unchanged() and z.outside_unchanged() and x.outside_unchanged()


@pytest.mark.parametrize("dtype", list(STORAGE))
@pytest.mark.parametrize("offset,ld_pad", [(1, 0), (0, 3), (3, 5)])
def test_the_forward_off_16_bytes_and_with_wide_rows_takes_the_scalar_path(lib, dtype, offset, ld_pad):
    m, n = 9, 40
    rng = np.random.default_rng([offset, ld_pad, len(dtype)])
    x = Buffer(dtype, m, n, n + ld_pad, offset, rand(rng, (m, n)))
    bias = Buffer(dtype, 1, n, offset=offset, values=rand(rng, (1, n)))
    y = Buffer(dtype, m, n, n + ld_pad + 2, offset)
    assert lib.cygemm_bias_act_forward(code(dtype), m, n, x.ptr, x.ld, bias.ptr, y.ptr, y.ld, None, 0,
                                       ACTS["gelu"], SLOPE, None) == 0
    ref = activations.act("gelu", x.view().astype(np.float64) + bias.view().astype(np.float64))
    assert rel_err(y.view(), ref) <= 2 * TOL[dtype]
    assert y.outside_unchanged()


@pytest.mark.parametrize("dtype", list(STORAGE))
def test_the_forward_without_bias_and_in_place(lib, dtype):
    m, n = 6, 24
    rng = np.random.default_rng(7)
    values = rand(rng, (m, n))
    x = Buffer(dtype, m, n, values=values)
    x64 = x.view().astype(np.float64)
    assert lib.cygemm_bias_act_forward(code(dtype), m, n, x.ptr, x.ld, None, x.ptr, x.ld, None, 0,
                                       ACTS["silu"], SLOPE, None) == 0
    assert rel_err(x.view(), activations.act("silu", x64)) <= 2 * TOL[dtype]
    assert x.outside_unchanged()


def test_the_forward_refuses_a_dtype_it_does_not_take_and_writes_nothing(lib):
    y = Buffer("float32", 2, 2)
    st = lib.cygemm_bias_act_forward(code("float64"), 2, 2, y.ptr, 2, None, y.ptr, 2, None, 0, 1, SLOPE, None)
    assert st != 0
    assert np.isnan(y.view()).all()


def _backward(lib, dtype, act, m, n, gy, z, dz, dbias, beta, from_output):
    scratch = np.full(max(1, lib.cygemm_act_backward_scratch_floats(m, n)), np.nan, np.float32)
    return lib.cygemm_act_backward(code(dtype), m, n, gy.ptr, gy.ld, z.ptr, z.ld, dz.ptr if dz else None,
                                   dz.ld if dz else 0, dbias.ptr if dbias else None, beta, scratch.ctypes.data,
                                   ACTS[act], SLOPE, int(from_output), None)


@pytest.mark.parametrize("dtype", list(STORAGE))
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("m,n", SHAPES + ((300, 17),))
def test_the_backward_and_the_bias_gradient_against_float64(lib, dtype, act, m, n):
    rng = np.random.default_rng([m, n, ACTS[act], 3, len(dtype)])
    gy, z = Buffer(dtype, m, n, values=rand(rng, (m, n))), Buffer(dtype, m, n, values=rand(rng, (m, n)))
    dz, dbias = Buffer(dtype, m, n), Buffer(dtype, 1, n)
    assert _backward(lib, dtype, act, m, n, gy, z, dz, dbias, 0.0, False) == 0
    ref = gy.view().astype(np.float64) * activations.act_grad(act, z.view().astype(np.float64), SLOPE)
    assert rel_err(dz.view(), ref) <= 2 * TOL[dtype]
    # the column sum of dz as the kernel computed it in float32: within the sum's own rounding
    assert rel_err(dbias.view()[0], ref.sum(axis=0)) <= 2 * TOL[dtype] * max(1.0, np.sqrt(m))
    assert dz.outside_unchanged() and dbias.outside_unchanged()


@pytest.mark.parametrize("dtype", list(STORAGE))
@pytest.mark.parametrize("act", FROM_OUTPUT)
def test_the_backward_from_the_forwards_output(lib, dtype, act):
    m, n = 11, 40
    rng = np.random.default_rng([ACTS[act], 5, len(dtype)])
    z64 = rand(rng, (m, n))
    y = Buffer(dtype, m, n, values=activations.act(act, z64, SLOPE))
    gy = Buffer(dtype, m, n, values=rand(rng, (m, n)))
    dz = Buffer(dtype, m, n)
    assert _backward(lib, dtype, act, m, n, gy, y, dz, None, 0.0, True) == 0
    ref = gy.view().astype(np.float64) * activations.act_grad(act, z64, SLOPE)
    assert rel_err(dz.view(), ref) <= 4 * TOL[dtype]
    assert dz.outside_unchanged()


@pytest.mark.parametrize("dtype", list(STORAGE))
def test_the_bias_gradient_alone_is_added_with_beta_one_and_is_the_same_bits_every_time(lib, dtype):
    m, n = 200, 70
    rng = np.random.default_rng(11)
    gy, z = Buffer(dtype, m, n, values=rand(rng, (m, n))), Buffer(dtype, m, n, values=rand(rng, (m, n)))
    start = rand(rng, (1, n))
    dbias = Buffer(dtype, 1, n, values=start)
    assert _backward(lib, dtype, "relu", m, n, gy, z, None, dbias, 1.0, False) == 0
    first = dbias.view().copy()
    ref = (gy.view().astype(np.float64) * activations.act_grad("relu", z.view().astype(np.float64))).sum(axis=0)
    assert rel_err(first[0], ref + start.astype(STORAGE[dtype]).astype(np.float64)[0]) \
        <= 2 * TOL[dtype] * np.sqrt(m)
    again = Buffer(dtype, 1, n, values=start)
    assert _backward(lib, dtype, "relu", m, n, gy, z, None, again, 1.0, False) == 0
    bits = np.uint32 if dtype == "float32" else np.uint16
    assert np.array_equal(again.view().view(bits), first.view(bits))


def test_the_backward_in_place_over_gy(lib):
    m, n = 5, 32
    rng = np.random.default_rng(13)
    gy, z = Buffer("float32", m, n, values=rand(rng, (m, n))), Buffer("float32", m, n, values=rand(rng, (m, n)))
    ref = gy.view().astype(np.float64) * activations.act_grad("tanh", z.view().astype(np.float64))
    assert _backward(lib, "float32", "tanh", m, n, gy, z, gy, None, 0.0, False) == 0
    assert rel_err(gy.view(), ref) <= 2 * TOL["float32"]
