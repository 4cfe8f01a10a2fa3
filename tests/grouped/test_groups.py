"""cygemm.grouped.groups: a grouped call's groups read, mapped and checked, through
cygemm.grouped.grouped_gemm, moe_gemm and describe_grouped.

CPU (fake device arrays): group-size mismatches name the group and its transposes, the first
bad group is the one named, a non-2-D matrix or another dtype names its group and As[0]; the
strided-batch rule (one size, leading dimension and layout, constant non-negative strides of
whole elements) names the active groups by their numbers; the grouped route's alignment rule
by dtype and TF32 and its int32 limit; K == 0 and empty groups set apart (macs, streams);
outputs checked exactly against inputs of any group (column blocks of one buffer and empty
views pass); moe_gemm's experts named as slices of x, w and out, and its empty experts leaving
the others one strided batch only while their weights stay evenly spaced.

GPU, against float64 NumPy with NaN-poisoned outputs: an empty expert between evenly spaced
ones run as one strided batch, K == 0 groups scaled by beta beside alpha/beta products on the
grouped, loop and streams routes, 4-byte-aligned float32 groups on the grouped route in strict fp32, and one active group
among empty ones."""
import re

import numpy as np
import pytest

from cygemm import grouped
import cygemm.grouped.gemm  # noqa: F401 (LT_NEEDS_DEVICE_OFFSETS)
from cygemm.engine.errors import NoGpuError
from fakes import BASE, FakeDeviceArray
from gpu_util import f64, poisoned, rand, rel_err

SLOT = 0x10000


def fake(shape, ptr, typestr="<f4", strides=None):
    return FakeDeviceArray(shape, typestr, strides, ptr)


def fake_groups(sizes, typestr="<f4", slots=None):
    """Fakes for groups of (m, n, k): A (m, k), B (k, n), out (m, n), group i in slot slots[i]
    (default i: one stride apart) of three regions."""
    slots = range(len(sizes)) if slots is None else slots
    As, Bs, outs = [], [], []
    for (m, n, k), s in zip(sizes, slots):
        As.append(fake((m, k), BASE + SLOT * s, typestr))
        Bs.append(fake((k, n), BASE + 0x1000_0000 + SLOT * s, typestr))
        outs.append(fake((m, n), BASE + 0x2000_0000 + SLOT * s, typestr))
    return As, Bs, outs


# ------------------------------------------------------------------ CPU: reading the groups

@pytest.mark.parametrize("trans_a,trans_b,msg", [
    (True, True, "Bs[2]: op(As[2]) is 3x5 (trans_a=True) so op(Bs[2]) must have 5 rows, got 4x2 (trans_b=True)"),
    (True, False, "Bs[2]: op(As[2]) is 3x5 (trans_a=True) so op(Bs[2]) must have 5 rows, got 2x4 (trans_b=False)"),
    (False, True, "Bs[2]: op(As[2]) is 5x3 (trans_a=False) so op(Bs[2]) must have 3 rows, got 4x2 (trans_b=True)"),
])
def test_an_inner_size_mismatch_names_the_group_and_its_transposes(trans_a, trans_b, msg):
    """Groups 0 and 1 agree under each flag pair (op(X) = X.T where flagged); group 2's A is
    (5, 3) and its B (2, 4), which agree under none."""
    sq = [fake((6, 6), BASE), fake((7, 7), BASE + SLOT)]
    As = sq + [fake((5, 3), BASE + 2 * SLOT)]
    Bs = [fake((6, 6), BASE + 0x100000), fake((7, 7), BASE + 0x110000), fake((2, 4), BASE + 0x120000)]
    M = 3 if trans_a else 5
    N = 2 if trans_b else 4
    outs = [fake((6, 6), BASE + 0x200000), fake((7, 7), BASE + 0x210000), fake((M, N), BASE + 0x220000)]
    for call in (grouped.grouped_gemm, grouped.describe_grouped):
        with pytest.raises(ValueError) as e:
            call(As, Bs, outs, trans_a=trans_a, trans_b=trans_b)
        assert str(e.value) == msg


