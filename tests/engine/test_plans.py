"""The plan layer (cygemm.engine.plans): its cache's order on the CPU; each GEMM route it runs
(forced) against float64, single and strided batched, and its plan cache, bounded over
thousands of shapes. The dense layer's routes are in dense/test_layer.py, the tuning table and
file in engine/test_tuning.py."""
import numpy as np
import pytest

import cygemm
from cygemm.engine import plans, tuning
from gpu_util import f64, poisoned, rand, rel_err

cp = None


@pytest.fixture
def gpu():
    global cp
    cp = pytest.importorskip("cupy")
    yield
    tuning.force_routes()


# ------------------------------------------------------------------ GPU: every route against float64

GEMM_CASES = [  # (M, K, N, trans_a, trans_b)
    (96, 64, 80, False, False), (33, 17, 129, True, False), (64, 48, 40, False, True), (7, 300, 5, True, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["cublasGemmEx", "cublasLt"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])     # CuPy has no bfloat16
def test_gemm_each_route_against_float64(gpu, route, dtype):
    tuning.force_routes(gemm=route)
    tol = 1e-5 if dtype == "float32" else 1e-2
    for M, K, N, ta, tb in GEMM_CASES:
        A = rand(cp, (K, M) if ta else (M, K), dtype)
        B = rand(cp, (N, K) if tb else (K, N), dtype)
        C = poisoned(cp, (M, N), dtype)
        cygemm.gemm(A, B, C, trans_a=ta, trans_b=tb, math="fp32")
        a, b = f64(cp, A), f64(cp, B)
        ref = (a.T if ta else a) @ (b.T if tb else b)
        assert rel_err(C.get(), ref) < tol, (route, M, K, N, ta, tb)


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["cublasGemmEx", "cublasLt"])
def test_batched_each_route_against_float64_broadcast_and_beta(gpu, route):
    tuning.force_routes(gemm=route)
    A, B = rand(cp, (6, 40, 24)), rand(cp, (6, 24, 56))
    C0 = rand(cp, (6, 40, 56))
    C = C0.copy()
    cygemm.gemm_strided_batched(A, B, C, beta=1.0, math="fp32")
    assert rel_err(C.get(), f64(cp, A) @ f64(cp, B) + f64(cp, C0)) < 1e-5
    W = rand(cp, (24, 56))                   # broadcast: batch stride 0
    C = poisoned(cp, (6, 40, 56))
    cygemm.gemm_strided_batched(A, W, C, math="fp32")
    assert rel_err(C.get(), f64(cp, A) @ f64(cp, W)) < 1e-5


# ------------------------------------------------------------------ GPU: tuning


# ------------------------------------------------------------------ bounded plans, tuning users pay once

@pytest.mark.gpu
def test_the_plan_cache_stays_bounded_over_3000_batch_sizes(gpu):
    """A server that sees batch sizes 1..3000 (64x64 weights) keeps at most plan_cache_size
    plans per thread (it kept all 3000 before, and device memory fell by 96 MiB)."""
    from cygemm.gemm_ops import forward_into
    plans.clear_plan_cache()
    limit = cygemm.get_options()["plan_cache_size"]
    W, bias = rand(cp, (64, 64)), rand(cp, (64,))
    X = rand(cp, (3000, 64))
    Y = poisoned(cp, (3000, 64))
    forward_into(X[:1], W, Y[:1], bias, act="relu", math="fp32")    # the stream's workspace exists
    free = []
    counts = []
    for _ in range(2):          # the second pass meets every kernel cuBLASLt loaded in the first
        cp.cuda.Device().synchronize()
        free.append(cp.cuda.runtime.memGetInfo()[0])
        for m in range(1, 3001):
            forward_into(X[:m], W, Y[:m], bias, act="relu", math="fp32")
            counts.append(plans.plan_cache_size())
    cp.cuda.Device().synchronize()
    free.append(cp.cuda.runtime.memGetInfo()[0])
    first, second = (free[0] - free[1]) / 2**20, (free[1] - free[2]) / 2**20
    print(f"plans after 3000 shapes: {counts[2999]} (limit {limit}); device memory {first:.1f} MiB less "
          f"after the first pass (kernels cuBLASLt loads lazily), {second:.1f} MiB after the second")
    assert max(counts) <= limit and counts[-1] == limit
    assert second < 2.0, "the second pass (plans evicted and remade) must not take more memory"
    assert rel_err(Y.get(), np.maximum(f64(cp, X) @ f64(cp, W) + f64(cp, bias), 0)) < 1e-5
    old = cygemm.set_options(plan_cache_size=5)
    try:
        plans.clear_plan_cache()
        for m in range(1, 20):
            forward_into(X[:m], W, Y[:m], bias, act="relu", math="fp32")
        assert plans.plan_cache_size() == 5
    finally:
        cygemm.set_options(**old)


# ---- the plan cache's order, on the CPU (plans without descriptors)

def _keys_after(ops, limit):
    return [keys for keys, _ in plans._exercise_cache(ops, limit)]


def test_the_cache_drops_the_least_recently_used_plan_beyond_its_limit():
    trace = _keys_after([("put", ("a",)), ("put", ("b",)), ("put", ("c",)), ("put", ("d",))], 3)
    assert trace[-1] == [("b",), ("c",), ("d",)]
    assert trace[2] == [("a",), ("b",), ("c",)]


def test_a_lookup_makes_a_plan_the_most_recent_so_it_outlives_newer_ones():
    trace = plans._exercise_cache([("put", ("a",)), ("put", ("b",)), ("put", ("c",)), ("get", ("a",)), ("put", ("d",)),
                                   ("get", ("b",)), ("get", ("zz",))], 3)
    assert trace[3] == ([("b",), ("c",), ("a",)], True)
    assert trace[4][0] == [("c",), ("a",), ("d",)]          # b, the least recent, went
    assert trace[5] == ([("c",), ("a",), ("d",)], False)    # a dropped plan is not found
    assert trace[6] == ([("c",), ("a",), ("d",)], False)


def test_a_plan_in_use_moves_to_the_recent_end_only_once_half_the_cache_was_added_since():
    ops = [("put", ("a",)), ("put", ("b",)), ("touch", ("a",))]
    assert _keys_after(ops, 4)[-1] == [("a",), ("b",)]           # one put since a: not moved (no dict work)
    ops += [("put", ("c",)), ("put", ("d",)), ("touch", ("a",))]
    assert _keys_after(ops, 4)[-1] == [("b",), ("c",), ("d",), ("a",)]  # three puts since a > 4 // 2: moved
    ops += [("put", ("e",))]
    assert _keys_after(ops, 4)[-1] == [("c",), ("d",), ("a",), ("e",)]  # so b, not a, is dropped


def test_a_put_of_a_cached_key_replaces_it_without_growing():
    assert _keys_after([("put", ("a",)), ("put", ("b",)), ("put", ("a",))], 3)[-1] == [("b",), ("a",)]


def test_an_unknown_operation_is_refused():
    with pytest.raises(ValueError, match="op: expected"):
        plans._exercise_cache([("drop", ("a",))], 3)
