"""GPU: the dense layer (forward_into/backward_into, cygemm.dense): forward and backward for every
activation against float64 NumPy (tests/refs) and PyTorch autograd where installed, each of its
forward and backward routes forced, on fresh random inputs with NaN-poisoned outputs."""
import itertools

import numpy as np
import pytest

import cygemm
from cygemm import gemm_ops
from cygemm.engine import tuning
from cygemm.gemm_ops import backward_into, forward_into
from gpu_util import err_vs_scale, f64, poisoned, rand, rel_err
from refs import activations

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

ACTS = ["none", "relu", "leaky_relu", "gelu", "gelu_erf", "sigmoid", "tanh", "silu"]
SLOPE = 0.07          # not leaky_relu's default 0.01: a kernel that ignores the slope fails


def bound(math_mode, k):
    return 1e-5 * max(1, np.sqrt(k / 64)) if math_mode == "fp32" else 3e-3


SHAPES = [(1, 7, 33), (7, 1, 1000), (33, 1000, 7), (1000, 33, 1), (64, 64, 64), (256, 128, 520)]


@pytest.mark.parametrize("M,K,N", SHAPES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("with_bias,save_z", list(itertools.product([False, True], repeat=2)))
def test_forward_matches_float64(M, K, N, act, with_bias, save_z):
    math_mode = "fp32" if (M + K + N) % 2 else "tf32"     # both maths over the shapes
    A, B, bias = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,))
    Y = poisoned(cp, (M, N))
    Z = poisoned(cp, (M, N)) if save_z else None
    forward_into(A, B, Y, bias if with_bias else None, act=act, leaky_slope=SLOPE, save_z=save_z, z_out=Z,
                 math=math_mode)
    z = f64(cp, A) @ f64(cp, B) + (f64(cp, bias) if with_bias else 0)
    tol = bound(math_mode, K)
    assert rel_err(Y.get(), activations.act(act, z, SLOPE)) < tol * 4
    if save_z:
        assert rel_err(Z.get(), z) < tol


@pytest.mark.parametrize("act", ACTS)
def test_forward_bias_as_row_and_transposed_weight(act):
    M, K, N = 48, 96, 80
    A, W, bias = rand(cp, (M, K)), rand(cp, (N, K)), rand(cp, (1, N))
    Y, Z = poisoned(cp, (M, N)), poisoned(cp, (M, N))
    forward_into(A, W.T, Y, bias, act=act, leaky_slope=SLOPE, save_z=True, z_out=Z, math="fp32")
    z = f64(cp, A) @ f64(cp, W).T + f64(cp, bias)
    assert rel_err(Z.get(), z) < 1e-5
    assert rel_err(Y.get(), activations.act(act, z, SLOPE)) < 4e-5


@pytest.mark.parametrize("M,K,N", [(1, 7, 33), (33, 1000, 7), (1000, 33, 1), (256, 128, 520)])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("want", ["all", "no-gA", "no-gB", "bias-only", "no-bias"])
def test_backward_matches_float64(M, K, N, act, want):
    A, B, gY, Z = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (M, N)), rand(cp, (M, N))
    gA = poisoned(cp, (M, K)) if want not in ("no-gA", "bias-only") else None
    gB = poisoned(cp, (K, N)) if want not in ("no-gB", "bias-only") else None
    gBias = poisoned(cp, (N,)) if want != "no-bias" else None
    dZ = poisoned(cp, (M, N))
    res = backward_into(A, B, gY, Z, act=act, leaky_slope=SLOPE, gA_out=gA, gB_out=gB, gBias_out=gBias,
                        work_dZ=dZ, math="fp32")
    assert res == (gA, gB, gBias)
    dz = f64(cp, gY) * activations.act_grad(act, f64(cp, Z), SLOPE)
    # Against the magnitudes that went in, not the result: with N = 1 the bias gradient is one
    # sum of M terms that can cancel to ~0 (seen: 1.9e-4 norm-relative at M=1000, N=1 under
    # racecheck), as in issue 10's item 9.
    dz_scale = np.abs(f64(cp, gY))
    if gA is not None:
        assert err_vs_scale(gA.get(), dz @ f64(cp, B).T, dz_scale @ np.abs(f64(cp, B)).T) < 2e-5
    if gB is not None:
        assert err_vs_scale(gB.get(), f64(cp, A).T @ dz, np.abs(f64(cp, A)).T @ dz_scale) < \
            2e-5 * max(1, np.sqrt(M / 64))
    if gBias is not None:
        assert err_vs_scale(gBias.get(), dz.sum(axis=0), dz_scale.sum(axis=0)) < 2e-5 * max(1, np.sqrt(M / 64))


