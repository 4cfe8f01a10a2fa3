"""cygemm.engine.tuning: timing candidates and single flight.

CPU: SingleFlight, the one pure-Python class (what the tuning table's claims rest on), with
threads and events, every wait bounded so that a bug fails instead of hanging: a waiter blocks
exactly while another thread owns its key and then sees the owner's result; a nested claim by
the owner returns False and keeps the claim; an owner that fails wakes its waiters and one of
them takes over; release by a thread that does not own the key raises and leaves the claim as it
was; a settled key claims nothing; keys are compared by value and different keys never wait for
each other. (engine/test_tuning.py has the first-call scenarios on SingleFlight: eight threads
and one owner, a failing owner, a nested claim; these check the contract piece by piece.)

GPU, through GemmPlan.autotune and cygemm.gemm (time_choices is cdef): each tuning mode
("cold": L2 flushed, "hot", "sustained": calls back to back) reports one run's time; "auto"
stays within its budget, max(50 ms, 25 runs), where "exhaustive" does not; a problem is timed
from exactly autotune_min_macs multiply-adds (batches counted); a new problem met in a capture is
not timed there but at its first eager call."""
import threading
import time

import numpy as np
import pytest

import cygemm
from cygemm.engine import tuning
from cygemm.engine.tuning import SingleFlight
from gpu_util import f64, poisoned, rand, rel_err

WAIT = 10.0         # the longest any step may take before the test calls it a deadlock
BLOCKED = 0.3       # how long a blocked claim is watched to stay blocked


def _start(target, *args):
    """Run target(*args) in a daemon thread (one left hanging by a bug cannot hold up the suite):
    (done, box): done is set when it returns; box then holds "result" or "error"."""
    done, box = threading.Event(), {}

    def run():
        try:
            box["result"] = target(*args)
        except BaseException as exc:        # the test reads it from box
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, box


def _claim_and_release(flights, key, settled):
    """A thread's whole first call: claim, and if it owns the key, release it at once."""
    owned = flights.claim(key, settled)
    if owned:
        flights.release(key)
    return owned


def _result(done, box):
    assert done.wait(WAIT), "a claim is still waiting: deadlock"
    if "error" in box:
        raise box["error"]
    return box["result"]


# ------------------------------------------------------------------ CPU: SingleFlight

def test_a_waiter_blocks_while_the_key_is_owned_and_then_sees_the_owners_result():
    flights, result = SingleFlight(), []
    key = ("gemm", 7, (1, 2))
    assert flights.claim(key, lambda: bool(result)) is True
    same_key = tuple(["gemm", 7, (1, 2)])      # equal, not the same object: the same key
    done, box = _start(flights.claim, same_key, lambda: bool(result))
    assert not done.wait(BLOCKED), "a claim of an owned key returned before the owner's release"
    result.append("the owner's choice")
    flights.release(key)
    assert _result(done, box) is False          # settled: the waiter uses the result
    # Nothing is left claimed: with no result, the next claim owns the key at once.
    result.clear()
    assert _result(*_start(_claim_and_release, flights, key, lambda: False)) is True


def test_a_nested_claim_by_the_owner_returns_false_and_keeps_the_claim():
    flights = SingleFlight()
    nested_done, let_go = threading.Event(), threading.Event()

    def owner():
        assert flights.claim("k", lambda: False) is True
        nested = [flights.claim("k", lambda: False) for _ in range(2)]     # no deadlock on itself
        nested_done.set()
        assert let_go.wait(WAIT)
        flights.release("k")                                # one release ends it
        return nested

    owner_done, owner_box = _start(owner)
    assert nested_done.wait(WAIT), "a nested claim by the owner waits for itself: deadlock"
    done, box = _start(_claim_and_release, flights, "k", lambda: False)
    assert not done.wait(BLOCKED), "a nested claim released the owner's claim"
    let_go.set()
    assert _result(owner_done, owner_box) == [False, False]
    assert _result(done, box) is True                       # no result was left: it owned the key
    with pytest.raises(RuntimeError, match="not claimed by this thread"):
        flights.release("k")                                # (released by that thread already)


def test_an_owner_that_fails_wakes_its_waiters_and_exactly_one_takes_over():
    flights, result, owners = SingleFlight(), [], []
    took_over, finish = threading.Event(), threading.Event()

    def first_call(i):
        if not flights.claim("shape", lambda: bool(result)):
            return ("used", list(result))
        try:
            owners.append(i)
            took_over.set()
            assert finish.wait(WAIT)
            result.append(i)
            return "timed"
        finally:
            flights.release("shape")

    assert flights.claim("shape", lambda: bool(result)) is True    # this thread: the failing owner
    waiters = [_start(first_call, i) for i in range(3)]
    assert not any(done.wait(BLOCKED) for done, _ in waiters)
    with pytest.raises(ValueError, match="timing failed"):
        try:
            raise ValueError("timing failed")
        finally:
            flights.release("shape")          # as a caller must: in a finally
    assert took_over.wait(WAIT), "no waiter woke when the failing owner released"
    time.sleep(BLOCKED)
    assert not any(done.is_set() for done, _ in waiters), "a waiter went on while the new owner works"
    assert len(owners) == 1, owners
    finish.set()
    got = [_result(done, box) for done, box in waiters]
    assert got.count("timed") == 1 and sorted(g for g in got if g != "timed") == [("used", owners)] * 2, got


