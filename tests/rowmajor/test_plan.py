"""cygemm.GemmPlan: plan, autotune, execute (other operands, other streams, captured), close;
its kinds (plain, a cuBLASLt epilogue, FP8 as cygemm.fp8.ScaledMatmulPlan) and what each refuses."""
import numpy as np
import pytest

import cygemm
from cygemm import fp8
from cygemm.engine import plans, tuning
from fakes import BASE, FakeDeviceArray
from gpu_util import f64, poisoned, rand, rel_err
from refs import activations, fp8 as fp8_ref

cp = None


@pytest.fixture
def gpu():
    global cp
    cp = pytest.importorskip("cupy")


def test_construction_checks_everything_before_any_gpu_work():
    a = FakeDeviceArray((4, 6))
    b = FakeDeviceArray((6, 5), ptr=a.__cuda_array_interface__["data"][0] + 4096)
    out = FakeDeviceArray((4, 5), ptr=a.__cuda_array_interface__["data"][0] + 8192)
    p = cygemm.GemmPlan(a, b, out, math="fp32")          # no GPU needed to make it
    assert p.route is None and not p.tuned and not p.closed
    with pytest.raises(ValueError, match="out: expected shape \\(4, 5\\)"):
        cygemm.GemmPlan(a, b, FakeDeviceArray((4, 4)))
    p.close()
    with pytest.raises(ValueError, match="closed"):
        p.execute()


@pytest.mark.gpu
@pytest.mark.parametrize("batched", [False, True])
def test_plan_autotune_execute_on_other_operands_and_streams(gpu, batched):
    shape_a, shape_b = ((5, 256, 192), (5, 192, 320)) if batched else ((256, 192), (192, 320))
    A, B = rand(cp, shape_a), rand(cp, shape_b)
    C = poisoned(cp, A.shape[:-1] + (B.shape[-1],))
    tuning.clear_tuning()                                # the only gemm entry will be this plan's
    with cygemm.GemmPlan(A, B, C, math="fp32", batched=batched) as p:
        assert p.plan() is p and p.route is not None and not p.tuned
        p.autotune()                                     # any size: it was asked for
        assert p.tuned and p.tuned_ms > 0
        # What autotune chose is what it recorded for the module functions: route and time.
        (entry,) = [e for e in tuning.tuning_entries() if e["kind"] == "gemm"]
        assert entry["route"] == p.route and entry["ms"] == pytest.approx(p.tuned_ms, rel=1e-6)
        assert p.execute() is C
        assert rel_err(C.get(), np.matmul(f64(cp, A), f64(cp, B))) < 1e-5
        s = cp.cuda.Stream(non_blocking=True)
        A2, C2 = rand(cp, A.shape), poisoned(cp, C.shape)
        cp.cuda.Device().synchronize()
        assert p.execute(A2, None, C2, stream=s) is C2    # B as planned
        s.synchronize()
        assert rel_err(C2.get(), np.matmul(f64(cp, A2), f64(cp, B))) < 1e-5
        with pytest.raises(ValueError, match="not the planned"):
            p.execute(rand(cp, A.shape[:-2] + (A.shape[-2] + 1, A.shape[-1])), None,
                      poisoned(cp, C.shape[:-2] + (C.shape[-2] + 1, C.shape[-1])))
        P = rand(cp, (A.size + C.size,))           # an out that shares A's last 64 elements
        A3, C3 = P[:A.size].reshape(A.shape), P[A.size - 64:A.size - 64 + C.size].reshape(C.shape)
        with pytest.raises(ValueError, match="out: its memory overlaps A"):
            p.execute(A3, None, C3)
    assert p.closed
    with pytest.raises(ValueError, match="closed"):
        p.execute()


