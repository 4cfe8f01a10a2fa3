"""cygemm/kernels/grouped.cu on the CPU (tests/kernels/emulator): the table that cuBLASLt's grouped
matmul reads (pointers, sizes and leading dimensions per group, derived on the device from the
experts' row offsets), and the zeroing of the outputs of groups without rows, run on host memory.

The expected tables are derived here from the offsets, independently of the kernel: the layout
from its rule (arrays of 8-byte pointers, then of int32, each starting 16 bytes apart; alpha and
beta last), each group's pointers from the operand's base, strides and the group's first row.
Memory around the table and the outputs is poisoned and must be left as it was."""
import ctypes

import numpy as np
import pytest

import emulator

INVALID = 1                     # cudaErrorInvalidValue
RAGGED_M, RAGGED_N, RAGGED_K = 0, 1, 2


class Operand(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("group_stride", ctypes.c_longlong), ("row_stride", ctypes.c_longlong)]


class Problem(ctypes.Structure):
    _fields_ = [("a", Operand), ("b", Operand), ("d", Operand), ("scale_a", Operand), ("scale_b", Operand),
                ("scale_b_kblocks", ctypes.c_longlong), ("m", ctypes.c_longlong), ("n", ctypes.c_longlong), ("k", ctypes.c_longlong),
                ("lda", ctypes.c_longlong), ("ldb", ctypes.c_longlong), ("ldd", ctypes.c_longlong),
                ("ragged", ctypes.c_int), ("rows", ctypes.c_longlong)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emulator.build_or_skip("grouped", tmp_path_factory)
    lib.cygemm_write_grouped_table.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                               ctypes.POINTER(Problem), ctypes.c_void_p, ctypes.c_void_p]
    lib.cygemm_group_row_scales.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p,
                                            ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.cygemm_zero_empty_groups.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
                                             ctypes.c_void_p,
                                             ctypes.c_longlong, ctypes.c_longlong, ctypes.c_longlong,
                                             ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p]
    return lib


