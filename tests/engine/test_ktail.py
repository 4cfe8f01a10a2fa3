"""The K-tail guard (cygemm.engine.ktail) and the first-use checks of promises (cygemm.engine.promises).

The detector needs no tolerance: A (M x K) is zero but its first and last columns, which are 1,
and B (K x N) is all ones, so every element of C = A @ B is exactly 2; a kernel that never adds
the end of K returns 1. On an H200 with cuBLAS 13.1, cuBLAS itself returned 1 on the shapes in
KNOWN_WRONG (benchmarks/ktail_probe.cu); with the guard every shape here must give 2.
"""
import json
import os

import numpy as np
import pytest

import cygemm
from cygemm.engine import ktail as _ktail, promises as _promises

# (M, N, K) that cuBLAS 13.1's cublasGemmEx and cuBLASLt's first choice got wrong (bf16 and fp16).
KNOWN_WRONG = [(64, 256, 32776), (256, 128, 32776), (16, 512, 24584), (8, 128, 40968), (1, 1024, 32776),
               (128, 256, 32776), (1, 64, 40968)]


# ---------------------------------------------------------------- the rule, without a GPU

@pytest.mark.parametrize("k, splits, drops", [
    (32776, 16, True),      # q = 512 (block 64), t = 8: 512 % 16 == 0, 16 > 8
    (32776, 8, False),      # 8 > t fails for block 64 (t = 8); block 128: t = 8, q = 256, 8 > 8 fails
    (32776, 15, False),     # 15 divides no q of any block
    (24584, 16, True),
    (40968, 32, True),
    (32768, 16, False),     # a multiple of 256: no block leaves a tail
    (1000, 1, False),       # no split, nothing dropped
])
def test_the_rule_flags_the_splits_that_leave_a_tail(k, splits, drops):
    was = _ktail.enabled()
    _ktail.set_enabled(True)
    try:
        possible, flagged = _ktail._rule(k, splits)
    finally:
        _ktail.set_enabled(was)
    assert flagged == drops
    assert possible == (k % 256 != 0)


def test_short_or_whole_ks_are_never_looked_at():
    assert _ktail._rule(64, 2)[0] is False          # 64 = one block of 64, no q > t for any block
    assert _ktail._rule(4096, 2)[0] is False
    assert _ktail._rule(4100, 2)[0] is True


# ---------------------------------------------------------------- first-use checks, without a GPU

@pytest.fixture
def fresh_promises(monkeypatch):
    _promises._reset_for_tests()
    ran = []
    monkeypatch.setattr(_promises, "_CHECKS", {p: (lambda p=p: ran.append(p) or True) for p in _promises.PROMISES})
    kept = {}
    from cygemm.engine import tuning
    from cygemm.engine import context as _context
    monkeypatch.setattr(tuning, "_lookup_promise", lambda device, key: kept.get(key))
    monkeypatch.setattr(tuning, "_remember_promise", lambda device, key, record: kept.__setitem__(key, record))
    monkeypatch.setattr(_context, "current_device", lambda: 0)
    monkeypatch.setattr(_promises, "_on_a_side_stream", lambda check: check())     # (no GPU here)
    yield ran, kept
    _promises._reset_for_tests()


def test_a_verified_cublas_runs_no_check(fresh_promises, monkeypatch):
    ran, kept = fresh_promises
    monkeypatch.setattr(_promises, "_cublaslt_version", lambda: _promises.VERIFIED_CUBLASLT[0])
    measured = [p for p in _promises.PROMISES if _promises.VERIFIED[p]]
    assert measured == ["ktail_guard", "batch_invariant"]
    for p in measured:
        _promises.require(p)
    assert ran == [] and kept == {}


def test_promises_no_gpu_has_measured_are_checked_on_every_version(fresh_promises, monkeypatch):
    """lt_grouped and ktail_fixed were measured on no cuBLASLt: even 13.1 checks them."""
    ran, kept = fresh_promises
    monkeypatch.setattr(_promises, "_cublaslt_version", lambda: _promises.VERIFIED_CUBLASLT[0])
    for p in ("lt_grouped", "ktail_fixed"):
        _promises.require(p)
    assert sorted(ran) == ["ktail_fixed", "lt_grouped"]


