"""The mixture-of-experts calls with their offsets on the GPU (cygemm.grouped.lt_grouped and the
device-offset path of cygemm.grouped.gemm): on the CPU, every refusal before anything runs and
which route describe_moe names, and why, for each library, GPU, dtype, layout and mode (the
feature gate's test hook stands in for other cuBLAS versions and GPUs); on the GPU, both routes
against float64 references on fresh seeded inputs with NaN-poisoned outputs, ragged and empty
experts, a captured graph replayed with new offsets, and no host sync on the sync-free route."""
import numpy as np
import pytest

import cygemm
from cygemm import grouped
from cygemm.engine import lt_features
from fakes import BASE, FakeDeviceArray
from gpu_util import f64, poisoned, rand, rel_err


def fake(shape, ptr, typestr="<f4", strides=None):
    return FakeDeviceArray(shape, typestr, strides, ptr)


def moe(T=40, K=64, N=48, G=4, layout="kn", typestr="<f2", offsets="<i4", kind="forward"):
    """Stand-ins for one call: (a, b, offsets, out), each in its own region; bfloat16-sized
    (2-byte) elements by default, every start and row 16-byte aligned."""
    x = fake((T, K), BASE, typestr)
    if kind == "forward":
        b = fake((G, K, N) if layout == "kn" else (G, N, K), BASE + 0x1000000, typestr)
        out = fake((T, N), BASE + 0x2000000, typestr)
    else:
        b = fake((T, N), BASE + 0x1000000, typestr)
        out = fake((G, K, N) if layout == "kn" else (G, N, K), BASE + 0x2000000, typestr)
    offs = fake((G + 1,), BASE + 0x30000000, offsets)
    return x, b, offs, out


# ---------------------------------------------------------------- CPU: refusals before anything runs

@pytest.mark.parametrize("call", ["forward", "wgrad"])
def test_offsets_of_a_non_integer_dtype_are_refused(call):
    x, b, offs, out = moe(offsets="<f4", kind=call)
    fn = grouped.moe_gemm if call == "forward" else grouped.moe_gemm_wgrad
    with pytest.raises(TypeError, match=r"group_offsets: expected int32 or int64, got float32"):
        fn(x, b, offs, out)


@pytest.mark.parametrize("call", ["forward", "wgrad"])
def test_offsets_of_another_length_are_refused(call):
    x, b, _, out = moe(kind=call)
    fn = grouped.moe_gemm if call == "forward" else grouped.moe_gemm_wgrad
    what = "w" if call == "forward" else "dw"
    with pytest.raises(ValueError, match=rf"group_offsets: expected G \+ 1 = 5 offsets \({what} holds 4 experts\), got 4"):
        fn(x, b, fake((4,), BASE + 0x3000000, "<i8"), out)


def test_offsets_that_are_not_contiguous_or_not_1d_are_refused():
    x, w, _, out = moe()
    with pytest.raises(ValueError, match="group_offsets: expected a contiguous 1-D array, got a stride of 2 elements"):
        grouped.moe_gemm(x, w, fake((5,), BASE + 0x3000000, "<i4", strides=(8,)), out)
    with pytest.raises((TypeError, ValueError), match="group_offsets"):
        grouped.moe_gemm(x, w, fake((5, 1), BASE + 0x3000000, "<i4"), out)


def test_an_output_sharing_memory_with_the_offsets_or_an_input_is_refused():
    x, w, offs, out = moe()
    with pytest.raises(ValueError, match="out.*group_offsets|group_offsets.*out"):
        grouped.moe_gemm(x, w, fake((5,), BASE + 0x2000000 + 64, "<i4"), out)
    x, dy, offs, dw = moe(kind="wgrad")
    with pytest.raises(ValueError, match="dw.*x|x.*dw"):
        grouped.moe_gemm_wgrad(x, dy, offs, fake(dw.__cuda_array_interface__["shape"], BASE + 0x40, "<f2"))


