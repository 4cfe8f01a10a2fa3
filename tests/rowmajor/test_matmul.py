"""cygemm.matmul: NumPy's matmul semantics. CPU: the cuBLAS calls it makes (a NumPy model of
cuBLAS runs them on host memory) and its argument errors. GPU: against float64 and
cp.matmul, torch tensors, copies only where needed, capture."""
import itertools

import numpy as np
import pytest

import cygemm
from cygemm.rowmajor.matmul import describe_matmul
from fakes import BASE, FakeDeviceArray, fake_view
from gpu_util import err_vs_scale, f64, poisoned, rand, rel_err
from refs.cublas import cublas_gemm_model


# ------------------------------------------------------------------ CPU: the calls, modelled

def _carve(buf, cursor, shape, order):
    """A view of `shape` in buf: 'C', 'F' (last two axes swapped in memory), 'T' (every axis
    reversed in memory), 'pad' (rows padded), 'bperm' (first two batch axes swapped in memory)."""
    size = int(np.prod(shape))
    start = cursor[0]
    if order == "pad" and shape:
        full = buf[start:start + size * 2].reshape(*shape[:-1], shape[-1] * 2)
        v = full[..., 1:shape[-1] + 1]
        cursor[0] += size * 2 + 5
    else:
        flat = buf[start:start + size]
        cursor[0] += size + 5
        if order == "C" or len(shape) < 2:
            v = flat.reshape(shape)
        elif order == "F":
            v = np.swapaxes(flat.reshape(*shape[:-2], shape[-1], shape[-2]), -1, -2)
        elif order == "T":
            v = flat.reshape(shape[::-1]).T
        elif order == "bperm" and len(shape) >= 4:
            v = np.swapaxes(flat.reshape(shape[1], shape[0], *shape[2:]), 0, 1)
        elif order == "rev" and len(shape) >= 3:
            v = flat.reshape(shape)[::-1]
        elif order == "bcast" and len(shape) >= 3 and shape[0] > 1:
            base = flat[:size // shape[0]].reshape((1,) + shape[1:])
            base[...] = np.random.default_rng(size).standard_normal(base.shape)
            v = np.broadcast_to(base, shape)        # read-only: filled here
        else:
            v = flat.reshape(shape)
    return v


CASES = [
    # a shape, b shape
    ((5, 7), (7, 3)), ((1, 7), (7, 1)), ((7,), (7, 4)), ((6, 7), (7,)), ((7,), (7,)),
    ((4, 5, 7), (7, 3)), ((5, 7), (4, 7, 3)), ((4, 5, 7), (4, 7, 3)), ((4, 5, 7), (1, 7, 3)),
    ((2, 3, 5, 7), (2, 3, 7, 4)), ((2, 1, 5, 7), (1, 3, 7, 4)), ((3, 5, 7), (2, 1, 7, 4)),
    ((2, 3, 5, 7), (7,)), ((7,), (2, 3, 7, 4)), ((2, 0, 5, 7), (7, 3)), ((5, 0), (0, 3)),
    ((8, 3, 5, 7), (8, 1, 7, 4)), ((2, 3, 4, 5, 7), (7, 3)), ((2, 3, 4, 5, 7), (3, 1, 7, 2)),
]
ORDERS = ["C", "F", "T", "pad", "bperm", "rev", "bcast"]
OUT_ORDERS = ["C", "F", "pad", "bperm", "rev"]


def _unit_stride_in_last_two(x):
    """Whether one of x's matrix axes steps one element (or has one element): _carve's layouts
    that have one are one matrix after another with rows or columns contiguous, which BLAS
    reads in place with a leading dimension; "T" of 3 or more axes puts the unit step on the
    first axis instead, which no leading dimension describes."""
    if x.ndim < 2 or x.size == 0:
        return True
    return any(x.shape[i] == 1 or x.strides[i] == x.itemsize for i in (-2, -1))


def _problem(buf, rng, a_shape, b_shape, oa, ob, oc):
    """a and b of random values and a NaN out, carved from buf in the given layouts, and the
    float64 reference."""
    cursor = [0]
    a = _carve(buf, cursor, a_shape, oa)
    b = _carve(buf, cursor, b_shape, ob)
    for x in (a, b):
        if x.flags.writeable:           # a broadcast view was filled by _carve
            x[...] = rng.standard_normal(x.shape)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    c = _carve(buf, cursor, ref.shape, oc)
    c[...] = np.nan
    return a, b, c, ref


def test_describe_matmul_takes_host_arrays_and_descriptions_and_speaks_row_major_first():
    a, b = np.ones((3, 8, 5), np.float32), np.ones((5, 4), np.float32)
    [call] = describe_matmul(a, b)                       # out=None: a C-ordered (3, 8, 4) result
    assert (call["M"], call["N"], call["K"], call["batch"]) == (24, 4, 5, 1)    # batch folded into M
    assert call["swapped"] and (call["cublas_a"], call["cublas_b"]) == ("b", "a") and "b^T @ a^T" in call["why"]
    assert (call["m"], call["n"], call["k"], call["a"]) == (4, 24, 5, b.__array_interface__["data"][0])
    described = describe_matmul(((3, 8, 5), "float32"), ((5, 4), "float32"))
    assert [{k: v for k, v in c.items() if k not in ("a", "b", "c")} for c in described] == \
        [{k: v for k, v in call.items() if k not in ("a", "b", "c")}]
    [col] = describe_matmul(((6, 5), "float32"), ((5, 4), "float32"), np.empty((4, 6), np.float32).T)
    assert not col["swapped"] and (col["m"], col["n"], col["cublas_a"]) == (6, 4, "a")
    with pytest.raises(ValueError, match="b: matmul needs b's second-to-last axis"):
        describe_matmul(((3, 4), "float32"), ((5, 2), "float32"))
    with pytest.raises(ValueError, match="dtypes differ"):
        describe_matmul(((3, 4), "float32"), ((4, 2), "float64"))
    with pytest.raises(TypeError, match="a host \\(NumPy\\) array or tensor, or a \\(shape, dtype\\) pair"):
        describe_matmul([1, 2, 3], ((4, 2), "float32"))


@pytest.mark.parametrize("which", ["a", "b", "out"])
def test_a_matrix_without_a_unit_stride_axis_is_not_read_in_place(which):
    """x[::2, ::2]: no axis of unit stride, which no cuBLAS leading dimension describes."""
    buf = np.zeros(4000, np.float32)
    views = {"a": buf[:400].reshape(20, 20)[::2, ::2], "b": buf[400:500].reshape(10, 10),
             "out": buf[500:600].reshape(10, 10)}
    if which != "a":
        views["a"] = buf[1000:1100].reshape(10, 10)
    views[which] = buf[2000:2400].reshape(20, 20)[::2, ::2]
    with pytest.raises(ValueError, match="copy"):
        describe_matmul(*(fake_view(buf, views[k]) for k in ("a", "b", "out")))


@pytest.mark.parametrize("a_shape,b_shape", CASES)
def test_calls_compute_numpy_matmul_for_every_layout(a_shape, b_shape):
    rng = np.random.default_rng(abs(hash((a_shape, b_shape))) % 2**32)
    for oa, ob, oc in itertools.product(ORDERS, ORDERS, OUT_ORDERS):
        buf = np.zeros(20_000, np.float32)
        a, b, c, ref = _problem(buf, rng, a_shape, b_shape, oa, ob, oc)
        before = buf.copy()
        if not all(_unit_stride_in_last_two(x) for x in (a, b, c)):
            with pytest.raises(ValueError, match="copy"):
                describe_matmul(fake_view(buf, a), fake_view(buf, b), fake_view(buf, c))
            continue
        calls = describe_matmul(fake_view(buf, a), fake_view(buf, b), fake_view(buf, c))
        for d in calls:
            cublas_gemm_model(buf, d, batched=True)
        np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5, err_msg=f"a {oa}, b {ob}, out {oc}: {calls}")
        written = np.zeros(buf.shape, bool)
        if c.size:
            idx = (np.asarray(c.__array_interface__["data"][0] - buf.__array_interface__["data"][0]) // 4
                   + sum(np.arange(n).reshape([-1 if i == j else 1 for j in range(c.ndim)]) * (s // 4)
                         for i, (n, s) in enumerate(zip(c.shape, c.strides))))
            written[np.ravel(idx)] = True
        np.testing.assert_array_equal(buf[~written], before[~written], err_msg="wrote outside out")


def test_contiguous_batches_merge_into_one_strided_batched_call():
    buf = np.zeros(10_000, np.float32)
    a = buf[:2 * 3 * 5 * 7].reshape(2, 3, 5, 7)
    b = buf[300:300 + 2 * 3 * 7 * 4].reshape(2, 3, 7, 4)
    c = buf[500:500 + 2 * 3 * 5 * 4].reshape(2, 3, 5, 4)
    calls = describe_matmul(fake_view(buf, a), fake_view(buf, b), fake_view(buf, c))
    assert len(calls) == 1 and calls[0]["batch"] == 6
    d = calls[0]        # the swap: cuBLAS's A is our b, its B our a
    assert (d["stride_a"], d["stride_b"], d["stride_c"]) == (28, 35, 20)


def test_batches_that_broadcast_b_fold_into_one_tall_gemm():
    buf = np.zeros(10_000, np.float32)
    a = buf[:2 * 3 * 5 * 7].reshape(2, 3, 5, 7)
    b = buf[300:300 + 7 * 4].reshape(7, 4)          # broadcast over both batch axes
    c = buf[400:400 + 2 * 3 * 5 * 4].reshape(2, 3, 5, 4)
    calls = describe_matmul(fake_view(buf, a), fake_view(buf, b), fake_view(buf, c))
    assert len(calls) == 1 and calls[0]["batch"] == 1 and calls[0]["n"] == 30   # (30, 7) @ (7, 4)
    b2 = buf[600:600 + 2 * 7 * 4].reshape(2, 1, 7, 4)   # broadcast over the inner axis only
    calls = describe_matmul(fake_view(buf, a), fake_view(buf, b2), fake_view(buf, c))
    assert [(d["batch"], d["n"]) for d in calls] == [(2, 15)]


def test_batch_axes_that_cannot_merge_loop_without_copies():
    buf = np.zeros(10_000, np.float32)
    a = np.swapaxes(buf[:2 * 3 * 5 * 7].reshape(3, 2, 5, 7), 0, 1)   # (2, 3, 5, 7), axes swapped
    b = buf[300:300 + 7 * 4].reshape(7, 4)
    c = buf[400:400 + 2 * 3 * 5 * 4].reshape(2, 3, 5, 4)
    calls = describe_matmul(fake_view(buf, a), fake_view(buf, b), fake_view(buf, c))
    assert [d["batch"] for d in calls] == [3, 3]
    assert [d["b"] - BASE for d in calls] == [0, 35 * 4]      # cuBLAS's B is our a


def test_the_longest_batch_axis_and_a_reversed_out_compute_numpys_result():
    rng = np.random.default_rng(3)
    buf = np.zeros(40_000, np.float32)
    a = buf[:64 * 8 * 4 * 5].reshape(64, 8, 4, 5)
    b = buf[11_000:11_000 + 64 * 5 * 3].reshape(64, 1, 5, 3)     # broadcast over the inner axis
    a[...], b[...] = rng.standard_normal(a.shape), rng.standard_normal(b.shape)
    base = buf[20_000:20_000 + 64 * 8 * 4 * 3].reshape(64, 8, 4, 3)
    b_outer = buf[12_000:12_000 + 8 * 5 * 3].reshape(1, 8, 5, 3)   # broadcast over the outer axis
    b_outer[...] = rng.standard_normal(b_outer.shape)
    cases = [(a, b_outer, base, [64] * 8),               # the longest axis is cuBLAS's batch
             (a, b, base, [64]),                         # b's broadcast inner axis folds into M
             (a[::-1], b[::-1], base[::-1], [64]),       # all run backwards on axis 0: flipped
             (a, b, base[::-1, ::-1], [1] * 512)]        # signs differ on every axis: one by one
    for x, y, c, batches in cases:
        c[...] = np.nan
        calls = describe_matmul(fake_view(buf, x), fake_view(buf, y), fake_view(buf, c))
        assert [d["batch"] for d in calls] == batches
        assert min(d["stride_b"] for d in calls) >= 0 and min(d["stride_c"] for d in calls) >= 0
        for d in calls:
            cublas_gemm_model(buf, d, batched=True)
        np.testing.assert_allclose(c, np.matmul(x.astype(np.float64), y), rtol=1e-5, atol=1e-5)


def test_an_out_whose_matrices_overlap_is_refused_before_anything_runs():
    buf = np.zeros(10_000, np.float32)
    a = buf[:2 * 4 * 3 * 5].reshape(2, 4, 3, 5)
    b = buf[500:520].reshape(5, 4)
    # out[0, 1] and out[1, 0] are the same memory
    c = np.lib.stride_tricks.as_strided(buf[1000:], (2, 4, 3, 4), (48, 48, 16, 4))
    for bb in (b, buf[600:600 + 2 * 4 * 5 * 4].reshape(2, 4, 5, 4)):    # b broadcast (folds) or not
        with pytest.raises(ValueError, match="out: .*overlap"):
            describe_matmul(fake_view(buf, a), fake_view(buf, bb), fake_view(buf, c))
        with pytest.raises(ValueError, match="out: .*overlap"):
            cygemm.matmul(fake_view(buf, a), fake_view(buf, bb), fake_view(buf, c))
    c0 = np.lib.stride_tricks.as_strided(buf[1000:], (2, 4, 3, 4), (0, 48, 16, 4))
    with pytest.raises(ValueError, match="out: a batch axis of stride 0"):
        cygemm.matmul(fake_view(buf, a), fake_view(buf, b), fake_view(buf, c0))


def test_layouts_that_need_a_copy_or_a_temporary_are_reported():
    buf = np.zeros(10_000, np.float32)
    a = buf[:400].reshape(20, 20)[::2, ::2]         # no unit-stride axis
    b = buf[500:600].reshape(10, 10)
    c = buf[700:800].reshape(10, 10)
    with pytest.raises(ValueError, match="copy"):
        describe_matmul(fake_view(buf, a), fake_view(buf, b), fake_view(buf, c))
    x = buf[1000:1100].reshape(10, 10)
    with pytest.raises(ValueError, match="temporary"):
        describe_matmul(fake_view(buf, x), fake_view(buf, b), fake_view(buf, x))
    wide = buf[2000:2200].reshape(10, 20)           # out = wide[:, 10:], a = wide[:, :10]: disjoint
    calls = describe_matmul(fake_view(buf, wide[:, :10]), fake_view(buf, b), fake_view(buf, wide[:, 10:]))
    assert len(calls) == 1


@pytest.mark.parametrize("a,b,out,exc,words", [
    ((5, 7), (6, 3), None, ValueError, ["b:", "(7)", "(5, 7)", "(6, 3)"]),
    ((7,), (6,), None, ValueError, ["b:", "only"]),
    ((2, 5, 7), (3, 7, 4), None, ValueError, ["batch axes", "(2,)", "(3,)", "broadcast"]),
    ((5, 7), (7, 3), (5, 4), ValueError, ["out:", "(5, 3)", "(5, 4)"]),
    ((7,), (7,), (1,), ValueError, ["out:", "expected shape ()"]),
])
def test_shape_errors_name_the_argument_and_both_shapes(a, b, out, exc, words):
    args = [FakeDeviceArray(a), FakeDeviceArray(b)]
    with pytest.raises(exc) as e:
        cygemm.matmul(*args, None if out is None else FakeDeviceArray(out))
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_dtype_errors_name_the_argument():
    with pytest.raises(TypeError, match="a: expected float16, bfloat16, float32, float64, complex64 or complex128"):
        cygemm.matmul(FakeDeviceArray((2, 2), "<V2"), FakeDeviceArray((2, 2)))     # (no dtype CuPy multiplies)
    with pytest.raises(ValueError, match="a: matmul needs at least 1 dimension"):
        cygemm.matmul(FakeDeviceArray(()), FakeDeviceArray((2, 2)))
    with pytest.raises(ValueError, match="math: expected 'tf32', 'fp32' or 'cupy', got 'fast'"):
        cygemm.matmul(FakeDeviceArray((2, 2)), FakeDeviceArray((2, 2)), math="fast")


# ------------------------------------------------------------------ GPU

cp = None


@pytest.fixture
def gpu():
    global cp
    cp = pytest.importorskip("cupy")


def _tol(dtype, K, math="tf32"):
    if dtype == np.float64:
        return 1e-12
    if dtype == np.float16:
        return 1e-2
    return 1e-5 if math == "fp32" else 1e-3 * max(1.0, np.sqrt(K / 256))


def _ref(a, b):
    return np.matmul(f64(cp, a), f64(cp, b))


def _views(x, how):
    """A device view of x's values in layout `how` (values equal x's)."""
    if how == "C":
        return x
    if how == "F":
        return cp.asfortranarray(x) if x.ndim == 2 else cp.swapaxes(cp.ascontiguousarray(cp.swapaxes(x, -1, -2)), -1, -2)
    if how == "slice":
        big = cp.full(x.shape[:-1] + (x.shape[-1] + 6,), cp.nan, x.dtype)
        big[..., 3:3 + x.shape[-1]] = x
        return big[..., 3:3 + x.shape[-1]]
    if how == "step2":          # no unit-stride axis: matmul copies it
        big = cp.full(x.shape[:-2] + (2 * x.shape[-2], 2 * x.shape[-1]), cp.nan, x.dtype)
        big[..., ::2, ::2] = x
        return big[..., ::2, ::2]
    raise ValueError(how)


GPU_SHAPES = [((64, 48), (48, 80)), ((33,), (33, 17)), ((40, 33), (33,)), ((129,), (129,)),
              ((6, 32, 24), (24, 16)), ((3, 1, 20, 36), (4, 36, 12)), ((5, 16, 300), (5, 300, 8)),
              ((2, 0, 4, 5), (5, 3)), ((4, 0), (0, 6))]


@pytest.mark.gpu
@pytest.mark.parametrize("a_shape,b_shape", GPU_SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("how", ["C", "F", "slice", "step2"])
def test_matmul_matches_float64_and_cupy(gpu, a_shape, b_shape, dtype, how):
    a = rand(cp, a_shape, dtype)
    b = rand(cp, b_shape, dtype)
    av = _views(a, how) if a.ndim >= 2 else a
    bv = _views(b, how) if b.ndim >= 2 else b
    ref = _ref(a, b)
    scale = np.matmul(np.abs(f64(cp, a)), np.abs(f64(cp, b)))
    K = a_shape[-1]
    for math in ("tf32", "fp32"):
        out = poisoned(cp, ref.shape, dtype)
        got = cygemm.matmul(av, bv, out, math=math)
        assert got is out
        alloc = cygemm.matmul(av, bv, math=math)
        assert isinstance(alloc, cp.ndarray) and alloc.shape == ref.shape and alloc.dtype == dtype
        for x in (out, alloc):              # errors against |a| @ |b|: results may cancel to ~0
            assert err_vs_scale(cp.asnumpy(x), ref, scale) < _tol(dtype, K, math)
    if dtype != np.float16:
        assert err_vs_scale(cp.asnumpy(cp.matmul(a, b)), ref, scale) < _tol(dtype, K)   # CuPy meets it too


def _rand_like(shape, dtype):
    return rand(cp, shape, dtype)


@pytest.mark.gpu
def test_out_overlapping_an_input_gives_numpys_result(gpu):
    x = rand(cp, (48, 48), np.float32)
    b = rand(cp, (48, 48), np.float32)
    ref = _ref(x, b)
    cygemm.matmul(x, b, x, math="fp32")           # out is a
    assert rel_err(cp.asnumpy(x), ref) < 1e-5
    y = rand(cp, (48, 48), np.float32)
    a = rand(cp, (48, 48), np.float32)
    ref = _ref(a, y.T)
    cygemm.matmul(a, y.T, y, math="fp32")         # out is b's transpose's base
    assert rel_err(cp.asnumpy(y), ref) < 1e-5


@pytest.mark.gpu
def test_mixed_dtypes_promote_as_cupy(gpu):
    a = rand(cp, (32, 24), np.float16)
    b = rand(cp, (24, 16), np.float32)
    got = cygemm.matmul(a, b, math="fp32")
    assert got.dtype == cp.matmul(a, b).dtype == np.float32
    assert rel_err(cp.asnumpy(got), _ref(a, b)) < 1e-5


@pytest.mark.gpu
def test_math_cupy_follows_cupy_tf32(gpu, monkeypatch):
    """math='cupy' gives cp.matmul's numerics: strict fp32 unless CUPY_TF32=1."""
    a = rand(cp, (256, 1024), np.float32)
    b = rand(cp, (1024, 256), np.float32)
    ref = _ref(a, b)
    monkeypatch.setenv("CUPY_TF32", "0")
    strict = rel_err(cp.asnumpy(cygemm.matmul(a, b, math="cupy")), ref)
    monkeypatch.setenv("CUPY_TF32", "1")
    tf32 = rel_err(cp.asnumpy(cygemm.matmul(a, b, math="cupy")), ref)
    assert strict < 1e-5 < tf32 < 5e-3


@pytest.mark.gpu
def test_matmul_on_a_non_current_stream_and_captured_with_out(gpu):
    s = cp.cuda.Stream(non_blocking=True)
    a = rand(cp, (4, 64, 96), np.float32)
    b = rand(cp, (96, 32), np.float32)
    out = poisoned(cp, (4, 64, 32), np.float32)
    cp.cuda.Device().synchronize()
    cygemm.matmul(a, b, out, math="fp32", stream=s)            # once eagerly, as the README asks
    s.synchronize()
    out[...] = cp.nan
    cp.cuda.Device().synchronize()
    with cygemm.graph.capture(s) as graph:
        cygemm.matmul(a, b, out, math="fp32", stream=s)
        with pytest.raises(cygemm.CaptureError, match="out=None allocates"):
            cygemm.matmul(a, b, stream=s)
    graph.launch(s)
    s.synchronize()
    assert rel_err(cp.asnumpy(out), _ref(a, b)) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype", [
    ("float32", "float64", "float32"), ("float16", "float16", "float32"), ("float64", "float64", "float32"),
    ("float32", "float32", "float64"), ("float32", "float32", "float16")])