def test_an_unverified_cublas_checks_each_promise_once_and_keeps_the_verdict(fresh_promises, monkeypatch):
    ran, kept = fresh_promises
    monkeypatch.setattr(_promises, "_cublaslt_version", lambda: 139999)
    for _ in range(3):
        _promises.require("ktail_guard")
        _promises.require("batch_invariant")
    assert sorted(ran) == ["batch_invariant", "ktail_guard"]
    assert kept == {("ktail_guard",): {"holds": True}, ("batch_invariant",): {"holds": True}}
    _promises._reset_for_tests()            # a new process: the kept verdict, no second check
    _promises.require("ktail_guard")
    assert sorted(ran) == ["batch_invariant", "ktail_guard"]


def test_a_failed_check_makes_the_mode_refuse(fresh_promises, monkeypatch):
    ran, kept = fresh_promises
    monkeypatch.setattr(_promises, "_cublaslt_version", lambda: 139999)
    _promises._fail.add("batch_invariant")
    with pytest.raises(cygemm.CygemmError, match="batch_invariant.*139999.*run_to_run"):
        _promises.require("batch_invariant")
    with pytest.raises(cygemm.CygemmError):         # and again: the verdict is kept
        _promises.require("batch_invariant")
    assert kept[("batch_invariant",)] == {"holds": False}


# ---------------------------------------------------------------- the detector on the GPU

def _detector(cp, dtype, m, n, k):
    a = cp.zeros((m, k), dtype)
    a[:, 0] = 1
    a[:, -1] = 1
    return a, cp.ones((k, n), dtype)


def _dtypes():
    from cygemm.engine.dtypes import numpy_dtype
    out = [("float16", "tf32")]
    try:
        out.insert(0, (numpy_dtype("bfloat16"), "tf32"))
    except TypeError:
        pass
    return out + [("float32", "tf32"), ("float32", "fp32")]


def _wrong(cp, c):
    return int((c.astype(cp.float32) != 2).sum())


def _run(cp, entry, mode, a, b, math):
    """One detector product through `entry` under `mode` (determinism or autotune); C poisoned."""
    m, n = a.shape[0], b.shape[1]
    c = cp.full((m, n), cp.nan, a.dtype)
    kw = {"determinism": mode} if mode in ("run_to_run", "batch_invariant") else {"autotune": mode}
    if entry == "gemm":
        cygemm.gemm(a, b, out=c, math=math, **kw)
    elif entry == "matmul":
        cygemm.matmul(a, b, out=c, math=math, **kw)
    elif entry == "strided_batched":
        c3 = cp.full((2, m, n), cp.nan, a.dtype)
        cygemm.gemm_strided_batched(cp.stack([a, a]), cp.stack([b, b]), out=c3, math=math, **kw)
        return _wrong(cp, c3)
    elif entry == "plan":           # (a GemmPlan is timed by its autotune(), not an option)
        with cygemm.GemmPlan(a, b, c, math=math, **({} if "autotune" in kw else kw)) as p:
            p.plan()
            if mode == "auto":
                p.autotune("auto")
            p.execute()
    elif entry == "dense":
        from cygemm.gemm_ops import forward_into
        forward_into(a, b, c, cp.zeros(n, a.dtype), act="relu", math=math, **kw)
    return _wrong(cp, c)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, math", _dtypes(), ids=lambda x: str(x))
@pytest.mark.parametrize("entry", ["gemm", "matmul", "strided_batched", "plan", "dense"])
@pytest.mark.parametrize("mode", ["off", "auto", "run_to_run", "batch_invariant"])
def test_no_entry_point_or_mode_drops_the_end_of_k(entry, mode, dtype, math):
    """The shapes cuBLAS 13.1 got wrong, and their neighbours, through every entry point and mode."""
    import cupy as cp
    for m, n, k in KNOWN_WRONG[:4] + [(32, 512, 24584 + 16), (64, 1024, 8200)]:
        a, b = _detector(cp, dtype, m, n, k)
        assert _run(cp, entry, mode, a, b, math) == 0, (entry, mode, m, n, k)


