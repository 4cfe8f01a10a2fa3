"""Reproducible GEMMs: the determinism option (run_to_run, batch_invariant) through every entry
point. GPU: row i of a result is bitwise the same for every number of rows M and whatever the
other rows hold (batch_invariant), the same bits in processes with different tuning files, in
eager and captured runs, on other threads and streams; and each result against a float64 NumPy
reference made from the host copies of the inputs (not from cygemm): the GEMMs and matmul, the
dense layer's forward and backward, FP8 and cygemm.nn. CPU: the option's checks."""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import cygemm
from cygemm import gemm_ops
from fakes import FakeDeviceArray
from gpu_util import f64, rel_err, tol
from refs import activations

# FP8 products against float64 of the FP8 values: fp8/test_scaled.py's OUT_TOL (FP8 tensor-core sums are
# not kept in full fp32 between promotions, so a float32 out is bounded looser than strict fp32).
FP8_TOL = {"bfloat16": 1e-2, "float32": 4e-4}

MS = [1, 2, 3, 7, 64, 100, 1000, 4096]
K, N = 1024, 768
DTYPES = [("float32", "fp32"), ("float32", "tf32"), ("float16", "tf32"), ("bfloat16", "tf32")]


# ------------------------------------------------------------------ CPU

@pytest.mark.parametrize("call", ["gemm", "gemm_strided_batched", "matmul"])
def test_a_bad_determinism_is_refused_naming_it_before_anything_runs(call):
    shape = (2, 4, 4) if call == "gemm_strided_batched" else (4, 4)
    a = FakeDeviceArray(shape)
    out = FakeDeviceArray(shape, ptr=a.__cuda_array_interface__["data"][0] + 4096)
    with pytest.raises(ValueError, match=r"^determinism: expected None, 'off', 'run_to_run' or 'batch_invariant', "
                                         r"got 'bitwise'"):
        getattr(cygemm, call)(a, a, out, determinism="bitwise")


# (GemmPlan takes determinism=; its timing is its autotune() method, asked for by name.)
ENTRY_POINTS = ["gemm", "gemm_strided_batched", "matmul", "int_mm", "grouped.grouped_gemm",
                "grouped.moe_gemm", "grouped.describe_grouped", "fp8.scaled_matmul", "dense.forward_into",
                "dense.backward_into"]


def _entry(path):
    import importlib
    mod, _, name = path.rpartition(".")
    return getattr(importlib.import_module("cygemm." + mod) if mod else cygemm, name)


@pytest.mark.parametrize("path", ENTRY_POINTS)
def test_every_gemm_entry_point_takes_autotune_and_determinism(path):
    import inspect
    params = inspect.signature(_entry(path)).parameters
    for name in ("autotune", "determinism"):
        assert name in params and params[name].kind == inspect.Parameter.KEYWORD_ONLY
        assert params[name].default is None


def _bad_policy_call(path, **policy):
    base = FakeDeviceArray((1,)).__cuda_array_interface__["data"][0]
    a = FakeDeviceArray((4, 4))
    b = FakeDeviceArray((4, 4), ptr=base + 4096)
    out = FakeDeviceArray((4, 4), "<i4" if path == "int_mm" else "<f4", ptr=base + 8192)
    if path == "int_mm":
        return cygemm.int_mm(FakeDeviceArray((4, 4), "|i1"), FakeDeviceArray((4, 4), "|i1", (1, 4), base + 4096), out,
                             **policy)
    if path.startswith("grouped.") and path != "grouped.moe_gemm":
        return _entry(path)([a], [b], [out], **policy)
    if path == "grouped.moe_gemm":
        w = FakeDeviceArray((1, 4, 4), ptr=base + 4096)
        return cygemm.grouped.moe_gemm(a, w, [0, 4], out, **policy)
    if path == "fp8.scaled_matmul":
        return cygemm.fp8.scaled_matmul(a, b, a, b, **policy)
    return _entry(path)(a, b, out, **policy)


