"""torch.compile through cygemm's public functions (cygemm.autograd.traced): each traces to a
custom operator with no graph break (on fake CUDA tensors, no GPU needed), a call the
operators cannot keep is a graph break that names why, the stand-ins load in either order of
imports, and on the CPU, with torch's products standing in for cygemm's GPU calls, a compiled
model passes every argument where the eager call takes it. The GPU tests compile with Inductor
and compare against the eager calls bit for bit."""
import inspect
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch._dynamo  # noqa: E402  (loads cygemm's stand-ins)
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import cygemm  # noqa: E402
from cygemm import dense, fp8, grouped  # noqa: E402
from cygemm.autograd import into_ops, traced  # noqa: E402

# The public functions as the user's code holds them (the CPU tests below patch the module
# attributes the operators call; a model holding these still traces to the stand-ins).
PUBLIC = {"matmul": cygemm.matmul, "gemm": cygemm.gemm, "gemm_strided_batched": cygemm.gemm_strided_batched,
          "int_mm": cygemm.int_mm, "scaled_matmul": fp8.scaled_matmul, "forward_into": dense.forward_into,
          "moe_gemm": grouped.moe_gemm, "moe_gemm_wgrad": grouped.moe_gemm_wgrad}


def test_each_public_function_has_a_stand_in_with_its_signature():
    assert traced.STANDS_IN_FOR == PUBLIC
    for name, fn in PUBLIC.items():
        stand_in = getattr(traced, name)
        assert stand_in.__torch_dynamo_original__ is fn
        assert inspect.signature(stand_in.__torch_dynamo_polyfill__) == inspect.signature(fn), name


def _fake_cuda():
    with FakeTensorMode():
        t = dict(x=torch.empty(8, 16, device="cuda"), w=torch.empty(16, 4, device="cuda"),
                 o=torch.empty(8, 4, device="cuda"), xb=torch.empty(3, 8, 16, device="cuda"),
                 wb=torch.empty(3, 16, 4, device="cuda"), i8=torch.empty(8, 16, device="cuda", dtype=torch.int8),
                 w8=torch.empty(4, 16, device="cuda", dtype=torch.int8).T,
                 f8=torch.empty(8, 16, device="cuda", dtype=torch.float8_e4m3fn),
                 g8=torch.empty(4, 16, device="cuda", dtype=torch.float8_e4m3fn).T,
                 s=torch.empty((), device="cuda"), bias=torch.empty(4, device="cuda"),
                 we=torch.empty(2, 16, 4, device="cuda"), offs=torch.empty(3, device="cuda", dtype=torch.int32))
    return t


def test_a_model_calling_every_public_function_is_one_graph_of_cygemms_operators():
    """torch._dynamo.explain on fake CUDA tensors: one graph, no break, and in it the operator
    each call is kept as."""
    t = _fake_cuda()
    P = PUBLIC

    def model(x, w, o, xb, wb, i8, w8, f8, g8, s, bias, we, offs):
        y = P["matmul"](x, w) + P["gemm"](x, w, alpha=2.0)
        P["gemm"](x, w, o, trans_b=False, beta=1.0)
        z = P["gemm_strided_batched"](xb, wb).sum(0)
        k = P["int_mm"](i8, w8).float()
        q = P["scaled_matmul"](f8, g8, s, s, out_dtype="float32", scale_mode="tensor")
        P["forward_into"](x, w, o, bias, act="gelu")
        m = torch.empty_like(o)
        P["moe_gemm"](x, we, offs, m)
        P["moe_gemm"](x, we, [0, 3, 8], m)
        dw = torch.empty_like(we)
        P["moe_gemm_wgrad"](x, m, offs, dw)
        return y + z + k + q + o + m, dw

    torch._dynamo.reset()
    e = torch._dynamo.explain(model)(*t.values())
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    called = [str(n.target) for n in e.graphs[0].graph.nodes if n.op == "call_function" and "cygemm" in str(n.target)]
    assert called == ["cygemm.matmul.default", "cygemm.gemm_into.default", "cygemm.gemm_into.default",
                      "cygemm.gemm_into.default", "cygemm.int_mm_into.default", "cygemm.scaled_matmul_into.default",
                      "cygemm.dense_forward_into.default", "cygemm.moe_gemm_dev_into.default",
                      "cygemm.moe_gemm_into.default", "cygemm.moe_gemm_wgrad_into.default"]