@pytest.mark.gpu
def test_a_plan_with_beta_accumulates_and_replays_in_a_graph(gpu):
    A, B, C0 = rand(cp, (128, 96)), rand(cp, (96, 64)), rand(cp, (128, 64))
    C = C0.copy()
    s = cp.cuda.Stream(non_blocking=True)
    p = cygemm.GemmPlan(A, B, C, alpha=0.5, beta=1.0, math="fp32").plan(stream=s)
    p.autotune(mode="exhaustive", stream=s)              # timed on a scratch C: C untouched
    s.synchronize()
    np.testing.assert_array_equal(C.get(), C0.get())
    with cygemm.graph.capture(s) as g:
        p.execute(stream=s)
        with pytest.raises(cygemm.CaptureError):
            p.autotune(stream=s)
    for _ in range(3):
        g.launch(s)
    s.synchronize()
    assert rel_err(C.get(), f64(cp, C0) + 3 * 0.5 * (f64(cp, A) @ f64(cp, B))) < 1e-5
    p.close()
    p.close()                                           # idempotent


@pytest.mark.gpu
def test_autotune_records_the_choice_for_the_module_functions(gpu, tmp_path):
    old = cygemm.set_options(tuning_cache=tmp_path / "t.jsonl", autotune_min_macs=1e18)
    try:
        tuning.clear_tuning()
        A, B, C = rand(cp, (200, 136)), rand(cp, (136, 72)), poisoned(cp, (200, 72))
        cygemm.GemmPlan(A, B, C, math="fp32").autotune()
        assert any(e["kind"] == "gemm" for e in tuning.tuning_entries())
        assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 2
    finally:
        cygemm.set_options(**old)
        tuning.clear_tuning()


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["cublasGemmEx", "cublasLt"])
def test_a_forced_route_is_the_plans_route_and_computes_right(gpu, route):
    A, B = rand(cp, (96, 64)), rand(cp, (64, 80))
    C = poisoned(cp, (96, 80))
    old = tuning.forced_routes()
    try:
        tuning.force_routes(**dict(old, gemm=route))
        with cygemm.GemmPlan(A, B, C, math="fp32") as p:
            assert p.plan().route == route
            assert p.execute() is C
            cp.cuda.Device().synchronize()
            assert rel_err(C.get(), f64(cp, A) @ f64(cp, B)) < 1e-5
    finally:
        tuning.force_routes(**old)


# ------------------------------------------------------------------ kinds and refusals

M, K, N = 64, 96, 48                 # N a multiple of 8: GELU_AUX's rule for Z's row stride holds
MF, KF, NF = 64, 128, 32             # FP8: rows of 16-byte multiples
FUSED = ("none", "relu", "gelu")     # the activations cuBLASLt's epilogues apply
UNFUSED = tuple(a for a in activations.NAMES if a not in FUSED)


class FakeMaker:
    """Fake device arrays for the CPU run, each at an address of its own (never dereferenced)."""
    gpu = False

    def __init__(self):
        self.next_addr = BASE
        self.outputs = []

    def _fake(self, shape, dtype, strides=None, offset=0):
        ptr = self.next_addr + offset
        self.next_addr += 1 << 20
        return FakeDeviceArray(shape, np.dtype(dtype).str, strides, ptr)

    def arr(self, shape, dtype="float32"):
        return self._fake(shape, dtype)

    def out(self, shape, dtype="float32", layout="C"):
        """An output: C order; "F" order; "padded" (rows 2 elements longer); "misaligned" (4 bytes
        past an aligned address)."""
        size = np.dtype(dtype).itemsize
        strides = {"F": (size, size * shape[0]), "padded": (size * (shape[1] + 2), size)}.get(layout)
        x = self._fake(shape, dtype, strides, 4 if layout == "misaligned" else 0)
        self.outputs.append(x)
        return x

    def row(self, x):
        """x's first row, an (N,) view of its memory."""
        cai = x.__cuda_array_interface__
        return FakeDeviceArray(cai["shape"][1:], cai["typestr"], None, cai["data"][0])

    def fp8(self, shape, kmajor=False):
        """FP8 bytes (uint8), row-major; kmajor: w.T of a C-contiguous w of shape[::-1]."""
        return self._fake(shape, "uint8", (1, shape[0]) if kmajor else None)

    def scalar(self):
        return self._fake((1,), "float32")


