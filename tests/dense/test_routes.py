"""cygemm.dense.routes: the dense layer's forward routes (cuBLASLt epilogues, a GEMM and
cygemm's kernels) and backward routes (its two GEMMs on one stream or two), and their runners.

CPU: cygemm.dense.FORWARD_ROUTES and BACKWARD_ROUTES are the route tables' own names, in their
route numbers' order, and state the rules that decide where a route applies (cygemm.dense has
no describe_* function: the routes are observable through force_routes and the results);
force_routes(forward=..., backward=...) takes every pair and refuses any other name; a forced
route never skips forward_into's or backward_into's argument checks.

GPU, against float64 NumPy on seeded random inputs with NaN-poisoned outputs (strict fp32 1e-5,
float16 1e-2): a forced forward route that does not apply (no epilogue for the activation, Z
asked of a route that does not write it, Z's leading dimension or alignment not what GELU_AUX
needs, no bias for the BIAS epilogue, K == 0) falls back and stays right; every forward route
forced for the activations that have no cuBLASLt epilogue, in float16 and into row slices of
wider buffers (nothing written beside them); every backward route forced, with accumulation, y
instead of Z, a column-major gB_out and one gradient alone; and a forced route under
determinism="run_to_run" giving the same bits twice. Routes forced are undone after each test."""
import numpy as np
import pytest

import cygemm
from cygemm import dense
from cygemm.dense import backward_into, forward_into
from cygemm.engine import epilogues, tuning
from cygemm.dense import routes as dense_routes
from fakes import BASE, FakeDeviceArray
from gpu_util import f64, poisoned, rand, rel_err, tol
from refs import activations

FORWARD = ["epilogue", "gelu_aux", "bias_epilogue_kernel", "gemm_kernel"]
BACKWARD = ["serial", "branches"]


@pytest.fixture
def unforced():
    """The test forces routes; none stay forced after it."""
    tuning.force_routes()
    yield
    tuning.force_routes()


# ------------------------------------------------------------------ CPU: the tables

def test_the_route_descriptions_are_the_tables_names_in_route_order():
    assert dense.FORWARD_ROUTES is dense_routes.FORWARD_ROUTES
    assert dense.BACKWARD_ROUTES is dense_routes.BACKWARD_ROUTES
    assert list(dense.FORWARD_ROUTES) == FORWARD == list(tuning.registered_routes()["forward"])
    assert list(dense.BACKWARD_ROUTES) == BACKWARD == list(tuning.registered_routes()["backward"])


def test_the_route_descriptions_state_where_each_route_applies():
    fwd = dense.FORWARD_ROUTES
    # The epilogue route is for the activations cuBLASLt has an epilogue for, and saves no Z.
    assert epilogues.EPILOGUE_ACTS in fwd["epilogue"] and "Z not saved" in fwd["epilogue"]
    # GELU_AUX's rules on Z are those of the epilogue table.
    [aux] = [r for r in epilogues.EPILOGUES if r["name"] == "gelu_aux_bias"]
    assert f"a multiple of {aux['z_ld_multiple']}" in fwd["gelu_aux"]
    assert f"{aux['z_alignment']}-byte aligned" in fwd["gelu_aux"]
    assert "the fallback of every other route" in fwd["gemm_kernel"]
    assert "second stream" in dense.BACKWARD_ROUTES["branches"]
    assert "caller's stream" in dense.BACKWARD_ROUTES["serial"]


@pytest.mark.parametrize("forward", FORWARD)
@pytest.mark.parametrize("backward", BACKWARD)
def test_every_forward_and_backward_pair_can_be_forced_and_round_trips(unforced, forward, backward):
    tuning.force_routes(forward=forward, backward=backward)
    assert tuning.forced_routes() == {"forward": forward, "backward": backward}
    tuning.force_routes(forward=forward)             # the backward no longer forced
    assert tuning.forced_routes() == {"forward": forward}
    tuning.force_routes(backward=backward, forward=None)
    assert tuning.forced_routes() == {"backward": backward}


