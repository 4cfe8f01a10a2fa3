"""FP8 GEMMs (cygemm.fp8.scaled): scaled_matmul against float64 references computed from the FP8
values themselves (tests/refs/fp8.py), torch's _scaled_mm, captured graphs with new scales, the
FP8 training example, and every refused layout with nothing written. The CPU tests read fake
device arrays. The conversions are in test_convert.py."""
import numpy as np
import pytest

import cygemm
from cygemm import fp8
from fakes import FakeDeviceArray, BASE
from refs import activations, fp8 as fp8_ref
from refs.cublas import cublas_gemm_model
from gpu_util import rel_err


def fake(shape, typestr="|u1", strides=None, ptr=BASE):
    return FakeDeviceArray(shape, typestr, strides, ptr)


def kmajor_b(k, n, ptr=BASE + 0x100000):
    """(K, N) FP8 bytes that are w.T of a C-contiguous (N, K) w."""
    return fake((k, n), strides=(1, k), ptr=ptr)


SCALE = fake((1,), "<f4", ptr=BASE + 0x200000)


# ------------------------------------------------------------------ CPU: layout and checks

def test_describe_maps_a_rowmajor_b_kmajor_to_cublas_tn():
    d = fp8.describe_scaled_matmul(fake((64, 128)), kmajor_b(128, 32), SCALE, SCALE,
                                   format_a="e4m3", format_b="e4m3")
    assert (d["opa"], d["opb"], d["m"], d["n"], d["k"]) == ("T", "N", 32, 64, 128)
    assert (d["M"], d["N"], d["K"]) == (64, 32, 128)
    assert (d["a_type"], d["b_type"], d["d_type"]) == ("float8_e4m3fn", "float8_e4m3fn", "bfloat16")
    assert d["epilogue"] == "default" and d["lda"] == 128 and d["ldb"] == 128 and d["ldc"] == 32


def test_describe_fp8_output_takes_bfloat16_c_and_the_epilogue():
    d = fp8.describe_scaled_matmul(fake((64, 128)), kmajor_b(128, 32), SCALE, SCALE, format_a="e4m3",
                                   format_b="e5m2", out_dtype="e4m3", scale_out=SCALE, amax_out=SCALE,
                                   act="gelu")
    assert (d["c_type"], d["d_type"], d["epilogue"]) == ("bfloat16", "float8_e4m3fn", "gelu")
    assert d["scales"] == {"a": True, "b": True, "out": True} and d["amax"]
    assert d["a_type"] == "float8_e5m2"            # cuBLAS's A is our b


# The cuBLAS arguments describe_scaled_matmul reports, run by a NumPy model of column-major
# cuBLAS (tests/refs/cublas.py) over FP8 bytes in host memory: they must compute a @ b. The values
# are small integers, exact in FP8 and in float32 sums, so the check is exact.
FP8_CASES = [  # M, K, N, a's row padding, b's column padding (bytes), out's row padding (elements)
    (16, 16, 16, 0, 0, 0), (32, 48, 16, 0, 0, 0), (64, 128, 32, 0, 0, 0), (48, 32, 80, 0, 0, 0),
    (5, 64, 12, 0, 0, 0), (40, 32, 24, 16, 32, 4)]


