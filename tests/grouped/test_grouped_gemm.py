"""Grouped GEMMs (cygemm.grouped): every refusal on the CPU with fake device arrays, and the
routes that apply; on the GPU, every route forced where it applies against float64 NumPy
references, on fresh random inputs with NaN-poisoned outputs."""
import threading

import numpy as np
import pytest

import cygemm
from cygemm import grouped
from cygemm.engine import tuning
from fakes import BASE, FakeDeviceArray
from refs import moe as moe_ref
from gpu_util import f64, poisoned, rand, rel_err, tol

ROUTES = ["batched", "grouped", "loop", "streams"]


def fake(shape, ptr, typestr="<f4", strides=None):
    return FakeDeviceArray(shape, typestr, strides, ptr)


def fake_groups(sizes, typestr="<f4", uniform=False):
    """Fakes for groups of (m, n, k): A (m, k), B (k, n), out (m, n), each in its own 64 KiB
    slot (uniform: slots one stride apart, so the groups are one strided batch)."""
    As, Bs, outs = [], [], []
    for i, (m, n, k) in enumerate(sizes):
        slot = 0x10000 * i if uniform else 0x10000 * i + (0x1000 if i % 2 else 0)
        As.append(fake((m, k), BASE + slot, typestr))
        Bs.append(fake((k, n), BASE + 0x1000_0000 + slot, typestr))
        outs.append(fake((m, n), BASE + 0x2000_0000 + slot, typestr))
    return As, Bs, outs


# ------------------------------------------------------------------ CPU: refusals

def test_lists_of_different_lengths_are_refused():
    As, Bs, outs = fake_groups([(4, 5, 6)] * 3)
    with pytest.raises(ValueError, match=r"Bs: expected one matrix per group, as As has \(3\), got 2"):
        grouped.grouped_gemm(As, Bs[:2], outs)
    with pytest.raises(ValueError, match=r"outs: expected one matrix per group, as As has \(3\), got 4"):
        grouped.grouped_gemm(As, Bs, outs + outs[:1])
    with pytest.raises(TypeError, match="As: expected a sequence"):
        grouped.grouped_gemm(None, Bs, outs)


def test_dtypes_that_differ_between_groups_are_refused_naming_the_group():
    As, Bs, outs = fake_groups([(4, 5, 6)] * 3)
    As[2] = fake((4, 6), BASE + 0x3000_0000, "<f2")
    with pytest.raises(TypeError, match=r"As\[2\]: expected the dtype of As\[0\] \(float32\), got float16"):
        grouped.grouped_gemm(As, Bs, outs)
    As, Bs, outs = fake_groups([(4, 5, 6)] * 3)
    outs[1] = fake((4, 5), BASE + 0x3000_0000, "<f2")
    with pytest.raises(TypeError, match=r"outs\[1\]:"):
        grouped.grouped_gemm(As, Bs, outs)


def test_inner_dimensions_that_disagree_name_the_group():
    As, Bs, outs = fake_groups([(4, 5, 6), (7, 8, 9), (2, 3, 4)])
    Bs[1] = fake((10, 8), BASE + 0x3000_0000)
    with pytest.raises(ValueError, match=r"Bs\[1\]: op\(As\[1\]\) is 7x9 .* must have 9 rows, got 10x8"):
        grouped.grouped_gemm(As, Bs, outs)
    As, Bs, outs = fake_groups([(4, 5, 6), (7, 8, 9)])
    outs[1] = fake((7, 9), BASE + 0x3000_0000)
    with pytest.raises(ValueError, match=r"outs\[1\]: expected shape \(7, 8\), got \(7, 9\)"):
        grouped.grouped_gemm(As, Bs, outs)


def test_transposes_apply_to_every_group():
    As = [fake((6, 4), BASE), fake((9, 7), BASE + 0x10000)]          # op(A) = A.T: 4x6, 7x9
    Bs = [fake((5, 6), BASE + 0x100000), fake((8, 9), BASE + 0x110000)]
    outs = [fake((4, 5), BASE + 0x200000), fake((7, 8), BASE + 0x210000)]
    d = grouped.describe_grouped(As, Bs, outs, trans_a=True, trans_b=True)
    assert d["active"] == 2 and d["macs"] == 4 * 5 * 6 + 7 * 8 * 9
    with pytest.raises(ValueError, match=r"Bs\[0\]"):
        grouped.describe_grouped(As, Bs, outs, trans_a=True)


