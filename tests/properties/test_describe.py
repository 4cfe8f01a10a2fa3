"""CPU: the one describe_* contract. describe_gemm, describe_matmul, fp8.describe_scaled_matmul and
describe_grouped take device arrays (here: fakes with __cuda_array_interface__), NumPy arrays in
host memory and (shape, dtype) pairs alike, bfloat16 and FP8 dtypes by NumPy dtype (ml_dtypes) or
by name; they give the same keys in the same order; the cuBLAS arguments they report, run by the
NumPy model of column-major cuBLAS (tests/refs/cublas.py) over the host arrays' own memory,
compute the row-major product; bad operands are refused naming the argument. No GPU is needed."""
import numpy as np
import pytest

import cygemm
from cygemm import fp8
from fakes import DESCRIBE_KEYS, BASE, FakeDeviceArray, fake_view
from refs.cublas import cublas_gemm_model

# The keys every description starts with, in this order (describe_matmul's docstring).
COMMON = DESCRIBE_KEYS
POINTERS = ("a", "b", "c")


def _address(x):
    return x.__array_interface__["data"][0]


def _without_pointers(d):
    return {k: v for k, v in d.items() if k not in POINTERS}


def _fp8_operands(M=64, K=128, N=32):
    """a (M, K) row-major, b = w.T for a C-ordered w (N, K): uint8 NumPy arrays, and scales."""
    return np.zeros((M, K), np.uint8), np.zeros((N, K), np.uint8).T, np.ones(1, np.float32)


# ------------------------------------------------------------------ one key set, in one order

def test_every_describe_gives_the_common_keys_first_in_one_order():
    gemm = cygemm.describe_gemm(((4, 3), "float32"), ((3, 5), "float32"))
    [matmul] = cygemm.describe_matmul(((4, 3), "float32"), ((3, 5), "float32"))
    a, b, s = _fp8_operands()
    scaled = fp8.describe_scaled_matmul(a, b, s, s, format_a="e4m3", format_b="e4m3")
    grouped = cygemm.describe_grouped([((4, 3), "float32"), ((0, 3), "float32")], [((3, 5), "float32")] * 2,
                                      [((4, 5), "float32"), ((0, 5), "float32")])
    for what, d in [("gemm", gemm), ("matmul", matmul), ("scaled", scaled),
                    ("group 0", grouped["per_group"][0]), ("empty group 1", grouped["per_group"][1])]:
        assert list(d)[:len(COMMON)] == COMMON, what
    assert list(gemm)[len(COMMON):] == ["strided_batched", "int64_api", "route"]
    assert list(matmul) == COMMON + ["route", "path"] and matmul["path"] == "cublas"
    assert {"call", "a_type", "b_type", "c_type", "d_type", "bias_type", "epilogue", "scales", "scale_modes",
            "amax", "fast_accum"} == set(scaled) - set(COMMON)
    assert list(grouped["per_group"][0])[len(COMMON):] == ["route"]
    assert {"chosen", "decided_by", "why_chosen", "per_group"} <= set(grouped)


def test_the_same_problem_is_described_alike_by_each_function():
    """(64, 32) @ (32, 16) in float32: the row-major swap, the same numbers everywhere."""
    expect = dict(M=64, N=16, K=32, batch=1, swapped=True, opa="N", opb="N", m=16, n=64, k=32,
                  lda=16, ldb=32, ldc=16, stride_a=0, stride_b=0, stride_c=0)
    a, b = ((64, 32), "float32"), ((32, 16), "float32")
    gemm = cygemm.describe_gemm(a, b)
    [matmul] = cygemm.describe_matmul(a, b)
    [group] = cygemm.describe_grouped([a], [b], [((64, 16), "float32")])["per_group"]
    for d, names in [(gemm, ("B", "A")), (matmul, ("b", "a")), (group, ("Bs[0]", "As[0]"))]:
        assert {k: d[k] for k in expect} == expect
        assert (d["cublas_a"], d["cublas_b"]) == names
        assert f"its first operand is {names[0]}" in d["why"]


# ------------------------------------------------------------------ three ways to give an operand