def test_shapes_that_do_not_fit_are_refused_naming_the_argument():
    x, w, offs, out = moe()
    with pytest.raises(ValueError, match=r"w: x is \(40, 64\) so w must be \(G, 64, N\)"):
        grouped.moe_gemm(x, fake((4, 63, 48), BASE + 0x1000000, "<f2"), offs, out)
    with pytest.raises(ValueError, match=r"out: expected shape \(40, 48\), got \(40, 47\)"):
        grouped.moe_gemm(x, w, offs, fake((40, 47), BASE + 0x2000000, "<f2"))
    x, dy, offs, dw = moe(kind="wgrad")
    with pytest.raises(ValueError, match=r"dy: expected 40 rows \(the rows of x\), got shape \(39, 48\)"):
        grouped.moe_gemm_wgrad(x, fake((39, 48), BASE + 0x1000000, "<f2"), offs, dw)
    with pytest.raises(ValueError, match=r"dw: expected shape \(G, 48, 64\) for dw_layout='nk', got \(4, 64, 48\)"):
        grouped.moe_gemm_wgrad(x, dy, offs, dw, dw_layout="nk")
    with pytest.raises(ValueError, match=r"dw_layout: expected 'kn' \(dw is \(G, K, N\)\) or 'nk'"):
        grouped.moe_gemm_wgrad(x, dy, offs, dw, dw_layout="mn")
    with pytest.raises(TypeError, match=r"dy: expected the dtype of x \(float16\), got float32"):
        grouped.moe_gemm_wgrad(x, fake((40, 48), BASE + 0x1000000, "<f4"), offs, dw)


def test_routes_are_checked_against_the_offsets_kind():
    x, w, offs, out = moe()
    with pytest.raises(ValueError, match="route: expected None or one of .*'lt_grouped', 'host_offsets', got 'fast'"):
        grouped.moe_gemm(x, w, offs, out, route="fast")
    with pytest.raises(ValueError, match="route: 'lt_grouped' does not apply: it reads the group offsets from a device"):
        grouped.moe_gemm(x, w, [0, 10, 20, 30, 40], out, route="lt_grouped")


@pytest.mark.nogpu
@pytest.mark.parametrize("call", ["forward", "wgrad"])
def test_a_valid_call_gets_as_far_as_the_gpu(call):
    """Every check passes on the CPU: the first error is the missing GPU."""
    x, b, offs, out = moe(kind=call)
    fn = grouped.moe_gemm if call == "forward" else grouped.moe_gemm_wgrad
    with pytest.raises(Exception) as info:
        fn(x, b, offs, out)
    assert "GPU" in str(info.value) or "driver" in str(info.value), info.value


# ---------------------------------------------------------------- CPU: the route describe_moe names, and why

HOPPER_13_10 = dict(version=131000, major=9)


@pytest.mark.parametrize("kind", ["forward", "wgrad"])
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_hopper_and_cublas_13_10_take_the_sync_free_route(kind, layout):
    with lt_features._pretend(**HOPPER_13_10):
        d = grouped.describe_moe(*moe(layout=layout, kind=kind), kind=kind, layout=layout)
    assert d["offsets"] == "device" and d["groups"] == 4
    assert d["routes"] == ["lt_grouped", "host_offsets"]
    assert d["chosen"] == "lt_grouped" and d["decided_by"] == "rule" and d["syncs"] is False


@pytest.mark.parametrize("pretend,words", [
    (dict(version=130100, major=9), "needs cuBLASLt 13.8.1 or newer"),
    (dict(version=130800, major=9), "needs cuBLASLt 13.8.1 or newer"),
    (dict(version=131000, major=8), "compute capability 9.0 or newer (Hopper); device 0 is 8.x"),
    (dict(version=131000, major=9, grouped=False), "does not export cublasLtGroupedMatrixLayoutCreate"),
])
def test_an_older_cublas_or_gpu_reads_the_offsets_once_and_says_why(pretend, words):
    with lt_features._pretend(**pretend):
        d = grouped.describe_moe(*moe())
    assert d["chosen"] == "host_offsets" and d["syncs"] is True
    assert words in d["not_applicable"]["lt_grouped"]