@pytest.mark.parametrize("path", ["int_mm", "grouped.grouped_gemm", "grouped.moe_gemm", "grouped.describe_grouped",
                                  "fp8.scaled_matmul"])
@pytest.mark.parametrize("policy, words", [
    (dict(determinism="bitwise"), "determinism: expected None, 'off', 'run_to_run' or 'batch_invariant', got 'bitwise'"),
    (dict(autotune="fast"), "autotune: expected None, 'off', 'auto' or 'exhaustive', got 'fast'")])
def test_a_bad_policy_is_refused_naming_it_by_the_entry_points_that_lacked_it(path, policy, words):
    import re
    with pytest.raises(ValueError, match=re.escape(words)):
        _bad_policy_call(path, **policy)


# ------------------------------------------------------------------ GPU

def _cp():
    return pytest.importorskip("cupy")


def _bits(x):
    """The result's bytes as unsigned integers: equal bits, not equal values (-0.0, NaN)."""
    cp = _cp()
    return x.view(cp.uint16 if x.dtype.itemsize == 2 else cp.uint32)


def _same_bits(x, y):
    cp = _cp()
    return bool(cp.array_equal(_bits(cp.ascontiguousarray(x)), _bits(cp.ascontiguousarray(y))))


def _operands(dtype, m=4096, k=K, n=N, seed=0):
    cp = _cp()
    rng = np.random.default_rng(seed)
    x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32)).astype(_dtype(dtype))
    w = cp.asarray(rng.standard_normal((k, n)).astype(np.float32)).astype(_dtype(dtype))
    return x, w


def _dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(name)


def _host64(x):
    """float64 host copy of a device array (16-bit floats through float32, which holds them exactly)."""
    cp = _cp()
    return f64(cp, x if x.dtype in (np.float32, np.float64) else x.astype(cp.float32))


def _check_rows(run, x, mode, dtype, math, ref64=None, bound=None):
    """run(rows) -> result; every M's result is bitwise the first M rows of the full one, and
    the full one's row 0 is unchanged when the other rows change. With `ref64`, the full one
    is also within `bound` (default: tol(dtype, math, K)) of that float64 reference."""
    cp = _cp()
    full = run(x)
    cp.cuda.Device().synchronize()
    if ref64 is not None:
        bound = tol(dtype, math, K) if bound is None else bound
        err = rel_err(_host64(full), ref64)
        assert err < bound, f"{mode}: {err:.3g} from float64, bound {bound:.3g}"
    for m in MS:
        part = run(x[:m])
        assert _same_bits(part, full[:m]), f"{mode}: rows of M={m} differ from those of M={len(x)}"
    other = x.copy()
    other[1:] = other[1:][::-1]
    assert _same_bits(run(other)[:1], full[:1]), f"{mode}: row 0 changed with the other rows"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", DTYPES)