@pytest.mark.parametrize("call, why", [
    (lambda t: PUBLIC["matmul"](t["x"], t["w"], stream=0), "stream= is given"),
    (lambda t: PUBLIC["gemm"](t["x"], t["w"], beta=1.0), "a nonzero beta needs out"),
    (lambda t: PUBLIC["forward_into"](t["x"], t["w"], t["o"], save_z=True), "z_out and save_z disagree"),
    (lambda t: PUBLIC["moe_gemm_wgrad"](t["x"], t["o"], [0, 3, 8], torch.empty_like(t["we"])), "on the host"),
    # a call that writes into given tensors records no gradient: eagerly cygemm refuses the tensor
    (lambda t: PUBLIC["gemm"](t["x"].requires_grad_(), t["w"], t["o"]), "requires grad"),
    (lambda t: PUBLIC["forward_into"](t["x"], t["w"].requires_grad_(), t["o"]), "requires grad"),
    (lambda t: PUBLIC["scaled_matmul"](t["f8"], t["g8"], t["s"], t["s"], out=t["o"], out_dtype="bfloat16"),
     "out_dtype the call does not make"),
])
def test_a_call_the_operators_cannot_keep_breaks_fullgraph_naming_why(call, why):
    t = _fake_cuda()
    torch._dynamo.reset()
    with pytest.raises(Exception, match=why):
        torch.compile(lambda t: call(t), fullgraph=True, backend="eager")(t)


def test_the_operators_are_registered_and_write_only_what_they_declare():
    for name in ("matmul_into", "gemm_into", "int_mm_into", "scaled_matmul_into", "dense_forward_into",
                 "moe_gemm_into", "moe_gemm_dev_into", "moe_gemm_wgrad_into"):
        schema = getattr(torch.ops.cygemm, name).default._schema
        written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert written and written <= {"out", "amax_out", "z_out", "lt_workspace", "dw"}, (name, written)
        assert not schema.returns, name