def test_release_by_a_thread_that_does_not_own_the_key_raises_and_the_claim_stands():
    flights = SingleFlight()
    with pytest.raises(RuntimeError, match=r"release\('never'\): the key is not claimed by this thread"):
        flights.release("never")
    owned, let_go = threading.Event(), threading.Event()

    def owner():
        assert flights.claim("k", lambda: False)
        owned.set()
        assert let_go.wait(WAIT)
        flights.release("k")
        return "released"

    owner_done, owner_box = _start(owner)
    assert owned.wait(WAIT)
    with pytest.raises(RuntimeError, match="not claimed by this thread"):
        flights.release("k")                    # this thread does not own it
    done, box = _start(_claim_and_release, flights, "k", lambda: False)
    assert not done.wait(BLOCKED), "a failed release by another thread ended the owner's claim"
    let_go.set()
    assert _result(owner_done, owner_box) == "released"
    assert _result(done, box) is True


def test_a_settled_key_claims_nothing_and_asks_settled_each_time():
    flights, asked = SingleFlight(), []

    def settled():
        asked.append(threading.get_ident())
        return True

    assert flights.claim("k", settled) is False
    assert flights.claim("k", settled) is False
    assert len(asked) == 2
    # Nothing was claimed: another thread, finding no result, owns the key without waiting.
    done, box = _start(_claim_and_release, flights, "k", lambda: False)
    assert _result(done, box) is True


def test_an_exception_from_settled_propagates_and_leaves_the_key_unclaimed():
    flights = SingleFlight()

    def broken():
        raise KeyError("the table")

    with pytest.raises(KeyError, match="the table"):
        flights.claim("k", broken)
    assert _result(*_start(_claim_and_release, flights, "k", lambda: False)) is True


def test_owners_of_different_keys_work_at_the_same_time():
    """Four threads, four keys: each owns its key while the others own theirs (a barrier that
    all four owners must reach while holding their claims), so no key waits for another."""
    flights = SingleFlight()
    inside = threading.Barrier(4, timeout=WAIT)

    def work(key):
        assert flights.claim(key, lambda: False)
        try:
            inside.wait()                   # BrokenBarrierError if the claims were serialised
            return key
        finally:
            flights.release(key)

    keys = [("gemm", i) for i in range(4)]
    assert [_result(*w) for w in [_start(work, k) for k in keys]] == keys


def test_every_round_has_one_owner_and_every_waiter_sees_its_result():
    """50 rounds of five threads meeting one new key: one owns it and records a result before
    releasing; each of the others, whenever it arrives, gets False with the result there."""
    for round_ in range(50):
        flights, result, go = SingleFlight(), [], threading.Event()

        def first_call(i):
            assert go.wait(WAIT)
            if flights.claim(("round", round_), lambda: bool(result)):
                try:
                    result.append(i)
                    return "owner"
                finally:
                    flights.release(("round", round_))
            return ("saw", len(result))

        threads = [_start(first_call, i) for i in range(5)]
        go.set()
        got = [_result(*t) for t in threads]
        assert got.count("owner") == 1 and got.count(("saw", 1)) == 4, (round_, got)


# ------------------------------------------------------------------ GPU: timing through the plans

cp = None


# (the gpu fixture: tests/engine/conftest.py)


def _event_ms(run, reps):
    """The median time of run() over reps runs, each between CUDA events on the current stream."""
    times = []
    for _ in range(reps):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


BIG = 4096          # a strict-fp32 BIG^3 GEMM: a few milliseconds a run on Hopper, compute-bound


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cold", "hot", "sustained"])
def test_each_tuning_mode_reports_the_time_of_one_run(gpu, mode):
    """tuned_ms is one run's median time in every mode: "sustained" times several calls back to
    back and must divide by their number, "cold" flushes L2 before each run (not timed)."""
    A, B = rand(cp, (BIG, BIG)), rand(cp, (BIG, BIG))
    C = poisoned(cp, (BIG, BIG))
    old = cygemm.set_options(tuning_mode=mode)
    try:
        with cygemm.GemmPlan(A, B, C, math="fp32") as p:
            p.autotune()
            assert p.tuned and p.tuned_ms > 0
            C.fill(cp.nan)
            p.execute()
            cp.cuda.Device().synchronize()
            ref = f64(cp, A[:64]) @ f64(cp, B)
            assert rel_err(C[:64].get(), ref) < 1e-5 * (BIG / 64) ** 0.5
            one_run = _event_ms(p.execute, 15)
    finally:
        cygemm.set_options(**old)
    assert 0.6 < p.tuned_ms / one_run < 1.7, f"{mode}: tuned_ms {p.tuned_ms:.3f} ms, one run {one_run:.3f} ms"