def test_host_arrays_pairs_and_fakes_describe_the_same_call():
    buf = np.zeros(4096, np.float32)
    a, b, c = buf[:12].reshape(4, 3), buf[100:115].reshape(3, 5), buf[200:240].reshape(5, 8)[:, :4].T
    # c: (4, 5) column-major with leading dimension 8 (a transposed slice)
    host = cygemm.describe_gemm(a, b, c)
    fake = cygemm.describe_gemm(fake_view(buf, a), fake_view(buf, b), fake_view(buf, c))
    assert _without_pointers(host) == _without_pointers(fake)
    assert not host["swapped"] and (host["m"], host["n"], host["ldc"]) == (4, 5, 8)
    assert (host["a"], host["b"], host["c"]) == (_address(a), _address(b), _address(c))
    assert (fake["a"], fake["b"], fake["c"]) == (BASE, BASE + 400, BASE + 800)
    paired = cygemm.describe_gemm(((4, 3), "float32"), ((3, 5), "float32"), ((4, 5), "float32"))
    assert paired["swapped"] and (paired["a"], paired["b"], paired["c"]) == (None, None, None)


def test_pairs_have_no_memory_and_out_none_has_none():
    buf = np.zeros((3, 5), np.float32)
    d = cygemm.describe_gemm(((4, 3), "float32"), buf)          # out=None: the new result
    assert (d["a"], d["b"], d["c"]) == (_address(buf), None, None)     # swapped: cuBLAS's a is b
    [call] = cygemm.describe_matmul(np.zeros((4, 3), np.float32), ((3, 5), "float32"))
    assert call["a"] is None and call["b"] is not None and call["c"] is None


def test_describing_reads_no_element_and_takes_read_only_arrays():
    a = np.full((8, 4), np.nan, np.float32)
    b = np.full((4, 6), np.nan, np.float32)
    a.flags.writeable = b.flags.writeable = False
    out = np.full((8, 6), 7.0, np.float32)
    cygemm.describe_gemm(a, b, out)
    cygemm.describe_matmul(a, b, out)
    cygemm.describe_grouped([a], [b], [out])
    assert (out == 7.0).all() and np.isnan(a).all() and np.isnan(b).all()


def test_fp8_takes_host_arrays_pairs_and_fakes():
    a, b, s = _fp8_operands()
    host = fp8.describe_scaled_matmul(a, b, s, s, format_a="e4m3", format_b="e5m2")
    paired = fp8.describe_scaled_matmul(((64, 128), "uint8"), b, ((), "float32"), ((1,), "float32"),
                                        format_a="e4m3", format_b="e5m2")
    fake = fp8.describe_scaled_matmul(FakeDeviceArray((64, 128), "|u1"),
                                      FakeDeviceArray((128, 32), "|u1", (1, 128), BASE + 2**20),
                                      FakeDeviceArray((1,), "<f4", ptr=BASE + 2**21), FakeDeviceArray((1,), "<f4", ptr=BASE + 2**21),
                                      format_a="e4m3", format_b="e5m2")
    assert _without_pointers(host) == _without_pointers(paired) == _without_pointers(fake)
    assert (host["opa"], host["opb"], host["m"], host["n"], host["k"]) == ("T", "N", 32, 64, 128)
    assert (host["a_type"], host["b_type"]) == ("float8_e5m2", "float8_e4m3fn")       # cuBLAS's A is b
    assert (host["a"], host["b"], host["c"]) == (_address(b), _address(a), None)
    assert (paired["a"], paired["b"]) == (_address(b), None)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "e4m3"])
def test_fp8_dtype_names_carry_their_format(name):
    a, b, s = _fp8_operands()
    d = fp8.describe_scaled_matmul(((64, 128), name), b, s, s, format_b="e4m3", bias=((32,), "bfloat16"))
    assert (d["b_type"], d["bias_type"], d["epilogue"]) == ("float8_e4m3fn", "bfloat16", "bias")
    with pytest.raises(TypeError, match="a: its dtype is float8_e4m3fn but format_a='e5m2'"):
        fp8.describe_scaled_matmul(((64, 128), name), b, s, s, format_a="e5m2", format_b="e4m3")