def test_the_first_bad_group_is_the_one_named():
    As, Bs, outs = fake_groups([(4, 5, 6)] * 4)
    Bs[1] = fake((7, 5), BASE + 0x3000_0000)
    Bs[3] = fake((8, 5), BASE + 0x3100_0000)
    with pytest.raises(ValueError, match=re.escape("Bs[1]: op(As[1]) is 4x6 (trans_a=False) so op(Bs[1]) must "
                                                   "have 6 rows, got 7x5")):
        grouped.grouped_gemm(As, Bs, outs)
    As, Bs, outs = fake_groups([(4, 5, 6)] * 4)
    outs[2] = fake((4, 6), BASE + 0x3000_0000)
    outs[3] = fake((5, 5), BASE + 0x3100_0000)
    with pytest.raises(ValueError, match=re.escape("outs[2]: expected shape (4, 5), got (4, 6)")):
        grouped.grouped_gemm(As, Bs, outs)


def test_a_matrix_that_is_not_2d_or_of_another_dtype_names_its_group_and_as0():
    As, Bs, outs = fake_groups([(4, 5, 6)] * 3)
    As[1] = fake((6,), BASE + 0x3000_0000)
    with pytest.raises(ValueError, match=re.escape("As[1]: expected a 2-D array, got 1-D with shape (6,)")):
        grouped.grouped_gemm(As, Bs, outs)
    As, Bs, outs = fake_groups([(4, 5, 6)] * 3)
    outs[2] = fake((1, 4, 5), BASE + 0x3000_0000)
    with pytest.raises(ValueError, match=re.escape("outs[2]: expected a 2-D array")):
        grouped.describe_grouped(As, Bs, outs)
    As, Bs, outs = fake_groups([(4, 5, 6)] * 3, "<f2")
    Bs[0] = fake((6, 5), BASE + 0x3000_0000)                  # float32 beside float16's As[0]
    with pytest.raises(TypeError, match=re.escape("Bs[0]: expected the dtype of As[0] (float16), got float32")):
        grouped.grouped_gemm(As, Bs, outs)


# ------------------------------------------------------------------ CPU: which routes the groups allow

def test_one_strided_batch_needs_one_layout_and_names_the_active_groups_that_differ():
    # Group 0 is empty (it runs nothing): the comparison is between the active groups 1 and 3.
    As, Bs, outs = fake_groups([(0, 8, 32), (16, 8, 32), (16, 8, 32), (16, 8, 32)])
    As[3] = fake((16, 32), BASE + 3 * SLOT, strides=(40 * 4, 4))              # rows padded to 40
    why = grouped.describe_grouped(As, Bs, outs)["not_applicable"]["batched"]
    assert why.startswith("groups differ in size, leading dimension or layout (group 1: cuBLAS NN m=8 n=16 k=32")
    assert "; group 3: cuBLAS NN m=8 n=16 k=32" in why and "=40" in why


@pytest.mark.parametrize("slots,why", [
    ([0, 1, 2, 4], "the groups' matrices are not at constant strides (group 3 breaks the stride of the first two)"),
    ([2, 1, 0], "the groups' matrices are not at non-negative strides of whole elements"),
    ([0, 0, 0], None),          # stride 0 in every array: outputs overlap (refused below)
])
def test_one_strided_batch_needs_constant_non_negative_strides(slots, why):
    sizes = [(16, 8, 32)] * len(slots)
    if why is None:
        with pytest.raises(ValueError, match=re.escape("outs[1]: its memory overlaps outs[0]")):
            grouped.describe_grouped(*fake_groups(sizes, slots=slots))
        return
    d = grouped.describe_grouped(*fake_groups(sizes, slots=slots))
    assert d["not_applicable"]["batched"] == why and d["routes"] == ["grouped", "loop", "streams"]


def test_strides_that_are_not_whole_elements_are_not_one_batch():
    As, Bs, outs = fake_groups([(16, 8, 32)] * 2)
    outs[1] = fake((16, 8), BASE + 0x2000_0000 + SLOT + 2)    # 2 bytes past its slot: half a float32
    d = grouped.describe_grouped(As, Bs, outs, math="fp32")
    assert d["not_applicable"]["batched"] == "the groups' matrices are not at non-negative strides of whole elements"
    assert "grouped" in d["routes"]            # strict fp32: the grouped route takes any alignment