@pytest.mark.gpu
def test_auto_timing_stays_within_its_budget_where_exhaustive_times_longer(gpu):
    """"auto": the warm-up and first round of every candidate always run, then rounds stop at the
    budget max(50 ms, 25 runs); the finalists only in what is left. "exhaustive" times every
    candidate for every round, then the finalists again (5 + 11 rounds, far past the budget)."""
    A, B = rand(cp, (BIG, BIG)), rand(cp, (BIG, BIG))
    C = poisoned(cp, (BIG, BIG))
    with cygemm.GemmPlan(A, B, C, math="fp32") as p:
        p.autotune("exhaustive")            # kernels loaded, the L2 flush buffer made: not measured
        one_run = _event_ms(p.execute, 5)
        walls = {}
        for mode in ("auto", "exhaustive"):
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            p.autotune(mode)
            walls[mode] = (time.perf_counter() - t0) * 1e3
            assert p.tuned
        C.fill(cp.nan)
        p.execute()
        cp.cuda.Device().synchronize()
    budget = max(50.0, 25 * one_run)
    # At most 9 candidates (the heuristic's 8 and cublasGemmEx): warm-up and first round, 18 runs.
    bound = 1.3 * max(budget, 18 * one_run) + 25.0
    print(f"one run {one_run:.2f} ms, budget {budget:.1f} ms; autotune wall: {walls}")
    assert walls["auto"] < bound, (walls, bound)
    assert walls["exhaustive"] > walls["auto"], walls
    assert rel_err(C[:64].get(), f64(cp, A[:64]) @ f64(cp, B)) < 1e-5 * (BIG / 64) ** 0.5


@pytest.mark.gpu
def test_a_problem_is_timed_from_exactly_autotune_min_macs_with_batches_counted(gpu):
    M, K, N = 96, 64, 80
    old = cygemm.set_options(autotune="auto", autotune_min_macs=float(M * K * N))
    try:
        cases = [((M, K), (K, N), 1), ((M - 1, K), (K, N), 0),             # one row short: not timed
                 ((M, K), (K, N + 1), 1),                                   # one column past: timed
                 ((2, M // 2, K), (2, K, N), 1), ((2, M // 2 - 1, K), (2, K, N), 0)]  # batches count
        for shape_a, shape_b, timed in cases:
            before = tuning.tuning_count()
            A, B = rand(cp, shape_a), rand(cp, shape_b)
            C = poisoned(cp, shape_a[:-1] + shape_b[-1:])
            (cygemm.gemm_strided_batched if len(shape_a) == 3 else cygemm.gemm)(A, B, C, math="fp32")
            assert rel_err(C.get(), np.matmul(f64(cp, A), f64(cp, B))) < 1e-5, (shape_a, shape_b)
            assert tuning.tuning_count() - before == timed, (shape_a, shape_b, timed)
    finally:
        cygemm.set_options(**old)


@pytest.mark.gpu
def test_a_new_problem_met_in_a_capture_is_timed_at_its_first_eager_call_not_in_the_capture(gpu):
    old = cygemm.set_options(autotune="auto", autotune_min_macs=1)
    try:
        s = cp.cuda.Stream(non_blocking=True)
        small = rand(cp, (8, 8))
        cygemm.gemm(small, small, stream=s)             # the stream's workspace, outside the capture
        A, B = rand(cp, (320, 256)), rand(cp, (256, 288))
        C = poisoned(cp, (320, 288))
        ref = f64(cp, A) @ f64(cp, B)
        cp.cuda.Device().synchronize()
        before = tuning.tuning_count()
        with cygemm.graph.capture(s) as graph:
            cygemm.gemm(A, B, C, math="fp32", stream=s)
        assert tuning.tuning_count() == before, "timed inside a capture"
        graph.launch(s)
        s.synchronize()
        assert rel_err(C.get(), ref) < 1e-5
        C.fill(cp.nan)
        cp.cuda.Device().synchronize()
        cygemm.gemm(A, B, C, math="fp32", stream=s)     # the first eager call of the problem
        s.synchronize()
        assert tuning.tuning_count() == before + 1
        assert rel_err(C.get(), ref) < 1e-5
        C.fill(cp.nan)
        cp.cuda.Device().synchronize()
        graph.launch(s)                                  # the graph still runs what it captured
        s.synchronize()
        assert rel_err(C.get(), ref) < 1e-5
    finally:
        cygemm.set_options(**old)