def _sweep_shapes(count, seed):
    """Deep K (8k-64k), small M and N (1-512), K mod 64 over 1..40; fixed by the seed."""
    rng = np.random.default_rng(seed)
    # Half the K's have q a multiple of 16 or 32 (the split counts cuBLAS 13.1 takes here),
    # half any q: a uniform q alone rarely meets q % s == 0.
    qs = np.where(rng.random(count) < 0.5, rng.choice([128, 192, 256, 384, 512, 640, 768, 896, 960], count),
                  rng.integers(128, 1001, count))
    ts = rng.integers(1, 41, count)
    ms = rng.choice([1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512], count)
    ns = rng.choice([8, 64, 128, 192, 256, 384, 512], count)
    pads = rng.random(count) < 0.25
    return [(int(m), int(n), int(64 * q + t), bool(p)) for m, n, q, t, p in zip(ms, ns, qs, ts, pads)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, math", _dtypes(), ids=lambda x: str(x))
def test_sweep_the_guard_saves_every_shape_cublas_gets_wrong(dtype, math):
    """CYGEMM_KTAIL_SHAPES shapes per dtype (default 2000) through gemm, with the guard and without
    it (cuBLAS alone); with it none is wrong. CYGEMM_KTAIL_REPORT=path appends the counts as JSON."""
    import cupy as cp
    from cygemm.engine import plans
    shapes = _sweep_shapes(int(os.environ.get("CYGEMM_KTAIL_SHAPES", "2000")), 37)
    wrong = {"guarded": [], "cublas": []}
    for guarded in (True, False):
        _ktail.set_enabled(guarded)
        plans.clear_plan_cache()
        try:
            for m, n, k, pad in shapes:
                a, b = _detector(cp, dtype, m, n, k)
                if pad:                 # unaligned leading dimensions: views of wider arrays
                    a = cp.pad(a, ((0, 0), (0, 1)))[:, :k]
                    b = cp.pad(b, ((0, 0), (0, 1)))[:, :n]
                    a[:, 0], a[:, k - 1] = 1, 1
                c = cp.full((m, n), cp.nan, a.dtype)
                cygemm.gemm(a, b, out=c, math=math)
                if _wrong(cp, c):
                    wrong["guarded" if guarded else "cublas"].append((m, n, k, pad))
        finally:
            _ktail.set_enabled(True)
            plans.clear_plan_cache()
    name = f"{np.dtype(dtype).name}/{math}"
    print(f"ktail sweep {name}: {len(shapes)} shapes; wrong with the guard {len(wrong['guarded'])}, "
          f"cuBLAS alone {len(wrong['cublas'])}: {wrong['cublas'][:12]}")
    if os.environ.get("CYGEMM_KTAIL_REPORT"):
        with open(os.environ["CYGEMM_KTAIL_REPORT"], "a") as f:
            f.write(json.dumps({"dtype": name, "shapes": len(shapes), "cublas": cygemm.versions().get("cublasLt"),
                                "wrong_guarded": wrong["guarded"], "wrong_cublas": wrong["cublas"]}) + "\n")
    assert wrong["guarded"] == []


@pytest.mark.gpu
def test_with_the_guard_off_the_detector_sees_what_cublas_returns():
    """The detector through cygemm with the guard off and on: on, every element is 2."""
    import cupy as cp
    from cygemm.engine import plans
    a, b = _detector(cp, "float16", 64, 256, 32776)
    _ktail.set_enabled(False)
    plans.clear_plan_cache()
    try:
        c = cp.full((64, 256), cp.nan, cp.float16)
        cygemm.gemm(a, b, out=c)
        raw = _wrong(cp, c)
    finally:
        _ktail.set_enabled(True)
        plans.clear_plan_cache()
    c = cp.full((64, 256), cp.nan, cp.float16)
    cygemm.gemm(a, b, out=c)
    assert _wrong(cp, c) == 0
    # cuBLAS alone: 0 (right) or every element 1 (wrong). On the H200 with cuBLAS 13.1 the raw
    # cublasGemmEx of benchmarks/ktail_probe.cu was wrong here; through cygemm's own handle and
    # workspaces it was right (and 1 of 2,000 swept shapes was wrong).
    assert raw in (0, 64 * 256)
    print(f"cuBLAS alone at 64 x 256 x 32776 float16: {raw} wrong elements")


@pytest.mark.gpu
def test_a_forced_failure_of_the_batch_invariant_check_refuses_the_mode(monkeypatch):
    import cupy as cp
    from cygemm.engine import plans
    _promises._reset_for_tests()
    monkeypatch.setattr(_promises, "_cublaslt_version", lambda: 139999)
    monkeypatch.setattr(_promises, "VERIFIED_CUBLASLT", ())
    from cygemm.engine import tuning
    monkeypatch.setattr(tuning, "_remember_promise", lambda *a: None)
    monkeypatch.setattr(tuning, "_lookup_promise", lambda *a: None)
    _promises._fail.add("batch_invariant")
    plans.clear_plan_cache()
    x = cp.ones((3, 64), cp.float32)
    try:
        with pytest.raises(cygemm.CygemmError, match="batch_invariant"):
            cygemm.matmul(x, x.T, determinism="batch_invariant")
        assert _promises.checks_run["batch_invariant"] >= 1
    finally:
        _promises._reset_for_tests()
        plans.clear_plan_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("promise", ["ktail_guard", "batch_invariant"])
def test_a_first_use_inside_a_capture_checks_beside_it_and_the_graph_replays_right(promise, monkeypatch):
    """On an unverified cuBLAS, the first GEMM that relies on a promise comes inside a capture
    (CuPy's, global mode): the check runs on its own stream, the capture survives, and the
    replayed graph gives the exact detector result."""
    import cupy as cp
    from cygemm.engine import plans, tuning
    _promises._reset_for_tests()
    monkeypatch.setattr(_promises, "_cublaslt_version", lambda: 139999)
    monkeypatch.setattr(_promises, "VERIFIED_CUBLASLT", ())
    monkeypatch.setattr(tuning, "_remember_promise", lambda *a: None)
    monkeypatch.setattr(tuning, "_lookup_promise", lambda *a: None)
    dtype = _dtypes()[1][0]                                 # float16
    mode = "batch_invariant" if promise == "batch_invariant" else "off"
    s = cp.cuda.Stream(non_blocking=True)

    def first_use(m, n, k, stream):
        """A first call of (m, n, k) in a fresh state: whether it ran the promise's check."""
        _promises._reset_for_tests()
        _ktail._forget_verdicts()       # (the guard's verdicts, and with them its check, come anew)
        plans.clear_plan_cache()
        before = _promises.checks_run[promise]
        a, b = _detector(cp, dtype, m, n, k)
        c = cp.full((m, n), cp.nan, dtype)
        return a, b, c, before
    # The guard's check runs where the guard acts: a shape whose kernel it moves, with cygemm's
    # own handle and workspaces (found eagerly first).
    for m, n, k in KNOWN_WRONG + [(32, 128, 51232)]:
        a, b, c, before = first_use(m, n, k, s)
        cygemm.gemm(a, b, out=c, determinism=mode, stream=s)
        s.synchronize()
        if _promises.checks_run[promise] > before:
            break
    else:
        pytest.skip(f"the guard acts on none of these shapes with cuBLASLt {cygemm.versions()['cublasLt']}")
    a, b, c, before = first_use(m, n, k, s)
    try:
        s.begin_capture()
        try:
            cygemm.gemm(a, b, out=c, determinism=mode, stream=s)   # (its first call: plan and check now)
        finally:
            graph = s.end_capture()
        assert _promises.checks_run[promise] == before + 1
        with s:
            c[...] = cp.nan
        graph.launch(s)
        s.synchronize()
        assert _wrong(cp, c) == 0
    finally:
        from cygemm.engine import release as _release
        _release.note_capture(s)    # (a raw capture is known over at the stream's next call: now)
        _promises._reset_for_tests()
        plans.clear_plan_cache()


@pytest.mark.gpu
def test_the_checks_themselves_hold_on_this_gpu(monkeypatch):
    """The first-use checks as an unverified cuBLAS would run them: all hold here (the grouped
    matmul's where this cuBLAS and GPU have it)."""
    from cygemm.engine import lt_features
    assert _promises._CHECKS["ktail_guard"]()
    assert _promises._CHECKS["batch_invariant"]()
    if lt_features.feature_gate("grouped_gemm") is None:
        assert _promises._CHECKS["lt_grouped"]()


def test_whether_the_guard_stands_down_is_asked_only_when_it_would_act():
    _ktail._forget_fix()
    assert _ktail.stands_down() is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_guard_stands_down_only_where_cublas_confirms_its_fix(dtype):
    """Below 13.8.1 (the test hook's 13.1) the guard acts; from 13.8.1 the first flagged GEMM runs
    the detector unguarded once, and the guard stands down if it was exact. Every result exact."""
    import cupy as cp
    from cygemm.engine import lt_features, plans
    m, n, k = KNOWN_WRONG[0]
    _promises._reset_for_tests()
    try:
        for pretend in (dict(version=130100), None):
            _ktail._forget_fix()
            plans.clear_plan_cache()
            before = _promises.checks_run["ktail_fixed"]
            a, b = _detector(cp, dtype, m, n, k)
            c = cp.full((m, n), cp.nan, a.dtype)
            # (None: the guard was never asked, where this GPU's heuristic chose no split that
            # drops K's end for the shape: the H200's known-wrong shapes need not be the H100's.)
            if pretend:
                with lt_features._pretend(**pretend):
                    cygemm.gemm(a, b, out=c)
                assert _ktail.stands_down() is not True
            else:
                cygemm.gemm(a, b, out=c)
                if lt_features.feature_gate("ktail_fixed") is None and _ktail.stands_down() is not None:
                    assert _promises.checks_run["ktail_fixed"] == before + 1
                    print(f"cuBLASLt {cygemm.versions()['cublasLt']}: the K-tail fix "
                          f"{'holds: the guard stands down' if _ktail.stands_down() else 'failed its check'}")
                else:
                    assert _ktail.stands_down() is not True
            assert _wrong(cp, c) == 0
    finally:
        _ktail._forget_fix()
        _promises._reset_for_tests()
        plans.clear_plan_cache()


# ---------------------------------------------------------------- every other entry point

ENTRIES = ["matmul", "strided_batched", "plan", "dense", "dense_backward_gB", "dense_backward_gA",
           "grouped:batched", "grouped:grouped", "grouped:loop", "grouped:streams", "moe", "fp8", "int8"]
MODES = ["off", "auto", "run_to_run", "batch_invariant"]


def _set_mode(mode):
    if mode in ("run_to_run", "batch_invariant"):
        return cygemm.set_options(determinism=mode, autotune="auto")
    return cygemm.set_options(determinism="off", autotune=mode)


def _entry_wrong(cp, entry, dtype, math, m, n, k):
    """Elements of the entry's detector product that are not exactly what they must be."""
    from cygemm import fp8, gemm_ops, grouped
    if entry.startswith("dense_backward"):
        ones = cp.ones
        if entry == "dense_backward_gB":     # gB = A.T @ gY: the layer's rows (k of them) are its K
            A = cp.zeros((k, m), dtype)
            A[0], A[-1] = 1, 1
            _, gB, _ = gemm_ops.backward(A, ones((m, n), dtype), ones((k, n), dtype), None, with_bias=False,
                                         need_gA=False, math=math)
            return _wrong(cp, gB)
        gY = cp.zeros((m, k), dtype)         # gA = gY @ B.T: the layer's width (k) is its K
        gY[:, 0], gY[:, -1] = 1, 1
        gA, _, _ = gemm_ops.backward(ones((m, n), dtype), ones((n, k), dtype), gY, None, with_bias=False,
                                     need_gB=False, math=math)
        return _wrong(cp, gA)
    if entry.startswith("grouped:"):
        a, b = _detector(cp, dtype, m, n, k)
        route = entry.split(":")[1]
        if route == "batched":              # (views at strides: its one strided-batched GEMM)
            a2, b2, out = cp.stack([a, a]), cp.stack([b, b]), cp.full((2, m, n), cp.nan, dtype)
            As, Bs, outs = [a2[0], a2[1]], [b2[0], b2[1]], [out[0], out[1]]
        else:                               # (arrays of their own: 16-byte aligned, as cuBLAS needs)
            As, Bs, outs = [a, a], [b, b], [cp.full((m, n), cp.nan, dtype) for _ in range(2)]
        grouped.grouped_gemm(As, Bs, outs, math=math, route=route)
        return sum(_wrong(cp, c) for c in outs)
    if entry == "moe":
        a, _ = _detector(cp, dtype, m, n, k)
        out = cp.full((2 * m, n), cp.nan, dtype)
        grouped.moe_gemm(cp.concatenate([a, a]), cp.ones((2, k, n), dtype), [0, m, 2 * m], out, math=math)
        return _wrong(cp, out)
    if entry == "fp8":                      # 0x38 is 1.0 in E4M3; K a multiple of 16
        k = k - k % 16 + 16
        a = cp.zeros((m, k), cp.uint8)
        a[:, 0], a[:, -1] = 0x38, 0x38
        w = cp.full((n, k), 0x38, cp.uint8)
        one = cp.ones(1, cp.float32)
        out = cp.full((m, n), cp.nan, cp.float16)
        fp8.scaled_matmul(a, w.T, one, one, out=out, format_a="e4m3", format_b="e4m3")
        return _wrong(cp, out)
    if entry == "int8":                     # K a multiple of 4; exact int32
        k = k - k % 4 + 4
        a = cp.zeros((m, k), cp.int8)
        a[:, 0], a[:, -1] = 1, 1
        out = cp.full((m, n), -1, cp.int32)
        cygemm.int_mm(a, cp.ones((n, k), cp.int8).T, out)
        return int((out != 2).sum())
    a, b = _detector(cp, dtype, m, n, k)
    return _run(cp, entry, "off", a, b, math)


@pytest.mark.gpu
@pytest.mark.parametrize("entry", ENTRIES)
def test_sweep_every_other_entry_point_and_mode(entry):
    """CYGEMM_KTAIL_ENTRY_SHAPES swept shapes (default 200) per 16-bit dtype through `entry`, the
    modes taken in turn (set as options, which every entry point follows): none drops the end of
    K. (FP8 and int8 run once, on their own types.) A mode that refuses a shape is counted apart."""
    import cupy as cp
    count = int(os.environ.get("CYGEMM_KTAIL_ENTRY_SHAPES", "200"))
    dtypes = [d for d, math in _dtypes() if math == "tf32" and np.dtype(d).itemsize == 2]
    if entry in ("fp8", "int8"):
        dtypes = dtypes[:1]
    wrong, refused, done = [], [], 0
    old = cygemm.get_options()
    try:
        for dtype in dtypes:
            for i, (m, n, k, _) in enumerate(_sweep_shapes(count, 38)):
                mode = MODES[i % len(MODES)]
                _set_mode(mode)
                try:
                    bad = _entry_wrong(cp, entry, dtype, "tf32", m, n, k)
                except cygemm.CygemmError as exc:
                    refused.append((mode, m, n, k, str(exc)[:80]))
                    continue
                done += 1
                if bad:
                    wrong.append((np.dtype(dtype).name, mode, m, n, k, bad))
    finally:
        cygemm.set_options(determinism=old["determinism"], autotune=old["autotune"])
    print(f"ktail entry sweep {entry}: {done} shapes run, wrong {len(wrong)}: {wrong[:8]}; "
          f"refused {len(refused)}: {refused[:3]}")
    if os.environ.get("CYGEMM_KTAIL_REPORT"):
        with open(os.environ["CYGEMM_KTAIL_REPORT"], "a") as f:
            f.write(json.dumps({"entry": entry, "shapes_run": done, "wrong": wrong, "refused": len(refused),
                                "cublas": cygemm.versions().get("cublasLt")}) + "\n")
    assert wrong == []
    assert done >= len(refused)         # (a sweep that refuses most of its shapes proves little)
