"""cygemm.engine.small_batched: batched GEMMs of small matrices by cygemm's kernel or cuBLAS.

CPU: which problems the kernel takes (dtypes, sizes, alignment) and which the fixed rule gives
it; describe_gemm and describe_matmul name the route; forcing and the determinism modes.

GPU: every dtype (float16, bfloat16, float32, float64, complex64, complex128) through
gemm_strided_batched with the kernel forced, each of its tiles in turn, against float64 references on fresh random inputs
with NaN-poisoned outputs: square and non-square sizes up to 64, every transpose (conjugate
transposes for complex), C- and F-ordered operands, broadcast operands (batch stride 0 and 2-D),
sliced (non-packed) batches, misaligned starts, alpha and beta. The kernel's launch counter shows
it ran. Batched matmul takes the route by the rule; a matrix's bits do not depend on the batch
it is in; graph capture replays it; an out of the wrong shape still raises before anything runs.
"""
import numpy as np
import pytest

import cygemm
from cygemm.engine import small_batched, tuning
from cygemm.engine.dtypes import BY_ANY_NAME
from gpu_util import poisoned, rand

# cudaDataType numbers, from the dtype table
F32, F64, F16, BF16, C64, C128 = (BY_ANY_NAME[n]["cuda"] for n in ("float32", "float64", "float16", "bfloat16",
                                                                  "complex64", "complex128"))


@pytest.fixture
def kernel_forced():
    tuning.force_routes(small_batched="kernel")
    yield
    tuning.force_routes()


@pytest.fixture(params=small_batched.TILES)
def tile(request):
    """The kernel forced, with each of its tiles in turn."""
    tuning.force_routes(small_batched="kernel")
    small_batched.force_tile(request.param)
    yield request.param
    small_batched.force_tile()
    tuning.force_routes()


@pytest.fixture
def unforced():
    tuning.force_routes()
    yield
    tuning.force_routes()


# ---------------------------------------------------------------- CPU

@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16, C64, C128])
def test_kernel_takes_small_problems_of_every_dtype(dtype):
    assert small_batched.kernel_fits(dtype, 0, 0, 4, 4, 4, 100) == (True, True)
    assert small_batched.kernel_fits(dtype, 1, 2, 3, 5, 7, 100)[0]


def test_kernel_refuses_what_it_cannot_take():
    assert small_batched.kernel_fits(F32, 0, 0, 65, 4, 4, 100) == (False, False)     # past 64
    assert small_batched.kernel_fits(C128, 0, 0, 64, 64, 64, 100)[0] is False        # past shared memory
    assert small_batched.kernel_fits(3, 0, 0, 4, 4, 4, 100)[0] is False              # int8 (CUDA_R_8I)
    assert small_batched.kernel_fits(F32, 0, 0, 4, 4, 0, 100)[0] is False            # K = 0


def test_fixed_rule_keeps_cublas_where_cublas_was_faster():
    rule = lambda *args, **kw: small_batched.kernel_fits(*args, **kw)[1]     # noqa: E731
    assert rule(F32, 0, 0, 2, 2, 2, 10) and rule(F16, 0, 0, 16, 16, 16, 10) and rule(F64, 0, 0, 8, 32, 8, 10)
    assert not rule(F32, 0, 0, 24, 24, 24, 10) and not rule(F32, 0, 0, 64, 64, 64, 10)
    assert not rule(F32, 0, 0, 16, 64, 16, 10)
    assert rule(C64, 0, 0, 16, 16, 16, 10) and not rule(C128, 0, 0, 16, 16, 16, 10) and rule(C128, 0, 0, 8, 8, 8, 10)
    assert rule(F32, 1, 0, 8, 8, 8, 10) and not rule(F32, 1, 0, 12, 12, 12, 10)     # transposed A
    assert rule(F32, 1, 0, 16, 16, 16, 10) and not rule(F32, 1, 0, 16, 16, 8, 10)
    assert rule(F32, 0, 1, 16, 16, 16, 10)