def test_grouped_takes_host_arrays_and_pairs_and_says_why_its_route():
    sizes = [(16, 8, 32), (3, 8, 32), (16, 1, 7)]
    As = [np.zeros((m, k), np.float32) for m, n, k in sizes]
    Bs = [np.zeros((k, n), np.float32) for m, n, k in sizes]
    outs = [np.zeros((m, n), np.float32) for m, n, k in sizes]
    host = cygemm.describe_grouped(As, Bs, outs)
    paired = cygemm.describe_grouped(*[[((x.shape), "float32") for x in xs] for xs in (As, Bs, outs)])
    assert host["chosen"] == paired["chosen"] == "loop" and host["decided_by"] == "rule"     # 3 groups: loop
    assert "fixed rule" in host["why_chosen"]
    for g, (m, n, k), h, p in zip(range(3), sizes, host["per_group"], paired["per_group"]):
        assert _without_pointers(h) == _without_pointers(p)
        assert (h["M"], h["N"], h["K"], h["route"]) == (m, n, k, "loop")
        assert (h["a"], h["b"], h["c"]) == (_address(Bs[g]), _address(As[g]), _address(outs[g]))
        assert (p["a"], p["b"], p["c"]) == (None, None, None)
    # Equal pairs lie one after another: one strided-batched GEMM.
    uniform = cygemm.describe_grouped([((16, 32), "float32")] * 4, [((32, 8), "float32")] * 4,
                                      [((16, 8), "float32")] * 4)
    assert uniform["chosen"] == "batched" and [g["route"] for g in uniform["per_group"]] == ["batched"] * 4


def test_grouped_routes_of_empty_and_zero_k_groups():
    d = cygemm.describe_grouped([((0, 4), "float32"), ((5, 0), "float32"), ((5, 4), "float32")],
                                [((4, 3), "float32"), ((0, 3), "float32"), ((4, 3), "float32")],
                                [((0, 3), "float32"), ((5, 3), "float32"), ((5, 3), "float32")])
    assert [g["route"] for g in d["per_group"]] == [None, "loop", d["chosen"]]
    assert d["chosen"] is not None and [g["K"] for g in d["per_group"]] == [4, 0, 4]


# ------------------------------------------------------------------ bfloat16 both ways

def test_bfloat16_by_name_in_every_describe():
    pair = lambda shape: (shape, "bfloat16")    # noqa: E731
    [call] = cygemm.describe_matmul(pair((64, 32)), pair((32, 16)))
    assert (call["M"], call["N"], call["K"]) == (64, 16, 32)
    assert cygemm.describe_gemm(pair((64, 32)), pair((32, 16)))["ldc"] == 16
    assert cygemm.describe_grouped([pair((64, 32))], [pair((32, 16))], [pair((64, 16))])["groups"] == 1
    with pytest.raises(TypeError, match="B: expected the dtype of A \\(bfloat16\\), got float16"):
        cygemm.describe_gemm(pair((64, 32)), ((32, 16), "float16"))


def test_bfloat16_ml_dtypes_arrays_in_every_describe():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    a, b, out = np.zeros((64, 32), bf16), np.zeros((32, 16), bf16), np.zeros((16, 64), bf16).T
    [call] = cygemm.describe_matmul(a, b, out)
    assert not call["swapped"] and (call["m"], call["n"], call["ldc"]) == (64, 16, 64)
    assert cygemm.describe_gemm(a, b, out)["c"] == _address(out)
    assert cygemm.describe_grouped([a], [b], [out])["per_group"][0]["ldc"] == 64
    [mixed] = cygemm.describe_matmul(a, ((32, 16), bf16))           # a dtype object in a pair too
    assert (mixed["a"], mixed["b"], mixed["K"]) == (None, _address(a), 32)     # swapped: cuBLAS's a is b
    w = np.zeros((32, 128), ml_dtypes.float8_e4m3fn)
    d = fp8.describe_scaled_matmul(np.zeros((64, 128), ml_dtypes.float8_e4m3fn), w.T, ((), "float32"),
                                   ((), "float32"), bias=np.zeros(32, bf16))
    assert (d["a_type"], d["b_type"], d["bias_type"]) == ("float8_e4m3fn", "float8_e4m3fn", "bfloat16")


# ------------------------------------------------------------------ the mapping, run by the NumPy model

LAYOUTS = {
    "C": lambda mem, at, r, c: mem[at:at + r * c].reshape(r, c),
    "F": lambda mem, at, r, c: mem[at:at + r * c].reshape(c, r).T,
    "C-padded": lambda mem, at, r, c: mem[at:at + r * (c + 3)].reshape(r, c + 3)[:, 1:c + 1],
    "F-padded": lambda mem, at, r, c: mem[at:at + c * (r + 2)].reshape(c, r + 2)[:, :r].T,
}