def test_a_layout_cublas_cannot_read_names_the_group():
    As, Bs, outs = fake_groups([(4, 5, 6)] * 3)
    As[1] = fake((4, 6), BASE + 0x3000_0000, strides=(48, 8))        # no unit-stride axis
    with pytest.raises(ValueError, match=r"As\[1\]: a layout cuBLAS cannot read in place"):
        grouped.grouped_gemm(As, Bs, outs)


def test_outputs_overlapping_an_input_or_another_output_are_refused():
    As, Bs, outs = fake_groups([(4, 5, 6)] * 4)
    with pytest.raises(ValueError, match=r"outs\[3\]: its memory overlaps outs\[1\]"):
        grouped.grouped_gemm(As, Bs, outs[:3] + [outs[1]])
    bad = outs[:2] + [fake((4, 5), As[0].__cuda_array_interface__["data"][0] + 8)] + outs[3:]
    with pytest.raises(ValueError, match=r"outs\[2\]: its memory overlaps As\[0\]"):
        grouped.grouped_gemm(As, Bs, bad)
    bad = outs[:3] + [fake((4, 5), Bs[2].__cuda_array_interface__["data"][0])]
    with pytest.raises(ValueError, match=r"outs\[3\]: its memory overlaps Bs\[2\]"):
        grouped.grouped_gemm(As, Bs, bad)


def test_inputs_may_share_memory_and_outputs_may_be_column_blocks_of_one_buffer():
    # One weight shared by every group, outputs side by side in one (4, 20) buffer.
    shared = fake((6, 5), BASE + 0x100000)
    As = [fake((4, 6), BASE + 0x1000 * i) for i in range(4)]
    outs = [fake((4, 5), BASE + 0x200000 + 4 * 5 * i, strides=(80, 4)) for i in range(4)]
    d = grouped.describe_grouped(As, [shared] * 4, outs)
    assert d["active"] == 4 and "batched" in d["routes"]


def test_unknown_or_inapplicable_routes_are_refused_before_anything_runs():
    As, Bs, outs = fake_groups([(4, 5, 6), (7, 8, 9)])          # ragged: not one batch
    with pytest.raises(ValueError, match=r"route: expected None or one of 'batched', 'grouped', 'loop', "
                                         r"'streams', got 'fast'"):
        grouped.grouped_gemm(As, Bs, outs, route="fast")
    with pytest.raises(ValueError, match=r"route: 'batched' does not apply: groups differ in size"):
        grouped.grouped_gemm(As, Bs, outs, route="batched")
    with pytest.raises(ValueError, match=r"route: 'streams' does not apply: needs two or more non-empty"):
        grouped.grouped_gemm(As[:1], Bs[:1], outs[:1], route="streams")
    # float16 at an address only 8-byte aligned: cuBLAS's grouped call needs 16.
    As, Bs, outs = fake_groups([(4, 8, 8)] * 2, "<f2")
    As[1] = fake((4, 8), BASE + 0x3000_0008, "<f2")
    with pytest.raises(ValueError, match=r"route: 'grouped' does not apply: a matrix is only 8-byte aligned"):
        grouped.grouped_gemm(As, Bs, outs, route="grouped")


def test_math_is_checked():
    As, Bs, outs = fake_groups([(4, 5, 6)])
    with pytest.raises(ValueError, match="math:"):
        grouped.grouped_gemm(As, Bs, outs, math="fp16")


def test_no_groups_launch_nothing_and_need_no_gpu():
    outs = []
    assert grouped.grouped_gemm([], [], outs) is outs
    assert grouped.last_route() is None
    assert cygemm.grouped_gemm is grouped.grouped_gemm and cygemm.moe_gemm is grouped.moe_gemm


def test_last_route_is_per_thread():
    seen = []
    t = threading.Thread(target=lambda: seen.append(grouped.last_route()))
    t.start()
    t.join()
    assert seen == [None]