def test_backward_accumulates_into_grads():
    M, K, N = 40, 30, 20
    A, B, gY, Z = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (M, N)), rand(cp, (M, N))
    gA0, gB0, gb0 = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,))
    gA, gB, gb = gA0.copy(), gB0.copy(), gb0.copy()
    backward_into(A, B, gY, Z, act="silu", gA_out=gA, gB_out=gB, gBias_out=gb, work_dZ=cp.empty((M, N), cp.float32),
                  math="fp32", accumulate=True)
    dz = f64(cp, gY) * activations.act_grad("silu", f64(cp, Z))
    assert rel_err(gA.get(), f64(cp, gA0) + dz @ f64(cp, B).T) < 2e-5
    assert rel_err(gB.get(), f64(cp, gB0) + f64(cp, A).T @ dz) < 2e-5
    assert rel_err(gb.get(), f64(cp, gb0) + dz.sum(0)) < 2e-5


def test_backward_bias_gradient_is_deterministic():
    M, N = 4099, 515
    gY, Z = rand(cp, (M, N)), rand(cp, (M, N))
    A, B = rand(cp, (M, 8)), rand(cp, (8, N))
    outs = []
    for _ in range(5):
        gb = poisoned(cp, (N,))
        backward_into(A, B, gY, Z, act="gelu", gBias_out=gb)
        outs.append(gb.get())
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("act", ACTS)
def test_against_torch_autograd(act):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as Fn
    M, K, N = 96, 160, 72
    A, B, bias, gY = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,)), rand(cp, (M, N))
    Y, Z = poisoned(cp, (M, N)), poisoned(cp, (M, N))
    forward_into(A, B, Y, bias, act=act, leaky_slope=SLOPE, save_z=True, z_out=Z, math="fp32")
    gA, gB, gb = poisoned(cp, (M, K)), poisoned(cp, (K, N)), poisoned(cp, (N,))
    backward_into(A, B, gY, Z, act=act, leaky_slope=SLOPE, gA_out=gA, gB_out=gB, gBias_out=gb,
                  work_dZ=cp.empty((M, N), cp.float32), math="fp32")
    t = lambda x: torch.as_tensor(cp.asnumpy(x), dtype=torch.float64).requires_grad_()
    tA, tB, tb = t(A), t(B), t(bias)
    fn = {"none": lambda z: z, "relu": torch.relu, "gelu": lambda z: Fn.gelu(z, approximate="tanh"),
          "gelu_erf": lambda z: Fn.gelu(z, approximate="none"), "sigmoid": torch.sigmoid, "tanh": torch.tanh,
          "silu": Fn.silu, "leaky_relu": lambda z: Fn.leaky_relu(z, SLOPE)}[act]
    ty = fn(tA @ tB + tb)
    ty.backward(torch.as_tensor(cp.asnumpy(gY), dtype=torch.float64))
    assert rel_err(Y.get(), ty.detach().numpy()) < 4e-5
    for ours, theirs in ((gA, tA.grad), (gB, tB.grad), (gb, tb.grad)):
        assert rel_err(ours.get(), theirs.numpy()) < 3e-5