def test_gemm_rows_are_batch_invariant(dtype, math):
    x, w = _operands(dtype)
    ref = _host64(x) @ _host64(w)
    _check_rows(lambda a: cygemm.gemm(a, w, math=math, determinism="batch_invariant"), x,
                "gemm", dtype, math, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", DTYPES)
def test_matmul_rows_and_batches_are_batch_invariant(dtype, math):
    cp = _cp()
    x, w = _operands(dtype)
    ref = _host64(x) @ _host64(w)
    _check_rows(lambda a: cygemm.matmul(a, w, math=math, determinism="batch_invariant"), x, "matmul", dtype, math,
                ref)
    # Batched: (B, M, K) @ (K, N), and each batch element of a stacked weight.
    x3 = x[:1024].reshape(8, 128, K)
    full = cygemm.matmul(x3, w, math=math, determinism="batch_invariant")
    assert rel_err(_host64(full), ref[:1024].reshape(8, 128, N)) < tol(dtype, math, K)
    for b in (1, 3, 8):
        assert _same_bits(cygemm.matmul(x3[:b], w, math=math, determinism="batch_invariant"), full[:b])
    w3 = cp.stack([w, w[:, ::-1].copy()])
    both = cygemm.matmul(x[:100], w3, math=math, determinism="batch_invariant")
    assert rel_err(_host64(both), np.stack([ref[:100], ref[:100, ::-1]])) < tol(dtype, math, K)
    assert _same_bits(both[0], cygemm.matmul(x[:100], w, math=math, determinism="batch_invariant"))
    assert _same_bits(cygemm.matmul(x[:7], w3, math=math, determinism="batch_invariant"), both[:, :7])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", DTYPES)
def test_gemm_strided_batched_elements_do_not_depend_on_the_batch_count(dtype, math):
    x, w = _operands(dtype)
    x3 = x.reshape(16, 256, K)
    full = cygemm.gemm_strided_batched(x3, w[None], math=math, determinism="batch_invariant")
    for b in (1, 2, 5, 16):
        assert _same_bits(cygemm.gemm_strided_batched(x3[:b], w[None], math=math, determinism="batch_invariant"),
                          full[:b])
    assert _same_bits(full[0], cygemm.gemm(x3[0], w, math=math, determinism="batch_invariant"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", DTYPES)
@pytest.mark.parametrize("act,save_z", [("none", False), ("relu", False), ("gelu", False), ("gelu", True),
                                        ("silu", False)])
def test_dense_forward_rows_are_batch_invariant(dtype, math, act, save_z):
    cp = _cp()
    x, w = _operands(dtype)
    bias = cp.asarray(np.random.default_rng(1).standard_normal(N).astype(np.float32)).astype(_dtype(dtype))
    z64 = _host64(x) @ _host64(w) + _host64(bias)
    ref = activations.act(act, z64)
    if save_z:
        ref = np.concatenate([ref, z64], axis=1)

    def run(a):
        y = cp.full((len(a), N), np.nan, dtype=a.dtype)
        z = cp.full((len(a), N), np.nan, dtype=a.dtype) if save_z else None
        gemm_ops.forward_into(a, w, y, bias, act=act, save_z=save_z, z_out=z, math=math,
                              determinism="batch_invariant")
        return y if z is None else cp.concatenate([y, z], axis=1)
    # (float32: 4x the GEMM's bound for the activation's epilogue, as dense/test_layer.py allows)
    _check_rows(run, x, f"forward {act}", dtype, math, ref, tol(dtype, math, K) * (4 if dtype == "float32" else 1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", DTYPES)
def test_dense_backward_data_gradient_rows_are_batch_invariant(dtype, math):
    cp = _cp()
    x, w = _operands(dtype)
    rng = np.random.default_rng(2)
    gy = cp.asarray(rng.standard_normal((4096, N)).astype(np.float32)).astype(_dtype(dtype))
    ref = _host64(gy) @ _host64(w).T                    # gA = gY @ B^T: sums of N terms

    def run(g):
        ga = cp.full((len(g), K), np.nan, dtype=g.dtype)
        gb = cp.empty((K, N), dtype=g.dtype)
        gemm_ops.backward_into(x[:len(g)], w, g, None, with_bias=False, gA_out=ga, gB_out=gb, math=math,
                               determinism="batch_invariant")
        return ga
    _check_rows(run, gy, "backward gA", dtype, math, ref, tol(dtype, math, N))


@pytest.mark.gpu
def test_dense_backward_weight_gradient_is_run_to_run_under_batch_invariant():
    """gB sums over the rows: under batch_invariant it runs as run_to_run does (same bits)."""
    cp = _cp()
    x, w = _operands("float32", m=2048)
    gy = cp.asarray(np.random.default_rng(6).standard_normal((2048, N)).astype(np.float32))
    got = {}
    for mode in ("batch_invariant", "run_to_run", "batch_invariant"):
        gb = cp.full((K, N), np.nan, dtype=cp.float32)
        gemm_ops.backward_into(x, w, gy, None, with_bias=False, gB_out=gb, determinism=mode)
        if mode in got:
            assert _same_bits(gb, got[mode])
        got[mode] = gb
    assert _same_bits(got["batch_invariant"], got["run_to_run"])
    assert rel_err(f64(cp, got["run_to_run"]), f64(cp, x).T @ f64(cp, gy)) < tol("float32", "tf32", 2048)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", DTYPES)
@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
def test_dense_layer_under_batch_invariant_matches_float64(dtype, math, act):
    """The dense layer under batch_invariant, against float64 from the host copies of its
    inputs: forward_into's Y = act(X @ W + b) and Z, then backward_into's gA, gB and gBias
    from gY and that Z (dZ = gY * act'(Z)), every output poisoned first."""
    cp = _cp()
    M = 1000
    x, w = _operands(dtype, m=M, seed=7)
    rng = np.random.default_rng(8)
    bias = cp.asarray(rng.standard_normal(N).astype(np.float32)).astype(_dtype(dtype))
    gy = cp.asarray(rng.standard_normal((M, N)).astype(np.float32)).astype(_dtype(dtype))
    y, z = (cp.full((M, N), np.nan, dtype=x.dtype) for _ in range(2))
    gemm_ops.forward_into(x, w, y, bias, act=act, save_z=True, z_out=z, math=math, determinism="batch_invariant")
    ga, gb, gbias = (cp.full(shape, np.nan, dtype=x.dtype) for shape in ((M, K), (K, N), (N,)))
    gemm_ops.backward_into(x, w, gy, z, act=act, gA_out=ga, gB_out=gb, gBias_out=gbias,
                           work_dZ=cp.empty((M, N), dtype=x.dtype), math=math, determinism="batch_invariant")
    cp.cuda.Device().synchronize()
    x64, w64, gy64 = _host64(x), _host64(w), _host64(gy)
    z64 = x64 @ w64 + _host64(bias)
    fp32 = dtype == "float32"
    assert rel_err(_host64(z), z64) < tol(dtype, math, K)
    assert rel_err(_host64(y), activations.act(act, z64)) < tol(dtype, math, K) * (4 if fp32 else 1)
    dz = gy64 * activations.act_grad(act, _host64(z))       # from the Z the backward was given
    assert rel_err(_host64(ga), dz @ w64.T) < tol(dtype, math, N)
    assert rel_err(_host64(gb), x64.T @ dz) < tol(dtype, math, M)
    assert rel_err(_host64(gbias), dz.sum(axis=0)) < tol(dtype, math, M)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", DTYPES)
def test_gemm_plan_rows_are_those_of_gemm(dtype, math):
    cp = _cp()
    x, w = _operands(dtype)
    full = cygemm.gemm(x, w, math=math, determinism="batch_invariant")
    for m in (3, 1000):
        out = cp.full((m, N), np.nan, dtype=x.dtype)
        with cygemm.GemmPlan(x[:m], w, out, math=math, determinism="batch_invariant") as p:
            p.autotune()                # timing may choose any kernel of the family: the same bits
            p.execute()
        assert _same_bits(out, full[:m])


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_fp8_rows_are_batch_invariant(out_dtype):
    cp = _cp()
    from cygemm import fp8
    from refs import fp8 as fp8_ref
    rng = np.random.default_rng(3)
    a_codes = fp8_ref.to_codes(rng.standard_normal((4096, K)) * 4, "e4m3")
    wt_codes = fp8_ref.to_codes(rng.standard_normal((N, K)) * 4, "e4m3")
    a, wt = cp.asarray(a_codes), cp.asarray(wt_codes)
    sa, sb = cp.asarray([0.5], cp.float32), cp.asarray([0.25], cp.float32)
    ref = 0.5 * 0.25 * (fp8_ref.decode(a_codes, "e4m3") @ fp8_ref.decode(wt_codes, "e4m3").T)
    old = cygemm.set_options(determinism="batch_invariant")
    try:
        _check_rows(lambda q: fp8.scaled_matmul(q, wt.T, sa, sb, out_dtype=out_dtype, format_a="e4m3",
                                                format_b="e4m3"), a, "fp8", out_dtype, "tf32", ref,
                    FP8_TOL[out_dtype])
    finally:
        cygemm.set_options(**old)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", DTYPES[1:])
def test_moe_groups_do_not_depend_on_the_other_groups_sizes(dtype, math):
    cp = _cp()
    x, _ = _operands(dtype, m=1024)
    rng = np.random.default_rng(4)
    w = cp.asarray(rng.standard_normal((4, K, N)).astype(np.float32)).astype(_dtype(dtype))
    old = cygemm.set_options(determinism="batch_invariant")
    try:
        for sizes in ([100, 300, 24, 600], [1, 7, 16, 1000], [512, 0, 0, 512]):
            offsets = [0] + np.cumsum(sizes).tolist()
            out = cp.full((1024, N), np.nan, dtype=x.dtype)
            cygemm.moe_gemm(x, w, offsets, out, math=math)
            for g, (lo, hi) in enumerate(zip(np.cumsum([0] + sizes[:-1]), np.cumsum(sizes))):
                if hi > lo:
                    alone = cygemm.gemm(x[lo:hi], w[g], math=math)
                    assert _same_bits(out[lo:hi], alone), (sizes, g)
    finally:
        cygemm.set_options(**old)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", DTYPES[1:])
def test_per_call_batch_invariant_grouped_and_moe_match_each_group_alone_and_float64(dtype, math):
    """determinism= per call (the option left "off"): each expert's rows are those of the expert
    alone under the same mode, whatever the other experts hold, and within bound of float64."""
    cp = _cp()
    x, _ = _operands(dtype, m=1024)
    rng = np.random.default_rng(6)
    w = cp.asarray(rng.standard_normal((4, K, N)).astype(np.float32)).astype(_dtype(dtype))
    x64, w64 = _host64(x), _host64(w)
    for sizes in ([100, 300, 24, 600], [1, 7, 16, 1000]):
        offsets = [0] + np.cumsum(sizes).tolist()
        out = cp.full((1024, N), np.nan, dtype=x.dtype)
        cygemm.moe_gemm(x, w, offsets, out, math=math, determinism="batch_invariant")
        groups = [(g, lo, hi) for g, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:])) if hi > lo]
        outs = [cp.full((hi - lo, N), np.nan, dtype=x.dtype) for _, lo, hi in groups]
        cygemm.grouped.grouped_gemm([x[lo:hi] for _, lo, hi in groups], [w[g] for g, _, _ in groups], outs,
                                    math=math, determinism="batch_invariant")
        for (g, lo, hi), o in zip(groups, outs):
            alone = cygemm.gemm(x[lo:hi], w[g], math=math, determinism="batch_invariant")
            assert _same_bits(out[lo:hi], alone) and _same_bits(o, alone), (sizes, g)
            assert rel_err(_host64(out[lo:hi]), x64[lo:hi] @ w64[g]) < tol(dtype, math, K)


@pytest.mark.gpu
def test_per_call_batch_invariant_fp8_and_int_mm_rows():
    cp = _cp()
    from cygemm import fp8
    from refs import fp8 as fp8_ref
    rng = np.random.default_rng(7)
    a_codes = fp8_ref.to_codes(rng.standard_normal((1024, K)) * 4, "e4m3")
    wt_codes = fp8_ref.to_codes(rng.standard_normal((N, K)) * 4, "e4m3")
    a, wt = cp.asarray(a_codes), cp.asarray(wt_codes)
    sa, sb = cp.asarray([0.5], cp.float32), cp.asarray([0.25], cp.float32)
    ref = 0.5 * 0.25 * (fp8_ref.decode(a_codes, "e4m3") @ fp8_ref.decode(wt_codes, "e4m3").T)
    _check_rows(lambda q: fp8.scaled_matmul(q, wt.T, sa, sb, out_dtype="float32", format_a="e4m3",
                                            format_b="e4m3", determinism="batch_invariant", autotune="off"),
                a, "fp8", "float32", "tf32", ref, FP8_TOL["float32"])
    xi = cp.asarray(rng.integers(-128, 128, (1024, K)).astype(np.int8))
    wi = cp.asarray(rng.integers(-128, 128, (N, K)).astype(np.int8))
    exact = xi.get().astype(np.int64) @ wi.get().astype(np.int64).T
    full = cygemm.int_mm(xi, wi.T, determinism="batch_invariant")
    assert np.array_equal(full.get(), exact)
    for m in MS[:5]:
        assert cp.array_equal(cygemm.int_mm(xi[:m], wi.T, determinism="run_to_run"), full[:m])


_PROCESS = textwrap.dedent("""
    import hashlib, sys, numpy as np, cupy as cp, cygemm
    mode, dtype = sys.argv[1], sys.argv[2]
    cygemm.set_options(autotune="exhaustive", autotune_min_macs=0)
    rng = np.random.default_rng(5)
    x = cp.asarray(rng.standard_normal((2048, 2048)).astype(np.float32)).astype(dtype)
    w = cp.asarray(rng.standard_normal((2048, 1536)).astype(np.float32)).astype(dtype)
    out = cygemm.gemm(x, w, determinism=mode)
    y = cygemm.matmul(x[:100], w, determinism=mode)
    cp.cuda.Device().synchronize()
    print(hashlib.sha256(out.get().tobytes() + y.get().tobytes()).hexdigest())
""")


def _in_process(mode, dtype, tuning_cache):
    env = dict(os.environ, CYGEMM_TUNING_CACHE=tuning_cache)
    done = subprocess.run([sys.executable, "-c", _PROCESS, mode, dtype], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["run_to_run", "batch_invariant"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_processes_with_different_tuning_files_give_the_same_bits(mode, dtype, tmp_path):
    fresh = str(tmp_path / "fresh.jsonl")
    first = _in_process(mode, dtype, fresh)                 # times its family's kernels (when several) and writes
    again = _in_process(mode, dtype, fresh)                 # reads what it wrote
    # A file filled by the fastest-kernel mode ("off") holds other choices: not used.
    filled = str(tmp_path / "off.jsonl")
    _in_process("off", dtype, filled)
    assert first == again == _in_process(mode, dtype, filled) == _in_process(mode, dtype, "off")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["run_to_run", "batch_invariant"])
def test_captured_replays_threads_and_streams_give_the_eager_bits(mode):
    cp = _cp()
    x, w = _operands("float32", m=2048)
    eager = cygemm.gemm(x, w, determinism=mode)
    out = cp.full_like(eager, np.nan)
    s = cp.cuda.Stream(non_blocking=True)
    cygemm.gemm(x, w, out, determinism=mode, stream=s)          # plans made before the capture
    s.synchronize()
    out.fill(np.nan)
    with cygemm.graph.capture(s) as graph:
        cygemm.gemm(x, w, out, determinism=mode, stream=s)
    graph.launch(s)
    s.synchronize()
    assert _same_bits(out, eager)
    results, errors = [None] * 4, []

    def worker(i):
        try:
            with cp.cuda.Stream(non_blocking=True) as st:
                results[i] = cygemm.gemm(x, w, determinism=mode, stream=st)
                st.synchronize()
        except Exception as exc:        # noqa: BLE001 (reported below)
            errors.append(exc)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(_same_bits(r, eager) for r in results)



@pytest.mark.gpu
def test_fp8_takes_the_mode_per_call():
    cp = _cp()
    from cygemm import fp8
    from refs import fp8 as fp8_ref
    rng = np.random.default_rng(4)
    a_codes = fp8_ref.to_codes(rng.standard_normal((4096, K)) * 4, "e4m3")
    wt_codes = fp8_ref.to_codes(rng.standard_normal((N, K)) * 4, "e4m3")
    a, wt = cp.asarray(a_codes), cp.asarray(wt_codes)
    one = cp.asarray([1.0], cp.float32)
    ref = fp8_ref.decode(a_codes, "e4m3") @ fp8_ref.decode(wt_codes, "e4m3").T
    assert cygemm.get_options()["determinism"] == "off"
    _check_rows(lambda q: fp8.scaled_matmul(q, wt.T, one, one, format_a="e4m3", format_b="e4m3",
                                            determinism="batch_invariant"), a, "fp8 per call", "bfloat16", "tf32",
                ref, FP8_TOL["bfloat16"])            # (the default out: bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_nn_predict_rows_are_batch_invariant(precision):
    cp = _cp()
    from cygemm import nn
    model = nn.MLP([K, 256, 128], act="gelu", seed=0, precision=precision)
    x = cp.asarray(np.random.default_rng(5).standard_normal((4096, K)).astype(np.float32))
    # float64 from the host copies of x and the float32 parameters, rounded to bfloat16 where
    # bf16-mixed's GEMMs read them so; gelu (tanh form) between the layers, none after the last.
    if precision == "fp32":
        r, bound = (lambda a: np.asarray(a, np.float64)), tol("float32", "tf32", K)
    else:
        r = lambda a: np.asarray(a, np.float32).astype(_dtype("bfloat16")).astype(np.float64)    # noqa: E731
        bound = tol("bfloat16")
    h = r(x.get())
    for i, layer in enumerate(model.layers):
        h = h @ r(layer.weight.get()).T + r(layer.bias.get())
        h = activations.act("gelu" if i < len(model.layers) - 1 else "none", h)
    old = cygemm.set_options(determinism="batch_invariant")
    try:
        _check_rows(lambda rows: model.predict(rows), x, f"nn {precision}", "float32", "tf32", h, bound)
    finally:
        cygemm.set_options(**old)


@pytest.mark.gpu
def test_float64_rows_are_batch_invariant_and_right():
    """float64 runs through cuBLASLt under batch_invariant (never cublasGemmEx): its alpha and
    beta must reach cuBLASLt as doubles, the scale type of a 64-bit compute type (they were
    passed as floats, which cuBLASLt read as garbage doubles)."""
    cp = _cp()
    x, w = _operands("float64", m=1024)
    old = cygemm.set_options(determinism="batch_invariant")
    try:
        ref64 = f64(cp, x) @ f64(cp, w)
        full = cygemm.matmul(x, w)
        assert rel_err(f64(cp, full), ref64) < 1e-12
        _check_rows(lambda a: cygemm.matmul(a, w), x, "float64", "float32", "fp32")
    finally:
        cygemm.set_options(**old)


@pytest.mark.gpu
def test_a_new_size_in_a_timed_bucket_times_only_its_fastest_members_with_the_same_rows():
    """batch_invariant: M = 9 times the family and keeps its fastest members for the bucket of
    M = 9..16; M = 12 and 16 choose among those alone, and their rows are those of M = 9 and of
    float64."""
    cp = _cp()
    from cygemm.engine import plans, tuning
    x, w = _operands("bfloat16", m=16, k=4096, n=1024, seed=7)
    wt = cp.ascontiguousarray(w.T)          # a linear layer's (N, K) weight
    tuning.clear_tuning()
    plans.clear_plan_cache()

    def run(m):
        out = cp.full((m, 1024), cp.nan, x.dtype)
        return cygemm.gemm(x[:m], wt, out, trans_b=True, determinism="batch_invariant")

    def records():
        return {tuple(e["key"]): e for e in tuning.tuning_entries()}

    first = run(9)
    buckets = [e for key, e in records().items() if key[-1] == "bucket"]
    assert len(buckets) == 1 and 1 <= len(buckets[0]["members"]) <= 4
    members = buckets[0]["members"]
    for m in (12, 16):
        before = set(records())
        got = run(m)
        new = [e for key, e in records().items() if key not in before]
        assert all(e["algo"] in members for e in new), f"M={m} chose outside its bucket's members"
        assert _same_bits(got[:9], first)
    assert [e["members"] for key, e in records().items() if key[-1] == "bucket"] == [members]
    err = rel_err(_host64(got), _host64(x) @ _host64(w))
    assert err < tol("bfloat16", "tf32", 4096)
