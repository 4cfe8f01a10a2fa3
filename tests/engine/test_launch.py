"""cygemm.engine.launch: enqueueing one GEMM, cublasGemmEx / cublasGemmStridedBatchedEx (their _64
forms past 2**31 - 1) or cublasLtMatmul by a plan (cdef: tested through cygemm.gemm,
gemm_strided_batched, GemmPlan, forward_into and scaled_matmul).

CPU: describe_gemm reports the 64-bit API exactly where launch takes it, past 2**31 - 1 in any
size, leading dimension or batch count (2**31 - 1 itself is 32-bit). GPU: a leading dimension
past 2**31 - 1 alone (a few rows 8 GiB apart), plain and strided batched, computes right; alpha
and beta reach both routes in the problem's scale type (float, double, complex float, complex
double); the bias, Z and FP8 scale pointers of the call are the ones used when calls of one
problem share a plan (the first call's buffers are left as they were). Results against float64
on seeded inputs, outputs NaN-poisoned first."""
import numpy as np
import pytest

import cygemm
from cygemm.engine import plans, tuning
from fakes import BASE, FakeDeviceArray as F
from gpu_util import f64, poisoned, rand, rel_err
from refs import activations

INT32_MAX = 2**31 - 1


# ------------------------------------------------------------------ CPU: where the 64-bit API is taken

@pytest.mark.parametrize("row_stride", [INT32_MAX, INT32_MAX + 1])
def test_a_leading_dimension_alone_past_int32_takes_the_64bit_api(row_stride):
    """A's rows `row_stride` elements apart (cuBLAS's ldb of the swapped call), every size small."""
    d = cygemm.describe_gemm(F((2, 64), strides=(4 * row_stride, 4)), F((64, 48), ptr=BASE + 2**40),
                             F((2, 48), ptr=BASE + 2**41))
    assert (d["m"], d["n"], d["k"], d["lda"], d["ldb"], d["ldc"]) == (48, 2, 64, 48, row_stride, 48)
    assert d["int64_api"] is (row_stride > INT32_MAX) and not d["strided_batched"]


@pytest.mark.parametrize("batch", [INT32_MAX, INT32_MAX + 1])
def test_a_batch_count_alone_past_int32_takes_the_64bit_api(batch):
    d = cygemm.describe_gemm(F((batch, 1, 1), strides=(4, 4, 4)), F((1, 1), ptr=BASE + 2**40),
                             F((batch, 1, 1), ptr=BASE + 2**41), batched=True)
    assert (d["m"], d["n"], d["k"], d["batch"]) == (1, 1, 1, batch) and d["strided_batched"]
    assert d["int64_api"] is (batch > INT32_MAX)


def test_k_alone_past_int32_and_a_strided_batch_with_a_long_row_take_the_64bit_api():
    d = cygemm.describe_gemm(F((1, 2**31)), F((2**31, 1), strides=(4, 4), ptr=BASE + 2**40),
                             F((1, 1), ptr=BASE + 2**41))
    assert d["k"] == 2**31 and d["int64_api"]
    row = 2**31 + 64
    d = cygemm.describe_gemm(F((2, 2, 64), strides=(4 * 64, 4 * row, 4)), F((2, 64, 48), ptr=BASE + 2**40),
                             F((2, 2, 48), ptr=BASE + 2**41), batched=True)
    assert (d["ldb"], d["stride_b"], d["batch"]) == (row, 64, 2) and d["strided_batched"] and d["int64_api"]
    small = cygemm.describe_gemm(F((2, 2, 64)), F((2, 64, 48), ptr=BASE + 2**40), F((2, 2, 48), ptr=BASE + 2**41),
                                 batched=True)
    assert not small["int64_api"]


# ------------------------------------------------------------------ GPU

cp = None


@pytest.fixture
def gpu():
    """CuPy; forced routes undone after."""
    global cp
    cp = pytest.importorskip("cupy")
    forced = tuning.forced_routes()
    tuning.force_routes()
    yield
    tuning.force_routes(**forced)


