"""FP8 scale modes (cygemm.fp8.args): per tensor, rowwise, 1x128 and 128x128 scales told by
their shapes and layouts or by scale_mode=, every refusal before anything runs (CPU, on fake
device arrays), and every pairing cuBLASLt runs on Hopper against a float64 reference of the
FP8 values with the scales expanded as tests/refs/fp8.py defines them (GPU)."""
import numpy as np
import pytest

import cygemm
from cygemm import fp8
from fakes import FakeDeviceArray, BASE
from refs import fp8 as fp8_ref
from gpu_util import rel_err

M, K, N = 256, 1024, 512
KB, MB, NB = K // 128, M // 128, N // 128


def fake(shape, typestr="|u1", strides=None, ptr=BASE):
    """A fake device array; strides in elements."""
    item = int(typestr[2:])
    return FakeDeviceArray(shape, typestr, None if strides is None else tuple(s * item for s in strides), ptr)


def f32(shape, strides=None, ptr=BASE + 0x400000):
    return fake(shape, "<f4", strides, ptr)


A = fake((M, K))
B = fake((K, N), strides=(1, K), ptr=BASE + 0x100000)         # w.T of a C-contiguous (N, K) w
# Each mode's scale_a and scale_b at (M, K, N), in cuBLASLt's layouts (see cygemm.fp8.args).
SCALES = {
    "tensor": (f32(()), f32((1,), ptr=BASE + 0x500000)),
    "rowwise": (f32((M, 1)), f32((1, N), ptr=BASE + 0x500000)),
    "1x128": (f32((M, KB), strides=(1, M)), f32((KB, N), ptr=BASE + 0x500000)),
    "128x128": (f32((MB, KB), strides=(8, 1)), f32((KB, NB), strides=(1, 8), ptr=BASE + 0x500000)),
}


def describe(scale_a, scale_b, **kw):
    return fp8.describe_scaled_matmul(A, B, scale_a, scale_b, format_a="e4m3", format_b="e4m3", **kw)


# ------------------------------------------------------------------ CPU: modes and refusals

@pytest.mark.parametrize("mode_a, mode_b", [("tensor", "tensor"), ("rowwise", "rowwise"), ("1x128", "128x128"),
                                            ("1x128", "1x128"), ("128x128", "1x128")])
def test_the_mode_is_told_by_the_scales_shapes_and_layouts(mode_a, mode_b):
    d = describe(SCALES[mode_a][0], SCALES[mode_b][1])
    assert d["scale_modes"] == {"a": mode_a, "b": mode_b}
    assert d["d_type"] == "bfloat16" and d["scales"] == {"a": True, "b": True, "out": False}
    assert describe(SCALES[mode_a][0], SCALES[mode_b][1], scale_mode=(mode_a, mode_b))["scale_modes"] == d["scale_modes"]


def test_rowwise_scales_may_be_vectors_and_shapes_fitting_two_modes_take_the_first_pair():
    d = describe(f32((M,)), f32((N,), ptr=BASE + 0x500000))
    assert d["scale_modes"] == {"a": "rowwise", "b": "rowwise"}
    # K = 128: one block along K, so a (M, 1) scale is rowwise and 1x128 at once (the same numbers).
    a, b = fake((M, 128)), fake((128, N), strides=(1, 128), ptr=BASE + 0x100000)
    sa, sb = f32((M, 1)), f32((1, N), ptr=BASE + 0x500000)
    kw = dict(format_a="e4m3", format_b="e4m3")
    assert fp8.describe_scaled_matmul(a, b, sa, sb, **kw)["scale_modes"] == {"a": "rowwise", "b": "rowwise"}
    assert fp8.describe_scaled_matmul(a, b, sa, sb, scale_mode="1x128", **kw)["scale_modes"] == {
        "a": "1x128", "b": "1x128"}
    # 128x128 scales with K not a multiple of 4 blocks: rows padded to the next multiple of 4.
    a, b = fake((M, 384)), fake((384, N), strides=(1, 384), ptr=BASE + 0x100000)
    d = fp8.describe_scaled_matmul(a, b, f32((M, 3), strides=(1, M)), f32((3, NB), strides=(1, 4), ptr=BASE + 0x500000),
                                   **kw)
    assert d["scale_modes"] == {"a": "1x128", "b": "128x128"}