@pytest.mark.parametrize("M, K, N, pad_a, pad_b, pad_out", FP8_CASES)
@pytest.mark.parametrize("format_a, format_b", [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")])
def test_describe_gives_cublas_arguments_that_compute_a_times_b(M, K, N, pad_a, pad_b, pad_out, format_a,
                                                                 format_b):
    rng = np.random.default_rng(M * 1000 + K * 10 + N)
    lda, ldb, ldo = K + pad_a, K + pad_b, N + pad_out
    a_off, b_off, out_off = 0, 16 * ((M * lda + 15) // 16) + 64, 1 << 20
    codes = np.zeros(b_off + N * ldb, np.uint8)
    values = np.full(codes.shape, np.nan)               # the value of each byte, as cuBLAS reads it
    a_vals = rng.integers(-4, 5, (M, K)).astype(np.float64)
    b_vals = rng.integers(-4, 5, (K, N)).astype(np.float64)
    a_bytes = codes[a_off:a_off + M * lda].reshape(M, lda)
    a_bytes[:, :K] = fp8_ref.to_codes(a_vals, format_a)
    b_bytes = codes[b_off:b_off + N * ldb].reshape(N, ldb)      # b = w.T, w (N, K) row-major
    b_bytes[:, :K] = fp8_ref.to_codes(b_vals.T, format_b)
    values[a_off:a_off + M * lda] = fp8_ref.decode(codes[a_off:a_off + M * lda], format_a)
    values[b_off:b_off + N * ldb] = fp8_ref.decode(codes[b_off:b_off + N * ldb], format_b)
    out_mem = np.full(out_off // 4 + M * ldo, np.nan)
    ptr = {"a": BASE + a_off, "b": BASE + b_off}
    d = fp8.describe_scaled_matmul(
        fake((M, K), strides=(lda, 1), ptr=ptr["a"]), fake((K, N), strides=(1, ldb), ptr=ptr["b"]), SCALE, SCALE,
        out=fake((M, N), "<f4", strides=(4 * ldo, 4), ptr=BASE + out_off), format_a=format_a, format_b=format_b)
    name = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
    fmt = {"a": name[format_a], "b": name[format_b]}
    assert (d["a_type"], d["b_type"]) == (fmt[d["cublas_a"]], fmt[d["cublas_b"]])
    cublas_gemm_model(values, dict(d, a=ptr[d["cublas_a"]], b=ptr[d["cublas_b"]], c=BASE + out_off), itemsize=1,
                      c_mem=out_mem, c_itemsize=4)
    out = out_mem[out_off // 4:].reshape(M, ldo)
    np.testing.assert_array_equal(out[:, :N], a_vals @ b_vals, err_msg=str(d))
    assert np.isnan(out[:, N:]).all() and np.isnan(out_mem[:out_off // 4]).all(), "written outside out"


@pytest.mark.parametrize("case, exc, words", [
    (dict(a=fake((64, 128), strides=(1, 64))), ValueError, ["a:", "row-major", "ascontiguousarray(a)"]),
    (dict(b=fake((128, 32))), ValueError, ["b:", "w.T", "ascontiguousarray(b.T).T"]),
    (dict(format_a=None), TypeError, ["a:", "format_a"]),
    (dict(format_a="e5m2", format_b="e5m2"), TypeError, ["E5M2 x E5M2"]),
    (dict(format_a="fp8"), ValueError, ["format_a", "'e4m3' or 'e5m2'"]),
    (dict(scale_a=fake((2,), "<f4")), ValueError, ["scale_a", "one float32 element", "got shape (2,)"]),
    (dict(scale_b=fake((1,), "<f2")), TypeError, ["scale_b", "float32", "float16"]),
    (dict(scale_out=SCALE), ValueError, ["scale_out", "FP8 output"]),
    (dict(amax_out=SCALE), ValueError, ["amax_out", "FP8 out", "fp8.amax"]),
    (dict(a=fake((64, 24)), b=kmajor_b(24, 32)), ValueError, ["a:", "K to be a multiple of 16", "K = 24",
                                                              "pad K to 32 with zeros in both a and b"]),
    (dict(a=fake((64, 30)), b=kmajor_b(30, 32)), ValueError, ["a:", "K to be a multiple of 16", "K = 30",
                                                              "pad K to 32"]),
    # a's rows padded to 32 bytes: b, K-major with K = 30, is the one to pad
    (dict(a=fake((64, 30), strides=(32, 1)), b=kmajor_b(30, 32)), ValueError, ["b:", "K to be a multiple of 16",
                                                                               "b's columns", "K = 30"]),
    (dict(a=fake((64, 32), strides=(40, 1)), b=kmajor_b(32, 32)), ValueError, ["a:", "stride between a's rows",
                                                                               "got 40", "K = 32"]),
    (dict(out=fake((64, 36), "<f2"), b=kmajor_b(128, 36)), ValueError, ["out:", "N to be a multiple of 8",
                                                                        "N = 36", "padded to 40"]),
    (dict(scale_a=0.5), TypeError, ["scale_a:", "device float32", "cupy.asarray(0.5, cupy.float32)"]),
    (dict(scale_b=2), TypeError, ["scale_b:", "device float32", "cupy.asarray(2.0, cupy.float32)"]),
    (dict(a=fake((64, 128), ptr=BASE + 8)), ValueError, ["a:", "16-byte aligned"]),
    (dict(b=kmajor_b(64, 32)), ValueError, ["b:", "must have 128 rows"]),
    (dict(act="silu"), ValueError, ["act:", "'relu' or 'gelu'"]),
    # An unknown name is told what FP8 applies, not every activation (silu, tanh are refused too)
    (dict(act="swish"), ValueError, ["act:", "FP8 GEMMs", "'none', 'relu' or 'gelu'", "'swish'"]),
    (dict(scale_b=fake((1,), "<f8")), TypeError, ["scale_b: FP8 scales are float32, got float64"]),
    (dict(out=fake((64, 32), "<f4"), out_dtype="bfloat16"), TypeError, ["out:", "out_dtype"]),
    (dict(out=fake((64, 16), "<f4")), ValueError, ["out:", "(64, 32)"]),
    (dict(out=fake((64, 32), "<f4", strides=(4, 256))), ValueError, ["out:", "row-major"]),
    (dict(bias=fake((32,), "<f4")), TypeError, ["bias:", "bfloat16"]),
    (dict(out=fake((64, 32), "<f2"), bias=fake((32,), "<f4")), TypeError, ["bias:", "float16"]),
    (dict(bias=fake((16,), "<f2")), ValueError, ["bias:", "(32,)"]),
    (dict(out_dtype="float64"), ValueError, ["out_dtype"]),
])
def test_bad_arguments_are_refused_naming_the_argument(case, exc, words):
    kw = dict(a=fake((64, 128)), b=kmajor_b(128, 32), scale_a=SCALE, scale_b=SCALE, format_a="e4m3",
              format_b="e4m3")
    kw.update(case)
    with pytest.raises(exc) as info:
        fp8.describe_scaled_matmul(**kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert "silu" not in str(info.value) or case.get("act") == "silu", str(info.value)


# ------------------------------------------------------------------ GPU

def _fp8_device(cp, x, fmt):
    """FP8 bytes of x (host float64) on the GPU, and the float64 values they hold."""
    codes = fp8_ref.to_codes(x, fmt)
    return cp.asarray(codes), fp8_ref.decode(codes, fmt)


def _scalar(cp, v):
    return cp.asarray(np.array([v], dtype=np.float32))


# float32 out: FP8 tensor-core sums are not kept in full fp32 between promotions (measured
# 1.0e-4 at K=128 on the H200), so the bound is looser than strict fp32's 1e-5.
OUT_TOL = {"bfloat16": 1e-2, "float16": 2e-3, "float32": 4e-4, "e4m3": 6e-2, "e5m2": 1.2e-1}


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16", "float32", "e4m3"])
@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_scaled_matmul_matches_float64_of_the_fp8_values(out_dtype, act, with_bias):
    import cupy as cp
    rng = np.random.default_rng()
    M, K, N = 96, 192, 80
    a, a64 = _fp8_device(cp, rng.standard_normal((M, K)) * 4, "e4m3")
    w, w64 = _fp8_device(cp, rng.standard_normal((N, K)) * 4, "e4m3")
    sa, sb = 0.37, 1.9
    ref = sa * sb * (a64 @ w64.T)
    bias = None
    if with_bias:
        bias_dtype = "float16" if out_dtype == "float16" else "bfloat16"
        from cygemm.engine.dtypes import numpy_dtype
        b32 = rng.standard_normal(N).astype(np.float32) * 5
        if bias_dtype == "float16":
            bias = cp.asarray(b32.astype(np.float16))
            ref = ref + b32.astype(np.float16).astype(np.float64)
        else:
            torch = pytest.importorskip("torch")
            bias = torch.from_numpy(b32).to("cuda", torch.bfloat16)
            ref = ref + bias.float().cpu().numpy().astype(np.float64)
    ref = activations.act(act, ref)
    amax = _scalar(cp, np.nan)
    fp8_out = out_dtype in ("e4m3", "e5m2")
    kw = dict(bias=bias, act=act, amax_out=amax if fp8_out else None)
    if fp8_out:
        s_out = 448.0 / np.abs(ref).max() * 0.5
        out = cp.full((M, N), 0x7F, dtype=cp.uint8)            # NaN codes
        fp8.scaled_matmul(a, w.T, _scalar(cp, sa), _scalar(cp, sb), out=out, format_a="e4m3",
                          format_b="e4m3", format_out=out_dtype, scale_out=_scalar(cp, s_out), **kw)
        got = fp8_ref.decode(cp.asnumpy(out), out_dtype) / s_out
    elif out_dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        fp8.scaled_matmul(a, w.T, _scalar(cp, sa), _scalar(cp, sb), out=out, format_a="e4m3",
                          format_b="e4m3", **kw)
        got = out.float().cpu().numpy()
    else:
        out = cp.full((M, N), cp.nan, dtype=out_dtype)
        fp8.scaled_matmul(a, w.T, _scalar(cp, sa), _scalar(cp, sb), out=out, format_a="e4m3",
                          format_b="e4m3", **kw)
        got = cp.asnumpy(out)
    assert rel_err(got, ref) < OUT_TOL[out_dtype]
    if fp8_out:
        assert abs(float(amax.get()[0]) - np.abs(ref).max()) <= 1e-3 * np.abs(ref).max()


@pytest.mark.gpu
def test_e5m2_operand_and_new_result():
    import cupy as cp
    pytest.importorskip("torch")
    rng = np.random.default_rng()
    M, K, N = 64, 128, 64
    g, g64 = _fp8_device(cp, rng.standard_normal((M, K)) * 100, "e5m2")      # a gradient
    w, w64 = _fp8_device(cp, rng.standard_normal((N, K)), "e4m3")
    out = fp8.scaled_matmul(g, w.T, _scalar(cp, 0.01), _scalar(cp, 1.0), format_a="e5m2",
                            format_b="e4m3", out_dtype="float32")
    assert out.dtype == cp.float32 and out.shape == (M, N)
    assert rel_err(cp.asnumpy(out), 0.01 * g64 @ w64.T) < OUT_TOL["float32"]


@pytest.mark.gpu
def test_torch_float8_tensors_against_torch_scaled_mm_and_float64():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "_scaled_mm"):
        pytest.skip("this torch has no _scaled_mm")
    M, K, N = 128, 256, 96
    a = (torch.randn(M, K, device="cuda") * 3).to(torch.float8_e4m3fn)
    w = (torch.randn(N, K, device="cuda") * 3).to(torch.float8_e4m3fn)
    sa, sb = torch.tensor([0.5], device="cuda"), torch.tensor([0.25], device="cuda")
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    fp8.scaled_matmul(a, w.t(), sa, sb, out=out)
    ref = 0.125 * (a.double().cpu().numpy() @ w.double().cpu().numpy().T)
    assert rel_err(out.float().cpu().numpy(), ref) < 1e-2
    theirs = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    assert rel_err(out.float().cpu().numpy(), theirs.double().cpu().numpy()) < 1e-2


@pytest.mark.gpu
def test_refused_layouts_write_nothing():
    import cupy as cp
    a = cp.asarray(fp8_ref.to_codes(np.random.default_rng().standard_normal((64, 128)), "e4m3"))
    w = cp.asarray(fp8_ref.to_codes(np.random.default_rng().standard_normal((32, 128)), "e4m3"))
    out = cp.full((64, 32), 0x7F, dtype=cp.uint8)
    amax = _scalar(cp, -1.0)
    one = _scalar(cp, 1.0)
    for a_, b_ in ((a, cp.ascontiguousarray(w.T)), (cp.asfortranarray(a), w.T)):
        with pytest.raises(ValueError, match="K contiguous"):
            fp8.scaled_matmul(a_, b_, one, one, out=out, format_a="e4m3", format_b="e4m3",
                              format_out="e4m3", scale_out=one, amax_out=amax)
    cp.cuda.runtime.deviceSynchronize()
    assert bool((out == 0x7F).all()) and float(amax.get()[0]) == -1.0


@pytest.mark.gpu
def test_captured_graph_replays_with_new_scales():
    import cupy as cp
    rng = np.random.default_rng()
    M, K, N = 128, 256, 128
    a, a64 = _fp8_device(cp, rng.standard_normal((M, K)), "e4m3")
    w, w64 = _fp8_device(cp, rng.standard_normal((N, K)), "e4m3")
    sa, sb = _scalar(cp, 1.0), _scalar(cp, 1.0)
    out = cp.full((M, N), 0x7F, dtype=cp.uint8)
    amax = _scalar(cp, 0.0)
    s_out = _scalar(cp, 4.0)
    s = cp.cuda.Stream(non_blocking=True)
    run = lambda: fp8.scaled_matmul(a, w.T, sa, sb, out=out, format_a="e4m3", format_b="e4m3",
                                    format_out="e4m3", scale_out=s_out, amax_out=amax, stream=s)
    run()                                # plan made eagerly
    with cygemm.graph.capture(s) as g:
        run()
    sa.set(np.array([2.0], np.float32))
    s_out.set(np.array([1.0], np.float32))
    out.fill(0x7F)
    g.launch(s)
    s.synchronize()
    ref = 2.0 * a64 @ w64.T
    assert rel_err(fp8_ref.decode(cp.asnumpy(out), "e4m3"), ref) < OUT_TOL["e4m3"]
    assert abs(float(amax.get()[0]) - np.abs(ref).max()) <= 1e-3 * np.abs(ref).max()


@pytest.mark.gpu
def test_fp8_digits_example_trains_within_a_point_of_bfloat16():
    pytest.importorskip("sklearn")
    import examples_path  # noqa: F401
    import train_digits_fp8 as ex
    acc_fp8, acc_bf16 = ex.main(["--epochs", "15"])
    assert acc_bf16 > 90.0
    assert acc_fp8 >= acc_bf16 - 1.0, (acc_fp8, acc_bf16)


def test_a_scaled_matmul_plan_takes_determinism_and_checks_it_when_made():
    kw = dict(out=fake((64, 32), "<f4", ptr=BASE + 0x300000), format_a="e4m3", format_b="e4m3")
    fp8.ScaledMatmulPlan(fake((64, 128)), kmajor_b(128, 32), SCALE, SCALE, determinism="run_to_run", **kw).close()
    with pytest.raises(ValueError, match=r"^determinism: expected None, 'off', 'run_to_run' or 'batch_invariant', "
                                         r"got 'sometimes'$"):
        fp8.ScaledMatmulPlan(fake((64, 128)), kmajor_b(128, 32), SCALE, SCALE, determinism="sometimes", **kw)