def test_describe_names_the_route(unforced):
    pair = lambda *shape: (shape, "float32")      # noqa: E731
    assert cygemm.describe_gemm(pair(10, 4, 4), pair(10, 4, 4), batched=True)["route"] == "kernel"
    assert cygemm.describe_gemm(pair(10, 64, 64), pair(10, 64, 64), batched=True)["route"] == "cublas"
    assert cygemm.describe_gemm(pair(4, 4), pair(4, 4))["route"] == "cublas"           # one matrix
    (call,) = cygemm.describe_matmul(pair(10, 3, 3), pair(10, 3, 3))
    assert call["route"] == "kernel" and "shared memory" in call["kernels"]
    tuning.force_routes(small_batched="cublas")
    assert cygemm.describe_gemm(pair(10, 4, 4), pair(10, 4, 4), batched=True)["route"] == "cublas"


def test_force_tile_names_the_tiles():
    with pytest.raises(ValueError, match="tile: expected one of"):
        small_batched.force_tile("8x8")
    small_batched.force_tile("vector")
    small_batched.force_tile()


def test_batch_invariant_mode_keeps_the_family(unforced):
    pair = lambda *shape: (shape, "float32")      # noqa: E731
    old = cygemm.set_options(determinism="batch_invariant")
    try:
        assert cygemm.describe_gemm(pair(10, 4, 4), pair(10, 4, 4), batched=True)["route"] == "cublas"
    finally:
        cygemm.set_options(**old)
    old = cygemm.set_options(determinism="run_to_run")
    try:
        assert cygemm.describe_gemm(pair(10, 4, 4), pair(10, 4, 4), batched=True)["route"] == "kernel"
    finally:
        cygemm.set_options(**old)


# ---------------------------------------------------------------- GPU

def _host(x):
    if hasattr(x, "cpu"):
        return x.float().cpu().numpy() if str(x.dtype) == "torch.bfloat16" else x.cpu().numpy()
    return x.get()


def _operands(cp, dtype, shapes, rng):
    """Random device arrays of `shapes` (bfloat16: torch tensors)."""
    out = []
    for shape in shapes:
        x = rng.standard_normal(shape)
        if np.dtype(dtype if dtype != "bfloat16" else "float32").kind == "c":
            x = x + 1j * rng.standard_normal(shape)
        if dtype == "bfloat16":
            import torch
            out.append(torch.tensor(x, dtype=torch.bfloat16, device="cuda"))
        else:
            out.append(cp.asarray(x.astype(dtype)))
    return out


def _nan_out(cp, dtype, shape):
    if dtype == "bfloat16":
        import torch
        return torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    return cp.full(shape, np.nan, dtype=dtype)


def _op(x, t):
    x = np.asarray(x)
    if t == "N":
        return x
    x = np.swapaxes(x, -1, -2)
    return x.conj() if t == "H" else x


BOUND = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 2e-6, "complex64": 2e-6, "float64": 1e-14,
         "complex128": 1e-14}
DTYPES = ["float16", "bfloat16", "float32", "float64", "complex64", "complex128"]
SHAPES = [(2, 2, 2), (3, 3, 3), (4, 4, 16), (5, 7, 3), (8, 8, 8), (16, 16, 16), (16, 64, 16), (32, 32, 32),
          (1, 9, 4), (33, 2, 64), (24, 8, 12), (8, 32, 4)]


def _check(got, want, dtype, k):
    got = np.asarray(got, dtype=np.complex128)
    assert not np.isnan(got).any(), "elements left unwritten"
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < BOUND[dtype] * max(1.0, (k / 16) ** 0.5), err