class RealMaker(FakeMaker):
    """CuPy arrays for the GPU run: random inputs, NaN-poisoned outputs."""
    gpu = True

    def __init__(self):
        super().__init__()
        self.rng = np.random.default_rng()

    def arr(self, shape, dtype="float32"):
        return rand(cp, shape, dtype, self.rng)

    def out(self, shape, dtype="float32", layout="C"):
        if layout == "padded":
            x = poisoned(cp, (shape[0], shape[1] + 2), dtype)[:, :shape[1]]
        elif layout == "misaligned":
            x = poisoned(cp, (int(np.prod(shape)) + 1,), dtype)[1:].reshape(shape)
        else:
            x = poisoned(cp, shape, dtype)
            x = cp.asfortranarray(x) if layout == "F" else x
        self.outputs.append(x)
        return x

    def row(self, x):
        return x[0]

    def fp8(self, shape, kmajor=False):
        codes = fp8_ref.to_codes(self.rng.standard_normal(shape[::-1] if kmajor else shape), "e4m3")
        return cp.asarray(codes).T if kmajor else cp.asarray(codes)

    def scalar(self):
        return cp.asarray(np.array([1.0], np.float32))


def _gemm_plan(mk, A=None, B=None, out=None, **kw):
    A = mk.arr((M, K)) if A is None else A
    B = mk.arr((K, N)) if B is None else B
    out = mk.out((M, N)) if out is None else out
    return cygemm.GemmPlan, (A, B, out), kw


def _fp8_plan(mk, out=None, a=None, **kw):
    a = mk.fp8((MF, KF)) if a is None else a
    out = mk.out((MF, NF)) if out is None else out
    return fp8.ScaledMatmulPlan, (a, mk.fp8((KF, NF), kmajor=True), mk.scalar(), mk.scalar()), dict(
        dict(out=out, format_a="e4m3", format_b="e4m3"), **kw)