def test_force_routes_refuses_names_the_dense_tables_do_not_have(unforced):
    with pytest.raises(ValueError) as e:
        tuning.force_routes(forward="gelu")           # an activation, not a route
    assert str(e.value) == ("forward: expected None, 'epilogue', 'gelu_aux', 'bias_epilogue_kernel', "
                            "'gemm_kernel', got 'gelu'")
    with pytest.raises(ValueError) as e:
        tuning.force_routes(backward="gemm_kernel")   # a forward route
    assert str(e.value) == "backward: expected None, 'serial', 'branches', got 'gemm_kernel'"
    assert tuning.forced_routes() == {}


def _fake(shape, slot):
    return FakeDeviceArray(shape, "<f4", None, BASE + slot * 0x100000)


@pytest.mark.parametrize("route", FORWARD)
def test_a_forced_forward_route_never_skips_the_argument_checks(unforced, route):
    tuning.force_routes(forward=route, backward="branches")
    A, B, Y, Z, bias = _fake((6, 5), 0), _fake((5, 4), 1), _fake((6, 4), 2), _fake((6, 4), 3), _fake((4,), 4)
    with pytest.raises(ValueError, match="z_out: save_z=True needs z_out"):
        forward_into(A, B, Y, bias, act="gelu", save_z=True)
    with pytest.raises(ValueError, match="z_out: given but save_z=False"):
        forward_into(A, B, Y, bias, act="gelu", z_out=Z)
    with pytest.raises(ValueError, match="act:"):
        forward_into(A, B, Y, bias, act=route)
    with pytest.raises(ValueError, match=r"B: A is \(6, 5\) so B must have 5 rows"):
        forward_into(A, _fake((4, 4), 1), Y, bias)
    with pytest.raises(ValueError, match=r"work_dZ: act='relu' with gA_out/gB_out needs a \(6, 4\) work_dZ"):
        backward_into(A, B, _fake((6, 4), 5), Z, act="relu", gA_out=_fake((6, 5), 6), gB_out=_fake((5, 4), 7))


# ------------------------------------------------------------------ GPU

cp = None


@pytest.fixture
def gpu(unforced):
    global cp
    cp = pytest.importorskip("cupy")


M, K, N = 64, 96, 48            # N a multiple of 8: GELU_AUX applies where save_z asks for it
SLOPE = 0.07                    # not leaky_relu's default: a kernel that ignores the slope fails


def _forward_ref(A, B, bias, act):
    z = f64(cp, A) @ f64(cp, B) + (f64(cp, bias) if bias is not None else 0)
    return activations.act(act, z, SLOPE), z


# (forced route, act, with bias, save_z, N, Z misaligned by one element): the route does not apply.
NOT_APPLYING = [
    ("epilogue", "leaky_relu", True, False, N, False),       # no cuBLASLt epilogue for leaky_relu
    ("epilogue", "silu", False, False, N, False),
    ("epilogue", "relu", True, True, N, False),              # the epilogue route writes no Z
    ("gelu_aux", "gelu", True, False, N, False),             # GELU_AUX is for save_z
    ("gelu_aux", "relu", True, True, N, False),              # no AUX epilogue for relu
    ("gelu_aux", "gelu", True, True, 44, False),             # Z's ld 44: not a multiple of 8
    ("gelu_aux", "gelu", False, True, N, True),              # Z only 4-byte aligned
    ("bias_epilogue_kernel", "tanh", False, True, N, False),  # no bias for the BIAS epilogue
]


