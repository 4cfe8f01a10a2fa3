"""cygemm.rowmajor.batch_layout: matmul's batch axes and its actions, decided once before anything runs.

CPU (fake device arrays, through cygemm.matmul's argument checks and cygemm.describe_matmul): the
result's shape as NumPy broadcasts the batch axes (1-D operands included); a zero-length batch
axis broadcasting against 1 but not against more; empty results making no call while K == 0
makes one; length-1 batch axes dropped before the axes merge; a broadcast operand staying put
across the loop of calls; when batches that broadcast b fold into M and when they do not; and,
for a batch of matrices with no unit-stride axis, the operand that matmul would copy named.

GPU: decide_copies' reasons, each the one a capture refuses (out=None, an out of another dtype,
mixed dtypes, an out sharing memory with an input, an out cuBLAS cannot write, an a or b copied),
the same calls run eagerly against float64 with NaN-poisoned outputs, K == 0 batches writing
zeros, and broadcast, folded and copied batches against float64 in strict fp32."""
import re

import numpy as np
import pytest

import cygemm
from cygemm.rowmajor.matmul import describe_matmul
from fakes import FakeDeviceArray, fake_view
from gpu_util import f64, poisoned, rand, rel_err, tol
from refs.cublas import cublas_gemm_model


def _by_role(call):
    """A described call's pointers and batch strides under the caller's names ("a", "b",
    "out"); describe_matmul gives them in cuBLAS's order (swapped for a row-major out)."""
    ptr = {call["cublas_a"]: call["a"], call["cublas_b"]: call["b"], "out": call["c"]}
    stride = {call["cublas_a"]: call["stride_a"], call["cublas_b"]: call["stride_b"], "out": call["stride_c"]}
    return ptr, stride


def _pair(shape):
    return (shape, "float32")


# ------------------------------------------------------------------ CPU: shapes and broadcasting

SHAPES = [
    ((2, 1, 5, 7), (3, 7, 4)),          # a's length-1 axis broadcasts against b's 3
    ((3, 1, 5, 7), (1, 4, 7, 3)),       # each operand broadcasts along one axis
    ((6, 1, 1, 5, 7), (2, 7, 3)),       # b has fewer batch axes than a
    ((1, 1, 5, 7), (4, 1, 7, 3)),
    ((7,), (2, 3, 7, 4)),               # 1-D a: a row, its axis removed from the result
    ((2, 3, 5, 7), (7,)),               # 1-D b: a column, its axis removed
    ((7,), (7,)),                       # a 0-D result
    ((0, 5, 7), (1, 7, 3)),             # an empty batch axis broadcasts against 1
]


@pytest.mark.parametrize("a_shape,b_shape", SHAPES)
def test_the_result_shape_is_numpys_broadcast_and_every_element_is_one_calls(a_shape, b_shape):
    want = np.matmul(np.zeros(a_shape, np.float32), np.zeros(b_shape, np.float32)).shape
    with pytest.raises(ValueError) as e:
        cygemm.matmul(FakeDeviceArray(a_shape), FakeDeviceArray(b_shape, ptr=0x7F10_0000_0000),
                      FakeDeviceArray(want + (2,), ptr=0x7F20_0000_0000))
    assert str(e.value).startswith(f"out: expected shape {want}, got {want + (2,)}")
    calls = describe_matmul(_pair(a_shape), _pair(b_shape))
    # The calls cover the result once: their matrices hold as many elements as it has.
    assert sum(d["batch"] * d["M"] * d["N"] for d in calls) == int(np.prod(want))