def test_an_out_of_another_dtype_gets_the_result_cast_as_numpy_does(gpu, a_dtype, b_dtype, out_dtype):
    """NumPy and cp.matmul compute in the inputs' promoted dtype and cast into out
    (same_kind); so does cygemm.matmul, for CuPy and torch outs alike."""
    a, b = rand(cp, (3, 40, 56), a_dtype), rand(cp, (56, 24), b_dtype)
    out = poisoned(cp, (3, 40, 24), out_dtype)
    assert cygemm.matmul(a, b, out, math="fp32") is out
    computed = np.result_type(a_dtype, b_dtype)
    ref = np.matmul(cp.asnumpy(a).astype(computed), cp.asnumpy(b).astype(computed)).astype(out_dtype)
    exact = np.matmul(f64(cp, a), f64(cp, b))
    bound = max(_tol(computed.type, 56, "fp32"), _tol(np.dtype(out_dtype).type, 56, "fp32"))
    assert rel_err(cp.asnumpy(out), exact) < bound
    assert rel_err(cp.asnumpy(out), ref.astype(np.float64)) < bound
    torch = pytest.importorskip("torch")
    tout = torch.full((3, 40, 24), float("nan"), device="cuda", dtype=getattr(torch, out_dtype))
    assert cygemm.matmul(a, b, tout, math="fp32") is tout
    torch.cuda.synchronize()
    assert rel_err(tout.double().cpu().numpy(), exact) < bound


