"""cygemm.jax inside jax.jit on an NVIDIA GPU: each target against a float64 reference and
against the eager cygemm call on the same data bit for bit (the eager call's out poisoned with
NaN first); ragged_dot with empty groups and rows past the groups; gradients against jax.grad
of XLA's own functions; vmap. Skipped where JAX has no CUDA device."""
import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")     # (CuPy shares the GPU here)
jax = pytest.importorskip("jax")
from gpu_util import jax_has_gpu  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import cygemm  # noqa: E402
import cygemm.jax as cj  # noqa: E402


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not jax_has_gpu(jax), reason="needs JAX with a CUDA GPU")]
cp = pytest.importorskip("cupy") if jax_has_gpu(jax) else None


@pytest.fixture
def x64():
    """JAX's float64 and complex128 (off by default: jnp would make float32 of them)."""
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def _rand(shape, dtype=jnp.float32, seed=0):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype)


def _cupy(x):
    return cp.asarray(np.asarray(x))


def _rel(got, ref):
    got, ref = np.asarray(got, np.complex128 if np.iscomplexobj(ref) else np.float64), np.asarray(ref)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("dtype, math, bound", [(jnp.float32, "fp32", 1e-5), (jnp.bfloat16, "tf32", 1e-2),
                                                (jnp.float64, "tf32", 1e-12), (jnp.complex64, "fp32", 1e-5)])
def test_matmul_gives_the_eager_calls_bits(dtype, math, bound, x64):
    a = _rand((3, 96, 64), jnp.float32, 1).astype(dtype)
    b = _rand((64, 80), jnp.float32, 2).astype(dtype)
    if dtype == jnp.complex64:
        a, b = a + 1j * _rand(a.shape, jnp.float32, 3), b - 1j * _rand(b.shape, jnp.float32, 4)
    got = jax.jit(lambda a, b: cj.matmul(a, b, math=math))(a, b)
    A, B = _cupy(a), _cupy(b)
    out = cp.full((3, 96, 80), np.nan, A.dtype)
    cygemm.matmul(A, B, out, math=math)
    assert np.array_equal(np.asarray(got).view(np.uint8), cp.asnumpy(out).view(np.uint8))
    ref = np.asarray(a).astype(np.complex128) @ np.asarray(b).astype(np.complex128)
    assert _rel(got, ref if dtype == jnp.complex64 else ref.real) < bound


def test_matmul_gradients_and_vmap():
    a, b = _rand((2, 32, 48), seed=5), _rand((48, 24), seed=6)
    f = lambda a, b: (cj.matmul(a, b, math="fp32") ** 2).sum()          # noqa: E731
    g = lambda a, b: (jnp.matmul(a, b, precision="highest") ** 2).sum()  # noqa: E731
    for got, want in zip(jax.jit(jax.grad(f, (0, 1)))(a, b), jax.grad(g, (0, 1))(a, b)):
        assert _rel(got, np.asarray(want, np.float64)) < 1e-5
    # vmap: one batched call, the eager batched call's bits
    bb = jnp.stack([b, b * 2])
    v = jax.jit(jax.vmap(lambda a, b: cj.matmul(a, b, math="fp32")))(a, bb)
    out = cp.full((2, 32, 24), np.nan, cp.float32)
    cygemm.matmul(_cupy(a), _cupy(bb), out, math="fp32")
    assert np.array_equal(np.asarray(v), cp.asnumpy(out))


@pytest.mark.parametrize("act, bias", [("gelu", True), ("relu", True), ("none", False)])
def test_dense_forward_gives_the_eager_bits_and_its_gradients_xlas(act, bias):
    x, k = _rand((4, 32, 64), seed=7), _rand((64, 48), seed=8) / 8
    b = _rand((48,), seed=9) if bias else None
    y = jax.jit(lambda x, k, b: cj.dense(x, k, b, act=act, math="fp32"))(x, k, b)
    out = cp.full((128, 48), np.nan, cp.float32)
    cygemm.dense.forward_into(_cupy(x.reshape(128, 64)), _cupy(k), out, None if b is None else _cupy(b), act=act,
                              math="fp32")
    assert np.array_equal(np.asarray(y).reshape(128, 48), cp.asnumpy(out))
    ref_act = {"gelu": lambda z: jax.nn.gelu(z, approximate=True), "relu": jax.nn.relu, "none": lambda z: z}[act]

    def ref(x, k, b):
        z = jnp.matmul(x, k, precision="highest") + (0 if b is None else b)
        return (ref_act(z) ** 2).sum()

    f = lambda x, k, b: (cj.dense(x, k, b, act=act, math="fp32") ** 2).sum()       # noqa: E731
    argnums = (0, 1, 2) if bias else (0, 1)
    for got, want in zip(jax.jit(jax.grad(f, argnums))(x, k, b), jax.grad(ref, argnums)(x, k, b)):
        assert _rel(got, np.asarray(want, np.float64)) < 1e-4