def _transposes(dtype):
    return ("N", "T", "H") if np.dtype(dtype if dtype != "bfloat16" else "float32").kind == "c" else ("N", "T")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_kernel_every_dtype_and_transpose(tile, dtype, m, n, k):
    import cupy as cp
    rng = np.random.default_rng(m * 10007 + n * 101 + k)
    batch = 37
    for ta in _transposes(dtype):
        for tb in _transposes(dtype):
            a_shape = (batch, k, m) if ta != "N" else (batch, m, k)
            b_shape = (batch, n, k) if tb != "N" else (batch, k, n)
            A, B = _operands(cp, dtype, [a_shape, b_shape], rng)
            out = _nan_out(cp, dtype, (batch, m, n))
            before = small_batched.kernel_launches()
            cygemm.gemm_strided_batched(A, B, out, trans_a=ta, trans_b=tb, math="fp32")
            assert small_batched.kernel_launches() == before + 1, (ta, tb)
            want = _op(_host(A).astype(np.complex128), ta) @ _op(_host(B).astype(np.complex128), tb)
            _check(_host(out), want, dtype, k)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "complex128"])
@pytest.mark.parametrize("layout", ["f_order", "broadcast_a", "broadcast_b", "two_d_b", "sliced", "misaligned",
                                    "strided_out"])
@pytest.mark.parametrize("m, n, k", [(5, 6, 7), (8, 4, 12)])       # (the second the vector tile's too)
def test_kernel_layouts(tile, dtype, layout, m, n, k):
    import cupy as cp
    rng = np.random.default_rng(7)
    batch = 50
    A, B = _operands(cp, dtype, [(batch, m, k), (batch, k, n)], rng)
    out = _nan_out(cp, dtype, (batch, m, n))
    target = out
    if layout == "f_order":
        A = cp.ascontiguousarray(A.transpose(0, 2, 1)).transpose(0, 2, 1)     # each matrix F-ordered
        B = cp.ascontiguousarray(B.transpose(0, 2, 1)).transpose(0, 2, 1)
    elif layout == "broadcast_a":
        A = cp.broadcast_to(A[:1], A.shape)
    elif layout == "broadcast_b":
        B = cp.broadcast_to(B[:1], B.shape)
    elif layout == "two_d_b":
        B = B[0]
    elif layout == "sliced":                                       # gaps between and inside matrices
        bigA, bigB = _operands(cp, dtype, [(batch, m + 3, k + 2), (batch, k + 1, n + 5)], rng)
        A, B = bigA[:, 1:m + 1, 2:k + 2], bigB[:, :k, 3:n + 3]
    elif layout == "misaligned":                                   # starts off 16 bytes
        flatA, flatB = _operands(cp, dtype, [(batch * m * k + 1,), (batch * k * n + 1,)], rng)
        A, B = flatA[1:].reshape(batch, m, k), flatB[1:].reshape(batch, k, n)
    elif layout == "strided_out":
        big = _nan_out(cp, dtype, (batch, m + 2, n + 3))
        target = big[:, 1:m + 1, :n]
    before = small_batched.kernel_launches()
    alpha, beta = (0.5, 0.0) if layout != "strided_out" else (1.5, 0.0)
    cygemm.gemm_strided_batched(A, B, target, alpha=alpha, beta=beta, math="fp32")
    assert small_batched.kernel_launches() == before + 1
    want = alpha * (_host(A).astype(np.complex128) @ _host(B).astype(np.complex128))
    _check(_host(target), np.broadcast_to(want, (batch, m, n)), dtype, k)
    if layout == "strided_out":                                    # nothing written past the view
        rest = _host(out if target is out else big)
        assert np.isnan(rest[:, 0]).all() and np.isnan(rest[:, :, n:]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "bfloat16"])
@pytest.mark.parametrize("m, n, k", [(4, 3, 5), (8, 4, 12)])
def test_kernel_alpha_beta(tile, dtype, m, n, k):
    import cupy as cp
    rng = np.random.default_rng(3)
    batch = 64
    A, B, C = _operands(cp, dtype, [(batch, m, k), (batch, k, n), (batch, m, n)], rng)
    c0 = _host(C).astype(np.complex128)
    complex_ = np.dtype(dtype if dtype != "bfloat16" else "float32").kind == "c"
    alpha, beta = (0.75 - 0.5j, 1.25 + 0.25j) if complex_ else (0.75, -1.25)
    cygemm.gemm_strided_batched(A, B, C, alpha=alpha, beta=beta, math="fp32")
    want = alpha * (_host(A).astype(np.complex128) @ _host(B).astype(np.complex128)) + beta * c0
    _check(_host(C), want, dtype, k)