def test_a_zero_length_batch_axis_broadcasts_against_one_but_not_against_more():
    with pytest.raises(ValueError):            # NumPy refuses it too
        np.matmul(np.zeros((0, 5, 7)), np.zeros((4, 7, 3)))
    with pytest.raises(ValueError, match=re.escape("b: the batch axes of a (0,) and b (4,) do not broadcast")):
        describe_matmul(_pair((0, 5, 7)), _pair((4, 7, 3)))
    with pytest.raises(ValueError, match="do not broadcast"):
        cygemm.matmul(FakeDeviceArray((4, 5, 7)), FakeDeviceArray((0, 7, 3), ptr=0x7F10_0000_0000))
    assert describe_matmul(_pair((0, 5, 7)), _pair((1, 7, 3))) == []
    assert describe_matmul(_pair((1, 5, 7)), _pair((0, 7, 3))) == []


@pytest.mark.parametrize("a_shape,b_shape", [
    ((2, 0, 5, 7), (7, 3)),     # an empty batch axis of a
    ((2, 3, 5, 7), (7, 0)),     # N == 0, b broadcast
    ((3, 5, 7), (3, 7, 0)),     # N == 0 in a batch
    ((0, 7), (7, 3)),           # M == 0
    ((3, 0, 7), (7, 3)),        # M == 0, b broadcast
    ((4, 0, 7), (7,)),          # M == 0, b 1-D
    ((3, 0, 7), (3, 7, 3)),     # M == 0 in a batch both operands have (out's batch strides are 0)
    ((2, 1, 0, 7), (3, 7, 4)),  # the same, broadcast
])
def test_an_empty_result_makes_no_call(a_shape, b_shape):
    assert describe_matmul(_pair(a_shape), _pair(b_shape)) == []


def test_k_zero_is_not_empty_its_calls_write_the_zero_sums():
    for a_shape, b_shape in [((5, 0), (0, 3)), ((2, 5, 0), (0, 3)), ((2, 5, 0), (2, 0, 3)), ((0,), (0,))]:
        calls = describe_matmul(_pair(a_shape), _pair(b_shape))
        want = np.matmul(np.zeros(a_shape), np.zeros(b_shape)).shape
        assert calls and all(d["K"] == 0 and d["k"] == 0 for d in calls), (a_shape, b_shape, calls)
        assert sum(d["batch"] * d["M"] * d["N"] for d in calls) == int(np.prod(want))


# ------------------------------------------------------------------ CPU: merging, folding, the loop

def test_length_one_batch_axes_are_dropped_before_the_axes_merge():
    """A length-1 axis may have any stride (torch's unsqueeze gives one): it must not stop the
    axes around it merging into one strided batch."""
    buf = np.zeros(100_000, np.float32)
    odd = np.lib.stride_tricks.as_strided(buf[:2 * 3 * 5 * 7], (2, 1, 3, 5, 7), (3 * 35 * 4, 999 * 4, 35 * 4, 28, 4))
    b = buf[1000:1000 + 2 * 3 * 7 * 4].reshape(2, 1, 3, 7, 4)
    c = buf[2000:2000 + 2 * 3 * 5 * 4].reshape(2, 1, 3, 5, 4)
    [call] = describe_matmul(fake_view(buf, odd), fake_view(buf, b), fake_view(buf, c))
    _, stride = _by_role(call)
    assert (call["batch"], call["M"], call["N"], call["K"]) == (6, 5, 4, 7)
    assert stride == {"a": 35, "b": 28, "out": 20}
    # An out of stride 0 along a length-1 axis is no overlap either.
    c0 = np.lib.stride_tricks.as_strided(buf[5000:], (1, 5, 4), (0, 16, 4))
    assert len(describe_matmul(fake_view(buf, buf[:35].reshape(1, 5, 7)), fake_view(buf, b[0, 0, 0]),
                               fake_view(buf, c0))) == 1