@pytest.mark.parametrize("case,words", [
    (dict(typestr="<f4"), "takes bfloat16 and float16 here, got float32"),
    (dict(K=60), "must start on 16 bytes"),                 # x's rows 120 bytes apart
    (dict(N=44), "must start on 16 bytes"),                 # out's rows 88 bytes apart
    (dict(G=1025, T=2050), "at most 1024 groups"),
])
def test_what_the_grouped_matmul_cannot_take_is_named(case, words):
    with lt_features._pretend(**HOPPER_13_10):
        d = grouped.describe_moe(*moe(**case))
    assert d["chosen"] == "host_offsets"
    assert words in d["not_applicable"]["lt_grouped"], d["not_applicable"]


def test_a_determinism_mode_reads_the_offsets():
    with lt_features._pretend(**HOPPER_13_10):
        d = grouped.describe_moe(*moe(), determinism="batch_invariant")
    assert d["chosen"] == "host_offsets" and "determinism mode" in d["not_applicable"]["lt_grouped"]


def test_inside_a_capture_only_the_sync_free_route_applies():
    with lt_features._pretend(**HOPPER_13_10):
        d = grouped.describe_moe(*moe(), capturing=True)
    assert d["routes"] == ["lt_grouped"] and d["chosen"] == "lt_grouped"
    assert "sync" in d["not_applicable"]["host_offsets"]
    with lt_features._pretend(version=130100, major=9):
        d = grouped.describe_moe(*moe(), capturing=True)
    assert d["routes"] == [] and d["chosen"] is None
    assert "CaptureError" in d["why_chosen"] and "13.8.1" in d["why_chosen"]


def test_host_offsets_name_the_host_routes_and_why_not_lt_grouped():
    x, w, _, out = moe(typestr="<f4")
    d = grouped.describe_moe(x, w, [0, 10, 10, 30, 40], out)
    assert d["offsets"] == "host" and d["syncs"] is False and d["chosen"] == "loop"
    assert "device array" in d["not_applicable"]["lt_grouped"]
    x, dy, _, dw = moe(kind="wgrad", typestr="<f4")
    d = grouped.describe_moe(x, dy, [0, 10, 10, 30, 40], dw, kind="wgrad")
    assert d["groups"] == 4 and "lt_grouped" in d["not_applicable"]


def test_describe_grouped_names_lt_grouped_and_what_it_needs():
    As = [fake((4, 8), BASE + 0x1000 * i) for i in range(3)]
    Bs = [fake((8, 8), BASE + 0x100000 + 0x1000 * i) for i in range(3)]
    outs = [fake((4, 8), BASE + 0x200000 + 0x1000 * i) for i in range(3)]
    d = grouped.describe_grouped(As, Bs, outs)
    assert "device array" in d["not_applicable"]["lt_grouped"]


def test_a_forced_route_is_what_describe_moe_chooses():
    from cygemm.engine import tuning
    tuning.force_routes(moe_offsets="host_offsets")
    try:
        with lt_features._pretend(**HOPPER_13_10):
            d = grouped.describe_moe(*moe())
        assert d["chosen"] == "host_offsets" and d["decided_by"] == "forced"
    finally:
        tuning.force_routes()


# ---------------------------------------------------------------- GPU: results against float64

def _cp():
    import cupy as cp
    return cp


def _offsets(counts):
    return [0] + np.cumsum(counts).tolist()


def _moe_ref(x, w, offs, layout):
    out = np.empty((x.shape[0], w.shape[2] if layout == "kn" else w.shape[1]))
    for g in range(len(offs) - 1):
        a, b = offs[g], offs[g + 1]
        out[a:b] = x[a:b] @ (w[g] if layout == "kn" else w[g].T)
    return out


def _wgrad_ref(x, dy, offs, layout):
    G = len(offs) - 1
    dw = np.zeros((G, x.shape[1], dy.shape[1]) if layout == "kn" else (G, dy.shape[1], x.shape[1]))
    for g in range(G):
        a, b = offs[g], offs[g + 1]
        dw[g] = x[a:b].T @ dy[a:b] if layout == "kn" else dy[a:b].T @ x[a:b]
    return dw


