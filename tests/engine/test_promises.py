"""cygemm.engine.promises: the promises that rest on observed cuBLAS behaviour (the K-tail guard,
batch_invariant), checked once at first use on a cuBLAS version they were not measured on.

CPU, with the checks and the tuning table's store replaced: the verified versions and what
`verified` answers, each promise's check and refusal message, one check under concurrent first
uses, a check that raises deciding nothing, kept verdicts (per device) honoured without a
check, the test hook failing one check only, and the exact detector the K-tail check uses.
GPU: a check runs on a stream of its own in relaxed capture mode and gives the thread its mode
back; a first use on an unverified cuBLAS checks once, then computes right.
(tests/engine/test_ktail.py has the basic once-per-promise and refusal cases, a check inside a
capture and the real checks holding on the GPU.)
"""
import threading

import numpy as np
import pytest

import cygemm
from cygemm.engine import promises as _promises
from gpu_util import f64, poisoned, rand, rel_err, tol

UNVERIFIED = 139999        # a cuBLASLt version no promise was measured on


@pytest.fixture
def promises(monkeypatch):
    """A fresh verdict state on an unverified cuBLAS: checks that record their runs and hold,
    run in place (no GPU), and a tuning table's store of verdicts in a dict."""
    _promises._reset_for_tests()
    ran = []
    kept = {}
    lookups = []
    from cygemm.engine import context as _context, tuning
    monkeypatch.setattr(_promises, "_CHECKS", {p: (lambda p=p: ran.append(p) or True) for p in _promises.PROMISES})
    monkeypatch.setattr(_promises, "_on_a_side_stream", lambda check: check())
    monkeypatch.setattr(_promises, "_cublaslt_version", lambda: UNVERIFIED)
    monkeypatch.setattr(_context, "current_device", lambda: 0)

    def lookup(device, key):
        lookups.append((device, key))
        return kept.get((device, key))

    monkeypatch.setattr(tuning, "_lookup_promise", lookup)
    monkeypatch.setattr(tuning, "_remember_promise", lambda device, key, record: kept.__setitem__((device, key), record))
    checks_before = dict(_promises.checks_run)
    state = type("State", (), {})()
    state.ran, state.kept, state.lookups, state.checks_before = ran, kept, lookups, checks_before
    yield state
    _promises._reset_for_tests()


def test_verified_answers_for_the_given_version_or_the_loaded_one():
    assert _promises.VERIFIED_CUBLASLT and all(isinstance(v, int) and v >= 130000 for v in _promises.VERIFIED_CUBLASLT)
    for v in _promises.VERIFIED_CUBLASLT:
        assert _promises.verified(v) is True
        assert _promises.verified(v + 1) is False          # a patch release is another version
    assert _promises.verified(0) is False
    loaded = cygemm.versions()["cublasLt"]                 # (no GPU needed)
    assert _promises.verified() == (loaded in _promises.VERIFIED_CUBLASLT)


@pytest.mark.parametrize("promise", _promises.PROMISES)
def test_each_promise_has_a_check_and_a_refusal_naming_versions_and_what_to_do(promises, promise):
    assert set(_promises._CHECKS) == set(_promises._WHAT) == set(_promises._INSTEAD) == set(_promises.PROMISES)
    assert set(_promises.checks_run) == set(_promises.PROMISES)
    _promises._fail.add(promise)
    with pytest.raises(cygemm.CygemmError) as info:
        _promises.require(promise)
    message = str(info.value)
    assert message.startswith(_promises._WHAT[promise]) and message.endswith(_promises._INSTEAD[promise])
    assert f"the loaded cuBLASLt {UNVERIFIED}" in message
    if not _promises.VERIFIED[promise]:         # measured on none yet: says so, suggests no pin
        assert "has not yet run on any cuBLASLt that offers it" in message
    for v in _promises.VERIFIED[promise]:
        assert str(v) in message
    # The pip pin it suggests installs a verified version: major.minor of a measured one.
    if _promises.VERIFIED[promise]:
        assert any(f"nvidia-cublas=={v // 10000}.{v // 100 % 100}.*" in message for v in _promises.VERIFIED[promise])
    other = [p for p in _promises.PROMISES if p != promise]
    for p in other:                                        # a failed check refuses its own mode only
        _promises.require(p)
    assert promises.ran == [promise] + other