@pytest.mark.parametrize("dtype", ["float16"])
@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
def test_half_precision_forward_backward(dtype, act):
    M, K, N = 64, 96, 40
    A, B, bias, gY = (rand(cp, s, dtype) for s in ((M, K), (K, N), (N,), (M, N)))
    Y, Z = poisoned(cp, (M, N), dtype), poisoned(cp, (M, N), dtype)
    forward_into(A, B, Y, bias, act=act, save_z=True, z_out=Z)
    z = f64(cp, A) @ f64(cp, B) + f64(cp, bias)
    assert rel_err(Y.get(), activations.act(act, z, SLOPE)) < 1e-2
    gA, gB, gb = poisoned(cp, (M, K), dtype), poisoned(cp, (K, N), dtype), poisoned(cp, (N,), dtype)
    backward_into(A, B, gY, Z, act=act, gA_out=gA, gB_out=gB, gBias_out=gb, work_dZ=cp.empty((M, N), dtype))
    dz = f64(cp, gY) * activations.act_grad(act, f64(cp, Z), SLOPE)
    assert rel_err(gA.get(), dz @ f64(cp, B).T) < 1e-2
    assert rel_err(gb.get(), dz.sum(0)) < 1e-2


def test_unaligned_pointers_take_a_correct_path():
    M, K, N = 64, 64, 64
    base = rand(cp, (M * K + 1,))
    A = base[1:].reshape(M, K)              # 4-byte aligned only
    B, bias = rand(cp, (K, N)), rand(cp, (N + 1,))[1:]
    Y = poisoned(cp, (M * N + 3,))[3:].reshape(M, N)
    forward_into(A, B, Y, bias, act="relu", math="fp32")
    z = f64(cp, A) @ f64(cp, B) + f64(cp, bias)
    assert rel_err(Y.get(), np.maximum(z, 0)) < 1e-5


def test_allocating_forms():
    M, K, N = 50, 40, 30
    A, B, bias = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,))
    Y, Z = gemm_ops.forward(A, B, bias, act="tanh", save_z=True, math="fp32")
    z = f64(cp, A) @ f64(cp, B) + f64(cp, bias)
    assert rel_err(Z.get(), z) < 1e-5 and rel_err(Y.get(), np.tanh(z)) < 2e-5
    gY = rand(cp, (M, N))
    gA, gB, gb = gemm_ops.backward(A, B, gY, Z, act="tanh", math="fp32")
    dz = f64(cp, gY) * (1 - np.tanh(z) ** 2)
    assert rel_err(gA.get(), dz @ f64(cp, B).T) < 2e-5 and rel_err(gb.get(), dz.sum(0)) < 2e-5


def test_into_functions_allocate_nothing():
    M, K, N = 128, 64, 96
    A, B, bias, gY = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,)), rand(cp, (M, N))
    Y, Z, gA, gB, gb = (cp.empty(s, cp.float32) for s in ((M, N), (M, N), (M, K), (K, N), (N,)))
    ws = gemm_ops.ensure_workspaces(M, N)
    s = cp.cuda.Stream(non_blocking=True)
    pool = cp.get_default_memory_pool()

    def run():
        for act in ("relu", "gelu", "silu"):
            forward_into(A, B, Y, bias, act=act, save_z=True, z_out=Z, lt_workspace=ws.lt_ws, stream=s)
            backward_into(A, B, gY, Z, act=act, gA_out=gA, gB_out=gB, gBias_out=gb, work_dZ=ws.dZ,
                          lt_workspace=ws.lt_ws, stream=s)
    run()
    s.synchronize()
    used, total = pool.used_bytes(), pool.total_bytes()
    for _ in range(100):
        run()
    s.synchronize()
    assert (pool.used_bytes(), pool.total_bytes()) == (used, total)