# name -> (build(mk) -> (class, args, kwargs), exception, words its message holds; the first names
# the argument). Each is refused when the plan is made, before any GPU work.
REFUSALS = {
    **{f"act {a}": (lambda mk, a=a: _gemm_plan(mk, act=a), ValueError, ["act:", repr(a), "forward_into"])
       for a in UNFUSED},
    "act unknown": (lambda mk: _gemm_plan(mk, act="swish"), ValueError, ["act:", "cuBLASLt's epilogues apply 'none', 'relu' or 'gelu'", "'swish'"]),
    "z_out with relu": (lambda mk: _gemm_plan(mk, act="relu", bias=mk.arr((N,)), z_out=mk.out((M, N))),
                        ValueError, ["z_out:", "GELU_AUX", "forward_into"]),
    "z_out with no activation": (lambda mk: _gemm_plan(mk, bias=mk.arr((N,)), z_out=mk.out((M, N))),
                                 ValueError, ["z_out:", "GELU_AUX", "forward_into"]),
    "z_out misaligned": (lambda mk: _gemm_plan(mk, act="gelu", z_out=mk.out((M, N), layout="misaligned")),
                         ValueError, ["z_out:", "16-byte aligned", "forward_into"]),
    "z_out row stride": (lambda mk: _gemm_plan(mk, act="gelu", z_out=mk.out((M, N), layout="padded")),
                         ValueError, ["z_out:", "multiple of 8", "got 50", "forward_into"]),
    "z_out column-major": (lambda mk: _gemm_plan(mk, act="gelu", z_out=mk.out((M, N), layout="F")),
                           ValueError, ["z_out:", "row-major"]),
    "z_out shape": (lambda mk: _gemm_plan(mk, act="gelu", z_out=mk.out((M, N + 8))),
                    ValueError, ["z_out:", f"({M}, {N})"]),
    "z_out dtype": (lambda mk: _gemm_plan(mk, act="gelu", z_out=mk.out((M, N), "float16")),
                    TypeError, ["z_out:", "float32", "float16"]),
    "z_out is out": (lambda mk: (lambda y: _gemm_plan(mk, out=y, act="gelu", z_out=y))(mk.out((M, N))),
                     ValueError, ["z_out:", "overlaps out"]),
    "bias on a column-major out": (lambda mk: _gemm_plan(mk, out=mk.out((M, N), layout="F"), bias=mk.arr((N,))),
                                   ValueError, ["out:", "row-major", "bias"]),
    "bias length": (lambda mk: _gemm_plan(mk, act="relu", bias=mk.arr((N + 1,))), ValueError, ["bias:", f"({N},)"]),
    "bias dtype": (lambda mk: _gemm_plan(mk, bias=mk.arr((N,), "float16")), TypeError, ["bias:", "float32"]),
    "bias in out's memory": (lambda mk: (lambda y: _gemm_plan(mk, out=y, act="relu", bias=mk.row(y)))(mk.out((M, N))),
                             ValueError, ["out:", "overlaps bias"]),
    "epilogue batched": (lambda mk: _gemm_plan(mk, mk.arr((3, M, K)), mk.arr((3, K, N)), mk.out((3, M, N)),
                                               act="relu", batched=True), ValueError, ["batched:", "2-D"]),
    "epilogue with K = 0": (lambda mk: _gemm_plan(mk, mk.arr((M, 0)), mk.arr((0, N)), act="relu"),
                            ValueError, ["A:", "K = 0", "forward_into"]),
    "epilogue out None": (lambda mk: (cygemm.GemmPlan, (mk.arr((M, K)), mk.arr((K, N)), None),
                                      dict(bias=mk.arr((N,)), act="relu")), ValueError, ["out:", "None"]),
    "fp8 act silu": (lambda mk: _fp8_plan(mk, act="silu"), ValueError, ["act:", "'relu' or 'gelu'"]),
    "fp8 out None": (lambda mk: (fp8.ScaledMatmulPlan, _fp8_plan(mk)[1], dict(_fp8_plan(mk)[2], out=None)),
                     ValueError, ["out:", "None"]),
    "fp8 a column-major": (lambda mk: _fp8_plan(mk, a=mk.fp8((MF, KF), kmajor=True)),
                           ValueError, ["a:", "row-major"]),
    "fp8 scale_out of a float out": (lambda mk: _fp8_plan(mk, scale_out=mk.scalar()),
                                     ValueError, ["scale_out:", "FP8 output"]),
    "fp8 amax_out of a float out": (lambda mk: _fp8_plan(mk, amax_out=mk.scalar()),
                                    ValueError, ["amax_out:", "FP8 out"]),
    "fp8 out shape": (lambda mk: _fp8_plan(mk, out=mk.out((MF, NF + 16))), ValueError, ["out:", f"({MF}, {NF})"]),
}


def _check_refusal(name, mk):
    build, exc, words = REFUSALS[name]
    cls, args, kwargs = build(mk)
    with pytest.raises(exc) as info:
        cls(*args, **kwargs)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refused_when_made_naming_the_argument(name):
    _check_refusal(name, FakeMaker())


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(REFUSALS))
def test_refusals_write_nothing(gpu, name):
    mk = RealMaker()
    _check_refusal(name, mk)
    cp.cuda.Device().synchronize()
    for out in mk.outputs:
        assert bool(cp.isnan(out).all()), f"{name}: an output lost its NaN poison"