def test_concurrent_first_uses_run_one_check_and_all_get_its_verdict(promises, monkeypatch):
    started, release = threading.Event(), threading.Event()
    runs = []

    def slow_check():
        runs.append(threading.get_ident())
        started.set()
        release.wait(10)
        return True

    monkeypatch.setattr(_promises, "_CHECKS", dict(_promises._CHECKS, batch_invariant=slow_check))
    results = []

    def use():
        try:
            _promises.require("batch_invariant")
            results.append("ok")
        except BaseException as exc:        # (reported below, not lost in the thread)
            results.append(repr(exc))

    threads = [threading.Thread(target=use, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    assert started.wait(10), "no check started"
    release.set()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a first use hung"
    assert results == ["ok"] * 8
    assert len(runs) == 1
    assert promises.kept == {(0, ("batch_invariant",)): {"holds": True}}


def test_a_check_that_raises_decides_nothing_and_the_next_use_checks_again(promises, monkeypatch):
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("out of memory during the check")
        return True

    monkeypatch.setattr(_promises, "_CHECKS", dict(_promises._CHECKS, ktail_guard=flaky))
    with pytest.raises(MemoryError, match="during the check"):
        _promises.require("ktail_guard")
    # Not left "being checked" (which would let every later use through unchecked), nothing kept.
    assert "ktail_guard" not in _promises._checking
    assert "ktail_guard" not in _promises._verdicts and promises.kept == {}
    _promises.require("ktail_guard")
    assert len(calls) == 2 and promises.kept == {(0, ("ktail_guard",)): {"holds": True}}
    assert _promises.checks_run["ktail_guard"] == promises.checks_before["ktail_guard"] + 2


def test_a_checks_own_uses_pass_while_other_promises_are_still_checked(promises, monkeypatch):
    order = []

    def ktail_check():
        order.append("ktail_guard: start")
        _promises.require("ktail_guard")        # its own GEMMs rely on it: let them
        _promises.require("batch_invariant")    # another promise: checked now, once
        order.append("ktail_guard: end")
        return True

    def batch_check():
        order.append("batch_invariant")
        return True

    monkeypatch.setattr(_promises, "_CHECKS", {"ktail_guard": ktail_check, "batch_invariant": batch_check})
    _promises.require("ktail_guard")
    _promises.require("batch_invariant")
    assert order == ["ktail_guard: start", "batch_invariant", "ktail_guard: end"]
    assert set(promises.kept) == {(0, ("ktail_guard",)), (0, ("batch_invariant",))}


def test_a_kept_failed_verdict_refuses_without_running_a_check(promises, monkeypatch):
    from cygemm.engine import context as _context
    monkeypatch.setattr(_context, "current_device", lambda: 3)
    promises.kept[(3, ("batch_invariant",))] = {"holds": False}
    promises.kept[(3, ("ktail_guard",))] = {"holds": True}
    with pytest.raises(cygemm.CygemmError, match="batch_invariant"):
        _promises.require("batch_invariant")
    _promises.require("ktail_guard")
    assert promises.ran == []
    assert _promises.checks_run == promises.checks_before
    # The verdicts are looked up for the device the call runs on.
    assert sorted(promises.lookups) == [(3, ("batch_invariant",)), (3, ("ktail_guard",))]


def test_a_verdict_on_one_device_is_not_taken_for_another(promises, monkeypatch):
    from cygemm.engine import context as _context
    promises.kept[(0, ("batch_invariant",))] = {"holds": True}
    monkeypatch.setattr(_context, "current_device", lambda: 1)
    _promises.require("batch_invariant")
    assert promises.ran == ["batch_invariant"]
    assert promises.kept[(1, ("batch_invariant",))] == {"holds": True}


def test_the_failure_hook_fails_the_next_check_only_even_on_a_verified_cublas(promises, monkeypatch):
    monkeypatch.setattr(_promises, "_cublaslt_version", lambda: _promises.VERIFIED_CUBLASLT[0])
    _promises.require("ktail_guard")
    assert promises.ran == []                            # verified: no check
    _promises._verdicts.clear()
    _promises._fail.add("ktail_guard")
    with pytest.raises(cygemm.CygemmError, match="end of K"):
        _promises.require("ktail_guard")
    assert promises.ran == ["ktail_guard"] and not _promises._fail
    _promises._verdicts.clear()                          # (a new process)
    _promises.require("ktail_guard")                     # verified again, the hook spent
    assert promises.ran == ["ktail_guard"]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_the_detector_gives_exactly_two_and_one_where_the_end_of_k_is_dropped(dtype):
    m, n, k = 5, 3, 1000
    a, b = _promises.detector(np, dtype, m, n, k)
    assert a.shape == (m, k) and b.shape == (k, n) and a.dtype == np.dtype(dtype)
    assert (a @ b == 2).all()
    assert (a[:, :-8] @ b[:-8] == 1).all()              # a kernel that never adds K's tail
    assert (a[:, 8:] @ b[8:] == 1).all()                # or its head


def test_the_checks_half_types_are_float16_then_bfloat16():
    """_check_batch_invariant takes the half types but the first as its bf16 ("[1:]")."""
    names = [np.dtype(d).name for d in _promises.half_dtypes(np)]
    assert names[0] == "float16"
    pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes")
    assert names == ["float16", "bfloat16"]


# ---------------------------------------------------------------- on the GPU

@pytest.mark.gpu
def test_a_check_runs_on_its_own_stream_in_relaxed_mode_and_gives_the_mode_back():
    import cupy as cp
    from cygemm.engine.streams import exchange_capture_mode
    M, K, N = 64, 96, 48
    A, B = rand(cp, (M, K)), rand(cp, (K, N))
    caller = cp.cuda.Stream(non_blocking=True)
    seen = {}

    def check():
        seen["stream"] = cp.cuda.get_current_stream().ptr
        mode = exchange_capture_mode(2)
        exchange_capture_mode(mode)
        seen["mode"] = mode
        C = poisoned(cp, (M, N))
        cygemm.gemm(A, B, C, math="fp32")           # on the check's stream (the current one)
        seen["C"] = C
        return True

    def failing():
        raise RuntimeError("the check failed to run")

    cp.cuda.Device().synchronize()
    old = exchange_capture_mode(1)                  # thread_local: the check must put it back
    try:
        with caller:
            assert _promises._on_a_side_stream(check) is True
            with pytest.raises(RuntimeError, match="failed to run"):
                _promises._on_a_side_stream(failing)
        back = exchange_capture_mode(1)
    finally:
        exchange_capture_mode(old)
    assert seen["mode"] == 2, "the check did not run in relaxed capture mode"
    assert seen["stream"] not in (caller.ptr, 0), "the check ran on the caller's stream"
    assert back == 1, "the thread's capture mode was not given back"
    # _on_a_side_stream synchronized the check's stream before returning.
    assert rel_err(seen["C"].get(), f64(cp, A) @ f64(cp, B)) < tol("float32", "fp32", K)


@pytest.mark.gpu
def test_a_first_use_on_an_unverified_cublas_checks_once_then_computes_right(monkeypatch):
    import cupy as cp
    from cygemm.engine import plans, tuning
    _promises._reset_for_tests()
    monkeypatch.setattr(_promises, "_cublaslt_version", lambda: UNVERIFIED)
    monkeypatch.setattr(tuning, "_lookup_promise", lambda *a: None)       # nothing kept from before
    monkeypatch.setattr(tuning, "_remember_promise", lambda *a: None)
    plans.clear_plan_cache()
    try:
        before = _promises.checks_run["batch_invariant"]
        M, K, N = 300, 256, 128
        x, w = rand(cp, (M, K)), rand(cp, (K, N))
        outs = []
        for rows in (M, 7, 1, M):
            out = poisoned(cp, (rows, N))
            cygemm.matmul(x[:rows], w, out, math="fp32", determinism="batch_invariant")
            outs.append(out)
        cp.cuda.Device().synchronize()
        assert _promises.checks_run["batch_invariant"] == before + 1
        ref = f64(cp, x) @ f64(cp, w)
        assert rel_err(outs[0].get(), ref) < tol("float32", "fp32", K)
        full = outs[0].view(cp.uint32)
        for part in outs[1:]:
            assert bool((part.view(cp.uint32) == full[:part.shape[0]]).all())
    finally:
        _promises._reset_for_tests()
        plans.clear_plan_cache()



def test_batch_invariant_by_cublas_flag_is_a_promise_of_its_own(monkeypatch):
    """batch_invariance="cublas" on a library that takes the flag: its verdict is kept apart from
    the families' (another key), and checked even on a version the families were measured on."""
    from cygemm.engine import lt_features
    if lt_features.feature_gate("batch_invariance") is not None:
        pytest.skip("the loaded cuBLASLt does not take the batch-invariance flag")
    _promises._reset_for_tests()
    ran, kept = [], {}
    from cygemm.engine import tuning
    from cygemm.engine import context as _context
    monkeypatch.setattr(_promises, "_CHECKS", {p: (lambda p=p: ran.append(p) or True) for p in _promises.PROMISES})
    monkeypatch.setattr(tuning, "_lookup_promise", lambda device, key: kept.get(key))
    monkeypatch.setattr(tuning, "_remember_promise", lambda device, key, record: kept.__setitem__(key, record))
    monkeypatch.setattr(_context, "current_device", lambda: 0)
    monkeypatch.setattr(_promises, "_on_a_side_stream", lambda check: check())
    monkeypatch.setattr(_promises, "_cublaslt_version", lambda: _promises.VERIFIED_CUBLASLT[0])
    old = cygemm.set_options(batch_invariance="cublas")
    try:
        _promises.require("batch_invariant")
        assert ran == ["batch_invariant"] and list(kept) == [("batch_invariant", "cublas")]
        cygemm.set_options(batch_invariance="families")
        _promises.require("batch_invariant")           # measured on 13.1: no check
        assert ran == ["batch_invariant"]
    finally:
        cygemm.set_options(**old)
        _promises._reset_for_tests()
