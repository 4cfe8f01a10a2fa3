"""cygemm.GemmPlan: plan, autotune, execute (other operands, other streams, captured), close."""
import numpy as np
import pytest

import cygemm
from cygemm import tuning
from fakes import FakeDeviceArray
from gpu_util import f64, poisoned, rand, rel_err

cp = None


@pytest.fixture
def gpu():
    global cp
    cp = pytest.importorskip("cupy")


def test_construction_checks_everything_before_any_gpu_work():
    a = FakeDeviceArray((4, 6))
    b = FakeDeviceArray((6, 5), ptr=a.__cuda_array_interface__["data"][0] + 4096)
    out = FakeDeviceArray((4, 5), ptr=a.__cuda_array_interface__["data"][0] + 8192)
    p = cygemm.GemmPlan(a, b, out, math="fp32")          # no GPU needed to make it
    assert p.route is None and not p.tuned and not p.closed
    with pytest.raises(ValueError, match="out: expected shape \\(4, 5\\)"):
        cygemm.GemmPlan(a, b, FakeDeviceArray((4, 4)))
    p.close()
    with pytest.raises(ValueError, match="closed"):
        p.execute()


@pytest.mark.gpu
@pytest.mark.parametrize("batched", [False, True])
def test_plan_autotune_execute_on_other_operands_and_streams(gpu, batched):
    shape_a, shape_b = ((5, 256, 192), (5, 192, 320)) if batched else ((256, 192), (192, 320))
    A, B = rand(cp, shape_a), rand(cp, shape_b)
    C = poisoned(cp, A.shape[:-1] + (B.shape[-1],))
    tuning.clear_tuning()                                # the only gemm entry will be this plan's
    with cygemm.GemmPlan(A, B, C, math="fp32", batched=batched) as p:
        assert p.plan() is p and p.route is not None and not p.tuned
        p.autotune()                                     # any size: it was asked for
        assert p.tuned and p.tuned_ms > 0
        # What autotune chose is what it recorded for the module functions: route and time.
        (entry,) = [e for e in tuning.tuning_entries() if e["kind"] == "gemm"]
        assert entry["route"] == p.route and entry["ms"] == pytest.approx(p.tuned_ms, rel=1e-6)
        assert p.execute() is C
        assert rel_err(C.get(), np.matmul(f64(cp, A), f64(cp, B))) < 1e-5
        s = cp.cuda.Stream(non_blocking=True)
        A2, C2 = rand(cp, A.shape), poisoned(cp, C.shape)
        cp.cuda.Device().synchronize()
        assert p.execute(A2, None, C2, stream=s) is C2    # B as planned
        s.synchronize()
        assert rel_err(C2.get(), np.matmul(f64(cp, A2), f64(cp, B))) < 1e-5
        with pytest.raises(ValueError, match="not the planned"):
            p.execute(rand(cp, A.shape[:-2] + (A.shape[-2] + 1, A.shape[-1])), None,
                      poisoned(cp, C.shape[:-2] + (C.shape[-2] + 1, C.shape[-1])))
        P = rand(cp, (A.size + C.size,))           # an out that shares A's last 64 elements
        A3, C3 = P[:A.size].reshape(A.shape), P[A.size - 64:A.size - 64 + C.size].reshape(C.shape)
        with pytest.raises(ValueError, match="out: its memory overlaps A"):
            p.execute(A3, None, C3)
    assert p.closed
    with pytest.raises(ValueError, match="closed"):
        p.execute()


@pytest.mark.gpu
def test_a_plan_with_beta_accumulates_and_replays_in_a_graph(gpu):
    A, B, C0 = rand(cp, (128, 96)), rand(cp, (96, 64)), rand(cp, (128, 64))
    C = C0.copy()
    s = cp.cuda.Stream(non_blocking=True)
    p = cygemm.GemmPlan(A, B, C, alpha=0.5, beta=1.0, math="fp32").plan(stream=s)
    p.autotune(mode="exhaustive", stream=s)              # timed on a scratch C: C untouched
    s.synchronize()
    np.testing.assert_array_equal(C.get(), C0.get())
    with cygemm.graph.capture(s) as g:
        p.execute(stream=s)
        with pytest.raises(cygemm.CaptureError):
            p.autotune(stream=s)
    for _ in range(3):
        g.launch(s)
    s.synchronize()
    assert rel_err(C.get(), f64(cp, C0) + 3 * 0.5 * (f64(cp, A) @ f64(cp, B))) < 1e-5
    p.close()
    p.close()                                           # idempotent


@pytest.mark.gpu
def test_autotune_records_the_choice_for_the_module_functions(gpu, tmp_path):
    old = cygemm.set_options(tuning_cache=tmp_path / "t.jsonl", autotune_min_macs=1e18)
    try:
        tuning.clear_tuning()
        A, B, C = rand(cp, (200, 136)), rand(cp, (136, 72)), poisoned(cp, (200, 72))
        cygemm.GemmPlan(A, B, C, math="fp32").autotune()
        assert any(e["kind"] == "gemm" for e in tuning.tuning_entries())
        assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 2
    finally:
        cygemm.set_options(**old)
        tuning.clear_tuning()


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["cublasGemmEx", "cublasLt"])
def test_a_forced_route_is_the_plans_route_and_computes_right(gpu, route):
    A, B = rand(cp, (96, 64)), rand(cp, (64, 80))
    C = poisoned(cp, (96, 80))
    old = tuning.forced_routes()
    try:
        tuning.force_routes(**dict(old, gemm=route))
        with cygemm.GemmPlan(A, B, C, math="fp32") as p:
            assert p.plan().route == route
            assert p.execute() is C
            cp.cuda.Device().synchronize()
            assert rel_err(C.get(), f64(cp, A) @ f64(cp, B)) < 1e-5
    finally:
        tuning.force_routes(**old)