@pytest.mark.gpu
@pytest.mark.parametrize("route,act,with_bias,save_z,n,misaligned", NOT_APPLYING)
def test_a_forced_forward_route_that_does_not_apply_falls_back_and_gives_float64(gpu, route, act, with_bias,
                                                                                save_z, n, misaligned):
    tuning.force_routes(forward=route)
    A, B, bias = rand(cp, (M, K)), rand(cp, (K, n)), rand(cp, (n,))
    Y = poisoned(cp, (M, n))
    Z = None
    if save_z:
        Z = poisoned(cp, (M * n + 1,))[1:].reshape(M, n) if misaligned else poisoned(cp, (M, n))
    forward_into(A, B, Y, bias if with_bias else None, act=act, leaky_slope=SLOPE, save_z=save_z, z_out=Z,
                 math="fp32")
    y, z = _forward_ref(A, B, bias if with_bias else None, act)
    assert rel_err(Y.get(), y) < 1e-5
    if save_z:
        assert rel_err(Z.get(), z) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("route", FORWARD)
@pytest.mark.parametrize("act", ["relu", "gelu", "sigmoid"])
def test_every_forced_forward_route_with_k_zero_is_act_of_the_bias(gpu, route, act):
    """K == 0: no cuBLASLt route applies (they need K > 0); out = act(bias) on every row."""
    tuning.force_routes(forward=route)
    A, B, bias = cp.empty((M, 0), cp.float32), cp.empty((0, N), cp.float32), rand(cp, (N,))
    Y, Z = poisoned(cp, (M, N)), poisoned(cp, (M, N))
    forward_into(A, B, Y, bias, act=act, save_z=True, z_out=Z, math="fp32")
    z = np.broadcast_to(f64(cp, bias), (M, N))
    assert rel_err(Y.get(), activations.act(act, z)) < 1e-5
    assert rel_err(Z.get(), z) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("route", FORWARD)
@pytest.mark.parametrize("act", ["leaky_relu", "gelu_erf", "sigmoid", "tanh", "gelu"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_forced_forward_route_into_row_slices_gives_float64_and_writes_nothing_beside(gpu, route, act,
                                                                                          dtype):
    tuning.force_routes(forward=route)
    A, B, bias = rand(cp, (M, K), dtype), rand(cp, (K, N), dtype), rand(cp, (N,), dtype)
    Ybuf, Zbuf = poisoned(cp, (M, N + 8), dtype), poisoned(cp, (M, N + 8), dtype)
    Y, Z = Ybuf[:, :N], Zbuf[:, :N]                 # leading dimension N + 8 (a multiple of 8)
    for save_z in (False, True):
        forward_into(A, B, Y, bias, act=act, leaky_slope=SLOPE, save_z=save_z, z_out=Z if save_z else None,
                     math="fp32")
        y, z = _forward_ref(A, B, bias, act)
        limit = 1e-5 if dtype == "float32" else tol("float16")
        assert rel_err(Y.get(), y) < limit, (route, act, dtype, save_z)
        if save_z:
            assert rel_err(Z.get(), z) < limit, (route, act, dtype)
        assert np.isnan(Ybuf[:, N:].get().astype(np.float64)).all()
        assert np.isnan(Zbuf[:, N:].get().astype(np.float64)).all()
    assert np.isnan(Zbuf.get().astype(np.float64)).sum() == M * 8


@pytest.mark.gpu
@pytest.mark.parametrize("route", BACKWARD)
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("act,from_output", [("gelu", False), ("relu", True), ("tanh", True), ("none", False)])
def test_every_forced_backward_route_gives_float64_gradients(gpu, route, accumulate, act, from_output):
    tuning.force_routes(backward=route)
    A, B, gY, Zv = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (M, N)), rand(cp, (M, N))
    gA0, gW0, gb0 = rand(cp, (M, K)), rand(cp, (N, K)), rand(cp, (N,))
    z = f64(cp, Zv)
    y = activations.act(act, z)
    Yv = cp.asarray(y.astype(np.float32))
    gA, gW, gb = (x.copy() if accumulate else poisoned(cp, x.shape) for x in (gA0, gW0, gb0))
    dZ = poisoned(cp, (M, N))
    # gB_out = gW.T: the weight gradient stored (N, K), as torch's nn.Linear keeps it.
    kw = dict(act=act, gA_out=gA, gB_out=gW.T, gBias_out=gb, work_dZ=None if act == "none" else dZ,
              math="fp32", accumulate=accumulate)
    if from_output:
        backward_into(A, B, gY, None, y=Yv, **kw)
    else:
        backward_into(A, B, gY, None if act == "none" else Zv, **kw)
    if not from_output:
        grad = activations.act_grad(act, z)
    elif act == "relu":
        grad = (f64(cp, Yv) > 0).astype(np.float64)
    else:                                              # tanh' from the (float32) output: 1 - y^2
        grad = 1 - f64(cp, Yv) ** 2
    dz = f64(cp, gY) * grad
    extra = [f64(cp, x) if accumulate else 0 for x in (gA0, gW0, gb0)]
    assert rel_err(gA.get(), dz @ f64(cp, B).T + extra[0]) < 1e-5
    assert rel_err(gW.get(), (f64(cp, A).T @ dz).T + extra[1]) < 1e-5
    assert rel_err(gb.get(), dz.sum(0) + extra[2]) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("route", BACKWARD)
@pytest.mark.parametrize("which", ["gA", "gB"])
def test_a_backward_with_one_gradient_under_either_forced_route_gives_float64(gpu, route, which):
    tuning.force_routes(backward=route)
    A, B, gY, Zv = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (M, N)), rand(cp, (M, N))
    gA, gB, dZ = poisoned(cp, (M, K)), poisoned(cp, (K, N)), poisoned(cp, (M, N))
    backward_into(A, B, gY, Zv, act="silu", gA_out=gA if which == "gA" else None,
                  gB_out=gB if which == "gB" else None, work_dZ=dZ, math="fp32")
    dz = f64(cp, gY) * activations.act_grad("silu", f64(cp, Zv))
    if which == "gA":
        assert rel_err(gA.get(), dz @ f64(cp, B).T) < 1e-5 and np.isnan(gB.get()).all()
    else:
        assert rel_err(gB.get(), f64(cp, A).T @ dz) < 1e-5 and np.isnan(gA.get()).all()