@pytest.mark.gpu
def test_matmul_takes_the_route_by_the_rule(unforced):
    import cupy as cp
    a, b = rand(cp, (1000, 4, 4)), rand(cp, (1000, 4, 4))
    out = poisoned(cp, (1000, 4, 4))
    before = small_batched.kernel_launches()
    cygemm.matmul(a, b, out=out, math="fp32")
    assert small_batched.kernel_launches() == before + 1
    _check(out.get(), a.get().astype(np.float64) @ b.get(), "float32", 4)
    # Broadcast over an outer axis: one strided batch per outer index, each by the kernel.
    a4, b3 = rand(cp, (3, 20, 2, 2)), rand(cp, (20, 2, 2))
    before = small_batched.kernel_launches()
    got = cygemm.matmul(a4, b3, math="fp32")
    assert small_batched.kernel_launches() > before
    _check(got.get(), a4.get().astype(np.float64) @ b3.get(), "float32", 2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_bits_do_not_depend_on_the_batch(unforced, dtype):
    import cupy as cp
    a, b = rand(cp, (4096, 8, 8), dtype), rand(cp, (4096, 8, 8), dtype)
    whole = cygemm.gemm_strided_batched(a, b, math="fp32")
    part = cygemm.gemm_strided_batched(a[1000:1003], b[1000:1003], math="fp32")
    assert (whole[1000:1003].view(cp.uint16 if dtype == "float16" else cp.uint32)
            == part.view(cp.uint16 if dtype == "float16" else cp.uint32)).all()


@pytest.mark.gpu
def test_graph_capture_replays_the_kernel(kernel_forced):
    import cupy as cp
    a, b = rand(cp, (500, 3, 3)), rand(cp, (500, 3, 3))
    out = poisoned(cp, (500, 3, 3))
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        cygemm.gemm_strided_batched(a, b, out, stream=s, math="fp32")      # warm-up
        s.begin_capture()
        cygemm.gemm_strided_batched(a, b, out, stream=s, math="fp32")
        graph = s.end_capture()
        out.fill(cp.nan)
        graph.launch(s)
    s.synchronize()
    _check(out.get(), a.get().astype(np.float64) @ b.get(), "float32", 3)


@pytest.mark.gpu
def test_bad_out_raises_before_the_kernel(kernel_forced):
    import cupy as cp
    a, b = rand(cp, (10, 3, 3)), rand(cp, (10, 3, 3))
    out = poisoned(cp, (10, 3, 4))
    before = small_batched.kernel_launches()
    with pytest.raises(ValueError, match="out"):
        cygemm.gemm_strided_batched(a, b, out)
    assert small_batched.kernel_launches() == before and cp.isnan(out).all()


@pytest.mark.gpu
def test_the_cublas_route_is_timed_running_what_it_runs():
    """A batch large enough to be timed: both routes run on the call's operands, and the "cublas"
    route timed is what the call would run on it, a cuBLASLt plan for a problem this large (made
    while the routes are timed, whichever wins), not a bare strided-batched call."""
    import cupy as cp
    from cygemm.engine import plans
    from tuning_util import isolated_tuning
    n = 1 << 17                                 # (16^3 x 2^17 = 2^29 multiply-adds: timed)
    a, b = rand(cp, (n, 16, 16)), rand(cp, (n, 16, 16))
    out = poisoned(cp, (n, 16, 16))
    with isolated_tuning():
        plans.clear_plan_cache()
        cygemm.gemm_strided_batched(a, b, out, math="fp32")
        assert plans.plan_cache_size() >= 1, "the cublas route was timed without the plan it runs"
    _check(out[:64].get(), a[:64].get().astype(np.float64) @ b[:64].get(), "float32", 16)
    assert not cp.isnan(out).any()
