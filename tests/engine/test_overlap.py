"""cygemm.engine.overlap: the geometry of memory every output check reads.

What is checked here (tests/engine/test_arrays.py holds the property tests over random blocks
of one matrix; these are the edge cases of the rules):
- a view's byte range [lo, hi) reaches below its pointer along a negative stride, and its end is
  exclusive: views that only touch end to end share nothing;
- two views share memory exactly where both are lines of one leading dimension (vectors, row and
  column blocks), checked against NumPy's exact np.shares_memory; a block that wraps past the end
  of a line is not missed; views of other leading dimensions or element sizes, batches, views
  without a unit-stride axis (reversed columns) or off the element grid are compared by address
  range (conservative, as arrays_overlap's docstring says); empty views overlap nothing;
- the refusal names both arguments and their byte ranges, through gemm (fakes) and describe_gemm
  (host arrays), which run the same check before anything launches.
GPU: outputs that are column blocks of an input's own buffer are computed in place, the input's
block left as it was.
"""
import numpy as np
import pytest

import cygemm
from cygemm.engine.overlap import arrays_overlap
from fakes import BASE, FakeDeviceArray, fake_view
from gpu_util import f64, rand, rel_err


def _address(x):
    return x.__array_interface__["data"][0]


def _byte_range(view):
    """[lo, hi) of the bytes a NumPy view can touch, from its address, shape and byte strides."""
    lo = hi = _address(view)
    for n, s in zip(view.shape, view.strides):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + view.itemsize


def _fake_range(buf, view):
    """_byte_range of fake_view(buf, view): the same offsets from BASE."""
    lo, hi = _byte_range(view)
    return BASE + lo - _address(buf), BASE + hi - _address(buf)


def _message(out_name, out_range, other_name, other_range):
    return (f"{out_name}: its memory overlaps {other_name} (bytes [{out_range[0]:#x}, {out_range[1]:#x}) and "
            f"[{other_range[0]:#x}, {other_range[1]:#x})); cuBLAS and cygemm's kernels need outputs that "
            f"share no memory with the other arguments")


FLAT = np.zeros(40, np.float32)
MAT = np.zeros((8, 10), np.float32)         # 8 lines of 10 elements: leading dimension 10


# ------------------------------------------------------------------ exact: lines of one leading dimension

EXACT = {
    # 1-D views of one stride are exact too, interleaved ones included
    "even vs odd elements": (FLAT, FLAT[0::2], FLAT[1::2], False),
    "even vs even shifted by one step": (FLAT, FLAT[0::2], FLAT[2::2], True),
    "stride 3 vs stride 3 shifted by 2": (FLAT, FLAT[0:30:3], FLAT[2:30:3], False),
    "end to end": (FLAT, FLAT[:10], FLAT[10:20], False),
    "one element shared at the end": (FLAT, FLAT[:11], FLAT[10:20], True),
    # a column (rows, 1) is segments of one element, ld apart
    "adjacent columns": (MAT, MAT[:, 3:4], MAT[:, 4:5], False),
    "column next to a column block": (MAT, MAT[:, 3:4], MAT[:, :3], False),
    "column inside a column block": (MAT, MAT[:, 3:4], MAT[:, :4], True),
    "column beside rows it crosses": (MAT, MAT[:, 9:10], MAT[2:5, :9], False),
    # a row is one segment
    "row through a column block": (MAT, MAT[2], MAT[:, 5:], True),
    "row above a column block": (MAT, MAT[2], MAT[3:, 5:], False),
    "row below a row block": (MAT, MAT[6, 2:8], MAT[:6, 2:8], False),
    "corner blocks that miss": (MAT, MAT[:4, :5], MAT[4:, 5:], False),
    "corner blocks that share one element": (MAT, MAT[:5, :6], MAT[4:, 5:], True),
}


@pytest.mark.parametrize("case", list(EXACT))
def test_lines_of_one_leading_dimension_are_compared_exactly(case):
    buf, x, y, shared = EXACT[case]
    assert np.shares_memory(x, y) == shared          # the case says what it is
    assert arrays_overlap(fake_view(buf, x), fake_view(buf, y)) == shared
    assert arrays_overlap(fake_view(buf, y), fake_view(buf, x)) == shared


# ------------------------------------------------------------------ negative strides

NEGATIVE = {
    "reversed vector ending where the next starts": (FLAT, FLAT[9::-1], FLAT[10:], False),
    "reversed vector sharing its first element": (FLAT, FLAT[10::-1], FLAT[10:], True),
    "reversed vector above another": (FLAT, FLAT[19:9:-1], FLAT[:10], False),
    "reversed vector reaching down into another": (FLAT, FLAT[19:8:-1], FLAT[:10], True),
    "reversed rows above a row block": (MAT, MAT[3::-1], MAT[4:], False),
    "reversed rows sharing a row": (MAT, MAT[4::-1], MAT[4:], True),
}