@pytest.mark.gpu
@pytest.mark.parametrize("forward,backward", [(f, b) for f in FORWARD for b in BACKWARD])
def test_a_forced_route_under_run_to_run_gives_the_same_bits_twice(gpu, forward, backward):
    tuning.force_routes(forward=forward, backward=backward)
    A, B, bias, gY = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,)), rand(cp, (M, N))
    runs = []
    for _ in range(2):
        Y, Z = poisoned(cp, (M, N)), poisoned(cp, (M, N))
        gA, gB, gb, dZ = poisoned(cp, (M, K)), poisoned(cp, (K, N)), poisoned(cp, (N,)), poisoned(cp, (M, N))
        forward_into(A, B, Y, bias, act="gelu", save_z=True, z_out=Z, determinism="run_to_run")
        backward_into(A, B, gY, Z, act="gelu", gA_out=gA, gB_out=gB, gBias_out=gb, work_dZ=dZ,
                      determinism="run_to_run")
        runs.append([x.get() for x in (Y, Z, gA, gB, gb)])
    for first, second in zip(*runs):
        np.testing.assert_array_equal(first, second)
    y, z = _forward_ref(A, B, bias, "gelu")
    # TF32 (the default math): ~1e-3, growing with sqrt(K).
    assert rel_err(runs[0][0], y) < tol("float32", "tf32", K) and rel_err(runs[0][1], z) < tol("float32", "tf32", K)
    dz = f64(cp, gY) * activations.act_grad("gelu", runs[0][1].astype(np.float64))
    assert rel_err(runs[0][2], dz @ f64(cp, B).T) < tol("float32", "tf32", N)
    assert rel_err(runs[0][3], f64(cp, A).T @ dz) < tol("float32", "tf32", M)
