"""cygemm.engine.chooser: a feature's routes as one table decided by the one chooser.

CPU: every route table registers its names, in its route numbers' order, with
cygemm.engine.tuning; force_routes checks every keyword before it changes anything and
forced_routes round-trips; describe_route (through cygemm.describe_grouped, its describing
caller) says "forced" for a forced route that applies, and for one that does not, the fixed
rule's route with "rule"; a problem the table would time is not decided before it is timed
(chosen None), autotune="off" and the determinism policies take the fixed rule, and past 1024
groups a grouped problem is never timed.

GPU: the route a grouped call runs (cygemm.grouped.last_route) is the forced one where it applies
and the fixed rule's where it does not, as describe_grouped said beforehand; a call's own route=
comes before the forcing; the results against float64 with NaN-poisoned outputs."""
import pytest

import cygemm
from cygemm import dense, grouped
from cygemm.engine import tuning
from fakes import BASE, FakeDeviceArray
from gpu_util import f64, poisoned, rand, rel_err

SLOT = 0x10000


def fake_groups(sizes, typestr="<f4", uniform=True, misalign=None):
    """Fakes for groups of (m, n, k), each in its own slot; uniform: slots one stride apart (one
    strided batch when the sizes agree), else every other slot shifted; misalign: byte offset
    added to every odd group's A (it breaks the 16-byte alignment of the grouped route)."""
    As, Bs, outs = [], [], []
    for i, (m, n, k) in enumerate(sizes):
        slot = SLOT * i + (0 if uniform or i % 2 == 0 else 0x1000)
        shift = misalign if misalign is not None and i % 2 else 0
        As.append(FakeDeviceArray((m, k), typestr, None, BASE + slot + shift))
        Bs.append(FakeDeviceArray((k, n), typestr, None, BASE + 0x1000_0000 + slot))
        outs.append(FakeDeviceArray((m, n), typestr, None, BASE + 0x2000_0000 + slot))
    return As, Bs, outs


@pytest.fixture
def unforced():
    """The test forces routes; none stay forced after it."""
    tuning.force_routes()
    yield
    tuning.force_routes()


@pytest.fixture
def min_macs_1():
    """Every problem is worth timing (autotune_min_macs=1) for the test."""
    old = cygemm.set_options(autotune_min_macs=1)
    yield
    cygemm.set_options(**old)


# ------------------------------------------------------------------ CPU: the registry

def test_every_route_table_registers_its_names_in_route_order():
    registered = tuning.registered_routes()
    # The tables' names, in the order of the route numbers the fixed rules prefer.
    assert registered["forward"] == ("epilogue", "gelu_aux", "bias_epilogue_kernel", "gemm_kernel")
    assert registered["backward"] == ("serial", "branches")
    assert registered["grouped"] == ("batched", "grouped", "loop", "streams")
    # The features' descriptions name the same routes, in the same order.
    assert tuple(dense.FORWARD_ROUTES) == registered["forward"]
    assert tuple(dense.BACKWARD_ROUTES) == registered["backward"]
    assert tuple(grouped.ROUTES) == registered["grouped"]
    registered["grouped"] = ("mine",)               # a copy: the registry is not changed
    assert tuning.registered_routes()["grouped"] == ("batched", "grouped", "loop", "streams")


@pytest.mark.parametrize("kind,names", [("forward", "'epilogue', 'gelu_aux', 'bias_epilogue_kernel', 'gemm_kernel'"),
                                        ("backward", "'serial', 'branches'"),
                                        ("grouped", "'batched', 'grouped', 'loop', 'streams'")])
def test_force_routes_refuses_a_name_of_another_kind_listing_the_valid_ones(unforced, kind, names):
    other = "loop" if kind != "grouped" else "serial"          # valid, but for another kind
    with pytest.raises(ValueError) as e:
        tuning.force_routes(**{kind: other})
    assert str(e.value) == f"{kind}: expected None, {names}, got {other!r}"
    assert tuning.forced_routes() == {}