def _carve(mem, rng, specs):
    """Host views into mem, one per (layout, rows, cols), apart; random values, out NaN."""
    views, at = [], 0
    for layout, rows, cols in specs:
        views.append(LAYOUTS[layout](mem, at, rows, cols))
        at += (rows + 3) * (cols + 3) + 5
        views[-1][...] = rng.integers(-3, 4, views[-1].shape)
    return views


def _run_model(mem, d, **kw):
    cublas_gemm_model(mem, d, d["batch"] > 1, base=_address(mem), **kw)


@pytest.mark.parametrize("la, lb, lc", [("C", "C", "C"), ("F", "C-padded", "C"), ("C", "F", "F-padded"),
                                        ("C-padded", "F-padded", "F")])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True)])
def test_describe_gemm_of_host_arrays_computes_the_product(la, lb, lc, trans_a, trans_b):
    M, K, N = 7, 5, 6
    mem = np.zeros(2000, np.float32)
    a, b, c = _carve(mem, np.random.default_rng(1), [(la, *((K, M) if trans_a else (M, K))),
                                                    (lb, *((N, K) if trans_b else (K, N))), (lc, M, N)])
    c[...] = np.nan
    want = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    d = cygemm.describe_gemm(a, b, c, trans_a=trans_a, trans_b=trans_b)
    _run_model(mem, d)
    np.testing.assert_array_equal(c, want, err_msg=str(d))


@pytest.mark.parametrize("lc", ["C", "F", "C-padded"])
def test_describe_matmul_and_grouped_of_host_arrays_compute_the_product(lc):
    mem = np.zeros(4000, np.float32)
    a, b, c = _carve(mem, np.random.default_rng(2), [("F-padded", 9, 4), ("C", 4, 3), (lc, 9, 3)])
    want = a.astype(np.float64) @ b
    for calls in (cygemm.describe_matmul(a, b, c), cygemm.describe_grouped([a], [b], [c])["per_group"]):
        c[...] = np.nan
        for d in calls:
            _run_model(mem, d)
        np.testing.assert_array_equal(c, want, err_msg=str(calls))


def test_describe_matmul_batched_host_arrays_compute_the_product():
    mem = np.zeros(4000, np.float32)
    a = mem[:3 * 8 * 5].reshape(3, 5, 8).transpose(0, 2, 1)     # (3, 8, 5), each matrix column-major
    b = mem[200:220].reshape(5, 4)                              # broadcast over the batch
    c = mem[400:400 + 3 * 8 * 4].reshape(3, 8, 4)
    a[...] = np.arange(a.size).reshape(a.shape) % 7 - 3
    b[...] = np.arange(20).reshape(5, 4) % 5 - 2
    c[...] = np.nan
    want = np.matmul(a.astype(np.float64), b)
    calls = cygemm.describe_matmul(a, b, c)
    assert [d["batch"] for d in calls] == [3] and calls[0]["stride_a"] == 0     # cuBLAS's a: b, broadcast
    for d in calls:
        _run_model(mem, d)
    np.testing.assert_array_equal(c, want)


def test_describe_scaled_matmul_of_ml_dtypes_fp8_arrays_computes_the_product():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    M, K, N = 32, 48, 16
    rng = np.random.default_rng(3)
    codes = np.zeros(8192, np.uint8)
    a = codes[:M * K].view(ml_dtypes.float8_e4m3fn).reshape(M, K)
    w = codes[4096:4096 + N * K].view(ml_dtypes.float8_e4m3fn).reshape(N, K)
    a[...] = rng.integers(-4, 5, a.shape).astype(ml_dtypes.float8_e4m3fn)   # small integers: exact
    w[...] = rng.integers(-4, 5, w.shape).astype(ml_dtypes.float8_e4m3fn)
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    out = np.full(M * N, np.nan)
    d = fp8.describe_scaled_matmul(a, w.T, ((), "float32"), ((), "float32"), out_dtype="float32")
    assert d["c"] is None          # out=None: the result has no memory yet; give the model one
    cublas_gemm_model(values, dict(d, c=_address(codes)), itemsize=1, c_mem=out, c_itemsize=4, base=_address(codes))
    np.testing.assert_array_equal(out.reshape(M, N), a.astype(np.float64) @ w.T.astype(np.float64))