@pytest.mark.parametrize("typestr,offset,math,applies", [
    ("<f4", 4, "fp32", True),                   # strict fp32: no alignment needed
    ("<f4", 4, "tf32", False),                  # TF32 needs 16 bytes
    ("<f2", 8, "fp32", False),                  # the half types need 16 bytes in any math
    ("<f2", 16, "tf32", True),
    ("<f4", 16, "tf32", True),
])
def test_the_grouped_routes_alignment_rule_depends_on_dtype_and_tf32(typestr, offset, math, applies):
    As, Bs, outs = fake_groups([(16, 8, 32), (5, 8, 32)], typestr)
    As[1] = fake((5, 32), BASE + SLOT + offset, typestr)
    d = grouped.describe_grouped(As, Bs, outs, math=math)
    assert ("grouped" in d["routes"]) == applies
    if not applies:
        dtype = "float32" if typestr == "<f4" else "float16"
        assert d["not_applicable"]["grouped"] == (
            f"a matrix is only {offset}-byte aligned; cublasGemmGroupedBatchedEx needs 16-byte aligned pointers "
            f"for {dtype}" + (" with TF32" if dtype == "float32" else ""))
    else:
        assert "grouped" not in d["not_applicable"]


def test_a_leading_dimension_past_int32_rules_out_the_grouped_route_naming_the_group():
    As, Bs, outs = fake_groups([(16, 8, 32), (2, 8, 32), (5, 8, 32)])
    As[1] = fake((2, 32), BASE + 0x10_0000_0000, strides=(2**31 * 4, 4))    # ld 2**31, far from the rest
    d = grouped.describe_grouped(As, Bs, outs, math="fp32")
    assert d["not_applicable"]["grouped"] == ("group 1 has a size or leading dimension past 2**31 - 1 "
                                              "(cublasGemmGroupedBatchedEx takes int)")
    assert "loop" in d["routes"] and "streams" in d["routes"]
    g1 = d["per_group"][1]                       # under the swap, cuBLAS's B is As[1]
    assert (g1["cublas_b"], g1["ldb"]) == ("As[1]", 2**31)


def test_k_zero_and_empty_groups_are_set_apart_from_the_active_ones():
    sizes = [(16, 8, 0), (0, 8, 32), (5, 0, 32), (5, 8, 32), (3, 2, 7)]
    d = grouped.describe_grouped(*fake_groups(sizes))
    assert (d["groups"], d["active"], d["zero_k"]) == (5, 2, 1)
    assert d["macs"] == 5 * 8 * 32 + 3 * 2 * 7              # only the active groups' products
    assert [g["route"] for g in d["per_group"]] == ["loop", None, None, d["chosen"], d["chosen"]]
    # One active group beside a K == 0 one: nothing to run beside it on a second stream.
    d = grouped.describe_grouped(*fake_groups([(16, 8, 0), (5, 8, 32)]))
    assert d["not_applicable"] == {"streams": "needs two or more non-empty groups",
                                   "lt_grouped": grouped.gemm.LT_NEEDS_DEVICE_OFFSETS}
    assert (d["chosen"], d["routes"]) == ("batched", ["batched", "grouped", "loop"])
    with pytest.raises(ValueError, match="route: 'streams' does not apply: needs two or more non-empty groups"):
        grouped.grouped_gemm(*fake_groups([(16, 8, 0), (5, 8, 32)]), route="streams")


# ------------------------------------------------------------------ CPU: outputs against inputs

def test_an_output_overlapping_a_later_groups_input_is_named_first():
    As, Bs, outs = fake_groups([(4, 5, 6)] * 3)
    outs[0] = fake((4, 5), BASE + 2 * SLOT + 8)                 # inside As[2]
    with pytest.raises(ValueError, match=re.escape("outs[0]: its memory overlaps As[2]")):
        grouped.grouped_gemm(As, Bs, outs)
    As, Bs, outs = fake_groups([(4, 5, 6)] * 3)
    outs[2] = fake((4, 5), BASE + 0x1000_0000 + 16)             # inside Bs[0]
    with pytest.raises(ValueError, match=re.escape("outs[2]: its memory overlaps Bs[0]")):
        grouped.describe_grouped(As, Bs, outs)