def test_workspace_cache_keys_and_clear():
    gemm_ops.clear_ws_cache()
    w1 = gemm_ops.ensure_workspaces(10, 20)
    assert gemm_ops.ensure_workspaces(10, 20) == w1          # the same buffers
    w2 = gemm_ops.ensure_workspaces(10, 20, dtype=np.float16)
    w3 = gemm_ops.ensure_workspaces(10, 20, lt_bytes=1 << 20)
    assert w2.dZ is not w1.dZ and w3.lt_ws is not w1.lt_ws and w2.dZ.dtype == np.float16
    assert w3.lt_ws.nbytes == 1 << 20 and w3.dZ is w1.dZ
    assert w1.dZ.shape == (10, 20) and w1.lt_ws.nbytes == 4 << 20
    assert len(gemm_ops.ws_cache_keys()) == 4                # dZ f32, dZ f16, lt_ws 4 MiB, lt_ws 1 MiB
    s = cp.cuda.Stream(non_blocking=True)
    w4 = gemm_ops.ensure_workspaces(10, 20, stream=s)        # another stream: its own buffers
    assert w4.dZ is not w1.dZ and w4.lt_ws is not w1.lt_ws
    gemm_ops.clear_ws_cache()
    assert gemm_ops.ws_cache_keys() == [] and gemm_ops.ensure_workspaces(10, 20).dZ is not w1.dZ


@pytest.mark.parametrize("act", ["relu", "leaky_relu", "sigmoid", "tanh"])
def test_backward_from_output_equals_backward_from_z(act):
    M, K, N = 120, 72, 88
    A, B, bias, gY = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,)), rand(cp, (M, N))
    Y, Z = poisoned(cp, (M, N)), poisoned(cp, (M, N))
    forward_into(A, B, Y, bias, act=act, leaky_slope=SLOPE, save_z=True, z_out=Z, math="fp32")
    grads = []
    for kw in ({"Z": Z}, {"Z": None, "y": Y}):
        g = [poisoned(cp, s) for s in ((M, K), (K, N), (N,))]
        z = kw.pop("Z")
        backward_into(A, B, gY, z, act=act, leaky_slope=SLOPE, gA_out=g[0], gB_out=g[1], gBias_out=g[2],
                      work_dZ=cp.empty((M, N), cp.float32), math="fp32", **kw)
        grads.append(g)
    dz = f64(cp, gY) * activations.act_grad(act, f64(cp, Z), SLOPE)
    for ours, ref in zip(grads[1], (dz @ f64(cp, B).T, f64(cp, A).T @ dz, dz.sum(0))):
        assert rel_err(ours.get(), ref) < 1e-4


def test_large_problem_paths_autotune_and_gelu_route_in_a_subprocess():
    """The paths taken only above CYGEMM_AUTOTUNE_MIN_MACS (autotuned plans, GELU + save_z
    through BIAS + kernel), forced on small shapes by lowering the threshold."""
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent("""
        import numpy as np, cupy as cp
        from cygemm.gemm_ops import forward_into
        from cygemm.engine import plans
        rng = np.random.default_rng()
        M, K, N = 96, 64, 80
        a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((M, K), (K, N), (N,)))
        for act in ("gelu", "relu", "silu"):
            Y, Z = cp.full((M, N), cp.nan, cp.float32), cp.full((M, N), cp.nan, cp.float32)
            forward_into(cp.asarray(a), cp.asarray(b), Y, cp.asarray(bias), act=act, save_z=True, z_out=Z,
                         math="fp32")
            z = a.astype(np.float64) @ b + bias
            ez = np.linalg.norm(Z.get() - z) / np.linalg.norm(z)
            assert ez < 1e-5, (act, ez)
            assert not np.isnan(Y.get()).any(), act
        tuned = [p.tuned_ms for p in plans.thread_plans().values()]
        assert tuned and any(t > 0 for t in tuned), tuned
        print("OK", len(tuned))
    """)
    env = dict(__import__("os").environ, CYGEMM_AUTOTUNE_MIN_MACS="1")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0 and p.stdout.startswith("OK"), p.stdout + p.stderr[-2000:]