def test_force_routes_checks_every_keyword_before_changing_anything(unforced):
    tuning.force_routes(grouped="loop", backward="branches")
    with pytest.raises(ValueError, match="forward: expected None"):
        tuning.force_routes(grouped="streams", forward="fused")
    with pytest.raises(ValueError, match="unknown kind 'sideways'"):
        tuning.force_routes(grouped="streams", sideways="serial")
    assert tuning.forced_routes() == {"grouped": "loop", "backward": "branches"}


def test_forced_routes_round_trip_and_none_leaves_a_kind_unforced(unforced):
    tuning.force_routes(forward="gemm_kernel", backward="branches", grouped="streams")
    forced = tuning.forced_routes()
    assert forced == {"forward": "gemm_kernel", "backward": "branches", "grouped": "streams"}
    forced["grouped"] = "loop"                       # a copy: changing it forces nothing
    assert tuning.forced_routes()["grouped"] == "streams"
    tuning.force_routes(**tuning.forced_routes())    # restores what it returned
    assert tuning.forced_routes() == {"forward": "gemm_kernel", "backward": "branches", "grouped": "streams"}
    tuning.force_routes(forward=None, grouped="loop")  # each call replaces the forcing; None: unforced
    assert tuning.forced_routes() == {"grouped": "loop"}
    tuning.force_routes()
    assert tuning.forced_routes() == {}


# ------------------------------------------------------------------ CPU: what describe_route says

@pytest.mark.parametrize("route", ["batched", "grouped", "loop", "streams"])
def test_a_forced_route_that_applies_is_described_as_forced(unforced, route):
    groups = fake_groups([(16, 8, 32)] * 4)          # uniform: every route applies
    assert grouped.describe_grouped(*groups)["routes"] == ["batched", "grouped", "loop", "streams"]
    tuning.force_routes(grouped=route)
    d = grouped.describe_grouped(*groups)
    assert (d["chosen"], d["decided_by"]) == (route, "forced")
    assert d["why_chosen"] == "cygemm.engine.tuning forces this route"
    assert [g["route"] for g in d["per_group"]] == [route] * 4


@pytest.mark.parametrize("sizes,kw,forced,rule", [
    ([(16, 8, 32), (3, 8, 32), (16, 1, 7)], {}, "batched", "loop"),             # ragged, fewer than 8
    ([(16, 8, 32), (3, 8, 32)] * 4, {}, "batched", "grouped"),                  # ragged, 8 groups
    ([(16, 8, 32)], {}, "streams", "batched"),                                  # one group: nothing beside it
    ([(16, 8, 32), (16, 8, 0)], {}, "streams", "batched"),                      # K == 0 is not a second GEMM
    ([(16, 8, 32), (3, 8, 32)] * 4, {"typestr": "<f2", "misalign": 8}, "grouped", "loop"),  # 8-byte aligned
])
def test_a_forced_route_that_does_not_apply_takes_the_fixed_rule_and_describe_says_so(unforced, sizes, kw,
                                                                                     forced, rule):
    groups = fake_groups(sizes, uniform=False, **kw) if len(sizes) > 1 else fake_groups(sizes)
    unforced_d = grouped.describe_grouped(*groups)
    assert forced in unforced_d["not_applicable"]
    assert (unforced_d["chosen"], unforced_d["decided_by"]) == (rule, "rule")
    tuning.force_routes(grouped=forced)
    d = grouped.describe_grouped(*groups)
    assert (d["chosen"], d["decided_by"]) == (rule, "rule")
    assert d["why_chosen"].startswith("the fixed rule")