@pytest.mark.parametrize("scales, kw, exc, words", [
    # a 1x128 scale_a stored K-contiguous (the transposed layout)
    ((f32((M, KB)), SCALES["128x128"][1]), {}, ValueError,
     ["scale_a:", f"({M}, {KB}) float32 stored M-contiguous", f"element strides (1, {M})",
      f"cupy.empty(({KB}, {M}), cupy.float32).T", f"got shape ({M}, {KB}) with element strides ({KB}, 1)"]),
    # a 128x128 scale_b stored N-contiguous
    ((SCALES["1x128"][0], f32((KB, NB), ptr=BASE + 0x500000)), {}, ValueError,
     ["scale_b:", f"({KB}, {NB}) float32 stored K-contiguous with columns 8 apart", "element strides (1, 8)"]),
    # 128x128 rows must be round_up(ceil(K/128), 4) apart: K = 1024 gives 8, not 12
    ((f32((MB, KB), strides=(12, 1)), SCALES["1x128"][1]), {}, ValueError, ["scale_a:", "rows 8 apart"]),
    ((SCALES["128x128"][0], SCALES["128x128"][1]), {}, ValueError,
     ["scale_a/scale_b", "not 128x128 with 128x128"]),
    ((SCALES["rowwise"][0], SCALES["tensor"][1]), {}, ValueError, ["scale_a/scale_b", "rowwise with rowwise"]),
    ((SCALES["tensor"][0], SCALES["tensor"][1]), dict(scale_mode="rowwise"), ValueError,
     ["scale_a:", "rowwise scale of a (M, K) = (256, 1024)", f"({M}, 1) float32"]),
    ((SCALES["1x128"][0], SCALES["1x128"][1]), dict(scale_mode="blockwise"), ValueError,
     ["scale_mode:", "'128x128'", "'1x128'", "'rowwise'", "'tensor'"]),
    ((SCALES["1x128"][0], SCALES["1x128"][1]), dict(scale_mode=("128x128", "128x128")), ValueError,
     ["scale_mode:", "not 128x128 with 128x128"]),
    ((SCALES["1x128"][0], SCALES["1x128"][1]), dict(out_dtype="e4m3"), ValueError,
     ["out:", "1x128 scales", "float16, bfloat16 or float32", "float8_e4m3fn"]),
    ((f32((M, KB), strides=(1, M), ptr=BASE + 0x400004), SCALES["1x128"][1]), {}, ValueError,
     ["scale_a:", "16-byte aligned", "0x7f0000400004"]),
    ((fake((M, KB), "<f2", strides=(1, M)), SCALES["1x128"][1]), {}, TypeError, ["scale_a:", "float32", "float16"]),
    ((f32((1, M, KB)), SCALES["1x128"][1]), {}, ValueError, ["scale_a:", "at most 2 dimensions"]),
])
def test_bad_scales_are_refused_naming_the_argument_and_the_layout(scales, kw, exc, words):
    with pytest.raises(exc) as info:
        describe(*scales, **kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_block_scales_need_m_and_n_multiples_of_4():
    kw = dict(format_a="e4m3", format_b="e4m3")
    b = fake((K, N), strides=(1, K), ptr=BASE + 0x100000)
    with pytest.raises(ValueError, match=r"a: FP8 GEMMs with block scales need M to be a multiple of 4, got M = 6"):
        fp8.describe_scaled_matmul(fake((6, K)), b, f32((6, KB), strides=(1, 6)), SCALES["1x128"][1], **kw)
    with pytest.raises(ValueError, match=r"b: FP8 GEMMs with block scales need N to be a multiple of 4, got N = 22"):
        fp8.describe_scaled_matmul(A, fake((K, 22), strides=(1, K), ptr=BASE + 0x100000), SCALES["1x128"][0],
                                   f32((KB, 22), ptr=BASE + 0x500000), out=fake((M, 22), "<f4", ptr=BASE + 0x800000),
                                   **kw)
    b = fake((K, 20), strides=(1, K), ptr=BASE + 0x100000)
    out = fake((M, 20), "<f4", ptr=BASE + 0x800000)
    # rowwise scales have no such rule: N = 20 (a float32 out's rows are 80 bytes, 16-byte multiples)
    d = fp8.describe_scaled_matmul(A, b, SCALES["rowwise"][0], f32((1, 20), ptr=BASE + 0x500000), out=out, **kw)
    assert d["scale_modes"] == {"a": "rowwise", "b": "rowwise"}


def test_the_reference_expands_each_scale_over_its_block():
    s = np.arange(1.0, 7.0).reshape(2, 3)             # a (2, 300): 1x128 blocks along K
    e = fp8_ref.expand_scale(s, "1x128", (2, 300), "a")
    assert e[1, 0] == 4.0 and e[1, 127] == 4.0 and e[1, 128] == 5.0 and e[0, 299] == 3.0
    e = fp8_ref.expand_scale(s.T, "1x128", (300, 2), "b")          # b (300, 2): blocks down K
    assert e[0, 1] == 4.0 and e[128, 1] == 5.0 and e[299, 0] == 3.0
    e = fp8_ref.expand_scale(s, "128x128", (200, 300), "a")
    assert e[127, 127] == 1.0 and e[128, 0] == 4.0 and e[199, 299] == 6.0
    e = fp8_ref.expand_scale([7.0, 8.0], "rowwise", (2, 5), "a")
    assert (e[0] == 7.0).all() and (e[1] == 8.0).all()


# ------------------------------------------------------------------ GPU: against float64

PAIRS = [("tensor", "tensor"), ("rowwise", "rowwise"), ("1x128", "128x128"), ("1x128", "1x128"), ("128x128", "1x128")]
# bfloat16 out rounds to 2**-8; float32 out keeps FP8 tensor-core sums (measured 1e-4 per tensor).
TOL = {"bfloat16": 1e-2, "float32": 5e-4}


def _scales_on_device(cp, rng, mode, operand, m, k, n):
    """Random positive scales of `mode` for a (m, k) or b (k, n), as host float64 and as the
    device array in cuBLASLt's layout."""
    kb, ld = -(-k // 128), -(-(-(-k // 128)) // 4) * 4
    rows = m if operand == "a" else n
    blocks = -(-rows // 128)
    if mode == "tensor":
        host = rng.uniform(0.25, 2.0, 1)
        return host, cp.asarray(host.astype(np.float32))
    if mode == "rowwise":
        host = rng.uniform(0.25, 2.0, rows)
        shape = (rows, 1) if operand == "a" else (1, rows)
        return host, cp.asarray(host.astype(np.float32).reshape(shape))
    if mode == "1x128":
        host = rng.uniform(0.25, 2.0, (rows, kb) if operand == "a" else (kb, rows))
        if operand == "a":          # M-contiguous
            return host, cp.ascontiguousarray(cp.asarray(host.T.astype(np.float32))).T
        return host, cp.asarray(host.astype(np.float32))
    host = rng.uniform(0.25, 2.0, (blocks, kb) if operand == "a" else (kb, blocks))
    buf = cp.full((blocks, ld), cp.nan, dtype=cp.float32)       # the padding is never read
    buf[:, :kb] = cp.asarray((host if operand == "a" else host.T).astype(np.float32))
    return host, (buf[:, :kb] if operand == "a" else buf[:, :kb].T)


def _operands(cp, rng, m, k, n):
    a_codes = fp8_ref.to_codes(rng.standard_normal((m, k)) * 8, "e4m3")
    w_codes = fp8_ref.to_codes(rng.standard_normal((n, k)) * 8, "e4m3")
    return (cp.asarray(a_codes), fp8_ref.decode(a_codes, "e4m3"),
            cp.asarray(w_codes), fp8_ref.decode(w_codes, "e4m3").T)


def _problem(cp, rng, mode_a, mode_b, m, k, n):
    """Random E4M3 operands a (m, k) and w (n, k) on the device, scales of each mode, and
    ref(f): the float64 product of their values with a's scales times f."""
    a, a64, w, b64 = _operands(cp, rng, m, k, n)
    sa_host, sa = _scales_on_device(cp, rng, mode_a, "a", m, k, n)
    sb_host, sb = _scales_on_device(cp, rng, mode_b, "b", m, k, n)
    return a, w, sa, sb, lambda f=1.0: fp8_ref.scaled_product(a64, sa_host * f, mode_a, b64, sb_host, mode_b)


@pytest.mark.gpu
@pytest.mark.parametrize("mode_a, mode_b", PAIRS)
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("m, k, n", [(256, 1024, 512), (132, 320, 200)])
def test_every_pairing_matches_float64_of_the_scaled_fp8_values(mode_a, mode_b, out_dtype, m, k, n):
    import cupy as cp
    rng = np.random.default_rng()
    a, w, sa, sb, ref = _problem(cp, rng, mode_a, mode_b, m, k, n)
    if out_dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    else:
        out = cp.full((m, n), cp.nan, dtype=cp.float32)
    fp8.scaled_matmul(a, w.T, sa, sb, out=out, format_a="e4m3", format_b="e4m3")
    got = out.float().cpu().numpy() if out_dtype == "bfloat16" else cp.asnumpy(out)
    assert not np.isnan(got).any(), "elements left unwritten"
    assert rel_err(got, ref()) < TOL[out_dtype], (mode_a, mode_b)
    if out_dtype == "float32":          # the same bits again through a plan of the same problem
        again = cp.full((m, n), cp.nan, dtype=cp.float32)
        plan = fp8.ScaledMatmulPlan(a, w.T, sa, sb, out=again, format_a="e4m3", format_b="e4m3")
        plan.execute()
        assert cp.array_equal(again, out)
        plan.close()


@pytest.mark.gpu
@pytest.mark.parametrize("mode_a, mode_b", PAIRS)
def test_the_bias_and_relu_epilogue_runs_with_every_pairing(mode_a, mode_b):
    import cupy as cp
    rng = np.random.default_rng()
    m, k, n = 256, 1024, 512
    a, w, sa, sb, ref = _problem(cp, rng, mode_a, mode_b, m, k, n)
    bias_host = rng.standard_normal(n).astype(np.float16) * 64
    out = cp.full((m, n), cp.nan, dtype=cp.float16)
    fp8.scaled_matmul(a, w.T, sa, sb, out=out, bias=cp.asarray(bias_host), act="relu",
                      format_a="e4m3", format_b="e4m3")
    got = cp.asnumpy(out).astype(np.float64)
    assert not np.isnan(got).any(), "elements left unwritten"
    assert (got == 0).any() and (got > 0).any()            # relu clipped some and kept some
    assert rel_err(got, np.maximum(ref() + bias_host, 0)) < 1e-2, (mode_a, mode_b)


@pytest.mark.gpu
def test_rowwise_equals_torch_scaled_mm():
    torch = pytest.importorskip("torch")
    m, k, n = 256, 512, 384
    a = (torch.randn(m, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    sa = torch.rand(m, 1, device="cuda") + 0.25
    sb = torch.rand(1, n, device="cuda") + 0.25
    ours = fp8.scaled_matmul(a, w.t(), sa, sb)
    assert ours.dtype == torch.bfloat16 and ours.shape == (m, n)
    ref = (a.double() * sa.double()) @ (w.double() * sb.double().t()).t()
    assert rel_err(ours.float().cpu().numpy(), ref.cpu().numpy()) < TOL["bfloat16"]
    theirs = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    assert rel_err(ours.float().cpu().numpy(), theirs.double().cpu().numpy()) < TOL["bfloat16"]


@pytest.mark.gpu
@pytest.mark.parametrize("mode_a, mode_b", [("rowwise", "rowwise"), ("1x128", "128x128")])
def test_a_captured_graph_replays_with_the_scales_its_buffers_hold_then(mode_a, mode_b):
    import cupy as cp
    rng = np.random.default_rng()
    m, k, n = 128, 512, 256
    a, w, sa, sb, ref = _problem(cp, rng, mode_a, mode_b, m, k, n)
    out = cp.full((m, n), cp.nan, dtype=cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    run = lambda: fp8.scaled_matmul(a, w.T, sa, sb, out=out, format_a="e4m3", format_b="e4m3", stream=s)
    run()
    with cygemm.graph.capture(s) as g:
        run()
    with s:                         # in place, ordered before the replay: the captured pointers read them
        sa *= 3.0
        out.fill(cp.nan)
    g.launch(s)
    s.synchronize()
    assert rel_err(cp.asnumpy(out), ref(3.0)) < TOL["float32"]


@pytest.mark.gpu
def test_refused_scales_write_nothing():
    import cupy as cp
    rng = np.random.default_rng()
    m, k, n = 128, 512, 256
    a, _, w, _ = _operands(cp, rng, m, k, n)
    out = cp.full((m, n), cp.nan, dtype=cp.float32)
    wrong = cp.ones((m, k // 128), cp.float32)            # 1x128 shape, K-contiguous: not a layout cuBLASLt reads
    with pytest.raises(ValueError, match="scale_a"):
        fp8.scaled_matmul(a, w.T, wrong, cp.ones((k // 128, n), cp.float32), out=out, format_a="e4m3",
                          format_b="e4m3")
    with pytest.raises(ValueError, match="not 128x128 with 128x128"):
        _, sa = _scales_on_device(cp, rng, "128x128", "a", m, k, n)
        _, sb = _scales_on_device(cp, rng, "128x128", "b", m, k, n)
        fp8.scaled_matmul(a, w.T, sa, sb, out=out, format_a="e4m3", format_b="e4m3")
    cp.cuda.runtime.deviceSynchronize()
    assert bool(cp.isnan(out).all())