def _lt_usable():
    return lt_features.feature_gate("grouped_gemm") is None


ROUTES = ["lt_grouped", "host_offsets", None]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("index", ["int32", "int64"])
@pytest.mark.parametrize("route", ROUTES)
def test_forward_with_device_offsets_matches_float64(dtype, layout, index, route):
    cp = _cp()
    if route == "lt_grouped" and not _lt_usable():
        pytest.skip(f"lt_grouped: {lt_features.feature_gate('grouped_gemm')}")
    import ml_dtypes  # noqa: F401 (CuPy holds bfloat16 through it)
    counts = [7, 0, 33, 1, 24, 0, 16]
    offs = _offsets(counts)
    T, K, N, G = offs[-1], 64, 48, len(counts)
    x = rand(cp, (T, K)).astype(dtype)
    w = rand(cp, (G, K, N) if layout == "kn" else (G, N, K)).astype(dtype)
    out = poisoned(cp, (T, N), dtype)
    dev = cp.asarray(offs, dtype=index)
    grouped.moe_gemm(x, w, dev, out, w_layout=layout, route=route)
    cp.cuda.Device().synchronize()
    if route is None:
        assert grouped.last_route() in ("lt_grouped", "loop", "grouped", "streams", "batched")
    assert rel_err(cp.asnumpy(out.astype(cp.float32)), _moe_ref(f64(cp, x), f64(cp, w), offs, layout)) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("route", ROUTES)
def test_wgrad_with_device_offsets_matches_float64_and_zeroes_empty_experts(layout, route):
    cp = _cp()
    if route == "lt_grouped" and not _lt_usable():
        pytest.skip(f"lt_grouped: {lt_features.feature_gate('grouped_gemm')}")
    counts = [5, 0, 40, 3, 0, 16]
    offs = _offsets(counts)
    T, K, N, G = offs[-1], 64, 32, len(counts)
    x, dy = rand(cp, (T, K)).astype("bfloat16"), rand(cp, (T, N)).astype("bfloat16")
    dw = poisoned(cp, (G, K, N) if layout == "kn" else (G, N, K), "bfloat16")
    grouped.moe_gemm_wgrad(x, dy, cp.asarray(offs, dtype=cp.int32), dw, dw_layout=layout, route=route)
    cp.cuda.Device().synchronize()
    got = cp.asnumpy(dw.astype(cp.float32))
    assert (got[1] == 0).all() and (got[4] == 0).all()
    assert rel_err(got, _wgrad_ref(f64(cp, x), f64(cp, dy), offs, layout)) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_host_and_device_offsets_agree_for_float32_through_the_host_routes(layout):
    cp = _cp()
    counts = [3, 9, 0, 12]
    offs = _offsets(counts)
    T, K, N, G = offs[-1], 32, 24, len(counts)
    x, dy = rand(cp, (T, K)), rand(cp, (T, N))
    dw, dw_dev = poisoned(cp, (G, K, N) if layout == "kn" else (G, N, K)), poisoned(cp, (G, K, N) if layout == "kn" else (G, N, K))
    grouped.moe_gemm_wgrad(x, dy, offs, dw, dw_layout=layout, math="fp32")
    grouped.moe_gemm_wgrad(x, dy, cp.asarray(offs, dtype=cp.int64), dw_dev, dw_layout=layout, math="fp32")
    cp.cuda.Device().synchronize()
    ref = _wgrad_ref(f64(cp, x), f64(cp, dy), offs, layout)
    assert rel_err(cp.asnumpy(dw), ref) < 1e-5 and rel_err(cp.asnumpy(dw_dev), ref) < 1e-5