def test_a_problem_worth_timing_is_undecided_until_timed(unforced, min_macs_1):
    """autotune_min_macs=1: the table would be read, then the call would time the routes; a
    description times nothing, so the route is not decided yet (nor on a GPU, whose table has
    no entry for these sizes)."""
    groups = fake_groups([(13, 11, 7)] * 3)
    d = grouped.describe_grouped(*groups)
    assert (d["chosen"], d["decided_by"]) == (None, None)
    assert d["why_chosen"].startswith("not decided yet")
    assert [g["route"] for g in d["per_group"]] == [None] * 3
    off = grouped.describe_grouped(*groups, autotune="off")
    assert (off["chosen"], off["decided_by"]) == ("batched", "rule")
    # Determinism policies never time: the fixed rule, each group by its own plan (the loop;
    # docs/reproducibility.rst).
    for mode in ("run_to_run", "batch_invariant"):
        d = grouped.describe_grouped(*groups, determinism=mode)
        assert (d["chosen"], d["decided_by"]) == ("loop", "rule"), mode
    tuning.force_routes(grouped="streams")          # forcing decides before the table is read
    d = grouped.describe_grouped(*groups)
    assert (d["chosen"], d["decided_by"]) == ("streams", "forced")


def test_past_1024_groups_a_problem_is_never_timed(min_macs_1):
    sizes = [(1 + i % 2, 2, 3) for i in range(1025)]           # ragged: batched does not apply
    d = grouped.describe_grouped(*fake_groups(sizes[:1024], uniform=False))
    assert (d["active"], d["chosen"], d["decided_by"]) == (1024, None, None)
    d = grouped.describe_grouped(*fake_groups(sizes, uniform=False))
    assert (d["active"], d["chosen"], d["decided_by"]) == (1025, "grouped", "rule")


# ------------------------------------------------------------------ GPU: what runs is what was described

def _gpu_groups(cp, sizes):
    As = [rand(cp, (m, k)) for m, n, k in sizes]
    Bs = [rand(cp, (k, n)) for m, n, k in sizes]
    outs = [poisoned(cp, (m, n)) for m, n, k in sizes]
    return As, Bs, outs


def _check(cp, As, Bs, outs):
    cp.cuda.Device().synchronize()
    for i, (A, B, out) in enumerate(zip(As, Bs, outs)):
        assert rel_err(cp.asnumpy(out), f64(cp, A) @ f64(cp, B)) < 1e-5, f"group {i}"


@pytest.mark.gpu
@pytest.mark.parametrize("forced,ran", [("batched", "loop"), ("grouped", "grouped"), ("loop", "loop"),
                                        ("streams", "streams")])
def test_the_route_that_runs_is_the_forced_one_where_it_applies_else_the_rule(unforced, forced, ran):
    cp = pytest.importorskip("cupy")
    As, Bs, outs = _gpu_groups(cp, [(33, 17, 65), (8, 40, 24), (64, 9, 3)])      # ragged
    tuning.force_routes(grouped=forced)
    d = grouped.describe_grouped(As, Bs, outs, math="fp32")
    assert (d["chosen"], d["decided_by"]) == (ran, "forced" if forced == ran else "rule")
    grouped.grouped_gemm(As, Bs, outs, math="fp32")
    assert grouped.last_route() == ran
    _check(cp, As, Bs, outs)


@pytest.mark.gpu
def test_a_calls_own_route_comes_before_the_forced_one(unforced):
    cp = pytest.importorskip("cupy")
    As, Bs, outs = _gpu_groups(cp, [(24, 16, 40), (7, 16, 40)])
    tuning.force_routes(grouped="loop")
    grouped.grouped_gemm(As, Bs, outs, math="fp32", route="streams")
    assert grouped.last_route() == "streams"
    _check(cp, As, Bs, outs)
    for o in outs:
        o[...] = cp.nan
    grouped.grouped_gemm(As, Bs, outs, math="fp32")
    assert grouped.last_route() == "loop"
    _check(cp, As, Bs, outs)
    tuning.force_routes()
    for o in outs:
        o[...] = cp.nan
    grouped.grouped_gemm(As, Bs, outs, math="fp32", autotune="off")
    assert grouped.last_route() == "loop"            # unforced: the fixed rule for two ragged groups
    _check(cp, As, Bs, outs)