def test_an_operand_broadcast_along_the_outer_axis_stays_put_across_the_loop():
    """(3, 1, 5, 7) @ (1, 4, 7, 3): the axes cannot merge (a moves along the first only, b
    along the second only), so the longer one (4) is cuBLAS's batch and the other a loop of 3
    calls: call i is out[i] = a[i, 0] @ b[0], a read with batch stride 0 within each call."""
    rng = np.random.default_rng(5)
    buf = np.zeros(10_000, np.float32)
    a = buf[:3 * 5 * 7].reshape(3, 1, 5, 7)
    b = buf[1000:1000 + 4 * 7 * 3].reshape(1, 4, 7, 3)
    c = buf[2000:2000 + 3 * 4 * 5 * 3].reshape(3, 4, 5, 3)
    a[...], b[...], c[...] = rng.standard_normal(a.shape), rng.standard_normal(b.shape), np.nan
    calls = describe_matmul(fake_view(buf, a), fake_view(buf, b), fake_view(buf, c))
    assert [d["batch"] for d in calls] == [4, 4, 4]
    ptrs = [_by_role(d)[0] for d in calls]
    for i, d in enumerate(calls):
        ptr, stride = _by_role(d)
        assert stride == {"a": 0, "b": 7 * 3, "out": 5 * 3}
        assert ptr["a"] - ptrs[0]["a"] == i * 35 * 4 and ptr["b"] == ptrs[0]["b"]
        assert ptr["out"] - ptrs[0]["out"] == i * 4 * 5 * 3 * 4
        cublas_gemm_model(buf, d, batched=True)
    np.testing.assert_allclose(c, np.matmul(a.astype(np.float64), b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case,want", [
    ("C", (1, 15, 1)),              # (3, 5, 7) @ (7, 4): one (15, 7) @ (7, 4) GEMM
    ("M is 1", (1, 3, 1)),          # (3, 1, 7) @ (7, 4): the rows are the batch's
    ("b is 1-D", (1, 15, 1)),       # (3, 5, 7) @ (7,): one (15, 7) matrix-vector product
    ("a padded", (3, 5, 1)),        # a's matrices not back to back: a strided batch of 3
    ("out F", (3, 5, 1)),           # out's matrices column-major: its rows do not follow
])
def test_batches_that_broadcast_b_fold_into_m_only_where_rows_follow_one_another(case, want):
    """want: (calls' batch, M, number of calls)."""
    rng = np.random.default_rng(7)
    buf = np.zeros(10_000, np.float32)
    a = buf[:3 * 5 * 7].reshape(3, 5, 7)
    b = buf[1000:1028].reshape(7, 4)
    c = buf[2000:2060].reshape(3, 5, 4)
    if case == "M is 1":
        a, c = buf[:21].reshape(3, 1, 7), buf[2000:2012].reshape(3, 1, 4)
    elif case == "b is 1-D":
        b, c = buf[1000:1007], buf[2000:2015].reshape(3, 5)
    elif case == "a padded":
        a = buf[:3 * 6 * 7].reshape(3, 6, 7)[:, :5]
    elif case == "out F":
        c = np.swapaxes(buf[2000:2060].reshape(3, 4, 5), 1, 2)
    a[...], b[...], c[...] = rng.standard_normal(a.shape), rng.standard_normal(b.shape), np.nan
    calls = describe_matmul(fake_view(buf, a), fake_view(buf, b), fake_view(buf, c))
    assert [(d["batch"], d["M"]) for d in calls] == [want[:2]] * want[2]
    _, stride = _by_role(calls[0])
    if want[0] > 1:                 # a strided batch: b, broadcast, at batch stride 0
        assert stride["b"] == 0 and stride["a"] == (42 if case == "a padded" else 35) and stride["out"] == 20
    for d in calls:
        cublas_gemm_model(buf, d, batched=True)
    np.testing.assert_allclose(c, np.matmul(a.astype(np.float64), b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", ["a", "b", "out"])
def test_a_batch_whose_unit_stride_is_on_the_batch_axis_names_the_operand_matmul_copies(which):
    """Every axis of the (4, 5, 7) a reversed in memory: element strides (1, 4, 20), no unit
    stride within a matrix, which no leading dimension describes: matmul copies that operand
    (a temporary for out), and describe_matmul, which describes only in-place calls, says which."""
    buf = np.zeros(10_000, np.float32)
    views = {"a": buf[:140].reshape(4, 5, 7), "b": buf[1000:1084].reshape(4, 7, 3),
             "out": buf[2000:2060].reshape(4, 5, 3)}
    shape = views[which].shape
    views[which] = buf[5000:5000 + int(np.prod(shape))].reshape(shape[::-1]).T
    assert 4 not in views[which].strides[-2:]
    with pytest.raises(ValueError) as e:
        describe_matmul(*(fake_view(buf, views[k]) for k in ("a", "b", "out")))
    msg = str(e.value)
    assert msg.startswith(f"{which}: a layout cuBLAS cannot {'write' if which == 'out' else 'read'} in place")
    assert "matmul would copy it" in msg and f"ascontiguousarray({which})" in msg


# ------------------------------------------------------------------ GPU

cp = None


@pytest.fixture
def gpu():
    global cp
    cp = pytest.importorskip("cupy")


def _t_layout(x):
    """x's values with every axis reversed in memory (unit stride on the first axis)."""
    return cp.ascontiguousarray(x.T).T


def _copy_case(name):
    """(a, b, out or None, the reason a capture refuses, and the whole buffer out is a view of
    when it is one, else None); out holds NaN (a's values when out is a)."""
    a, b = rand(cp, (4, 24, 40)), rand(cp, (40, 16))
    out = poisoned(cp, (4, 24, 16))
    if name == "out=None":
        return a, b, None, "out: out=None allocates the result; pass out=", None
    if name == "out float16":
        return a, b, poisoned(cp, (4, 24, 16), "float16"), ("out: its dtype float16 is not the result's (float32), "
                                                           "so the product goes to a new array first"), None
    if name == "mixed dtypes":
        return rand(cp, (4, 24, 40), "float16"), b, out, "a/b: mixing dtypes casts an operand into a new array", None
    if name == "mixed dtypes, out float16":     # out's reason is met first
        return (rand(cp, (4, 24, 40), "float16"), b, poisoned(cp, (4, 24, 16), "float16"),
                "out: its dtype float16 is not the result's (float32)", None)
    if name == "mixed dtypes, out=None":        # the cast is met before the allocation
        return a, rand(cp, (40, 16), "float16"), None, "a/b: mixing dtypes casts an operand into a new array", None
    if name == "out is a":
        x = rand(cp, (40, 40))
        return x, rand(cp, (40, 40)), x, ("out: it shares memory with a or b, so the product goes to a new array "
                                          "first"), None
    if name == "out [::2, ::2]":
        big = poisoned(cp, (48, 32))
        return a[0], b, big[::2, ::2], ("out: cuBLAS cannot write its layout, so the product goes to a new "
                                        "array first"), big
    if name == "a batch-major":
        return _t_layout(a), b, out, "a: its matrices have no unit-stride axis, so it is copied", None
    if name == "b batch-major":
        b_major = _t_layout(rand(cp, (4, 40, 16)))
        return a, b_major, out, "b: its matrices have no unit-stride axis, so it is copied", None
    raise ValueError(name)


COPY_CASES = ["out=None", "out float16", "mixed dtypes", "mixed dtypes, out float16", "mixed dtypes, out=None",
              "out is a", "out [::2, ::2]", "a batch-major", "b batch-major"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", COPY_CASES)
def test_each_copy_or_temporary_is_refused_in_capture_with_its_reason_and_runs_right_eagerly(gpu, name):
    a, b, out, reason, whole = _copy_case(name)
    ref = np.matmul(f64(cp, a), f64(cp, b))
    s = cp.cuda.Stream(non_blocking=True)
    warm_a, warm_b, warm_out = rand(cp, (8, 8)), rand(cp, (8, 8)), poisoned(cp, (8, 8))
    cp.cuda.Device().synchronize()
    cygemm.matmul(warm_a, warm_b, warm_out, math="fp32", stream=s)      # once eagerly before capturing
    s.synchronize()
    before = None if out is None else out.copy()
    with cygemm.graph.capture(s):
        cygemm.matmul(warm_a, warm_b, warm_out, math="fp32", stream=s)     # an in-place call is captured
        with pytest.raises(cygemm.CaptureError, match=re.escape(reason) + ".*which is not allowed while the "
                                                                          "stream is being captured"):
            cygemm.matmul(a, b, out, math="fp32", stream=s)
    s.synchronize()
    if out is not None:             # refused before anything was enqueued
        np.testing.assert_array_equal(cp.asnumpy(out), cp.asnumpy(before))
    got = cygemm.matmul(a, b, out, math="fp32", stream=s)
    s.synchronize()
    if out is not None:
        assert got is out
    assert got.shape == ref.shape
    limit = tol("float16") if got.dtype == np.float16 else 1e-5
    assert rel_err(cp.asnumpy(got), ref) < limit
    if whole is not None:           # the temporary went into out's elements only
        mask = np.ones(whole.shape, bool)
        mask[::2, ::2] = False
        assert np.isnan(cp.asnumpy(whole)[mask]).all()


@pytest.mark.gpu
def test_k_zero_batches_write_zeros_and_empty_batches_return_their_shape(gpu):
    out = poisoned(cp, (3, 5, 4))
    assert cygemm.matmul(cp.empty((3, 5, 0), cp.float32), cp.empty((0, 4), cp.float32), out) is out
    cp.cuda.Device().synchronize()
    assert (cp.asnumpy(out) == 0).all()
    out = poisoned(cp, (2, 3, 5, 4))
    cygemm.matmul(cp.empty((2, 1, 5, 0), cp.float32), cp.empty((3, 0, 4), cp.float32), out)
    cp.cuda.Device().synchronize()
    assert (cp.asnumpy(out) == 0).all()
    empty = cygemm.matmul(rand(cp, (2, 0, 5, 7)), rand(cp, (7, 3)))
    assert isinstance(empty, cp.ndarray) and empty.shape == (2, 0, 5, 3) and empty.dtype == np.float32
    assert cygemm.matmul(rand(cp, (0, 5, 7)), rand(cp, (1, 7, 3))).shape == (0, 5, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["both broadcast", "b broadcast, a padded", "b broadcast, out F",
                                  "a batch-major, b broadcast", "1-D a, batched b", "batched a, 1-D b"])
def test_broadcast_folded_looped_and_copied_batches_match_float64(gpu, case):
    if case == "both broadcast":
        a, b = rand(cp, (3, 1, 20, 36)), rand(cp, (1, 4, 36, 12))
    elif case == "b broadcast, a padded":
        a, b = rand(cp, (3, 24, 36))[:, :20], rand(cp, (36, 12))
    elif case == "b broadcast, out F":
        a, b = rand(cp, (3, 20, 36)), rand(cp, (36, 12))
    elif case == "a batch-major, b broadcast":
        a, b = _t_layout(rand(cp, (3, 20, 36))), rand(cp, (36, 12))
    elif case == "1-D a, batched b":
        a, b = rand(cp, (36,)), rand(cp, (2, 3, 36, 12))
    else:
        a, b = rand(cp, (2, 3, 20, 36)), rand(cp, (36,))
    ref = np.matmul(f64(cp, a), f64(cp, b))
    out = poisoned(cp, ref.shape)
    if case == "b broadcast, out F":
        out = cp.swapaxes(poisoned(cp, (3, 12, 20)), 1, 2)
    assert cygemm.matmul(a, b, out, math="fp32") is out
    alloc = cygemm.matmul(a, b, math="fp32")
    cp.cuda.Device().synchronize()
    assert alloc.shape == ref.shape
    for got in (out, alloc):
        assert rel_err(cp.asnumpy(got), ref) < 1e-5