# ------------------------------------------------------------------ CPU: moe_gemm refusals

def moe_fakes(T=10, K=8, N=6, G=3, w_layout="kn", typestr="<f4"):
    x = fake((T, K), BASE, typestr)
    w = fake((G, K, N) if w_layout == "kn" else (G, N, K), BASE + 0x100000, typestr)
    out = fake((T, N), BASE + 0x200000, typestr)
    return x, w, out


@pytest.mark.parametrize("offsets,words", [
    ([1, 4, 7, 10], "expected group_offsets[0] == 0, got 1"),
    ([0, 6, 4, 10], "expected non-decreasing offsets, got group_offsets[2] = 4 < group_offsets[1] = 6"),
    ([0, 4, 7, 9], "expected the last offset to be T = 10 (the rows of x), got 9"),
    ([0, 4, 10], "expected G + 1 = 4 offsets (w holds 3 experts), got 3"),
])
def test_bad_group_offsets_are_refused(offsets, words):
    x, w, out = moe_fakes()
    with pytest.raises(ValueError) as info:
        grouped.moe_gemm(x, w, offsets, out)
    assert str(info.value) == "group_offsets: " + words


def test_group_offsets_must_be_host_ints():
    x, w, out = moe_fakes()
    with pytest.raises(TypeError, match="group_offsets: expected a host sequence of ints"):
        grouped.moe_gemm(x, w, [0, 4.0, 7, 10], out)
    with pytest.raises(TypeError, match="group_offsets"):
        grouped.moe_gemm(x, w, None, out)


def test_bad_w_layout_and_shapes_are_refused():
    x, w, out = moe_fakes()
    with pytest.raises(ValueError, match=r"w_layout: expected 'kn' \(w is \(G, K, N\)\) or 'nk'"):
        grouped.moe_gemm(x, w, [0, 4, 7, 10], out, w_layout="kt")
    with pytest.raises(ValueError, match=r"w: x is \(10, 8\) so w must be \(G, N, 8\) for w_layout='nk', "
                                         r"got \(3, 8, 6\)"):
        grouped.moe_gemm(x, w, [0, 4, 7, 10], out, w_layout="nk")
    with pytest.raises(ValueError, match=r"out: expected shape \(10, 6\), got \(10, 7\)"):
        grouped.moe_gemm(x, w, [0, 4, 7, 10], fake((10, 7), BASE + 0x200000))
    with pytest.raises(ValueError, match="w: expected a 3-D array"):
        grouped.moe_gemm(x, fake((8, 6), BASE + 0x100000), [0, 10], out)
    with pytest.raises(TypeError, match=r"w: expected the dtype of x \(float32\), got float16"):
        grouped.moe_gemm(x, fake((3, 8, 6), BASE + 0x100000, "<f2"), [0, 4, 7, 10], out)


def test_moe_out_overlapping_x_or_w_is_refused():
    x, w, out = moe_fakes()
    with pytest.raises(ValueError, match="out: its memory overlaps x"):
        grouped.moe_gemm(x, w, [0, 4, 7, 10], fake((10, 6), BASE + 64))
    with pytest.raises(ValueError, match="out: its memory overlaps w"):
        grouped.moe_gemm(x, w, [0, 4, 7, 10], fake((10, 6), BASE + 0x100000))


def test_moe_route_that_does_not_apply_is_refused():
    x, w, out = moe_fakes()
    with pytest.raises(ValueError, match=r"route: 'batched' does not apply"):
        grouped.moe_gemm(x, w, [0, 4, 7, 10], out, route="batched")
    with pytest.raises(ValueError, match="route: expected None or one of"):
        grouped.moe_gemm(x, w, [0, 4, 7, 10], out, route="cutlass")


# ------------------------------------------------------------------ CPU: describe_grouped

