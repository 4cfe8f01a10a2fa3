"""CPU: cygemm.engine.arrays. describe_array reads __cuda_array_interface__ into element strides and
refuses what cuBLAS cannot read, naming the argument. The overlap check every output goes
through, a property test against NumPy's exact np.shares_memory on random views of one buffer:
it never misses an overlap, and for two 2-D views of one leading dimension (blocks of one
matrix) it is exact. Derandomized."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cygemm.engine import arrays as _arrays
from cygemm.engine.overlap import arrays_overlap
from fakes import BASE, FakeDeviceArray, fake_view


def test_describe_array_reads_cai_in_elements():
    x = FakeDeviceArray((3, 4, 5), "<f2", strides=(80, 20, 2), ptr=BASE + 64)
    d = _arrays.describe_array(x)
    assert d == dict(ptr=BASE + 64, batch=3, rows=4, cols=5, batch_stride=40,
                     row_stride=10, col_stride=1, dtype="float16")


def test_describe_array_c_contiguous_when_strides_missing():
    d = _arrays.describe_array(FakeDeviceArray((6, 7)))
    assert (d["batch"], d["row_stride"], d["col_stride"], d["batch_stride"]) == (1, 7, 1, 0)


@pytest.mark.parametrize("bad,exc,words", [
    (np.ones((2, 2), np.float32), TypeError, ["x:", "NumPy array in host memory", "cupy.asarray"]),
    ([[1.0]], TypeError, ["x:", "list"]),
    (FakeDeviceArray((2, 2), "<f8"), TypeError, ["x:", "expected float16, bfloat16 or float32, got float64"]),
    (FakeDeviceArray((4,)), ValueError, ["x:", "1-D"]),
    (FakeDeviceArray((2, 2, 2, 2)), ValueError, ["x:", "4-D"]),
    (FakeDeviceArray((2, 2), strides=(8, 2)), ValueError, ["x:", "multiple"]),
])
def test_describe_array_rejects_with_named_argument(bad, exc, words):
    with pytest.raises(exc) as info:
        _arrays.describe_array(bad, "x")
    for w in words:
        assert w in str(info.value)


# ---------------------------------------------------------------- the overlap check

ROWS, COLS = 12, 16


def block(buf, r0, c0, nr, nc, transposed):
    """A (nr, nc) block of the (ROWS, COLS) matrix in buf, maybe read transposed."""
    v = buf[r0:r0 + nr, c0:c0 + nc]
    return v.T if transposed else v


spans = st.tuples(st.integers(0, ROWS - 1), st.integers(0, COLS - 1), st.integers(1, ROWS), st.integers(1, COLS))


@settings(max_examples=400, deadline=None, derandomize=True)
@given(a=spans, b=spans, ta=st.booleans(), tb=st.booleans(), order=st.sampled_from(["C", "F"]))
def test_blocks_of_one_matrix_exact(a, b, ta, tb, order):
    buf = np.zeros((ROWS, COLS), np.float32, order=order)
    x = block(buf, a[0], a[1], min(a[2], ROWS - a[0]), min(a[3], COLS - a[1]), ta)
    y = block(buf, b[0], b[1], min(b[2], ROWS - b[0]), min(b[3], COLS - b[1]), tb)
    assert arrays_overlap(fake_view(buf, x), fake_view(buf, y)) == np.shares_memory(x, y)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(off=st.tuples(st.integers(0, 60), st.integers(0, 60)), shape=st.tuples(st.integers(1, 6), st.integers(1, 6),
       st.integers(1, 6), st.integers(1, 6)), step=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       batch=st.integers(1, 3))
def test_any_views_never_miss_an_overlap(off, shape, step, batch):
    """Strided and batched views of a flat buffer: conservative, never wrong the other way."""
    buf = np.zeros(4096, np.float32)
    n1 = batch * shape[0] * shape[1] * step[0]
    x = buf[off[0]:off[0] + n1].reshape(batch, shape[0], shape[1] * step[0])[:, :, ::step[0]]
    y = buf[off[1]:off[1] + shape[2] * shape[3] * step[1]].reshape(shape[2], shape[3] * step[1])[:, ::step[1]]
    got = arrays_overlap(fake_view(buf, x), fake_view(buf, y))
    if np.shares_memory(x, y):
        assert got


def test_examples():
    buf = np.zeros((8, 10), np.float32)
    f = lambda v: fake_view(buf, v)   # noqa: E731
    assert not arrays_overlap(f(buf[:, :5]), f(buf[:, 5:]))          # column blocks: disjoint
    assert arrays_overlap(f(buf[:, :5]), f(buf[:, 4:]))
    assert not arrays_overlap(f(buf[:4]), f(buf[4:]))                # row blocks
    assert arrays_overlap(f(buf), f(buf.T))
    assert not arrays_overlap(f(buf[:0]), f(buf))                    # empty overlaps nothing
    assert arrays_overlap(f(buf[:, ::2]), f(buf[:, 1::2]))           # interleaved: conservative
