"""cuBLASLt's grouped matmul fed from device offsets (cygemm.grouped.lt_grouped): on the CPU, when
the route applies and why not, for each cuBLAS version, GPU, dtype, alignment, group count, mode
and capture (the feature gate's test hook stands in for other libraries and GPUs), as
describe_moe reports it; on the GPU, wrong offsets never touch memory outside the operands, and a
captured graph replays with new offsets (no host sync)."""
import numpy as np
import pytest

import cygemm
from cygemm import grouped
from cygemm.engine import lt_features
from fakes import FakeDeviceArray, moe_fakes
from refs import moe as moe_ref
from gpu_util import f64, poisoned, rand, rel_err, skip_without_lt_grouped


def fake(shape, ptr, typestr="<f4", strides=None):
    return FakeDeviceArray(shape, typestr, strides, ptr)


def moe(**kw):
    return moe_fakes(**kw)


# ---------------------------------------------------------------- CPU: the route describe_moe names, and why

HOPPER_13_10 = dict(version=131000, major=9)


@pytest.mark.parametrize("kind", ["forward", "wgrad"])
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_hopper_and_cublas_13_10_take_the_sync_free_route(kind, layout):
    with lt_features._pretend(**HOPPER_13_10):
        d = grouped.describe_moe(*moe(layout=layout, kind=kind), kind=kind,
                                 **({"dw_layout": layout} if kind == "wgrad" else {"w_layout": layout}))
    assert d["offsets"] == "device" and d["groups"] == 4
    assert d["routes"] == ["lt_grouped", "host_offsets"]
    assert d["chosen"] == "lt_grouped" and d["decided_by"] == "rule" and d["syncs"] is False


@pytest.mark.parametrize("case,words", [
    (dict(typestr="<f4"), "takes bfloat16 and float16 here, got float32"),
    (dict(K=60), "x: every group's matrix must start on 16 bytes"),    # x's rows 120 bytes apart
    (dict(N=44), "w: its matrices' 44 elements along the contiguous axis"),     # w[g] (K, 44)
    (dict(G=897, T=1794), "at most 896 groups"),
])
def test_what_the_grouped_matmul_cannot_take_is_named(case, words):
    with lt_features._pretend(**HOPPER_13_10):
        d = grouped.describe_moe(*moe(**case))
    assert d["chosen"] == "host_offsets"
    assert words in d["not_applicable"]["lt_grouped"], d["not_applicable"]


# ---------------------------------------------------------------- GPU

def _cp():
    import cupy as cp
    return cp


@pytest.mark.gpu
def test_wrong_device_offsets_never_write_outside_out():
    """Unchecked wrong offsets give wrong rows but touch nothing past out (a guard band around it)."""
    cp = _cp()
    skip_without_lt_grouped()
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
    skip_without_lt_grouped()
    T, K, N, G = 96, 64, 48, 5
    x = rand(cp, (T, K)).astype("bfloat16")
    w = rand(cp, (G, K, N)).astype("bfloat16")
    dy = rand(cp, (T, N)).astype("bfloat16")
    out, dw = poisoned(cp, (T, N), "bfloat16"), poisoned(cp, (G, K, N), "bfloat16")
    dev = cp.asarray(moe_ref.offsets([20, 20, 20, 20, 16]), dtype=cp.int32)
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
        offs = moe_ref.offsets(counts)
        dev[...] = cp.asarray(offs, dtype=cp.int32)
        out[...] = cp.nan
        dw[...] = cp.nan
        cp.cuda.Device().synchronize()
        g.launch(s)
        s.synchronize()
        assert rel_err(cp.asnumpy(out.astype(cp.float32)), moe_ref.forward(f64(cp, x), f64(cp, w), offs, "kn")) < 2e-2
        assert rel_err(cp.asnumpy(dw.astype(cp.float32)), moe_ref.wgrad(f64(cp, x), f64(cp, dy), offs, "kn")) < 2e-2




def _strided(shape, strides_elems, ptr, typestr="<f2"):
    return FakeDeviceArray(shape, typestr, tuple(2 * e for e in strides_elems), ptr)