@pytest.mark.parametrize("act", ["relu", "silu", "none"])
def test_forward_k_zero_is_act_of_bias(act):
    M, N = 9, 13
    A, B, bias = cp.empty((M, 0), cp.float32), cp.empty((0, N), cp.float32), rand(cp, (N,))
    Y, Z = poisoned(cp, (M, N)), poisoned(cp, (M, N))
    forward_into(A, B, Y, bias, act=act, save_z=True, z_out=Z)
    z = np.broadcast_to(f64(cp, bias), (M, N))
    assert rel_err(Z.get(), z) < 1e-6 and rel_err(Y.get(), activations.act(act, z, SLOPE)) < 1e-5


def test_plan_cache_reuses_plans_across_alternating_layers_and_clears():
    from cygemm.engine import plans
    plans.clear_plan_cache()
    layers = [(rand(cp, (32, 48)), rand(cp, (48, 40)), rand(cp, (40,)), cp.empty((32, 40), cp.float32)),
              (rand(cp, (32, 40)), rand(cp, (40, 24)), rand(cp, (24,)), cp.empty((32, 24), cp.float32)),
              (rand(cp, (32, 24)), rand(cp, (24, 8)), rand(cp, (8,)), cp.empty((32, 8), cp.float32))]
    for _ in range(10):
        for A, B, b, Y in layers:
            Y[...] = cp.nan
            forward_into(A, B, Y, b, act="relu", math="fp32")
            ref = np.maximum(f64(cp, A) @ f64(cp, B) + f64(cp, b), 0)
            assert rel_err(Y.get(), ref) < 1e-5
    assert plans.plan_cache_size() == 3
    plans.clear_plan_cache()
    assert plans.plan_cache_size() == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_torch_tensors_forward_backward_against_torch(dtype, act):
    """torch tensors straight in (the weight stored (N, K), as nn.Linear keeps it), on torch's
    stream: the same results as torch's own layer, in float64 and in the tensors' dtype."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as Fn
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(11)
    M, K, N = 128, 96, 80
    A, W, bias, gY = (torch.randn(*s, device="cuda", generator=g).to(dt) for s in ((M, K), (N, K), (N,), (M, N)))
    nan = lambda *s: torch.full(s, float("nan"), device="cuda", dtype=dt)     # noqa: E731
    Y, Z, gA, gW, gb, dZ = nan(M, N), nan(M, N), nan(M, K), nan(N, K), nan(N), nan(M, N)
    s = torch.cuda.current_stream()
    forward_into(A, W.T, Y, bias, act=act, save_z=True, z_out=Z, math="fp32", stream=s)
    backward_into(A, W.T, gY, Z, act=act, gA_out=gA, gB_out=gW.T, gBias_out=gb, work_dZ=dZ, math="fp32", stream=s)
    fn = torch.relu if act == "relu" else (lambda z: Fn.gelu(z, approximate="tanh"))
    t = [x.double().requires_grad_() for x in (A, W, bias)]
    ref = fn(Fn.linear(*t))
    ref.backward(gY.double())
    bound = 3e-5 if dtype == "float32" else 2e-2
    err = lambda x, r: ((x.double() - r).norm() / r.norm()).item()          # noqa: E731
    assert not any(torch.isnan(x).any().item() for x in (Y, gA, gW, gb))
    assert err(Y, ref.detach()) < bound
    for ours, theirs in ((gA, t[0].grad), (gW, t[1].grad), (gb, t[2].grad)):
        assert err(ours, theirs) < bound
    # torch's own layer in the tensors' dtype lands within the same bound of ours.
    tt = [x.clone().requires_grad_() for x in (A, W, bias)]
    y_t = fn(Fn.linear(*tt))
    y_t.backward(gY)
    assert err(Y, y_t.detach().double()) < bound
    assert err(gW, tt[1].grad.double()) < bound


def test_an_lt_workspace_inside_A_is_refused_and_A_left_as_it_was():
    """A workspace that is a view of A's buffer would be written by cuBLASLt mid-GEMM (on the
    H200: A changed and a 5.9e-3 error at 256x256x16384 fp32). Refused before anything runs."""
    M, K, N = 256, 16384, 256
    P = rand(cp, (M + 512, K))
    A, before = P[:M], cp.asnumpy(P)
    B, Y = rand(cp, (K, N)), poisoned(cp, (M, N))
    with pytest.raises(ValueError, match="lt_workspace: its memory overlaps A"):
        forward_into(A, B, Y, None, act="relu", lt_workspace=P[M - 1:].reshape(-1), math="fp32")
    cp.cuda.Device().synchronize()
    np.testing.assert_array_equal(cp.asnumpy(P), before)
    assert bool(cp.isnan(Y).all())
    # Beside A (the rows after it), the same buffer is a valid workspace.
    forward_into(A, B, Y, None, act="relu", lt_workspace=P[M:].reshape(-1), math="fp32")
    assert rel_err(Y.get(), np.maximum(f64(cp, A) @ f64(cp, B), 0)) < bound("fp32", K)
    np.testing.assert_array_equal(cp.asnumpy(A), before[:M])


def test_cupy_bfloat16_arrays_are_read_like_torchs():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    M, K, N = 64, 96, 48
    rng = np.random.default_rng()
    A = cp.asarray(rng.standard_normal((M, K)).astype(bf16))
    B = cp.asarray(rng.standard_normal((K, N)).astype(bf16))
    bias = cp.asarray(rng.standard_normal(N).astype(bf16))
    Y = cp.asarray(np.full((M, N), np.nan, bf16))
    forward_into(A, B, Y, bias, act="gelu")
    a, b, c = (cp.asnumpy(x).astype(np.float64) for x in (A, B, bias))
    assert rel_err(cp.asnumpy(Y).astype(np.float64), activations.act("gelu", a @ b + c)) < 2e-2


# ------------------------------------------------------------------ each route, forced

@pytest.fixture
def unforced_routes():
    """The test forces routes; none stay forced after it."""
    yield
    tuning.force_routes()


@pytest.mark.gpu
@pytest.mark.parametrize("route", list(tuning.registered_routes()["forward"]))
@pytest.mark.parametrize("act", ["none", "relu", "gelu", "silu"])
def test_forward_each_route_against_float64(unforced_routes, route, act):
    tuning.force_routes(forward=route)
    M, K, N = 64, 96, 48                     # N a multiple of 8: gelu_aux applies with save_z
    A, B, bias = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,))
    for with_bias in (True, False):
        for save_z in (False, True):
            Y, Z = poisoned(cp, (M, N)), poisoned(cp, (M, N))
            forward_into(A, B, Y, bias, with_bias=with_bias, act=act, save_z=save_z,
                         z_out=Z if save_z else None, math="fp32")
            z = f64(cp, A) @ f64(cp, B) + (f64(cp, bias) if with_bias else 0)
            assert rel_err(Y.get(), activations.act(act, z)) < 1e-5, (route, act, with_bias, save_z)
            if save_z:
                assert rel_err(Z.get(), z) < 1e-5, (route, act, with_bias)


@pytest.mark.gpu
@pytest.mark.parametrize("accumulate", [False, True])
def test_backward_branches_against_float64_on_a_non_current_stream(unforced_routes, accumulate):
    tuning.force_routes(backward="branches")
    M, K, N = 80, 72, 56
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        A, B, gY, Z = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (M, N)), rand(cp, (M, N))
        gA0, gB0, gb0 = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,))
        gA, gB, gb = (x.copy() if accumulate else poisoned(cp, x.shape) for x in (gA0, gB0, gb0))
        dZ = poisoned(cp, (M, N))
    s.synchronize()
    backward_into(A, B, gY, Z, act="gelu", gA_out=gA, gB_out=gB, gBias_out=gb, work_dZ=dZ, math="fp32",
                  stream=s, accumulate=accumulate)
    s.synchronize()
    dz = f64(cp, gY) * activations.act_grad("gelu", f64(cp, Z))
    extra = [f64(cp, x) if accumulate else 0 for x in (gA0, gB0, gb0)]
    assert rel_err(gA.get(), dz @ f64(cp, B).T + extra[0]) < 1e-5
    assert rel_err(gB.get(), f64(cp, A).T @ dz + extra[1]) < 1e-5
    assert rel_err(gb.get(), dz.sum(0) + extra[2]) < 1e-5


@pytest.mark.gpu
def test_backward_branches_capture_into_a_graph_with_two_branches_and_replay(unforced_routes):
    tuning.force_routes(backward="branches")
    M, K, N = 64, 40, 48
    s = cp.cuda.Stream(non_blocking=True)
    A, B, gY, Z = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (M, N)), rand(cp, (M, N))
    gA, gB, gb, dZ = poisoned(cp, (M, K)), poisoned(cp, (K, N)), poisoned(cp, (N,)), poisoned(cp, (M, N))
    kw = dict(act="relu", gA_out=gA, gB_out=gB, gBias_out=gb, work_dZ=dZ, math="fp32", stream=s)
    backward_into(A, B, gY, Z, **kw)                   # once eagerly, as the README asks
    s.synchronize()
    for x in (gA, gB, gb):
        x[...] = cp.nan
    cp.cuda.Device().synchronize()
    with cygemm.graph.capture(s) as graph:
        backward_into(A, B, gY, Z, **kw)
    assert graph.num_nodes >= 3
    for _ in range(3):
        graph.launch(s)
    s.synchronize()
    dz = f64(cp, gY) * (f64(cp, Z) > 0)
    assert rel_err(gA.get(), dz @ f64(cp, B).T) < 1e-5
    assert rel_err(gB.get(), f64(cp, A).T @ dz) < 1e-5
    assert rel_err(gb.get(), dz.sum(0)) < 1e-5
    assert cygemm.engine.release.open_capture_count() == 0, "the side stream's part of the capture is over too"


@pytest.mark.gpu
def test_backward_follows_a_route_forced_after_its_route_was_remembered(unforced_routes):
    """A backward remembers its route in a C memo; force_routes must still take effect."""
    M, K, N = 64, 40, 48
    s = cp.cuda.Stream(non_blocking=True)
    A, B, gY, Z = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (M, N)), rand(cp, (M, N))
    gA, gB, gb, dZ = poisoned(cp, (M, K)), poisoned(cp, (K, N)), poisoned(cp, (N,)), poisoned(cp, (M, N))
    kw = dict(act="relu", gA_out=gA, gB_out=gB, gBias_out=gb, work_dZ=dZ, math="fp32", stream=s)
    forks = {}
    for route in ("branches", "serial", "branches"):
        tuning.force_routes(backward=route)
        backward_into(A, B, gY, Z, **kw)       # remembered eagerly, then captured
        s.synchronize()
        with cygemm.graph.capture(s) as graph:
            backward_into(A, B, gY, Z, **kw)
        successors = [f for f, _ in graph.edges]
        forks.setdefault(route, []).append(max(successors.count(f) for f in set(successors)))
    assert forks["serial"] == [1], f"serial must capture a chain, got out-degrees {forks}"
    assert min(forks["branches"]) >= 2, f"branches must fork, got out-degrees {forks}"
    graph.launch(s)
    s.synchronize()
    dz = f64(cp, gY) * (f64(cp, Z) > 0)
    assert rel_err(gA.get(), dz @ f64(cp, B).T) < 1e-5
    assert rel_err(gB.get(), f64(cp, A).T @ dz) < 1e-5