def test_outputs_are_checked_exactly_so_interleaved_and_empty_views_pass():
    # A and out side by side in the rows of one (4, 11) buffer: their byte ranges meet, their
    # elements do not.
    A = fake((4, 6), BASE, strides=(44, 4))
    out = fake((4, 5), BASE + 24, strides=(44, 4))
    assert grouped.describe_grouped([A], [fake((6, 5), BASE + 0x100000)], [out])["active"] == 1
    # An empty out at an input's address writes nothing.
    As = [fake((4, 6), BASE), fake((0, 6), BASE + 0x1000)]
    outs = [fake((4, 5), BASE + 0x200000), fake((0, 5), BASE)]
    d = grouped.describe_grouped(As, [fake((6, 5), BASE + 0x100000)] * 2, outs)
    assert (d["groups"], d["active"]) == (2, 1)
    # The same B in every group is one input read G times, not an overlap.
    shared = fake((6, 5), BASE + 0x100000)
    As, _, outs = fake_groups([(4, 5, 6)] * 6)
    assert grouped.describe_grouped(As, [shared] * 6, outs)["active"] == 6


# ------------------------------------------------------------------ CPU: moe_gemm's groups

def moe_fakes(T=12, K=8, N=6, G=4, x_strides=None, w_strides=None, out_strides=None):
    return (fake((T, K), BASE, strides=x_strides), fake((G, K, N), BASE + 0x100000, strides=w_strides),
            fake((T, N), BASE + 0x200000, strides=out_strides))


@pytest.mark.parametrize("which,strides,msg", [
    ("w", (8 * 6 * 8 * 4, 6 * 4 * 2, 8), "w[1]: a layout cuBLAS cannot read in place"),
    ("x", (8 * 4 * 2, 8), "x[0:4]: a layout cuBLAS cannot read in place"),
    ("out", (6 * 4 * 2, 8), "out[0:4]: a layout cuBLAS cannot write in place"),
])
def test_a_moe_layout_error_names_the_first_non_empty_experts_slice(which, strides, msg):
    """Expert 0 has no rows (nothing to map); expert 1's rows 0:4 are the first mapped."""
    x, w, out = moe_fakes(**{f"{which}_strides": strides})
    with pytest.raises(ValueError) as e:
        grouped.moe_gemm(x, w, [0, 0, 4, 8, 12], out)
    assert str(e.value).startswith(msg) and f"ascontiguousarray({msg.split(': ')[0]})" in str(e.value)


def test_an_empty_expert_breaks_the_strided_batch_only_where_the_weights_stop_being_evenly_spaced():
    x, w, out = moe_fakes()
    # Experts 0, 2, 3 have rows: x and out advance 4 rows each, w by 2 matrices then 1.
    with pytest.raises(ValueError, match=re.escape("route: 'batched' does not apply: the groups' matrices are "
                                                   "not at constant strides (group 3 breaks the stride of the "
                                                   "first two)")):
        grouped.moe_gemm(x, w, [0, 4, 4, 8, 12], out, route="batched")
    with pytest.raises(ValueError, match="route: 'streams' does not apply: needs two or more non-empty groups"):
        grouped.moe_gemm(x, w, [0, 12, 12, 12, 12], out, route="streams")


@pytest.mark.nogpu
@pytest.mark.parametrize("offsets", [[0, 3, 6, 9, 12], [0, 4, 8, 12, 12], [0, 6, 6, 12, 12],
                                     np.array([0, 0, 6, 6, 12])])
def test_evenly_spaced_non_empty_experts_are_one_strided_batch(offsets):
    """The batched route is accepted (it gets as far as needing a GPU): the active experts'
    rows and weights advance by constant strides, empty experts (trailing, or skipped at a
    constant step) notwithstanding."""
    x, w, out = moe_fakes()
    with pytest.raises(NoGpuError):
        grouped.moe_gemm(x, w, offsets, out, route="batched")


# ------------------------------------------------------------------ GPU

def _cp():
    return pytest.importorskip("cupy")