def test_uniform_groups_can_be_one_strided_batch():
    d = grouped.describe_grouped(*fake_groups([(16, 8, 32)] * 5, uniform=True))
    assert d["routes"] == ROUTES and list(d["not_applicable"]) == ["lt_grouped"]      # (it needs device offsets)
    assert d["not_applicable"]["lt_grouped"] == grouped.gemm.LT_NEEDS_DEVICE_OFFSETS
    assert (d["groups"], d["active"], d["zero_k"]) == (5, 5, 0)
    assert (d["chosen"], d["decided_by"]) == ("batched", "rule")      # small: the fixed rule


def test_ragged_groups_are_not_one_batch():
    d = grouped.describe_grouped(*fake_groups([(16, 8, 32), (3, 8, 32), (16, 1, 7)]))
    assert "batched" not in d["routes"] and d["routes"] == ["grouped", "loop", "streams"]
    assert "differ in size" in d["not_applicable"]["batched"]
    assert (d["chosen"], d["decided_by"]) == ("loop", "rule")         # fewer than 8 groups
    d = grouped.describe_grouped(*fake_groups([(16, 8, 32), (3, 8, 32)] * 4))
    assert (d["chosen"], d["decided_by"]) == ("grouped", "rule")


def test_equal_sizes_at_irregular_addresses_are_not_one_batch():
    d = grouped.describe_grouped(*fake_groups([(16, 8, 32)] * 3))     # slots alternate offsets
    assert "not at constant strides" in d["not_applicable"]["batched"]


def test_empty_and_k0_groups_are_set_apart():
    d = grouped.describe_grouped(*fake_groups([(0, 8, 32), (16, 0, 32), (16, 8, 0), (16, 8, 32)]))
    assert (d["active"], d["zero_k"]) == (1, 1)
    assert "streams" not in d["routes"]           # one GEMM has nothing to run beside it


def test_a_forced_route_is_what_describe_chooses():
    groups = fake_groups([(16, 8, 32), (3, 8, 32)])
    old = tuning.forced_routes()
    try:
        tuning.force_routes(**dict(old, grouped="streams"))
        d = grouped.describe_grouped(*groups)
        assert (d["chosen"], d["decided_by"]) == ("streams", "forced")
        tuning.force_routes(**dict(old, grouped="batched"))      # does not apply: the fixed rule
        assert grouped.describe_grouped(*groups)["decided_by"] == "rule"
    finally:
        tuning.force_routes(**old)
    assert "grouped" in tuning.registered_routes()


# ------------------------------------------------------------------ GPU

def _cp():
    return pytest.importorskip("cupy")


def _ref(As, Bs, trans_a, trans_b, cp):
    refs = []
    for A, B in zip(As, Bs):
        a, b = f64(cp, A), f64(cp, B)
        refs.append((a.T if trans_a else a) @ (b.T if trans_b else b))
    return refs


def _groups(cp, sizes, dtype="float32", trans_a=False, trans_b=False):
    As = [rand(cp, (k, m) if trans_a else (m, k), dtype) for m, n, k in sizes]
    Bs = [rand(cp, (n, k) if trans_b else (k, n), dtype) for m, n, k in sizes]
    outs = [poisoned(cp, (m, n), dtype) for m, n, k in sizes]
    return As, Bs, outs


def _check(outs, refs, limit, cp=None):
    for i, (out, ref) in enumerate(zip(outs, refs)):
        got = cp.asnumpy(out) if cp is not None else out
        if got.size == 0:
            continue
        if not np.any(ref):                       # K == 0: beta 0 zeroes the output
            assert np.all(np.asarray(got, np.float64) == 0), f"group {i}: not zeroed"
            continue
        assert rel_err(got, ref) < limit, f"group {i}"


RAGGED = [(33, 17, 65), (0, 5, 7), (1, 1, 1), (5, 0, 7), (64, 64, 64), (4, 6, 0), (7, 130, 9), (100, 3, 256),
          (16, 16, 16), (9, 40, 33)]


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["grouped", "loop", "streams"])
@pytest.mark.parametrize("dtype,math", [("float32", "fp32"), ("float32", "tf32"), ("float16", "tf32")])
def test_ragged_groups_with_empty_and_k0_groups_match_float64(route, dtype, math):
    cp = _cp()
    As, Bs, outs = _groups(cp, RAGGED, dtype)
    assert grouped.grouped_gemm(As, Bs, outs, math=math, route=route) is outs
    assert grouped.last_route() == route
    cp.cuda.Device().synchronize()
    limit = 1e-5 if math == "fp32" and dtype == "float32" else tol(dtype, math, 256)
    _check(outs, _ref(As, Bs, False, False, cp), limit, cp)