def _case(name):
    """(x, w, out) stand-ins of one layout cuBLASLt's rules for grouped matrices rule out."""
    base = 0x7F0000000000
    if name == "K of 200 bytes":            # x = buf[:, :100] of (40, 128): rows on 16 bytes, K is not
        return (_strided((40, 100), (128, 1), base), FakeDeviceArray((4, 100, 48), "<f2", None, base + 0x1000000),
                FakeDeviceArray((40, 48), "<f2", None, base + 0x2000000))
    if name == "w's rows 200 bytes apart":  # w = wbuf[:, :, :48] of (4, 64, 100)
        return (FakeDeviceArray((40, 64), "<f2", None, base), _strided((4, 64, 48), (6400, 100, 1), base + 0x1000000),
                FakeDeviceArray((40, 48), "<f2", None, base + 0x2000000))
    if name == "x broadcast":               # x's rows all one row (stride 0)
        return (_strided((40, 64), (0, 1), base), FakeDeviceArray((4, 64, 48), "<f2", None, base + 0x1000000),
                FakeDeviceArray((40, 48), "<f2", None, base + 0x2000000))
    raise KeyError(name)


@pytest.mark.parametrize("name,words", [
    ("K of 200 bytes", "x: its matrices' 100 elements along the contiguous axis"),
    ("w's rows 200 bytes apart", "w: its matrices' 48 elements along the contiguous axis and their stride of 100"),
])
def test_layouts_cublaslt_rules_out_for_grouped_matrices_are_named(name, words):
    x, w, out = _case(name)
    offs = FakeDeviceArray((5,), "<i4", None, 0x7F0030000000)
    with lt_features._pretend(**HOPPER_13_10):
        d = grouped.describe_moe(x, w, offs, out)
    assert d["chosen"] == "host_offsets" and words in d["not_applicable"]["lt_grouped"], d["not_applicable"]


def test_a_layout_no_route_can_read_is_refused_before_any_route_is_chosen():
    """x broadcast along its rows: neither the grouped matmul nor the routes of host offsets
    read it, so describe (and the call) refuse it up front rather than name a route that would
    sync and then fail."""
    x, w, out = _case("x broadcast")
    offs = FakeDeviceArray((5,), "<i4", None, 0x7F0030000000)
    with lt_features._pretend(**HOPPER_13_10):
        with pytest.raises(ValueError, match=r"x\[0:40\]: a layout cuBLAS cannot read in place"):
            grouped.describe_moe(x, w, offs, out)
        with pytest.raises(ValueError, match=r"x\[0:40\]: a layout cuBLAS cannot read in place"):
            grouped.moe_gemm(x, w, offs, out)


def test_experts_gradients_that_share_memory_are_refused():
    x, dy, offs, _ = moe(kind="wgrad")
    dw = _strided((4, 64, 48), (0, 48, 1), 0x7F0002000000)       # every expert's gradient in one matrix
    for o in (offs, [0, 10, 10, 30, 40]):
        with pytest.raises(ValueError, match=r"dw: its experts' matrices overlap \(a batch stride of 0 elements"):
            grouped.moe_gemm_wgrad(x, dy, o, dw)


def test_a_weight_gradient_into_misaligned_rows_is_named():
    x, dy, offs, _ = moe(kind="wgrad")
    dw = _strided((4, 64, 48), (6400, 100, 1), 0x7F0002000000)       # dw = buf[:, :, :48] of (4, 64, 100)
    with lt_features._pretend(**HOPPER_13_10):
        d = grouped.describe_moe(x, dy, offs, dw, kind="wgrad")
    assert "dw: its matrices' 48 elements along the contiguous axis and their stride of 100" in \
        d["not_applicable"]["lt_grouped"]


@pytest.mark.parametrize("major", [8, 12])
def test_only_the_gpus_cublaslt_lists_for_grouped_matrices_take_it(major):
    with lt_features._pretend(version=131000, major=major):
        d = grouped.describe_moe(*moe())
    assert d["chosen"] == "host_offsets" and f"is {major}.x" in d["not_applicable"]["lt_grouped"]