# ------------------------------------------------------------------ errors name the argument

@pytest.mark.parametrize("call, exc, words", [
    (lambda: cygemm.describe_gemm(((4, 3), "int32"), ((3, 5), "float32")), TypeError,
     ["A:", "float16, bfloat16, float32, float64, complex64, complex128 or int8", "int32"]),
    (lambda: cygemm.describe_gemm(((4, 3), "float32"), ((3, -5), "float32")), ValueError, ["B:", "shape"]),
    (lambda: cygemm.describe_gemm(((4, 3), "float32"), ((3, 5), "float32"), ((4, 5), "nonsense")), TypeError,
     ["out:", "expected a dtype", "'nonsense'"]),
    (lambda: cygemm.describe_gemm(((4, 3), "float32"), ((3, 5), "float32", "C")), TypeError,
     ["B:", "(shape, dtype) pair"]),
    (lambda: cygemm.describe_gemm(((4, 3), "float32"), ((3, 5), "float32"), ((4, 6), "float32")), ValueError,
     ["out:", "(4, 5)"]),
    (lambda: cygemm.describe_matmul(((4, 3), "bfloat16"), ((3, 5), "int32")), TypeError, ["b:", "int32"]),
    (lambda: cygemm.describe_matmul(np.zeros((4, 3), np.float32), np.zeros((4, 3), np.float32)), ValueError,
     ["b:"]),
    (lambda: cygemm.describe_grouped([((4, 3), "float32")] * 2, [((3, 5), "float32"), ((3, 5), "float16")],
                                     [((4, 5), "float32")] * 2), TypeError, ["Bs[1]:", "float16"]),
    (lambda: cygemm.describe_grouped([((4, 3), "float32")], [[3, 5, 7]], [((4, 5), "float32")]), TypeError,
     ["Bs[0]:", "(shape, dtype) pair"]),
    (lambda: fp8.describe_scaled_matmul(((64, 128), "float32"), np.zeros((32, 128), np.uint8).T, ((), "float32"),
                                        ((), "float32"), format_b="e4m3"), TypeError,
     ["a:", "float8_e4m3fn, float8_e5m2 or uint8", "float32"]),
    (lambda: fp8.describe_scaled_matmul(((64, 128), "e4m3"), np.zeros((32, 128), np.uint8).T, ((2,), "float32"),
                                        ((), "float32"), format_b="e4m3"), ValueError, ["scale_a:", "one float32 element", "got shape (2,)"]),
    (lambda: fp8.describe_scaled_matmul(((64, 128), "e4m3"), ((128, 32), "e4m3"), ((), "float32"),
                                        ((), "float32")), ValueError, ["b:", "column-major"]),
])
def test_bad_operands_are_refused_naming_the_argument(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_an_out_sharing_memory_with_an_input_is_refused_as_gemm_refuses_it():
    buf = np.zeros((8, 8), np.float32)
    with pytest.raises(ValueError, match="out: its memory overlaps A"):
        cygemm.describe_gemm(buf[:4, :4], buf[4:, 4:], buf[:4, 2:6])      # columns 2, 3 of A's rows


def test_every_describe_says_the_determinism_in_force_and_what_it_lets_run():
    old = cygemm.set_options(determinism="batch_invariant")
    try:
        d = cygemm.describe_matmul(((64, 32), "float32"), ((32, 16), "float32"))[0]
        assert d["determinism"] == "batch_invariant" and "4096 x 4096 x K" in d["kernels"]
        g = cygemm.describe_gemm(((64, 32), "float16"), ((32, 16), "float16"))
        assert g["determinism"] == "batch_invariant" and g["kernels"] == d["kernels"]
        cygemm.set_options(determinism="run_to_run")
        assert cygemm.describe_gemm(((8, 8), "float32"), ((8, 8), "float32"))["determinism"] == "run_to_run"
    finally:
        cygemm.set_options(**old)
    assert cygemm.describe_gemm(((8, 8), "float32"), ((8, 8), "float32"))["determinism"] == "off"


@pytest.mark.parametrize("flags", [dict(trans_a="N"), dict(trans_b="n"), dict(trans_a="N", trans_b="N")])
def test_describe_gemm_reads_the_letter_n_as_no_transpose(flags):
    """"N" is no transpose, as gemm reads it (the string's truth is not the flag): M, N, K and the
    row-major sentence are those of trans_a=False, trans_b=False."""
    plain = cygemm.describe_gemm(((4, 3), "float32"), ((3, 2), "float32"))
    lettered = cygemm.describe_gemm(((4, 3), "float32"), ((3, 2), "float32"), **flags)
    assert (lettered["M"], lettered["N"], lettered["K"]) == (4, 2, 3)
    assert lettered["why"] == plain["why"] and "op(" not in lettered["why"]


@pytest.mark.parametrize("operand", [[[1., 2.], [3., 4.]], [3, 5], (2, 3.5)])
def test_a_list_of_numbers_is_no_shape_dtype_pair(operand):
    """[[1., 2.], [3., 4.]] (host data) and [3, 5] (no dtype) are refused, not read as a pair."""
    with pytest.raises(TypeError) as info:
        cygemm.describe_matmul(operand, ((2, 2), "float32"))
    assert str(info.value) == (f"a: expected a device array, a host (NumPy) array or tensor, or a (shape, dtype) pair, got "
                               f"a {type(operand).__name__} that is no (shape, dtype) pair (for host data, pass "
                               f"numpy.asarray of it)")


@pytest.mark.parametrize("call, words", [
    (lambda: cygemm.describe_matmul(3, ((3, 2), "float32")),
     "a: expected a device array, a host (NumPy) array or tensor, or a (shape, dtype) pair, got builtins.int"),
    (lambda: cygemm.describe_gemm(((4, 3), "float32"), "B"),
     "B: expected a device array, a host (NumPy) array or tensor, or a (shape, dtype) pair, got builtins.str"),
    (lambda: cygemm.describe_grouped(((4, 3), "float32"), [((3, 5), "float32")], [((4, 5), "float32")]),
     "As: expected a list of operands, one a group, got one (shape, dtype) pair; for one group pass "
     "[((4, 3), 'float32')]"),
])
def test_describe_names_what_it_takes_for_what_it_cannot_read(call, words):
    with pytest.raises(TypeError) as info:
        call()
    assert str(info.value) == words


# ------------------------------------------------------------------ describe_* take the call

PAIRS = [("gemm", "describe_gemm"), ("gemm_strided_batched", "describe_gemm"), ("int_mm", "describe_gemm"),
         ("matmul", "describe_matmul"), ("fp8.scaled_matmul", "fp8.describe_scaled_matmul"),
         ("grouped_gemm", "describe_grouped"), ("moe_gemm", "describe_moe"), ("moe_gemm_wgrad", "describe_moe"),
         ("moe_scaled_gemm", "describe_moe_scaled")]


def _public(dotted):
    obj = cygemm
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("call, describe", PAIRS)
def test_each_describe_takes_every_keyword_of_its_call(call, describe):
    """describe_X(..., **kwargs) takes every keyword X(..., **kwargs) takes, with X's default."""
    import inspect
    called, described = inspect.signature(_public(call)), inspect.signature(_public(describe))
    for p in called.parameters.values():
        if p.kind is p.KEYWORD_ONLY:
            assert p.name in described.parameters, f"{describe} does not take {call}'s {p.name}="
            assert described.parameters[p.name].default == p.default, p.name


def test_the_description_is_of_the_calls_own_policy_math_and_scalars():
    """The call's determinism, autotune and math, not the options in force; alpha and beta checked."""
    A, B = ((64, 32), "float32"), ((32, 16), "float32")
    assert cygemm.get_options()["determinism"] == "off"
    d = cygemm.describe_gemm(A, B, determinism="run_to_run", math="fp32", beta=0.0, stream=None)
    assert (d["determinism"], d["compute"], d["autotune"]) == ("run_to_run", "fp32", "auto")
    assert cygemm.describe_gemm(A, B)["compute"] == "tf32"
    assert cygemm.describe_gemm(A, B, autotune="off")["autotune"] == "off"
    [m] = cygemm.describe_matmul(((4, 8, 32), "float32"), B, math="fp32", determinism="batch_invariant")
    assert (m["determinism"], m["compute"]) == ("batch_invariant", "fp32")
    a, b, s = _fp8_operands()
    f = fp8.describe_scaled_matmul(a, b, s, s, format_a="e4m3", format_b="e4m3", determinism="run_to_run")
    assert (f["determinism"], f["compute"]) == ("run_to_run", "fp32")
    g = cygemm.describe_grouped([((8, 8), "float32")] * 2, [((8, 8), "float32")] * 2, [((8, 8), "float32")] * 2,
                                route="loop", math="fp32")
    assert (g["chosen"], g["decided_by"], g["per_group"][0]["compute"]) == ("loop", "asked", "fp32")
    with pytest.raises(TypeError, match="alpha: expected a number, got str"):
        cygemm.describe_gemm(A, B, alpha="x")
    with pytest.raises(ValueError, match="determinism: expected None"):
        cygemm.describe_matmul(A, B, determinism="sometimes")
    with pytest.raises(ValueError, match="route: 'batched' does not apply"):
        cygemm.describe_grouped([((8, 8), "float32"), ((4, 8), "float32")], [((8, 8), "float32")] * 2,
                                [((8, 8), "float32"), ((4, 8), "float32")], route="batched")


def test_describe_moe_takes_host_arrays_and_pairs_and_the_calls_route():
    x, w, o = np.zeros((10, 8), np.float32), np.zeros((2, 8, 4), np.float32), np.zeros((10, 4), np.float32)
    d = cygemm.describe_moe(x, w, np.array([0, 4, 10]), o, route="loop")
    assert (d["offsets"], d["chosen"], d["decided_by"]) == ("host", "loop", "asked")
    d = cygemm.describe_moe(((10, 8), "float32"), ((2, 8, 4), "float32"), [0, 4, 10], ((10, 4), "float32"))
    assert d["offsets"] == "host" and d["chosen"] in d["routes"]
    with pytest.raises(TypeError, match="check_offsets: expected True or False"):
        cygemm.describe_moe(x, w, [0, 4, 10], o, check_offsets="yes")


def test_a_torch_cpu_tensor_is_described_as_its_numpy_view():
    """A host tensor is taken for its layout, as a NumPy array is (CPU)."""
    torch = pytest.importorskip("torch")
    a, w = torch.ones(4, 8), torch.ones(3, 8)
    got = cygemm.describe_matmul(a, w.T)
    want = cygemm.describe_matmul(a.numpy(), w.numpy().T)
    assert got == want
    assert cygemm.describe_gemm(a.to(torch.bfloat16), w.to(torch.bfloat16).T)["ldb"] == 8


def test_describe_moe_reports_the_calls_policy_and_takes_host_offsets_as_its_route():
    x, w, o = np.zeros((10, 8), np.float32), np.zeros((2, 8, 4), np.float32), np.zeros((10, 4), np.float32)
    d = cygemm.describe_moe(x, w, [0, 4, 10], o, route="host_offsets", math="fp32", determinism="run_to_run")
    assert (d["determinism"], d["compute"], d["autotune"]) == ("run_to_run", "fp32", "auto")
    assert d["offsets"] == "host" and d["chosen"] in d["routes"]


def test_describe_moe_scaled_takes_pairs_and_host_arrays():
    offsets = np.array([0, 3, 3, 10], np.int32)
    d = cygemm.describe_moe_scaled(((10, 32), "e4m3"), ((3, 16, 32), "e4m3"), ((), "float32"), ((3,), "float32"),
                                   offsets, ((10, 16), "bfloat16"))
    assert (d["offsets"], d["chosen"]) == ("host", "loop")
    d2 = cygemm.describe_moe_scaled(np.zeros((10, 32), np.uint8), np.zeros((3, 16, 32), np.uint8),
                                    np.ones((), np.float32), np.ones(3, np.float32), offsets,
                                    np.zeros((10, 16), np.float32), format_x="e4m3", format_w="e4m3")
    assert d2["chosen"] == "loop"


def test_fp8_out_dtype_and_format_out_that_disagree_are_refused():
    a, b, s = _fp8_operands()
    with pytest.raises(ValueError, match="format_out: 'e4m3' contradicts out_dtype='bfloat16'"):
        fp8.describe_scaled_matmul(a, b, s, s, format_a="e4m3", format_b="e4m3", out_dtype="bfloat16",
                                   format_out="e4m3")