@pytest.mark.gpu
def test_cupy_bfloat16_matmul_allocates_bfloat16(gpu):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng()
    a = cp.asarray(rng.standard_normal((2, 32, 48)).astype(ml_dtypes.bfloat16))
    b = cp.asarray(rng.standard_normal((48, 16)).astype(ml_dtypes.bfloat16))
    got = cygemm.matmul(a, b)
    assert got.dtype == np.dtype(ml_dtypes.bfloat16) and got.shape == (2, 32, 16)
    exact = np.matmul(cp.asnumpy(a).astype(np.float64), cp.asnumpy(b).astype(np.float64))
    assert rel_err(cp.asnumpy(got).astype(np.float64), exact) < 2e-2
    out = cp.asarray(np.full((2, 32, 16), np.nan, np.float32))         # and cast into float32
    cygemm.matmul(a, b, out)
    assert rel_err(cp.asnumpy(out), exact) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_tensors_in_torch_tensors_out(gpu, dtype):
    torch = pytest.importorskip("torch")
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(3, 40, 56, device="cuda", generator=g).to(dt)
    b = torch.randn(56, 24, device="cuda", generator=g).to(dt)
    got = cygemm.matmul(a, b, math="fp32")
    assert isinstance(got, torch.Tensor) and got.dtype == dt and got.shape == (3, 40, 24)
    ref = torch.matmul(a.double(), b.double())
    bound = 1e-5 if dtype == "float32" else 1e-2
    assert ((got.double() - ref).norm() / ref.norm()).item() < bound
    assert ((got.double() - torch.matmul(a, b).double()).norm() / ref.norm()).item() < bound
    out = torch.full((3, 40, 24), float("nan"), device="cuda", dtype=dt)
    assert cygemm.matmul(a.transpose(1, 2).contiguous().transpose(1, 2), b, out, math="fp32") is out
    assert ((out.double() - ref).norm() / ref.norm()).item() < bound