@pytest.mark.gpu
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (True, False), (True, True)])
def test_transposes_match_float64_on_every_route(route, trans_a, trans_b):
    cp = _cp()
    sizes = [(24, 40, 56)] * 4 if route == "batched" else [(24, 40, 56), (8, 3, 17), (50, 20, 4)]
    As, Bs, outs = _groups(cp, sizes, "float32", trans_a, trans_b)
    if route == "batched":      # one strided batch: slices of one array each
        A3 = rand(cp, (4,) + As[0].shape)
        B3 = rand(cp, (4,) + Bs[0].shape)
        O3 = poisoned(cp, (4, 24, 40))
        As, Bs, outs = list(A3), list(B3), list(O3)
    grouped.grouped_gemm(As, Bs, outs, trans_a=trans_a, trans_b=trans_b, math="fp32", route=route)
    assert grouped.last_route() == route
    cp.cuda.Device().synchronize()
    _check(outs, _ref(As, Bs, trans_a, trans_b, cp), 1e-5, cp)


@pytest.mark.gpu
@pytest.mark.parametrize("route", ROUTES)
def test_alpha_beta_and_one_group(route):
    cp = _cp()
    As, Bs, _ = _groups(cp, [(37, 29, 45)])
    C0 = rand(cp, (37, 29))
    outs = [C0.copy()]
    if route == "streams":
        with pytest.raises(ValueError, match="needs two or more"):
            grouped.grouped_gemm(As, Bs, outs, route=route)
        return
    grouped.grouped_gemm(As, Bs, outs, alpha=-0.75, beta=1.5, math="fp32", route=route)
    cp.cuda.Device().synchronize()
    ref = -0.75 * _ref(As, Bs, False, False, cp)[0] + 1.5 * f64(cp, C0)
    assert rel_err(cp.asnumpy(outs[0]), ref) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("route", ROUTES)
