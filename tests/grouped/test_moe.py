"""The mixture-of-experts calls (cygemm.grouped.moe): moe_gemm and moe_gemm_wgrad with offsets
on the host or the GPU. On the CPU: every refusal before anything runs, and describe_moe for host
offsets; on the GPU: both routes of device offsets and the host routes against float64 references
on fresh seeded inputs with NaN-poisoned outputs, ragged and empty experts, int32 and int64
offsets, check_offsets, and the capture error where the sync-free route does not apply."""
import pytest

from cygemm import grouped
from fakes import BASE, FakeDeviceArray, moe_fakes
from refs import moe as moe_ref
from gpu_util import f64, poisoned, rand, rel_err, skip_without_lt_grouped


def fake(shape, ptr, typestr="<f4", strides=None):
    return FakeDeviceArray(shape, typestr, strides, ptr)


def moe(**kw):
    return moe_fakes(**kw)


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


# ---------------------------------------------------------------- CPU: describe_moe of host offsets

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


# ---------------------------------------------------------------- GPU: results against float64

def _cp():
    import cupy as cp
    return cp


ROUTES = ["lt_grouped", "host_offsets", None]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("index", ["int32", "int64"])
@pytest.mark.parametrize("route", ROUTES)
def test_forward_with_device_offsets_matches_float64(dtype, layout, index, route):
    cp = _cp()
    if route == "lt_grouped":
        skip_without_lt_grouped()
    counts = [7, 0, 33, 1, 24, 0, 16]
    offs = moe_ref.offsets(counts)
    T, K, N, G = offs[-1], 64, 48, len(counts)
    x = rand(cp, (T, K)).astype(dtype)
    w = rand(cp, (G, K, N) if layout == "kn" else (G, N, K)).astype(dtype)
    out = poisoned(cp, (T, N), dtype)
    dev = cp.asarray(offs, dtype=index)
    grouped.moe_gemm(x, w, dev, out, w_layout=layout, route=route)
    cp.cuda.Device().synchronize()
    if route is None:
        assert grouped.last_route() in ("lt_grouped", "loop", "grouped", "streams", "batched")
    assert rel_err(cp.asnumpy(out.astype(cp.float32)), moe_ref.forward(f64(cp, x), f64(cp, w), offs, layout)) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("route", ROUTES)
def test_wgrad_with_device_offsets_matches_float64_and_zeroes_empty_experts(layout, route):
    cp = _cp()
    if route == "lt_grouped":
        skip_without_lt_grouped()
    counts = [5, 0, 40, 3, 0, 16]
    offs = moe_ref.offsets(counts)
    T, K, N, G = offs[-1], 64, 32, len(counts)
    x, dy = rand(cp, (T, K)).astype("bfloat16"), rand(cp, (T, N)).astype("bfloat16")
    dw = poisoned(cp, (G, K, N) if layout == "kn" else (G, N, K), "bfloat16")
    grouped.moe_gemm_wgrad(x, dy, cp.asarray(offs, dtype=cp.int32), dw, dw_layout=layout, route=route)
    cp.cuda.Device().synchronize()
    got = cp.asnumpy(dw.astype(cp.float32))
    assert (got[1] == 0).all() and (got[4] == 0).all()
    assert rel_err(got, moe_ref.wgrad(f64(cp, x), f64(cp, dy), offs, layout)) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_host_and_device_offsets_agree_for_float32_through_the_host_routes(layout):
    cp = _cp()
    counts = [3, 9, 0, 12]
    offs = moe_ref.offsets(counts)
    T, K, N, G = offs[-1], 32, 24, len(counts)
    x, dy = rand(cp, (T, K)), rand(cp, (T, N))
    dw, dw_dev = poisoned(cp, (G, K, N) if layout == "kn" else (G, N, K)), poisoned(cp, (G, K, N) if layout == "kn" else (G, N, K))
    grouped.moe_gemm_wgrad(x, dy, offs, dw, dw_layout=layout, math="fp32")
    grouped.moe_gemm_wgrad(x, dy, cp.asarray(offs, dtype=cp.int64), dw_dev, dw_layout=layout, math="fp32")
    cp.cuda.Device().synchronize()
    ref = moe_ref.wgrad(f64(cp, x), f64(cp, dy), offs, layout)
    assert rel_err(cp.asnumpy(dw), ref) < 1e-5 and rel_err(cp.asnumpy(dw_dev), ref) < 1e-5
