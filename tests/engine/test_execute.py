"""The one execute (cygemm.engine.execute): what each kind of call does when cuBLASLt refuses its
plan with nothing enqueued. A plain GEMM (gemm, GemmPlan) runs cublasGemmEx instead; the dense
layer takes its always-correct route; a call that is one cuBLASLt call (an epilogue GemmPlan,
FP8, int8) raises naming itself, writes nothing, and then says to make a new plan; under
determinism="batch_invariant" nothing else gives the same bits, so it raises. The refusal is
injected by ``execute.refuse_next`` at the one place plans run."""
import numpy as np
import pytest

import cygemm
from cygemm.engine import execute, tuning
from cygemm.engine.errors import CublasError, CygemmError
from gpu_util import f64, poisoned, rand, rel_err

cp = None


@pytest.fixture
def gpu():
    global cp
    cp = pytest.importorskip("cupy")
    tuning.force_routes()
    yield
    execute.refuse_next(0)
    tuning.force_routes()


def test_refuse_next_counts_and_refuses_a_negative_count():
    assert execute.refuse_next(0) == 0
    assert execute.refuse_next(2) == 0
    assert execute.refuse_next(0) == 2
    with pytest.raises(ValueError, match=r"^count: expected 0 or more, got -1$"):
        execute.refuse_next(-1)


# ------------------------------------------------------------------ GPU: each refusal policy

@pytest.mark.gpu
def test_a_refused_plain_gemm_runs_cublasgemmex_and_stays_there(gpu):
    tuning.force_routes(gemm="cublasLt")
    A, B = rand(cp, (200, 136)), rand(cp, (136, 184))
    ref = f64(cp, A) @ f64(cp, B)
    for _ in range(2):      # refused, then the plan is unusable: cublasGemmEx both times
        C = poisoned(cp, (200, 184))
        execute.refuse_next(1)
        cygemm.gemm(A, B, C, math="fp32")
        assert execute.refuse_next(0) == (1 if _ else 0)   # the second call never asks cuBLASLt
        assert rel_err(C.get(), ref) < 1e-5


@pytest.mark.gpu
def test_a_refused_batched_gemm_runs_cublasgemmex(gpu):
    tuning.force_routes(gemm="cublasLt")
    A, B = rand(cp, (5, 72, 40)), rand(cp, (5, 40, 88))
    C = poisoned(cp, (5, 72, 88))
    execute.refuse_next(1)
    cygemm.gemm_strided_batched(A, B, C, math="fp32")
    assert execute.refuse_next(0) == 0
    assert rel_err(C.get(), f64(cp, A) @ f64(cp, B)) < 1e-5


@pytest.mark.gpu
def test_a_refused_gemm_plan_runs_cublasgemmex(gpu):
    A, B = rand(cp, (96, 64)), rand(cp, (64, 120))
    C = poisoned(cp, (96, 120))
    with cygemm.GemmPlan(A, B, C, math="fp32") as p:
        p.plan()
        execute.refuse_next(1)
        p.execute()
        assert execute.refuse_next(0) == 0
    assert rel_err(C.get(), f64(cp, A) @ f64(cp, B)) < 1e-5


@pytest.mark.gpu
def test_a_refused_epilogue_plan_raises_writes_nothing_then_asks_for_a_new_plan(gpu):
    A, B, bias = rand(cp, (64, 48)), rand(cp, (48, 80)), rand(cp, (80,))
    C = poisoned(cp, (64, 80))
    with cygemm.GemmPlan(A, B, C, bias=bias, act="relu", math="fp32") as p:
        p.plan()
        execute.refuse_next(1)
        with pytest.raises(CublasError, match=r"cublasLtMatmul \(GemmPlan\)"):
            p.execute()
        assert bool(cp.isnan(C).all())
        with pytest.raises(ValueError, match="refused this plan's algorithm on an earlier execute; make a new "
                                             "GemmPlan"):
            p.execute()
        assert bool(cp.isnan(C).all())


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_a_refused_dense_forward_route_takes_the_gemm_and_kernel_route(gpu, act):
    from refs import activations
    tuning.force_routes(forward="epilogue")
    A, B, bias = rand(cp, (128, 96)), rand(cp, (96, 72)), rand(cp, (72,))
    out = poisoned(cp, (128, 72))
    execute.refuse_next(1)
    cygemm.dense.forward_into(A, B, out, bias, act=act, math="fp32")
    assert execute.refuse_next(0) == 0
    ref = activations.act(act, f64(cp, A) @ f64(cp, B) + f64(cp, bias))
    assert rel_err(out.get(), ref) < 1e-5


@pytest.mark.gpu
def test_a_refused_batch_invariant_gemm_raises_rather_than_change_its_bits(gpu):
    A, B = rand(cp, (256, 192)), rand(cp, (192, 160))
    C = poisoned(cp, (256, 160))
    cygemm.gemm(A, B, C, determinism="batch_invariant")    # decided (and timed, into C) first
    C = poisoned(cp, (256, 160))
    execute.refuse_next(1)
    with pytest.raises(CygemmError, match="batch_invariant"):
        cygemm.gemm(A, B, C, determinism="batch_invariant")
    assert bool(cp.isnan(C).all())


@pytest.mark.gpu
def test_a_refused_int8_gemm_raises_naming_int8_and_writes_nothing(gpu):
    rng = np.random.default_rng(11)
    a = rng.integers(-128, 128, (64, 96)).astype(np.int8)
    w = rng.integers(-128, 128, (80, 96)).astype(np.int8)
    out = cp.full((64, 80), -7, cp.int32)
    execute.refuse_next(1)
    with pytest.raises(CublasError, match=r"cublasLtMatmul \(int8\)"):
        cygemm.int_mm(cp.asarray(a), cp.asarray(w).T, out)
    assert bool((out == -7).all())


@pytest.mark.gpu
def test_a_refused_fp8_gemm_raises_naming_fp8_and_writes_nothing(gpu):
    from cygemm import fp8
    from refs import fp8 as fp8_ref
    if cp.cuda.Device().compute_capability < "89":
        pytest.skip("FP8 GEMMs need compute capability 8.9 or later")
    rng = np.random.default_rng(12)
    a = cp.asarray(fp8_ref.to_codes(rng.standard_normal((64, 128)), "e4m3"))
    w = cp.asarray(fp8_ref.to_codes(rng.standard_normal((48, 128)), "e4m3"))
    one = cp.ones(1, cp.float32)
    out = poisoned(cp, (64, 48))
    execute.refuse_next(1)
    with pytest.raises(CublasError, match=r"cublasLtMatmul \(FP8\)"):
        fp8.scaled_matmul(a, w.T, one, one, out=out, format_a="e4m3", format_b="e4m3")
    assert bool(cp.isnan(out).all())