@pytest.mark.parametrize("case", list(NEGATIVE))
def test_a_negative_stride_reaches_below_the_pointer(case):
    """The byte range of a view runs from its lowest element: along a negative stride that is
    below its pointer, so a reversed view that reaches down into another is not missed, and one
    that stops just above it is not refused."""
    buf, x, y, shared = NEGATIVE[case]
    assert np.shares_memory(x, y) == shared
    assert arrays_overlap(fake_view(buf, x), fake_view(buf, y)) == shared


def test_a_block_that_wraps_past_the_end_of_a_line_is_not_missed():
    """A (3, 4) view of leading dimension 10 starting at column 8 covers elements 8..11, 18..21,
    28..31: its segments run into the next line, where the exact test of blocks does not apply;
    it must still see that it shares elements 10, 11, 20, 21 with the first columns below."""
    wrap = np.lib.stride_tricks.as_strided(MAT.ravel()[8:], (3, 4), MAT.strides)
    below = MAT[1:, :2]
    assert np.shares_memory(wrap, below)
    assert arrays_overlap(fake_view(MAT, wrap), fake_view(MAT, below))
    assert not arrays_overlap(fake_view(MAT, wrap), fake_view(MAT, MAT[4:, :2]))     # byte ranges apart


# ------------------------------------------------------------------ conservative: by address range

def test_other_leading_dimensions_itemsizes_and_batches_are_compared_by_address_range():
    """Where the views are not unit-stride lines of one leading dimension and element size, arrays_overlap
    answers by address range: True wherever the ranges meet (though np.shares_memory may say
    False), False where they do not."""
    flat = np.zeros(200, np.float32)
    ld10, ld20 = flat[:80].reshape(8, 10)[:, :5], flat[5:85].reshape(4, 20)[:, :5]
    assert not np.shares_memory(ld10, ld20)
    assert arrays_overlap(fake_view(flat, ld10), fake_view(flat, ld20))
    assert not arrays_overlap(fake_view(flat, ld10), fake_view(flat, flat[100:180].reshape(4, 20)[:, :5]))
    # columns 5..9 of MAT's rows read as float16: bytes disjoint from columns 0..4, other element size
    left = fake_view(MAT, MAT[:, :5])
    assert arrays_overlap(left, FakeDeviceArray((8, 10), "<f2", (40, 2), BASE + 20))
    assert not arrays_overlap(left, FakeDeviceArray((8, 10), "<f2", (40, 2), BASE + MAT.nbytes))
    # reversed columns have no unit-stride axis: no lines, so by range, though disjoint from columns 5..9
    assert not np.shares_memory(MAT[:, 4::-1], MAT[:, 5:])
    assert arrays_overlap(fake_view(MAT, MAT[:, 4::-1]), fake_view(MAT, MAT[:, 5:]))
    # a view half an element off the grid: bytes 22..37 of each 40-byte line, disjoint from 0..19
    assert arrays_overlap(left, FakeDeviceArray((8, 4), "<f4", (40, 4), BASE + 22))
    # batched: column blocks of each matrix are compared by range; matrices apart are apart
    batched = MAT.reshape(2, 4, 10)
    assert not np.shares_memory(batched[:, :, :5], batched[:, :, 5:])
    assert arrays_overlap(fake_view(MAT, batched[:, :, :5]), fake_view(MAT, batched[:, :, 5:]))
    assert not arrays_overlap(fake_view(MAT, batched[:1]), fake_view(MAT, batched[1:]))


def test_empty_views_overlap_nothing_even_at_the_same_address():
    for empty in (MAT[:, 3:3], MAT[5:5], MAT.reshape(2, 4, 10)[:0]):
        assert not arrays_overlap(fake_view(MAT, empty), fake_view(MAT, MAT))
    assert not arrays_overlap(FakeDeviceArray((0, 4)), FakeDeviceArray((4, 4)))


def test_arrays_overlap_reads_1_to_3_dimensions_of_the_float_dtypes():
    with pytest.raises(ValueError, match=r"^x: expected a 1-D or 3-D array, got 0-D with shape \(\)$"):
        arrays_overlap(FakeDeviceArray(()), FakeDeviceArray((4,)))
    with pytest.raises(ValueError, match=r"^y: expected a 1-D or 3-D array, got 4-D"):
        arrays_overlap(FakeDeviceArray((4,)), FakeDeviceArray((1, 1, 2, 2)))
    with pytest.raises(TypeError, match="^x: expected float16, bfloat16 or float32, got float64"):
        arrays_overlap(FakeDeviceArray((2, 2), "<f8"), FakeDeviceArray((4,)))
    # a 3-D array and a vector just past its end (8 float32 = 32 bytes), then one on its last element
    assert not arrays_overlap(FakeDeviceArray((2, 2, 2)), FakeDeviceArray((4,), ptr=BASE + 32))
    assert arrays_overlap(FakeDeviceArray((2, 2, 2)), FakeDeviceArray((4,), ptr=BASE + 28))