def test_one_plan_class_and_its_kinds():
    assert issubclass(cygemm.GemmPlan, plans.Plan) and issubclass(fp8.ScaledMatmulPlan, cygemm.GemmPlan)
    mk = FakeMaker()
    A, B, out = mk.arr((M, K)), mk.arr((K, N)), mk.out((M, N))
    assert cygemm.GemmPlan(A, B, out).kind == "gemm"
    assert cygemm.GemmPlan(A, B, out, act="identity").kind == "gemm"
    assert cygemm.GemmPlan(A, B, out, act="relu").kind == "epilogue"
    assert cygemm.GemmPlan(A, B, out, bias=mk.arr((N,))).kind == "epilogue"
    # An activation alone is elementwise: any out layout; Z with rows padded to a multiple of 8.
    assert cygemm.GemmPlan(A, B, mk.out((M, N), layout="F"), act="gelu").kind == "epilogue"
    z = FakeDeviceArray((M, N), "<f4", (4 * (N + 8), 4), mk.out((M, N + 8)).__cuda_array_interface__["data"][0])
    p = cygemm.GemmPlan(A, B, out, bias=mk.arr((1, N)), act="GELU", z_out=z, alpha=0.5, beta=1.0)
    assert (p.kind, p.route, p.tuned, p.tuned_ms, p.closed) == ("epilogue", None, False, 0.0, False)
    q = fp8.ScaledMatmulPlan(*_fp8_plan(mk)[1], **_fp8_plan(mk)[2])
    assert q.kind == "fp8" and q.route is None
    # Other operands for execute: the planned layout, checked before any GPU work (z_out, as
    # planned, fixes the shape of the result).
    with pytest.raises(ValueError, match="z_out: expected shape"):
        p.execute(mk.arr((M + 1, K)), None, mk.out((M + 1, N)))
    r = cygemm.GemmPlan(A, B, out, bias=mk.arr((N,)), act="relu")
    with pytest.raises(ValueError, match="not the planned"):
        r.execute(mk.arr((M + 1, K)), None, mk.out((M + 1, N)))
    with pytest.raises(ValueError, match="not the planned"):
        q.execute(mk.fp8((MF + 16, KF)), None, mk.out((MF + 16, NF)))
    for plan in (p, q, r):
        plan.close()
        assert plan.closed and plan.route is None
        with pytest.raises(ValueError, match="closed"):
            plan.execute()
        plan.close()                                    # idempotent


# ------------------------------------------------------------------ GPU: epilogue plans

def _reference(A, B, bias, act, alpha=1.0, beta=0.0, C0=None):
    """(Z, act(Z)) in float64: Z = alpha * A @ B + beta * C0 + bias."""
    z = alpha * (f64(cp, A) @ f64(cp, B))
    if beta:
        z = z + beta * f64(cp, C0)
    if bias is not None:
        z = z + f64(cp, bias)
    return z, activations.act(act, z)


@pytest.mark.gpu
@pytest.mark.parametrize("act", FUSED)
@pytest.mark.parametrize("with_bias", [False, True])
def test_epilogue_plan_matches_float64_on_two_streams(gpu, act, with_bias):
    A, B = rand(cp, (M, K)), rand(cp, (K, N))
    bias = rand(cp, (N,)) if with_bias else None
    out, out2, A2 = poisoned(cp, (M, N)), poisoned(cp, (M, N)), rand(cp, (M, K))
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()                 # the inputs were made on the current stream
    with cygemm.GemmPlan(A, B, out, bias=bias, act=act, math="fp32") as p:
        assert p.kind == ("gemm" if act == "none" and not with_bias else "epilogue")
        p.plan(stream=s1)
        assert p.route == "cublasLt" or p.kind == "gemm"
        assert p.execute(stream=s1) is out
        s1.synchronize()
        assert rel_err(out.get(), _reference(A, B, bias, act)[1]) < 1e-5
        assert p.execute(A2, None, out2, stream=s2) is out2        # new A, B and bias as planned
        s2.synchronize()
        assert rel_err(out2.get(), _reference(A2, B, bias, act)[1]) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("with_bias", [False, True])
def test_gelu_plan_writes_z_beside_out(gpu, with_bias):
    A, B = rand(cp, (M, K)), rand(cp, (K, N))
    bias = rand(cp, (N,)) if with_bias else None
    out, Z = poisoned(cp, (M, N)), poisoned(cp, (M, N))
    cp.cuda.Device().synchronize()
    with cygemm.GemmPlan(A, B, out, bias=bias, act="gelu", z_out=Z, math="fp32") as p:
        assert p.execute() is out                       # plans first
        cp.cuda.Device().synchronize()
    z, y = _reference(A, B, bias, "gelu")
    assert rel_err(Z.get(), z) < 1e-5 and rel_err(out.get(), y) < 1e-5