@pytest.mark.gpu
def test_mixed_libraries_and_dtypes_give_a_torch_result_and_fill_a_cupy_out(gpu):
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(24, 40, device="cuda", generator=g)
    b = rand(cp, (40, 16), np.float16)
    ref = a.double().cpu().numpy() @ f64(cp, b)
    got = cygemm.matmul(a, b, math="fp32")                       # b is cast to float32 (a copy)
    torch.cuda.synchronize()
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert rel_err(got.cpu().numpy(), ref) < 1e-5
    x = rand(cp, (40, 40), np.float32)
    xt = torch.as_tensor(x, device="cuda")                       # the same memory as x
    ref2 = f64(cp, x) @ f64(cp, x)
    cygemm.matmul(xt, xt, x, math="fp32")                        # a CuPy out that is both inputs
    torch.cuda.synchronize()
    cp.cuda.Device().synchronize()
    assert rel_err(cp.asnumpy(x), ref2) < 1e-5


@pytest.mark.gpu
def test_four_d_batches_with_broadcast_reversed_and_permuted_layouts_match_cupy(gpu):
    a = rand(cp, (3, 8, 20, 24), np.float32)
    b = rand(cp, (8, 1, 24, 12), np.float32)                    # (3, 8) x (8, 1): no broadcast match
    bb = rand(cp, (1, 8, 24, 12), np.float32)
    ref = _ref(a, bb)
    for out in (poisoned(cp, (3, 8, 20, 12)), poisoned(cp, (3, 8, 20, 12))[::-1],
                cp.swapaxes(poisoned(cp, (8, 3, 20, 12)), 0, 1)):
        got = cygemm.matmul(a, bb, out, math="fp32")
        assert got is out
        assert rel_err(cp.asnumpy(out), ref) < 1e-5
    ap = cp.swapaxes(cp.ascontiguousarray(cp.swapaxes(a, 0, 1)), 0, 1)   # batch axes permuted in memory
    assert rel_err(cp.asnumpy(cygemm.matmul(ap, bb[:, ::-1], math="fp32")), _ref(a, bb[:, ::-1])) < 1e-5
    with pytest.raises(ValueError, match="do not broadcast"):
        cygemm.matmul(a, b)