ROW = 2**31 + 64          # elements between two rows of A: past INT32_MAX


def _rows_far_apart(batch, M, K):
    """A (batch, M, K) float32 view whose rows lie ROW elements apart (8 GiB) and whose matrices
    start K elements apart, in one buffer; only its rows are filled (seeded)."""
    need = (ROW * (M - 1) + K * batch) * 4 + 2**30
    if cp.cuda.Device().mem_info[0] < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory")
    buf = cp.empty(ROW * (M - 1) + K * batch, cp.float32)
    view = cp.lib.stride_tricks.as_strided(buf, shape=(batch, M, K), strides=(4 * K, 4 * ROW, 4))
    view[...] = rand(cp, (batch, M, K))
    return buf, view


@pytest.mark.gpu
def test_a_leading_dimension_past_int32_computes_right_through_the_64bit_gemmex(gpu):
    M, K, N = 2, 64, 48
    buf, A3 = _rows_far_apart(1, M, K)
    A = A3[0]
    B, C = rand(cp, (K, N)), poisoned(cp, (M, N))
    d = cygemm.describe_gemm(A, B, C)
    assert d["ldb"] == ROW and d["int64_api"]
    cygemm.gemm(A, B, C, math="fp32")
    cp.cuda.Device().synchronize()
    assert rel_err(C.get(), f64(cp, A) @ f64(cp, B)) < 1e-5
    del buf, A3, A
    cp.get_default_memory_pool().free_all_blocks()


@pytest.mark.gpu
def test_a_strided_batch_with_a_leading_dimension_past_int32_computes_right(gpu):
    nb, M, K, N = 2, 2, 64, 48
    buf, A = _rows_far_apart(nb, M, K)
    B, C = rand(cp, (nb, K, N)), poisoned(cp, (nb, M, N))
    d = cygemm.describe_gemm(A, B, C, batched=True)
    assert d["ldb"] == ROW and d["strided_batched"] and d["int64_api"]
    cygemm.gemm_strided_batched(A, B, C, math="fp32")
    cp.cuda.Device().synchronize()
    assert rel_err(C.get(), np.matmul(f64(cp, A), f64(cp, B))) < 1e-5
    C2 = poisoned(cp, (nb, M, N))
    W = rand(cp, (K, N))                            # one weight for the batch: its stride is 0
    cygemm.gemm_strided_batched(A, W, C2, math="fp32")
    cp.cuda.Device().synchronize()
    assert rel_err(C2.get(), np.matmul(f64(cp, A), f64(cp, W))) < 1e-5
    del buf, A
    cp.get_default_memory_pool().free_all_blocks()


# (dtype, alpha, beta, bound): the scale types float, double, complex float and complex double
SCALARS = [("float32", 0.75, -0.5, 1e-5), ("float16", 0.75, -0.5, 1e-2), ("float64", 1 / 3, -0.7, 1e-12),
           ("complex64", 0.9 - 0.7j, 0.8 - 0.6j, 2e-5), ("complex128", 0.9 - 0.7j, 0.8 - 0.6j, 1e-12)]


def _values(shape, dtype):
    x = rand(cp, shape, "float64")
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rand(cp, shape, "float64")
    return x.astype(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["cublasGemmEx", "cublasLt"])
@pytest.mark.parametrize("dtype, alpha, beta, bound", SCALARS)
def test_alpha_and_beta_reach_each_route_in_the_problems_scale_type(gpu, route, dtype, alpha, beta, bound):
    M, K, N = 48, 40, 56
    A, B, C0 = _values((M, K), dtype), _values((K, N), dtype), _values((M, N), dtype)
    C = C0.copy()
    tuning.force_routes(gemm=route)
    with cygemm.GemmPlan(A, B, C, alpha=alpha, beta=beta, math="fp32") as p:
        assert p.plan().route == route
        p.execute()
        cp.cuda.Device().synchronize()
    want = alpha * (cp.asnumpy(A).astype(np.complex128) @ cp.asnumpy(B)) + beta * cp.asnumpy(C0)
    if np.dtype(dtype).kind != "c":
        want = want.real
    got = cp.asnumpy(C)
    assert not np.isnan(got).any()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < bound