@pytest.mark.parametrize("first", ["cygemm", "torch"])
def test_the_stand_ins_load_with_dynamo_in_either_order_of_imports(first):
    """In a fresh process: import cygemm stays free of torch and Dynamo; torch's import brings
    the operators, Dynamo's the stand-ins, whichever was imported first."""
    second = "torch" if first == "cygemm" else "cygemm"
    code = (f"import sys; import {first}; import {second}\n"
            "assert 'torch._dynamo' not in sys.modules and 'cygemm.autograd.traced' not in sys.modules\n"
            "import torch; assert hasattr(torch.ops.cygemm, 'gemm_into')\n"
            "import torch._dynamo; assert 'cygemm.autograd.traced' in sys.modules\n"
            "assert not any(getattr(f, 'cygemm_follower', False) for f in sys.meta_path)\n"
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


_HOOK_CASES = {
    # an availability check (importlib.util.find_spec, as other libraries make) uses up nothing
    "find_spec": "import importlib.util; importlib.util.find_spec('torch')\n",
    # a reloaded cygemm keeps one finder, which does not ask itself back
    "reload": "import importlib; importlib.reload(cygemm)\n"
              "assert sum(getattr(f, 'cygemm_follower', False) for f in sys.meta_path) == 1\n",
}


@pytest.mark.parametrize("case", sorted(_HOOK_CASES))
def test_the_watch_on_torch_survives_what_other_code_does_before_torch_is_imported(case):
    code = ("import sys, cygemm\n" + _HOOK_CASES[case] +
            "import torch; assert 'cygemm.autograd' in sys.modules and hasattr(torch.ops.cygemm, 'gemm_into')\n"
            "assert type(torch.__spec__.loader).__name__ == 'SourceFileLoader', torch.__spec__.loader\n"
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_a_watched_module_whose_import_fails_stays_watched(tmp_path):
    """The follower runs after the module's first import that succeeds (a stand-in module
    whose first run raises, followed by a stand-in follower)."""
    (tmp_path / "flaky_mod.py").write_text(
        "import os\nif not os.path.exists(os.path.join(os.path.dirname(__file__), 'ok')):\n"
        "    raise ImportError('not yet')\n")
    (tmp_path / "follower_mod.py").write_text("FOLLOWED = True\n")
    code = (f"import sys, os; sys.path.insert(0, {str(tmp_path)!r})\n"
            "import cygemm\n"
            "cygemm._pending['flaky_mod'] = 'follower_mod'\n"
            "cygemm._follow_torch()\n"
            "try:\n    import flaky_mod\nexcept ImportError:\n    pass\n"
            "assert 'follower_mod' not in sys.modules\n"
            f"open(os.path.join({str(tmp_path)!r}, 'ok'), 'w').close()\n"
            "import flaky_mod; assert 'follower_mod' in sys.modules\n"
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_import_cygemm_alone_imports_no_torch():
    r = subprocess.run([sys.executable, "-c", "import sys, cygemm; print('torch' in sys.modules)"],
                       capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "False", r.stderr[-2000:]


# ------------------------------------------------------------------ CPU: the arguments' wiring
# torch's products stand in for cygemm's GPU calls where the operators call them; the model
# holds the public functions themselves, so Dynamo traces their stand-ins and AOT autograd
# functionalizes the operators' writes. Every argument a stand-in passes on must arrive.

def _op(t, x):
    return x.mT if t in (True, "T", "t", "H", "h", "C", "c") else x


@pytest.fixture
def torch_products(monkeypatch):
    def gemm(A, B, out=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, **kw):
        r = alpha * (_op(trans_a, A) @ _op(trans_b, B))
        return out.copy_(r + beta * out if beta != 0 else r)

    def matmul(a, b, out=None, **kw):
        return out.copy_(a @ b)

    def int_mm(A, B, out=None, **kw):
        return out.copy_(A.long() @ B.long())

    def scaled(a, b, sa, sb, *, out=None, bias=None, amax_out=None, **kw):
        r = sa * sb * (a.double() @ b.double()) + (bias if bias is not None else 0)
        if amax_out is not None:
            amax_out.copy_(r.abs().max())
        return out.copy_(r)

    def forward_into(A, B, out, bias=None, *, with_bias=True, act="none", save_z=False, z_out=None, **kw):
        z = A @ B + (bias if with_bias and bias is not None else 0)
        if save_z:
            z_out.copy_(z)
        return out.copy_(torch.relu(z) if act == "relu" else z)

    def moe(x, w, offs, out, *, w_layout="kn", **kw):
        o = offs.tolist() if isinstance(offs, torch.Tensor) else list(offs)
        for g in range(len(o) - 1):
            out[o[g]:o[g + 1]] = x[o[g]:o[g + 1]] @ (w[g] if w_layout == "kn" else w[g].T)
        return out

    def wgrad(x, dy, offs, dw, *, dw_layout="kn", **kw):
        o = offs.tolist()
        for g in range(len(o) - 1):
            xs, ds = x[o[g]:o[g + 1]], dy[o[g]:o[g + 1]]
            dw[g] = xs.T @ ds if dw_layout == "kn" else ds.T @ xs
        return dw

    for mod, name, fn in ((cygemm, "gemm", gemm), (cygemm, "gemm_strided_batched", gemm), (cygemm, "matmul", matmul),
                          (cygemm, "int_mm", int_mm), (fp8, "scaled_matmul", scaled), (dense, "forward_into", forward_into),
                          (grouped, "moe_gemm", moe), (grouped, "moe_gemm_wgrad", wgrad)):
        monkeypatch.setattr(mod, name, fn)
    monkeypatch.setattr(into_ops, "_stream_of", lambda x: 0)
    # (offsets "on the device": here, a CPU tensor)
    monkeypatch.setattr(traced, "_on_device", lambda offsets: isinstance(offsets, torch.Tensor))


def _cpu(*shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_a_compiled_model_on_the_public_functions_passes_every_argument(torch_products):
    P = PUBLIC
    x, w, b, xb, wb, we = _cpu(5, 3, seed=1), _cpu(3, 4, seed=2), _cpu(4, seed=3), _cpu(2, 5, 3, seed=4), \
        _cpu(2, 3, 4, seed=5), _cpu(2, 3, 6, seed=6)
    offs = torch.tensor([0, 2, 5])
    sa, sb = torch.tensor(0.5, dtype=torch.float64), torch.tensor(3.0, dtype=torch.float64)

    def model(x, w, b, xb, wb, we, offs):
        o = torch.zeros(5, 4, dtype=x.dtype)
        P["gemm"](x, w, o, alpha=2.0)
        P["gemm"](x, w, o, beta=0.5)                                   # x @ w + 0.5 * (2 x @ w)
        yt = P["gemm"](w, x, trans_a=True, trans_b="T", alpha=-1.0)    # -(w.T @ x.T)
        z = P["gemm_strided_batched"](xb, wb)
        m0 = P["matmul"](x, w, torch.empty(5, 4, dtype=x.dtype))
        h, zz = torch.empty(5, 4, dtype=x.dtype), torch.empty(5, 4, dtype=x.dtype)
        P["forward_into"](x, w, h, b, act="relu", save_z=True, z_out=zz)
        h2 = torch.empty(5, 4, dtype=x.dtype)
        P["forward_into"](x, w, h2, b, with_bias=False)
        amax = torch.zeros((), dtype=x.dtype)
        q = P["scaled_matmul"](x, w, sa, sb, out=torch.empty(5, 4, dtype=x.dtype), bias=b, amax_out=amax)
        m = torch.empty(5, 6, dtype=x.dtype)
        P["moe_gemm"](x, we, [0, 2, 5], m)
        dw = torch.empty(2, 3, 6, dtype=x.dtype)
        P["moe_gemm_wgrad"](x, m, offs, dw)
        return o, yt, z, m0, h, zz, h2, q, amax, m, dw

    torch._dynamo.reset()
    got = torch.compile(model, fullgraph=True, backend="aot_eager")(x, w, b, xb, wb, we, offs)
    zb = x @ w + b
    m = torch.cat([x[:2] @ we[0], x[2:] @ we[1]])
    want = (2 * (x @ w), -(w.T @ x.T), xb @ wb, x @ w, torch.relu(zb), zb, x @ w, 1.5 * (x @ w) + b,
            (1.5 * (x @ w) + b).abs().max(), m, torch.stack([x[:2].T @ m[:2], x[2:].T @ m[2:]]))
    assert len(got) == len(want)
    for i, (g, e) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, e, msg=f"result {i}")


def test_opcheck_of_the_into_operators_on_the_cpu(torch_products):
    """The declared writes, the fake implementations and AOT dispatch, run for real."""
    x, w = _cpu(5, 3, seed=7), _cpu(3, 4, seed=8)
    torch.library.opcheck(into_ops.matmul_into, (x, w, torch.empty(5, 4, dtype=x.dtype), "fp32", None, None))
    torch.library.opcheck(into_ops.gemm_into, (x, w.T.contiguous(), _cpu(5, 4, seed=9), "N", "T", 2.0, 0.5, "fp32",
                                               None, None, False))
    torch.library.opcheck(into_ops.dense_forward_into, (x, w, torch.empty(5, 4, dtype=x.dtype), _cpu(4, seed=10),
                                                        "relu", 0.01, torch.empty(5, 4, dtype=x.dtype), None, "fp32",
                                                        None, None))
    torch.library.opcheck(into_ops.moe_gemm_into, (x, _cpu(2, 3, 6, seed=11), [0, 2, 5],
                                                   torch.empty(5, 6, dtype=x.dtype), "kn", "fp32", None, None, None))
    i8 = torch.from_numpy(np.arange(15, dtype=np.int8).reshape(5, 3))
    torch.library.opcheck(into_ops.int_mm_into, (i8, torch.ones(3, 4, dtype=torch.int8),
                                                 torch.empty(5, 4, dtype=torch.int64), None, None))


# ------------------------------------------------------------------ GPU: Inductor, against the eager calls

def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, device="cuda", dtype=dtype, generator=g)


def _calls(P, x, w, c, xb, wb, i8, w8, f8, g8, s8, bias, we, offs):
    """Every public function, each result in a tensor of its own (the given outs poisoned)."""
    nan = float("nan")
    o1 = torch.full((x.shape[0], w.shape[1]), nan, device=x.device)
    o2 = c.clone()
    P["gemm"](x, w, o2, alpha=0.5, beta=2.0, math="fp32")
    o3 = P["gemm"](w, x, trans_a=True, trans_b="T", math="fp32")
    o4 = P["gemm_strided_batched"](xb, wb, math="fp32")
    o5 = P["matmul"](x, w, o1, math="fp32")
    o6 = P["int_mm"](i8, w8)
    o7 = P["scaled_matmul"](f8, g8, s8, s8, out_dtype="float32")
    h = torch.full_like(o1, nan)
    z = torch.full_like(o1, nan)
    P["forward_into"](x, w, h, bias, act="gelu", save_z=True, z_out=z, math="fp32")
    m = torch.full((x.shape[0], we.shape[2]), nan, device=x.device)
    P["moe_gemm"](x, we, offs, m, math="fp32")
    m2 = torch.full_like(m, nan)
    P["moe_gemm"](x, we, [0, 40, 40, 100, x.shape[0]], m2, math="fp32")     # (an expert with no rows)
    dw = torch.full_like(we, nan)
    P["moe_gemm_wgrad"](x, m, offs, dw, math="fp32")
    return o2, o3, o4, o5, o6, o7, h, z, m, m2, dw


@pytest.mark.gpu
def test_inductor_compiles_the_public_functions_into_the_eager_bits(cuda):
    x, w, c, bias = _rand(128, 64, seed=1), _rand(64, 96, seed=2), _rand(128, 96, seed=3), _rand(96, seed=4)
    xb, wb = _rand(3, 128, 64, seed=5), _rand(3, 64, 96, seed=6)
    g = torch.Generator(device="cuda").manual_seed(7)
    i8 = torch.randint(-128, 128, (128, 64), device="cuda", dtype=torch.int8, generator=g)
    w8 = torch.randint(-128, 128, (96, 64), device="cuda", dtype=torch.int8, generator=g).T
    fp8_ok = torch.cuda.get_device_capability() >= (8, 9)
    f8 = (_rand(128, 64, seed=8) * 3).to(torch.float8_e4m3fn) if fp8_ok else None
    g8 = (_rand(96, 64, seed=9) * 3).to(torch.float8_e4m3fn).T if fp8_ok else None
    s8 = torch.tensor([0.5], device="cuda")
    we = _rand(4, 64, 32, seed=10)
    offs = torch.tensor([0, 40, 40, 100, 128], device="cuda", dtype=torch.int32)
    args = (x, w, c, xb, wb, i8, w8, f8, g8, s8, bias, we, offs)
    P = dict(PUBLIC)
    if not fp8_ok:
        P["scaled_matmul"] = lambda *a, **k: torch.zeros(1, device="cuda")
    eager = _calls(P, *args)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: _calls(P, *a), fullgraph=True)(*args)
    for i, (e, k) in enumerate(zip(eager, compiled)):
        assert e.dtype == k.dtype and e.shape == k.shape, i
        assert torch.equal(e.view(torch.uint8) if e.element_size() == 1 else e, k.view(torch.uint8)
                           if k.element_size() == 1 else k), f"result {i} differs from the eager call's"
    # ... and the eager calls against float64 (fp32 math, so the bound is fp32's)
    X, W, C, B = (t.double() for t in (x, w, c, bias))
    Z = X @ W + B
    refs = {0: 0.5 * X @ W + 2 * C, 1: (W.T @ X.T), 2: xb.double() @ wb.double(), 3: X @ W, 7: Z,
            6: torch.nn.functional.gelu(Z, approximate="tanh")}
    for i, ref in refs.items():
        assert float((eager[i].double() - ref).norm() / ref.norm()) < 1e-5, i
    assert torch.equal(eager[4].double(), i8.double() @ w8.double())      # (exact: |sums| < 2**53)
    o = offs.tolist()
    M = torch.cat([X[o[g]:o[g + 1]] @ we[g].double() for g in range(4)])
    assert float((eager[8].double() - M).norm() / M.norm()) < 1e-5
    assert torch.equal(eager[8], eager[9])
    dW = torch.stack([X[o[g]:o[g + 1]].T @ eager[8].double()[o[g]:o[g + 1]] for g in range(4)])
    assert float((eager[10].double() - dW).norm() / dW.norm()) < 1e-5
    assert not eager[10][1].any()          # the expert with no rows: zeros