from hypothesis import given, settings, strategies as st  # noqa: E402


@st.composite
def _matmul_problem(draw):
    nb = draw(st.integers(0, 3))
    batch = [draw(st.integers(1, 4)) for _ in range(nb)]
    a_batch = [x if draw(st.booleans()) else 1 for x in batch][draw(st.integers(0, nb)):]
    b_batch = [x if draw(st.booleans()) else 1 for x in batch][draw(st.integers(0, nb)):]
    m, k, n = (draw(st.integers(1, 6)) for _ in range(3))
    a_shape = (k,) if draw(st.integers(0, 5)) == 0 else tuple(a_batch) + (m, k)
    b_shape = (k,) if draw(st.integers(0, 5)) == 0 else tuple(b_batch) + (k, n)
    orders = st.sampled_from(ORDERS)
    return a_shape, b_shape, draw(orders), draw(orders), draw(st.sampled_from(OUT_ORDERS))


@settings(max_examples=300, deadline=None)
@given(_matmul_problem())
def test_property_calls_compute_numpy_matmul(problem):
    buf = np.zeros(40_000, np.float32)
    a, b, c, ref = _problem(buf, np.random.default_rng(0), *problem)
    if not all(_unit_stride_in_last_two(x) for x in (a, b, c)):
        return
    for d in describe_matmul(fake_view(buf, a), fake_view(buf, b), fake_view(buf, c)):
        cublas_gemm_model(buf, d, batched=True)
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5, err_msg=str(problem))