def test_bfloat16_through_torch_tensors(route):
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed: bfloat16 inputs need torch tensors (CuPy has no bfloat16)")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here: bfloat16 inputs need torch CUDA tensors")
    sizes = [(32, 48, 64)] * 3 if route == "batched" else [(32, 48, 64), (8, 16, 24), (1, 8, 8)]
    if route == "batched":
        A3 = torch.randn((3, 32, 64), device="cuda").to(torch.bfloat16)
        B3 = torch.randn((3, 64, 48), device="cuda").to(torch.bfloat16)
        O3 = torch.full((3, 32, 48), float("nan"), device="cuda", dtype=torch.bfloat16)
        As, Bs, outs = list(A3.unbind(0)), list(B3.unbind(0)), list(O3.unbind(0))
    else:
        As = [torch.randn((m, k), device="cuda").to(torch.bfloat16) for m, n, k in sizes]
        Bs = [torch.randn((k, n), device="cuda").to(torch.bfloat16) for m, n, k in sizes]
        outs = [torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for m, n, k in sizes]
    torch.cuda.synchronize()
    grouped.grouped_gemm(As, Bs, outs, route=route, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    for A, B, out in zip(As, Bs, outs):
        ref = A.float().cpu().numpy().astype(np.float64) @ B.float().cpu().numpy().astype(np.float64)
        assert rel_err(out.float().cpu().numpy(), ref) < tol("bfloat16")


@pytest.mark.gpu
def test_more_groups_than_one_table_holds_run_in_several_grouped_calls():
    cp = _cp()
    G = 3000                                    # > 2730 per cuBLAS call, > 128 per pointer kernel
    rng = np.random.default_rng()
    sizes = [(1 + i % 3, 2 + i % 4, 1 + i % 5) for i in range(G)]
    As = [cp.asarray(rng.standard_normal((m, k)).astype(np.float32)) for m, n, k in sizes]
    Bs = [cp.asarray(rng.standard_normal((k, n)).astype(np.float32)) for m, n, k in sizes]
    outs = [poisoned(cp, (m, n)) for m, n, k in sizes]
    grouped.grouped_gemm(As, Bs, outs, math="fp32", route="grouped")
    assert grouped.last_route() == "grouped"
    cp.cuda.Device().synchronize()
    _check(outs, _ref(As, Bs, False, False, cp), 1e-5, cp)


@pytest.mark.gpu
def test_many_tiny_groups_take_the_grouped_route_by_the_fixed_rule():
    cp = _cp()
    As, Bs, outs = _groups(cp, [(3 + i % 5, 4, 8) for i in range(12)])
    grouped.grouped_gemm(As, Bs, outs, math="fp32")
    assert grouped.last_route() == "grouped"
    As2, Bs2, outs2 = _groups(cp, [(3, 4, 8), (5, 4, 8)])
    grouped.grouped_gemm(As2, Bs2, outs2, math="fp32")
    assert grouped.last_route() == "loop"
    cp.cuda.Device().synchronize()
    _check(outs, _ref(As, Bs, False, False, cp), 1e-5, cp)
    _check(outs2, _ref(As2, Bs2, False, False, cp), 1e-5, cp)
    grouped.grouped_gemm(*_groups(cp, [(0, 4, 8), (3, 0, 8)]))
    assert grouped.last_route() is None                    # nothing to launch


@pytest.mark.gpu
@pytest.mark.parametrize("w_layout", ["kn", "nk"])
@pytest.mark.parametrize("route", ["grouped", "loop", "streams", None])
def test_moe_ragged_with_an_empty_expert_matches_float64(w_layout, route):
    cp = _cp()
    counts = [7, 0, 33, 1, 24]
    offs = list(np.concatenate([[0], np.cumsum(counts)]))
    T, K, N, G = offs[-1], 64, 48, len(counts)
    x = rand(cp, (T, K))
    w = rand(cp, (G, K, N) if w_layout == "kn" else (G, N, K))
    out = poisoned(cp, (T, N))
    assert grouped.moe_gemm(x, w, offs, out, w_layout=w_layout, math="fp32", route=route) is out
    assert grouped.last_route() == (route or "loop")       # 4 non-empty experts: the loop
    with pytest.raises(ValueError, match="'batched' does not apply"):
        grouped.moe_gemm(x, w, offs, out, w_layout=w_layout, route="batched")
    cp.cuda.Device().synchronize()
    assert rel_err(cp.asnumpy(out), moe_ref.forward(f64(cp, x), f64(cp, w), offs, w_layout)) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("w_layout", ["kn", "nk"])
def test_moe_uniform_is_one_batched_gemm_and_agrees_with_the_loop(w_layout):
    cp = _cp()
    G, t, K, N = 6, 16, 32, 24
    offs = np.arange(G + 1) * t                            # a NumPy array of offsets
    x = rand(cp, (G * t, K))
    w = rand(cp, (G, K, N) if w_layout == "kn" else (G, N, K))
    out, out_loop = poisoned(cp, (G * t, N)), poisoned(cp, (G * t, N))
    grouped.moe_gemm(x, w, offs, out, w_layout=w_layout, math="fp32")
    assert grouped.last_route() == "batched"               # the fixed rule's first choice
    grouped.moe_gemm(x, w, offs, out_loop, w_layout=w_layout, math="fp32", route="loop")
    cp.cuda.Device().synchronize()
    ref = moe_ref.forward(f64(cp, x), f64(cp, w), list(offs), w_layout)
    assert rel_err(cp.asnumpy(out), ref) < 1e-5 and rel_err(cp.asnumpy(out_loop), ref) < 1e-5
    np.testing.assert_allclose(cp.asnumpy(out), cp.asnumpy(out_loop), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["grouped", "loop", "streams"])
def test_a_captured_graph_recomputes_from_new_inputs(route):
    cp = _cp()
    s = cp.cuda.Stream(non_blocking=True)
    As, Bs, outs = _groups(cp, [(33, 17, 65), (64, 64, 64), (1, 9, 5), (7, 130, 9)])
    cp.cuda.Device().synchronize()
    with cygemm.graph.capture(s) as g:
        grouped.grouped_gemm(As, Bs, outs, math="fp32", stream=s, route=route)
    for _ in range(3):
        for x in As + Bs:
            x[...] = rand(cp, x.shape)
        for o in outs:
            o[...] = cp.nan
        cp.cuda.Device().synchronize()
        g.launch(s)
        s.synchronize()
        _check(outs, _ref(As, Bs, False, False, cp), 1e-5, cp)


@pytest.mark.gpu
def test_a_captured_grouped_route_of_several_tables_replays():
    cp = _cp()
    s = cp.cuda.Stream(non_blocking=True)
    sizes = [(1 + i % 3, 2, 1 + i % 4) for i in range(2800)]         # two cuBLAS calls
    As, Bs, outs = _groups(cp, sizes)
    cp.cuda.Device().synchronize()
    with cygemm.graph.capture(s) as g:
        grouped.grouped_gemm(As, Bs, outs, math="fp32", stream=s, route="grouped")
    for x in As[-5:] + Bs[:5]:
        x[...] = rand(cp, x.shape)
    for o in outs:
        o[...] = cp.nan
    cp.cuda.Device().synchronize()
    g.launch(s)
    s.synchronize()
    _check(outs, _ref(As, Bs, False, False, cp), 1e-5, cp)


@pytest.mark.gpu
@pytest.mark.parametrize("route", ROUTES)
def test_a_non_default_stream(route):
    cp = _cp()
    A3, B3 = rand(cp, (4, 20, 30)), rand(cp, (4, 30, 10))
    As, Bs = list(A3), list(B3)
    outs, outs2 = list(poisoned(cp, (4, 20, 10))), list(poisoned(cp, (4, 20, 10)))
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    with s:                                                  # stream=None: CuPy's current one
        grouped.grouped_gemm(As, Bs, outs, math="fp32", route=route)
    grouped.grouped_gemm(As, Bs, outs2, math="fp32", route=route, stream=s)
    s.synchronize()
    refs = _ref(As, Bs, False, False, cp)
    _check(outs, refs, 1e-5, cp)
    _check(outs2, refs, 1e-5, cp)


@pytest.mark.gpu
def test_a_large_problem_is_timed_once_and_describe_shows_the_choice(tmp_path):
    cp = _cp()
    old = cygemm.set_options(tuning_cache=tmp_path / "t.jsonl", autotune_min_macs=1)
    try:
        tuning.clear_tuning()                  # the only grouped entry will be this problem's
        As, Bs, outs = _groups(cp, [(64, 48, 32), (16, 48, 32), (128, 8, 32)])
        grouped.grouped_gemm(As, Bs, outs, math="fp32")
        chosen = grouped.last_route()
        # The route that ran is the one whose recorded time is the smallest of those timed.
        (entry,) = [e for e in tuning.tuning_entries() if e["kind"] == "grouped"]
        timed = {name: ms for name, ms in entry["ms"].items() if ms >= 0}
        assert len(timed) >= 2 and entry["route"] == chosen == min(timed, key=timed.get), entry
        d = grouped.describe_grouped(As, Bs, outs, math="fp32")
        assert (d["chosen"], d["decided_by"]) == (chosen, "tuned")
        for o in outs:
            o[...] = cp.nan
        grouped.grouped_gemm(As, Bs, outs, math="fp32")
        assert grouped.last_route() == chosen
        cp.cuda.Device().synchronize()
        _check(outs, _ref(As, Bs, False, False, cp), 1e-5, cp)
    finally:
        cygemm.set_options(**old)


@pytest.mark.gpu
def test_last_route_names_what_ran_in_each_thread():
    cp = _cp()
    As, Bs, outs = _groups(cp, [(8, 8, 8), (4, 8, 8)])
    grouped.grouped_gemm(As, Bs, outs, route="streams")
    seen = []

    def other():
        seen.append(grouped.last_route())
        grouped.grouped_gemm(As, Bs, outs, route="grouped")
        seen.append(grouped.last_route())

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [None, "grouped"] and grouped.last_route() == "streams"
    cp.cuda.Device().synchronize()