def layout(groups):
    """The table's arrays (name -> byte offset) by the header's rule, derived here."""
    ptrs = -(-groups * 8 // 16) * 16
    ints = -(-groups * 4 // 16) * 16
    at = {"a": 0, "b": ptrs, "c": 2 * ptrs, "d": 3 * ptrs, "scale_a": 4 * ptrs, "scale_b": 5 * ptrs}
    for i, name in enumerate(("m", "n", "k", "lda", "ldb", "ldd")):
        at[name] = 6 * ptrs + i * ints
    at["alpha"] = 6 * ptrs + 6 * ints
    at["beta"] = at["alpha"] + 16
    at["bytes"] = at["beta"] + 16
    return at


def read(table, at, groups):
    """The table as dicts: name -> NumPy array of the groups' values."""
    out = {}
    for name in ("a", "b", "c", "d", "scale_a", "scale_b"):
        out[name] = table[at[name]:at[name] + 8 * groups].view(np.uint64).astype(np.int64)
    for name in ("m", "n", "k", "lda", "ldb", "ldd"):
        out[name] = table[at[name]:at[name] + 4 * groups].view(np.int32)
    out["alpha"] = table[at["alpha"]:at["alpha"] + 4].view(np.float32)[0]
    out["beta"] = table[at["beta"]:at["beta"] + 4].view(np.float32)[0]
    return out


def write(lib, offsets, problem, is64=True):
    """Run the table writer on host memory: the table (with 64 poisoned bytes either side, which
    must stay so) and the return code."""
    groups = len(offsets) - 1
    offs = np.asarray(offsets, np.int64 if is64 else np.int32)
    at = layout(max(groups, 1))
    buf = np.full(at["bytes"] + 128, 0xAB, np.uint8)
    table = buf[64:-64]
    rc = lib.cygemm_write_grouped_table(offs.ctypes.data, int(is64), groups, ctypes.byref(problem),
                                        table.ctypes.data, None)
    assert (buf[:64] == 0xAB).all() and (buf[-64:] == 0xAB).all(), "written outside the table"
    return rc, read(table, at, max(groups, 1)), at


def moe_forward(rows, K=64, N=48, G=5, w_nk=False, isz=2, ld_x=None, ld_out=None):
    """moe_gemm's problem in cuBLAS's terms (out rows of x times w[g]; m = N, n = the rows, k = K)."""
    ld_x, ld_out = ld_x or K, ld_out or N
    w_ld = K if w_nk else N
    return Problem(Operand(0x10000, K * N * isz, 0), Operand(0x4000000, 0, ld_x * isz),
                   Operand(0x8000000, 0, ld_out * isz), Operand(None, 0, 0), Operand(None, 0, 0), 0,
                   N, 0, K, w_ld, ld_x, ld_out, RAGGED_N, rows)


@pytest.mark.parametrize("is64", [True, False])
def test_forward_table_per_group_from_the_offsets(lib, is64):
    offsets = [0, 7, 7, 40, 41, 65]                        # an empty expert among ragged ones
    p = moe_forward(65)
    rc, t, _ = write(lib, offsets, p, is64)
    assert rc == 0
    lo, hi = np.array(offsets[:-1]), np.array(offsets[1:])
    g = np.arange(5)
    assert (t["a"] == 0x10000 + g * 64 * 48 * 2).all()         # w[g]
    assert (t["b"] == 0x4000000 + lo * 64 * 2).all()           # x[lo]
    assert (t["d"] == 0x8000000 + lo * 48 * 2).all() and (t["c"] == t["d"]).all()
    assert (t["m"] == 48).all() and (t["n"] == hi - lo).all() and (t["k"] == 64).all()
    assert (t["lda"] == 48).all() and (t["ldb"] == 64).all() and (t["ldd"] == 48).all()
    assert t["alpha"] == 1.0 and t["beta"] == 0.0


def test_fp8_scales_get_a_pointer_per_group_and_none_are_written_without_them(lib):
    offsets = [0, 4, 4, 9]
    p = moe_forward(9)
    rc, t, _ = write(lib, offsets, p)
    assert rc == 0 and (t["scale_a"] == 0xABABABABABABABAB - (1 << 64)).all()    # left as they were (poison)
    p.scale_a, p.scale_b = Operand(0x5000, 4, 0), Operand(0x6000, 0, 0)          # one per expert; one shared
    rc, t, _ = write(lib, offsets, p)
    assert rc == 0
    assert list(t["scale_a"]) == [0x5000, 0x5004, 0x5008] and list(t["scale_b"]) == [0x6000] * 3


def test_wgrad_table_has_ragged_k_and_empty_groups_compute_nothing(lib):
    offsets = [0, 3, 3, 10]
    K, N, isz = 32, 16, 2
    # dw[g] (K, N) row-major = cuBLAS D (N x K): A = dy rows (N x rows), B = x rows (op T)
    p = Problem(Operand(0x100000, 0, N * isz), Operand(0x200000, 0, K * isz), Operand(0x300000, K * N * isz, 0),
                Operand(None, 0, 0), Operand(None, 0, 0), 0, N, K, 0, N, K, N, RAGGED_K, 10)
    rc, t, _ = write(lib, offsets, p)
    assert rc == 0
    assert list(t["k"]) == [3, 0, 7]
    assert list(t["m"]) == [N, 0, N] and list(t["n"]) == [K, 0, K]
    assert list(t["a"]) == [0x100000 + r * N * isz for r in (0, 3, 3)]
    assert list(t["d"]) == [0x300000 + g * K * N * isz for g in range(3)]


@pytest.mark.parametrize("offsets,expect_rows", [
    ([-5, 4, 10], [4, 6]),              # below 0: clamped to 0
    ([0, 14, 10], [10, 0]),             # past T: clamped to T; then a decreasing one is empty
    ([0, 6, 4, 10], [6, 0, 6]),         # decreasing: empty, the next starts where given
])
def test_wrong_offsets_are_clamped_so_nothing_outside_the_operands_is_named(lib, offsets, expect_rows):
    rc, t, _ = write(lib, offsets, moe_forward(10))
    assert rc == 0
    assert list(t["n"]) == expect_rows
    last_row = (t["b"] - 0x4000000) // (64 * 2) + t["n"]
    assert (last_row <= 10).all() and ((t["b"] - 0x4000000) >= 0).all()


def test_many_groups_take_several_blocks(lib):
    G = 896
    offsets = np.concatenate([[0], np.cumsum(np.arange(G) % 3)])
    rc, t, _ = write(lib, offsets, moe_forward(int(offsets[-1])))
    assert rc == 0
    assert (t["n"] == np.arange(G) % 3).all()


@pytest.mark.parametrize("groups", [0, 897])
def test_group_counts_outside_the_table_are_refused_and_write_nothing(lib, groups):
    offsets = list(range(groups + 1))
    buf = np.full(4096, 0xAB, np.uint8)
    offs = np.asarray(offsets, np.int64)
    p = moe_forward(groups)
    assert lib.cygemm_write_grouped_table(offs.ctypes.data, 1, groups, ctypes.byref(p), buf.ctypes.data, None) == INVALID
    assert (buf == 0xAB).all()


@pytest.mark.parametrize("cols,elem", [(16, 2), (5, 2), (3, 4)])
def test_zero_empty_groups_zeroes_only_those_with_no_rows(lib, cols, elem):
    G, rows, row_stride = 4, 7, cols + 3                # rows with a gap after each
    offsets = np.array([0, 5, 5, 9, 9], np.int64)        # groups 1 and 3 are empty
    dtype = np.uint16 if elem == 2 else np.uint32
    out = np.full((G, rows, row_stride), 0x7FFF if elem == 2 else 0x7FFFFFFF, dtype)
    before = out.copy()
    rc = lib.cygemm_zero_empty_groups(offsets.ctypes.data, 1, G, 9, out.ctypes.data, rows * row_stride * elem,
                                      rows, cols, row_stride * elem, elem, None)
    assert rc == 0
    for g in range(G):
        if offsets[g + 1] == offsets[g]:
            assert (out[g, :, :cols] == 0).all()
            assert (out[g, :, cols:] == before[g, :, cols:]).all()      # the gaps are not written
        else:
            assert (out[g] == before[g]).all()


def test_zero_empty_groups_clamps_offsets_as_the_table_does(lib):
    """Offsets past T (or below 0) make a group empty in the table (m = n = 0): its output is
    zeroed too, so it is never left stale."""
    G, rows, cols = 3, 2, 8
    offsets = np.array([0, 6, 20, 30], np.int64)          # T = 6: groups 1 and 2 lie past it
    out = np.full((G, rows, cols), 0x7FFF, np.uint16)
    assert lib.cygemm_zero_empty_groups(offsets.ctypes.data, 1, G, 6, out.ctypes.data, rows * cols * 2, rows, cols,
                                        cols * 2, 2, None) == 0
    assert (out[0] == 0x7FFF).all() and (out[1:] == 0).all()
    rc, t, _ = write(lib, list(offsets), Problem(Operand(0x100000, 0, 16), Operand(0x200000, 0, 16),
                                                 Operand(0x300000, 32, 0), Operand(None, 0, 0), Operand(None, 0, 0),
                                                 0, 8, 8, 0, 8, 8, 8, RAGGED_K, 6))
    assert rc == 0 and list(t["k"]) == [6, 0, 0] and list(t["m"]) == [8, 0, 0]


def test_the_largest_table_fits_the_streams_64_kib():
    """The table of the most groups the route takes fits the stream's table (STREAM_TABLE_BYTES)."""
    assert layout(896)["bytes"] <= 64 * 1024 < layout(897 + 15)["bytes"]


def _regrouped(src, offsets, kblocks, size):
    """The regrouped layout, derived here: group g's (kblocks, round_up(rows, 4)) block, rows
    contiguous, padding zero, at kblocks * (round_up(first row, 4) + 4 g); NaN elsewhere."""
    T = src.shape[1]
    out = np.full(size, np.nan, np.float32)
    for g in range(len(offsets) - 1):
        a = max(0, min(offsets[g], T))
        b = max(a, min(offsets[g + 1], T))
        block = np.zeros((kblocks, -(-(b - a) // 4) * 4), np.float32)
        block[:, :b - a] = src[:, a:b]
        start = kblocks * (-(-a // 4) * 4 + 4 * g)
        out[start:start + block.size] = block.ravel()
    return out


@pytest.mark.parametrize("offsets", [[0, 5, 5, 9, 21, 21], [0, 0, 0, 4], [0, 1, 2, 3, 7],
                                     [0, 20, 0, 20], [0, 30, -5, 20]])          # (the last two: wrong offsets)
def test_token_scales_are_regrouped_into_each_groups_padded_block(lib, offsets):
    kblocks, T, G = 3, 20 if offsets[-1] == 20 else offsets[-1], len(offsets) - 1
    src = np.arange(kblocks * T, dtype=np.float32).reshape(kblocks, T) + 0.5    # (T, kblocks), T contiguous
    size = kblocks * (-(-T // 4) * 4 + 4 * G)           # what the workspace must hold
    want = _regrouped(src, offsets, kblocks, size)
    dst = np.full(size + 16, np.nan, np.float32)
    offs = np.asarray(offsets, np.int32)
    assert lib.cygemm_group_row_scales(src.ctypes.data, T, kblocks, offs.ctypes.data, 0, G, dst.ctypes.data,
                                       None) == 0
    if all(a <= b for a, b in zip(offsets, offsets[1:])) and offsets[0] == 0:
        assert np.array_equal(dst[:size], want, equal_nan=True)
    # (wrong offsets: groups may overlap, and their blocks too: wrong rows, but in bounds)
    assert np.isnan(dst[size:]).all()                   # nothing past the workspace, whatever the offsets


def test_the_table_points_each_group_at_its_regrouped_scales(lib):
    offsets = [0, 5, 5, 9, 21]
    p = moe_forward(21)
    p.scale_b, p.scale_b_kblocks = Operand(0x9000, 0, 0), 3
    p.scale_a = Operand(0xA000, 16, 0)
    rc, t, _ = write(lib, offsets, p)
    assert rc == 0
    starts = [0, 8 + 4, 8 + 8, 12 + 12]                 # round_up(first row, 4) + 4 g
    assert list(t["scale_b"]) == [0x9000 + 4 * 3 * r for r in starts]
    assert list(t["scale_a"]) == [0xA000 + 16 * g for g in range(4)]