@pytest.mark.gpu
def test_epilogue_plan_with_alpha_and_beta(gpu):
    A, B, bias, C0 = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,)), rand(cp, (M, N))
    out = C0.copy()
    cp.cuda.Device().synchronize()
    with cygemm.GemmPlan(A, B, out, bias=bias, act="relu", alpha=0.5, beta=2.0, math="fp32") as p:
        p.execute()
        cp.cuda.Device().synchronize()
    assert rel_err(out.get(), _reference(A, B, bias, "relu", 0.5, 2.0, C0)[1]) < 1e-5


@pytest.mark.gpu
def test_epilogue_plan_captured_replays_with_new_inputs(gpu):
    A, B, bias = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,))
    out, Z = poisoned(cp, (M, N)), poisoned(cp, (M, N))
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    p = cygemm.GemmPlan(A, B, out, bias=bias, act="gelu", z_out=Z, math="fp32").plan(stream=s)
    with cygemm.graph.capture(s) as g:
        p.execute(stream=s)
    A2, B2 = rand(cp, (M, K)), rand(cp, (K, N))
    cp.copyto(A, A2)
    cp.copyto(B, B2)
    out.fill(cp.nan)
    Z.fill(cp.nan)
    cp.cuda.Device().synchronize()
    g.launch(s)
    s.synchronize()
    z, y = _reference(A2, B2, bias, "gelu")
    assert rel_err(Z.get(), z) < 1e-5 and rel_err(out.get(), y) < 1e-5
    p.close()


@pytest.mark.gpu
def test_epilogue_plan_autotune_then_execute(gpu):
    tuning.clear_tuning()                           # the only gemm entry will be this plan's
    A, B, bias = rand(cp, (256, 256)), rand(cp, (256, 128)), rand(cp, (128,))
    out = poisoned(cp, (256, 128))
    cp.cuda.Device().synchronize()
    timed = tuning.tuning_count()
    with cygemm.GemmPlan(A, B, out, bias=bias, act="relu", math="fp32") as p:
        p.autotune()                                # any size: it was asked for
        assert p.tuned and p.tuned_ms > 0 and p.route == "cublasLt"
        assert tuning.tuning_count() == timed + 1
        (entry,) = [e for e in tuning.tuning_entries() if e["kind"] == "gemm"]
        assert entry["route"] == "cublasLt" and entry["ms"] == pytest.approx(p.tuned_ms, rel=1e-6)
        # Another plan of the problem takes the recorded choice; autotune times again.
        with cygemm.GemmPlan(A, B, poisoned(cp, out.shape), bias=bias, act="relu", math="fp32") as q:
            assert q.plan().tuned and q.tuned_ms == p.tuned_ms
        p.autotune(mode="exhaustive")
        assert p.tuned and tuning.tuning_count() == timed + 2
        out.fill(cp.nan)
        cp.cuda.Device().synchronize()
        assert p.execute() is out
        cp.cuda.Device().synchronize()
        assert rel_err(out.get(), _reference(A, B, bias, "relu")[1]) < 1e-5
    with pytest.raises(ValueError, match="closed"):
        p.execute()


# ------------------------------------------------------------------ GPU: FP8 plans

# As tests/fp8/test_scaled.py bounds scaled_matmul against the float64 of the FP8 values.
FP8_TOL = {"float16": 2e-3, "float32": 4e-4, "e4m3": 6e-2}


def _fp8_operand(rng, shape):
    """E4M3 bytes of random values on the GPU, and the float64 values they hold."""
    codes = fp8_ref.to_codes(rng.standard_normal(shape) * 4, "e4m3")
    return cp.asarray(codes), fp8_ref.decode(codes, "e4m3")


def _scalar(v):
    return cp.asarray(np.array([v], dtype=np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype, with_bias", [("float16", False), ("float16", True), ("float32", False),
                                                  ("e4m3", False)])