def test_int_mm_is_exact():
    key = jax.random.key(10)
    a = jax.random.randint(key, (64, 256), -128, 128, jnp.int8)
    w = jax.random.randint(jax.random.key(11), (32, 256), -128, 128, jnp.int8)
    got = jax.jit(cj.int_mm)(a, w.T)
    assert np.array_equal(np.asarray(got), np.asarray(a, np.int64) @ np.asarray(w, np.int64).T)


@pytest.mark.parametrize("mode", ["tensor", "rowwise", ("1x128", "128x128")])
def test_scaled_matmul_gives_the_eager_bits(mode):
    if cp.cuda.Device().compute_capability < "89":
        pytest.skip("FP8 GEMMs need compute capability 8.9 or later")
    m, n, k = 256, 128, 512
    a = (_rand((m, k), seed=12) * 3).astype(jnp.float8_e4m3fn)
    w = (_rand((n, k), seed=13) * 3).astype(jnp.float8_e4m3fn)
    if mode == "tensor":
        sa, sb = jnp.array([0.5], jnp.float32), jnp.array([0.25], jnp.float32)
    elif mode == "rowwise":
        sa, sb = jnp.abs(_rand((m, 1), seed=14)) + 0.1, jnp.abs(_rand((1, n), seed=15)) + 0.1
    else:
        sa, sb = jnp.abs(_rand((m, k // 128), seed=16)) + 0.1, jnp.abs(_rand((k // 128, n // 128), seed=17)) + 0.1
    got = jax.jit(lambda a, b, x, y: cj.scaled_matmul(a, b, x, y, out_dtype="float32",
                                                      scale_mode=None if isinstance(mode, str) else mode))(a, w.T, sa, sb)
    A = _cupy(a.view(jnp.uint8))
    W = _cupy(w.view(jnp.uint8))
    SA, SB = _cupy(sa), _cupy(sb)
    if mode != "tensor" and mode != "rowwise":      # cuBLASLt's layouts (see cygemm.fp8.scaled_matmul)
        SA = cp.asfortranarray(SA)
        kb4 = -(-(k // 128) // 4) * 4
        pad = cp.zeros((n // 128, kb4), cp.float32)
        pad[:, :k // 128] = SB.T
        SB = pad[:, :k // 128].T
    out = cp.full((m, n), np.nan, cp.float32)
    cygemm.fp8.scaled_matmul(A, W.T, SA, SB, out=out, format_a="e4m3", format_b="e4m3",
                             scale_mode=None if isinstance(mode, str) else mode)
    assert np.array_equal(np.asarray(got), cp.asnumpy(out))


def test_ragged_dot_with_empty_groups_rows_past_them_and_its_gradients():
    lhs, rhs = _rand((100, 64), seed=18), _rand((5, 64, 48), seed=19)
    sizes = jnp.array([10, 0, 40, 0, 30], jnp.int32)            # 80 rows in groups, 20 past them
    got = jax.jit(lambda l, r, g: cj.ragged_dot(l, r, g, math="fp32"))(lhs, rhs, sizes)
    L, R = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    ref = np.zeros((100, 48))
    o = np.concatenate([[0], np.cumsum(np.asarray(sizes))])
    for g in range(5):
        ref[o[g]:o[g + 1]] = L[o[g]:o[g + 1]] @ R[g]
    assert _rel(got, ref) < 1e-5
    assert not np.asarray(got)[80:].any()
    f = lambda l, r: (cj.ragged_dot(l, r, sizes, math="fp32") ** 2).sum()                  # noqa: E731
    h = lambda l, r: (jax.lax.ragged_dot(l, r, sizes, precision="highest") ** 2).sum()      # noqa: E731
    gl, gr = jax.jit(jax.grad(f, (0, 1)))(lhs, rhs)
    wl, wr = jax.grad(h, (0, 1))(lhs, rhs)
    assert _rel(gl, np.asarray(wl, np.float64)) < 1e-4 and _rel(gr, np.asarray(wr, np.float64)) < 1e-4
    assert not np.asarray(gr)[[1, 3]].any()                 # the empty groups' weights: zero gradients
    # rows past the groups take no part, whatever they hold
    bad = lhs.at[80:].set(jnp.inf)
    gl2, gr2 = jax.jit(jax.grad(f, (0, 1)))(bad, rhs)
    assert np.array_equal(np.asarray(gr2), np.asarray(gr)) and np.isfinite(np.asarray(gl2)).all()


def test_an_error_the_handler_finds_reaches_python_with_cygemms_reason():
    # cygemm.jax refuses a bad argument while JAX traces, so that it never reaches the GPU; a call
    # made straight to the FFI target, past those checks, is refused by the handler on the GPU,
    # and XLA hands its reason back
    from cygemm.jax import calls
    a, b = _rand((8, 16), seed=20), _rand((16, 4), seed=21)
    with pytest.raises(ValueError, match="determinism: expected"):
        jax.jit(lambda a, b: cj.matmul(a, b, determinism="sometimes")).lower(a, b)
    call = calls.ffi_call("cygemm_matmul", jax.ShapeDtypeStruct((8, 4), jnp.float32))
    with pytest.raises(Exception, match="cygemm: ValueError: determinism: expected"):
        jax.jit(lambda a, b: call(a, b, math="tf32", autotune="", determinism="sometimes"))(a, b).block_until_ready()