# ------------------------------------------------------------------ the refusal, through the entry points

def test_gemm_refuses_an_out_overlapping_a_naming_both_and_their_byte_ranges():
    P = np.zeros((6, 8), np.float32)            # a fake buffer at BASE: A its columns 0..4, out 4..7
    A, out = P[:, :5], P[:, 4:8]
    B = FakeDeviceArray((5, 4), ptr=BASE + (1 << 20))
    want = _message("out", _fake_range(P, out), "A", _fake_range(P, A))
    assert _fake_range(P, out) == (BASE + 16, BASE + 192) and _fake_range(P, A) == (BASE, BASE + 180)
    with pytest.raises(ValueError) as info:
        cygemm.gemm(fake_view(P, A), B, fake_view(P, out))
    assert str(info.value) == want


def test_describe_gemm_refuses_an_out_overlapping_b_with_the_host_byte_ranges():
    buf = np.zeros((8, 8), np.float32)
    A = np.zeros((4, 4), np.float32)
    B, out = buf[:4, :2], buf[:4, 1:3]          # column 1 of B is out's column 0
    with pytest.raises(ValueError) as info:
        cygemm.describe_gemm(A, B, out)
    assert str(info.value) == _message("out", _byte_range(out), "B", _byte_range(B))


def test_an_out_ending_where_an_input_begins_is_accepted_and_one_element_more_is_not():
    flat = np.zeros(64, np.float32)
    B = np.zeros((3, 2), np.float32)
    A = flat[8:20].reshape(4, 3)
    assert cygemm.describe_gemm(A, B, flat[:8].reshape(4, 2))["M"] == 4          # bytes [0, 32) and [32, 80)
    assert cygemm.describe_gemm(A, B, flat[20:28].reshape(4, 2))["M"] == 4       # just past A's end
    with pytest.raises(ValueError, match="^out: its memory overlaps A"):
        cygemm.describe_gemm(A, B, flat[19:27].reshape(4, 2))                    # A's last element


def test_an_out_column_beside_the_inputs_columns_is_accepted():
    """out = P[:, K:K+1] and A = P[:, :K]: a column and a column block of one leading dimension,
    exact, so accepted; one column to the left it is A's last column, and refused."""
    K = 5
    P = np.zeros((6, K + 1), np.float32)
    B = np.zeros((K, 1), np.float32)
    d = cygemm.describe_gemm(P[:, :K], B, P[:, K:K + 1])
    assert (d["M"], d["N"], d["K"], d["c"]) == (6, 1, K, _address(P[:, K:K + 1]))
    with pytest.raises(ValueError, match="^out: its memory overlaps A"):
        cygemm.describe_gemm(P[:, :K], B, P[:, K - 1:K])


# ------------------------------------------------------------------ GPU: column blocks computed in place

@pytest.mark.gpu
def test_forward_into_writes_out_and_z_out_as_column_blocks_of_as_buffer():
    import cupy as cp
    M, K, N = 96, 40, 24
    P = rand(cp, (M, K + 2 * N))               # A, out, z_out: columns 0..K-1, K..K+N-1, K+N..
    B, bias = rand(cp, (K, N)), rand(cp, (N,))
    P[:, K:] = cp.nan                          # out and z_out poisoned
    before = cp.asnumpy(P)
    A, out, z = P[:, :K], P[:, K:K + N], P[:, K + N:]
    cygemm.dense.forward_into(A, B, out, bias, act="relu", save_z=True, z_out=z, math="fp32")
    after = cp.asnumpy(P)
    z_ref = before[:, :K].astype(np.float64) @ f64(cp, B) + f64(cp, bias)
    assert rel_err(after[:, K + N:], z_ref) < 1e-5
    assert rel_err(after[:, K:K + N], np.maximum(z_ref, 0.0)) < 1e-5
    np.testing.assert_array_equal(after[:, :K], before[:, :K])          # A's block as it was


@pytest.mark.gpu
def test_gemm_writes_an_out_column_beside_as_columns():
    import cupy as cp
    M, K = 200, 33
    P = rand(cp, (M, K + 1))
    B = rand(cp, (K, 1))
    P[:, K] = cp.nan
    before = cp.asnumpy(P)
    cygemm.gemm(P[:, :K], B, P[:, K:K + 1], math="fp32")
    after = cp.asnumpy(P)
    assert rel_err(after[:, K:], before[:, :K].astype(np.float64) @ f64(cp, B)) < 1e-5
    np.testing.assert_array_equal(after[:, :K], before[:, :K])