def _moe_ref(cp, x, w, offs, w_layout):
    xs, ws = f64(cp, x), f64(cp, w)
    out = np.full((xs.shape[0], ws.shape[2] if w_layout == "kn" else ws.shape[1]), np.nan)
    for g in range(len(offs) - 1):
        wg = ws[g] if w_layout == "kn" else ws[g].T
        out[offs[g]:offs[g + 1]] = xs[offs[g]:offs[g + 1]] @ wg
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("w_layout", ["kn", "nk"])
@pytest.mark.parametrize("offsets", [[0, 16, 16, 32], [0, 0, 16, 16, 32], [0, 16, 32, 32]])
def test_empty_experts_between_evenly_spaced_ones_run_as_one_strided_batch(w_layout, offsets):
    cp = _cp()
    G, T, K, N = len(offsets) - 1, offsets[-1], 40, 24
    x = rand(cp, (T, K))
    w = rand(cp, (G, K, N) if w_layout == "kn" else (G, N, K))
    out = poisoned(cp, (T, N))
    grouped.moe_gemm(x, w, offsets, out, w_layout=w_layout, math="fp32")
    assert grouped.last_route() == "batched"          # the fixed rule's first choice, where it applies
    cp.cuda.Device().synchronize()
    assert rel_err(cp.asnumpy(out), _moe_ref(cp, x, w, offsets, w_layout)) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["grouped", "loop", "streams"])
def test_k_zero_groups_are_scaled_by_beta_beside_alpha_beta_products(route):
    cp = _cp()
    sizes = [(33, 17, 65), (12, 9, 0), (8, 40, 24), (0, 5, 3), (20, 6, 0), (64, 9, 3)]
    As = [rand(cp, (m, k)) for m, n, k in sizes]
    Bs = [rand(cp, (k, n)) for m, n, k in sizes]
    C0 = [rand(cp, (m, n)) for m, n, k in sizes]
    outs = [c.copy() for c in C0]
    grouped.grouped_gemm(As, Bs, outs, alpha=-0.5, beta=1.25, math="fp32", route=route)
    assert grouped.last_route() == route
    cp.cuda.Device().synchronize()
    for i, (A, B, c0, out) in enumerate(zip(As, Bs, C0, outs)):
        if out.size == 0:
            continue
        ref = -0.5 * (f64(cp, A) @ f64(cp, B)) + 1.25 * f64(cp, c0)      # K == 0: 1.25 * c0
        assert rel_err(cp.asnumpy(out), ref) < 1e-5, f"group {i}"


@pytest.mark.gpu
def test_four_byte_aligned_float32_groups_on_the_grouped_route_in_strict_fp32():
    cp = _cp()
    sizes = [(33, 17, 65), (8, 40, 24), (64, 9, 3), (5, 5, 5)]
    As, Bs, outs = [], [], []
    for m, n, k in sizes:                                  # each one float past a 256-byte boundary
        As.append(rand(cp, (m * k + 1,))[1:].reshape(m, k))
        Bs.append(rand(cp, (k * n + 1,))[1:].reshape(k, n))
        outs.append(poisoned(cp, (m * n + 1,))[1:].reshape(m, n))
    d = grouped.describe_grouped(As, Bs, outs, math="fp32")
    assert "grouped" in d["routes"] and "grouped" in grouped.describe_grouped(As, Bs, outs, math="tf32")[
        "not_applicable"]
    grouped.grouped_gemm(As, Bs, outs, math="fp32", route="grouped")
    assert grouped.last_route() == "grouped"
    cp.cuda.Device().synchronize()
    for i, (A, B, out) in enumerate(zip(As, Bs, outs)):
        assert rel_err(cp.asnumpy(out), f64(cp, A) @ f64(cp, B)) < 1e-5, f"group {i}"


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["batched", "grouped", "loop"])
def test_one_active_group_among_empty_ones(route):
    cp = _cp()
    sizes = [(0, 8, 16), (24, 0, 16), (24, 40, 56), (0, 0, 0)]
    As = [rand(cp, (m, k)) for m, n, k in sizes]
    Bs = [rand(cp, (k, n)) for m, n, k in sizes]
    outs = [poisoned(cp, (m, n)) for m, n, k in sizes]
    grouped.grouped_gemm(As, Bs, outs, math="fp32", route=route)
    assert grouped.last_route() == route
    cp.cuda.Device().synchronize()
    assert rel_err(cp.asnumpy(outs[2]), f64(cp, As[2]) @ f64(cp, Bs[2])) < 1e-5