@pytest.mark.gpu
def test_check_offsets_refuses_wrong_device_offsets():
    cp = _cp()
    T, K, N, G = 20, 16, 8, 3
    x, w, out = rand(cp, (T, K)), rand(cp, (G, K, N)), poisoned(cp, (T, N))
    with pytest.raises(ValueError, match="group_offsets: expected non-decreasing offsets"):
        grouped.moe_gemm(x, w, cp.asarray([0, 12, 4, 20], dtype=cp.int32), out, check_offsets=True)
    with pytest.raises(ValueError, match="group_offsets: expected the last offset to be T = 20"):
        grouped.moe_gemm(x, w, cp.asarray([0, 4, 8, 19], dtype=cp.int32), out, check_offsets=True)


@pytest.mark.gpu
def test_wrong_device_offsets_never_write_outside_out():
    """Unchecked wrong offsets give wrong rows but touch nothing past out (a guard band around it)."""
    cp = _cp()
    if not _lt_usable():
        pytest.skip(f"lt_grouped: {lt_features.feature_gate('grouped_gemm')}")
    T, K, N, G = 32, 64, 48, 3
    x, w = rand(cp, (T, K)).astype("bfloat16"), rand(cp, (G, K, N)).astype("bfloat16")
    band = cp.full((T + 16, N), 7, "bfloat16")
    out = band[8:8 + T]
    grouped.moe_gemm(x, w, cp.asarray([-4, 40, 8, 1000], dtype=cp.int64), out, route="lt_grouped")
    cp.cuda.Device().synchronize()
    assert (band[:8] == 7).all() and (band[8 + T:] == 7).all()


@pytest.mark.gpu
def test_a_captured_graph_replays_with_new_offsets_and_syncs_nothing():
    cp = _cp()
    if not _lt_usable():
        pytest.skip(f"lt_grouped: {lt_features.feature_gate('grouped_gemm')}")
    T, K, N, G = 96, 64, 48, 5
    x = rand(cp, (T, K)).astype("bfloat16")
    w = rand(cp, (G, K, N)).astype("bfloat16")
    dy = rand(cp, (T, N)).astype("bfloat16")
    out, dw = poisoned(cp, (T, N), "bfloat16"), poisoned(cp, (G, K, N), "bfloat16")
    dev = cp.asarray(_offsets([20, 20, 20, 20, 16]), dtype=cp.int32)
    s = cp.cuda.Stream(non_blocking=True)
    grouped.moe_gemm(x, w, dev, out, stream=s)                 # first use: plans, the promise's check
    cp.cuda.Device().synchronize()
    with cygemm.graph.capture(s) as g:
        grouped.moe_gemm(x, w, dev, out, stream=s)
        grouped.moe_gemm_wgrad(x, dy, dev, dw, stream=s)
    rng = np.random.default_rng(7)
    for _ in range(3):
        counts = rng.multinomial(T, [1 / G] * G)
        counts[rng.integers(G)] += counts[0] * 0     # (keeps the sum)
        counts[1] = 0 if rng.random() < 0.5 else counts[1]
        counts[-1] += T - counts.sum()
        offs = _offsets(counts)
        dev[...] = cp.asarray(offs, dtype=cp.int32)
        out[...] = cp.nan
        dw[...] = cp.nan
        cp.cuda.Device().synchronize()
        g.launch(s)
        s.synchronize()
        assert rel_err(cp.asnumpy(out.astype(cp.float32)), _moe_ref(f64(cp, x), f64(cp, w), offs, "kn")) < 2e-2
        assert rel_err(cp.asnumpy(dw.astype(cp.float32)), _wgrad_ref(f64(cp, x), f64(cp, dy), offs, "kn")) < 2e-2


@pytest.mark.gpu
def test_device_offsets_inside_a_capture_without_the_grouped_matmul_raise_capture_error():
    cp = _cp()
    T, K, N, G = 16, 16, 16, 2
    x, w, out = rand(cp, (T, K)), rand(cp, (G, K, N)), poisoned(cp, (T, N))     # float32: no lt_grouped
    dev = cp.asarray([0, 8, 16], dtype=cp.int32)
    s = cp.cuda.Stream(non_blocking=True)
    with pytest.raises(cygemm.CaptureError, match="takes bfloat16 and float16"):
        with cygemm.graph.capture(s):
            grouped.moe_gemm(x, w, dev, out, stream=s)