@pytest.mark.parametrize("act", FUSED)
def test_fp8_plan_matches_float64_and_scaled_matmul_bitwise(gpu, out_dtype, with_bias, act):
    tuning.clear_tuning()       # (and this thread's plans): both take the heuristic's first algorithm
    rng = np.random.default_rng()
    Mf, Kf, Nf = 64, 128, 48
    a, a64 = _fp8_operand(rng, (Mf, Kf))
    w, w64 = _fp8_operand(rng, (Nf, Kf))
    ref = 0.37 * 1.9 * (a64 @ w64.T)
    kw = dict(format_a="e4m3", format_b="e4m3", act=act)
    if with_bias:                                   # a float16 out takes a float16 bias
        b16 = (rng.standard_normal(Nf) * 5).astype(np.float16)
        kw["bias"] = cp.asarray(b16)
        ref = ref + b16.astype(np.float64)
    ref = activations.act(act, ref)
    fp8_out = out_dtype == "e4m3"
    s_out = 448.0 / np.abs(ref).max() * 0.5
    if fp8_out:
        kw.update(format_out="e4m3", scale_out=_scalar(s_out))
    outs = [cp.full((Mf, Nf), 0x7F, cp.uint8) if fp8_out else cp.full((Mf, Nf), cp.nan, out_dtype)
            for _ in range(2)]                      # NaN codes / NaN
    amaxes = [_scalar(np.nan), _scalar(np.nan)]
    scale_a, scale_b = _scalar(0.37), _scalar(1.9)
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    with fp8.ScaledMatmulPlan(a, w.T, scale_a, scale_b, out=outs[0], amax_out=amaxes[0] if fp8_out else None,
                              **kw) as p:
        assert p.kind == "fp8" and p.plan(stream=s).route == "cublasLt"
        assert p.execute(stream=s) is outs[0]
        fp8.scaled_matmul(a, w.T, scale_a, scale_b, out=outs[1], amax_out=amaxes[1] if fp8_out else None,
                          stream=s, **kw)
        s.synchronize()
    got = fp8_ref.decode(cp.asnumpy(outs[0]), "e4m3") / s_out if fp8_out else cp.asnumpy(outs[0])
    assert rel_err(got, ref) < FP8_TOL[out_dtype]
    mine, theirs = cp.asnumpy(outs[0]), cp.asnumpy(outs[1])
    assert np.array_equal(mine.view(np.uint8), theirs.view(np.uint8)), "not bitwise scaled_matmul's result"
    if fp8_out:
        amax = float(amaxes[0].get()[0])
        assert amax == float(amaxes[1].get()[0])
        assert abs(amax - np.abs(ref).max()) <= 1e-3 * np.abs(ref).max()


@pytest.mark.gpu
def test_fp8_plan_captured_replays_with_new_scales_and_inputs_then_retunes(gpu):
    rng = np.random.default_rng()
    Mf, Kf, Nf = 128, 128, 64
    a, a64 = _fp8_operand(rng, (Mf, Kf))
    w, w64 = _fp8_operand(rng, (Nf, Kf))
    sa, sb = _scalar(1.0), _scalar(1.0)
    out = cp.full((Mf, Nf), cp.nan, cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    p = fp8.ScaledMatmulPlan(a, w.T, sa, sb, out=out, format_a="e4m3", format_b="e4m3").plan(stream=s)
    with cygemm.graph.capture(s) as g:
        p.execute(stream=s)
    a2, a2_64 = _fp8_operand(rng, (Mf, Kf))
    cp.copyto(a, a2)
    sa.set(np.array([2.0], np.float32))
    out.fill(cp.nan)
    cp.cuda.Device().synchronize()
    g.launch(s)
    s.synchronize()
    assert rel_err(cp.asnumpy(out), 2.0 * (a2_64 @ w64.T)) < FP8_TOL["float32"]
    p.autotune(stream=s)                            # timed runs write out: filled again below
    out.fill(cp.nan)
    cp.cuda.Device().synchronize()
    p.execute(stream=s)
    s.synchronize()
    assert rel_err(cp.asnumpy(out), 2.0 * (a2_64 @ w64.T)) < FP8_TOL["float32"]
    p.close()
    with pytest.raises(ValueError, match="closed"):
        p.execute(stream=s)