FORWARD = [("epilogue", "relu", False), ("gelu_aux", "gelu", True), ("bias_epilogue_kernel", "silu", False)]


@pytest.mark.gpu
@pytest.mark.parametrize("route, act, save_z", FORWARD)
def test_a_shared_plan_runs_each_call_with_that_calls_bias_and_z(gpu, route, act, save_z):
    """Calls of one problem share a plan; the bias (and GELU's Z) pointers are set in its
    descriptor for every call: the second call reads its own bias and writes its own Z, and the
    first call's outputs keep their bits."""
    from cygemm.gemm_ops import forward_into
    tuning.force_routes(forward=route)
    M, K, N = 128, 96, 64                        # N a multiple of 8: GELU_AUX's rule for Z
    B = rand(cp, (K, N))
    results = []
    for call in range(2):
        A, bias = rand(cp, (M, K)), rand(cp, (N,))
        Y, Z = poisoned(cp, (M, N)), (poisoned(cp, (M, N)) if save_z else None)
        n_plans = plans.plan_cache_size()
        forward_into(A, B, Y, bias, act=act, save_z=save_z, z_out=Z, math="fp32")
        cp.cuda.Device().synchronize()
        if call:
            assert plans.plan_cache_size() == n_plans, "the second call made a plan of its own"
        z = f64(cp, A) @ f64(cp, B) + f64(cp, bias)
        assert rel_err(Y.get(), activations.act(act, z)) < 1e-5, call
        if save_z:
            assert rel_err(Z.get(), z) < 1e-5, call
        results.append((Y, Z, Y.get(), None if Z is None else Z.get()))
    Y1, Z1, y1, z1 = results[0]
    assert np.array_equal(Y1.get().view(np.uint32), y1.view(np.uint32)), "the second call wrote the first's out"
    if save_z:
        assert np.array_equal(Z1.get().view(np.uint32), z1.view(np.uint32)), "the second call wrote the first's Z"


@pytest.mark.gpu
def test_fp8_calls_that_share_a_plan_read_their_own_scales(gpu):
    cc = cp.cuda.Device().compute_capability
    if int(cc) < 89:
        pytest.skip(f"FP8 GEMMs need compute capability 8.9 or newer, this GPU has {cc}")
    from cygemm import fp8
    from refs import fp8 as fp8_ref
    M, K, N = 128, 256, 64
    rng = np.random.default_rng(20240611)
    w_codes = fp8_ref.to_codes(rng.standard_normal((N, K)) * 4, "e4m3")
    w = cp.asarray(w_codes)
    outs = []
    for scale_a, scale_b in ((0.5, 2.0), (0.25, 3.0)):
        a_codes = fp8_ref.to_codes(rng.standard_normal((M, K)) * 4, "e4m3")
        sa, sb = cp.asarray([scale_a], cp.float32), cp.asarray([scale_b], cp.float32)
        out = cp.full((M, N), cp.nan, cp.float32)
        n_plans = plans.plan_cache_size()
        fp8.scaled_matmul(cp.asarray(a_codes), w.T, sa, sb, out=out, format_a="e4m3", format_b="e4m3")
        cp.cuda.Device().synchronize()
        if outs:
            assert plans.plan_cache_size() == n_plans, "the second call made a plan of its own"
        ref = scale_a * scale_b * (fp8_ref.decode(a_codes, "e4m3") @ fp8_ref.decode(w_codes, "e4m3").T)
        assert rel_err(cp.asnumpy(out), ref) < 4e-4
        outs.append((out, cp.asnumpy(out)))
    first, kept = outs[0]
    assert np.array_equal(cp.asnumpy(first).view(np.uint32), kept.view(np.uint32))
