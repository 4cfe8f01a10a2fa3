"""cygemm.engine.candidates: timing a plan's candidates within the budget, and the tuning table's
records of the choice (made by record_of, applied by apply_record where they still fit).

Its code is cdef: tested through cygemm.GemmPlan (.plan() reads the table, .autotune() times)
and records put in the tuning table through a tuning file under the plan's own key. CPU:
autotune refuses a mode that times nothing before any GPU work. GPU: a cublasGemmEx record is
taken by a plain plan and refused under run_to_run (cublasGemmEx picks its kernel by size); a
record of a kernel that splits K is taken by a plain plan and refused under run_to_run (not of
the family: its bits would differ); timing a batched plan that reads C writes a scratch output,
leaving C and the gaps between its matrices bit for bit as they were; an exhaustively tuned plan
runs no slower than either default it was timed against. (The FP8 check of a timed choice is in
engine/test_tuning.py, the batch-invariant bucket records in engine/test_families.py.)"""
import ctypes

import numpy as np
import pytest

import cygemm
from cygemm.engine import tuning
from fakes import BASE, FakeDeviceArray
from gpu_util import f64, host_bits, poisoned, rand, rel_err
from tuning_util import (CONFIG_REDUCTION_SCHEME, CONFIG_SPLITK_NUM, algo_config, cublaslt, gpu_name,
                         write_tuning_file)

REDUCTION_INPLACE = 1           # cublasLtReductionScheme_t: split-K partial sums added in the output


def _with_config(text, **attrs):
    """The algorithm `text` (hex) with int32 configuration attributes set, as hex."""
    raw = bytes.fromhex(text)
    algo = ctypes.create_string_buffer(raw, len(raw))
    for attr, v in attrs.items():
        value = ctypes.c_int32(v)
        assert cublaslt().cublasLtMatmulAlgoConfigSetAttribute(algo, {"splitk": CONFIG_SPLITK_NUM,
                                                                       "reduction": CONFIG_REDUCTION_SCHEME}[attr],
                                                                ctypes.byref(value), ctypes.sizeof(value)) == 0
    return algo.raw[:len(raw)].hex()


# ------------------------------------------------------------------ CPU

@pytest.mark.parametrize("mode", ["off", "sometimes", None])
def test_autotune_refuses_a_mode_that_times_nothing_before_any_gpu_work(mode):
    a = FakeDeviceArray((4, 6))
    b = FakeDeviceArray((6, 5), ptr=BASE + 4096)
    out = FakeDeviceArray((4, 5), ptr=BASE + 8192)
    p = cygemm.GemmPlan(a, b, out, math="fp32")          # fake arrays: no GPU needed to make it
    with pytest.raises(ValueError, match=rf"^mode: expected 'auto' or 'exhaustive', got {mode!r}$"):
        p.autotune(mode=mode)
    assert not p.tuned and p.tuned_ms == 0 and p.route is None
    p.close()


# ------------------------------------------------------------------ GPU

cp = None


# (the gpu fixture: tests/engine/conftest.py)


def _load_records(path, records):
    """Put {key: record} (kind "gemm", this GPU) in the tuning table through a tuning file."""
    write_tuning_file(path, gpu_name(cp), records)
    assert tuning.load_tuning(path) == len(records)


def _record(entry):
    """A tuning entry's record alone (tuning_entries adds gpu, kind and key)."""
    return {k: v for k, v in entry.items() if k not in ("gpu", "kind", "key")}


@pytest.mark.gpu
def test_a_cublasgemmex_record_is_taken_by_a_plain_plan_and_refused_under_run_to_run(gpu, tmp_path):
    A, B = rand(cp, (256, 192)), rand(cp, (192, 320))
    ref = f64(cp, A) @ f64(cp, B)
    plain = cygemm.GemmPlan(A, B, poisoned(cp, (256, 320)), math="fp32").plan()
    rr_out = poisoned(cp, (256, 320))
    rr = cygemm.GemmPlan(A, B, rr_out, math="fp32", determinism="run_to_run").plan()
    assert rr.route == "cublasLt" and not rr.tuned
    rr.execute()
    cp.cuda.Device().synchronize()
    assert plain.key != rr.key, "a policy's choices must be kept apart from the fastest kernel's"
    _load_records(tmp_path / "t.jsonl", {key: {"route": "cublasGemmEx", "ms": 0.125} for key in (plain.key, rr.key)})
    out = poisoned(cp, (256, 320))
    with cygemm.GemmPlan(A, B, out, math="fp32") as p:
        assert p.plan().route == "cublasGemmEx" and p.tuned and p.tuned_ms == 0.125
        p.execute()
        cp.cuda.Device().synchronize()
    assert rel_err(out.get(), ref) < 1e-5
    out = poisoned(cp, (256, 320))
    with cygemm.GemmPlan(A, B, out, math="fp32", determinism="run_to_run") as q:
        assert q.plan().route == "cublasLt" and not q.tuned and q.tuned_ms == 0
        q.execute()
        cp.cuda.Device().synchronize()
    assert np.array_equal(host_bits(cp, out), host_bits(cp, rr_out)), "run_to_run's bits changed with the tuning table"
    assert rel_err(out.get(), ref) < 1e-5
    plain.close()
    rr.close()


@pytest.mark.gpu
@pytest.mark.parametrize("policy, M", [("run_to_run", 1024), ("batch_invariant", 64)])
def test_a_record_of_a_kernel_that_splits_k_is_refused_under_a_policy_but_taken_without_one(gpu, tmp_path,
                                                                                            policy, M):
    """The policy plan's tuned record, made to split K in two (cuBLASLt's own attribute setter),
    is put under the policy's key and under the plain key of the same problem: the plain plan
    takes it (it fits the problem), the policy's does not (not a kernel of its family: other
    bits) and gives the bits it gave before."""
    K, N = 1024, 1024
    A, B = rand(cp, (M, K), "float16"), rand(cp, (K, N), "float16")
    ref = f64(cp, A) @ f64(cp, B)
    kept = poisoned(cp, (M, N), "float16")
    # On a cuBLASLt the promise was not measured on, its first-use check runs GEMMs of its own:
    # settled first, so that the table below holds this test's entries alone.
    if policy == "batch_invariant":
        from cygemm.engine import promises
        promises.holds("batch_invariant")
    tuning.clear_tuning()
    with cygemm.GemmPlan(A, B, kept, determinism=policy) as pp:
        pp.autotune("exhaustive")
        assert pp.tuned and pp.route == "cublasLt"
        pp.execute()
        policy_key = pp.key
    with cygemm.GemmPlan(A, B, poisoned(cp, (M, N), "float16")) as plain:
        plain.plan()
        plain_key = plain.key
    (entry,) = [e for e in tuning.tuning_entries() if e["kind"] == "gemm" and e["key"][-1] != "bucket"]
    assert algo_config(entry["algo"], CONFIG_SPLITK_NUM) == 1
    split = dict(_record(entry), algo=_with_config(entry["algo"], splitk=2, reduction=REDUCTION_INPLACE))
    assert algo_config(split["algo"], CONFIG_SPLITK_NUM) == 2
    tuning.clear_tuning()
    _load_records(tmp_path / "t.jsonl", {policy_key: split, plain_key: split})
    out = poisoned(cp, (M, N), "float16")
    with cygemm.GemmPlan(A, B, out) as p:
        p.plan()
        assert p.tuned and p.route == "cublasLt", "the split kernel does not fit the problem: nothing is shown"
        p.execute()
        cp.cuda.Device().synchronize()
    assert rel_err(out.get(), ref) < 1e-2
    out = poisoned(cp, (M, N), "float16")
    with cygemm.GemmPlan(A, B, out, determinism=policy) as q:
        q.plan()
        assert not q.tuned and q.route == "cublasLt"
        q.execute()
        cp.cuda.Device().synchronize()
    assert np.array_equal(host_bits(cp, out), host_bits(cp, kept)), "the policy's bits changed with the tuning table"


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["auto", "exhaustive"])
def test_timing_a_batched_plan_that_reads_c_leaves_c_and_its_gaps_untouched(gpu, mode):
    """beta != 0: the timed runs write a scratch output as long as the whole batch (gaps between
    the matrices included); C is bit for bit what it was, then execute accumulates into it."""
    nb, M, K, N = 4, 96, 64, 80
    A, B = rand(cp, (nb, M, K)), rand(cp, (nb, K, N))
    c_buf = rand(cp, (nb, M + 3, N))
    C = c_buf[:, :M, :]                          # three rows between the matrices
    before = c_buf.copy()
    with cygemm.GemmPlan(A, B, C, alpha=0.5, beta=-1.5, math="fp32", batched=True) as p:
        p.autotune(mode)
        cp.cuda.Device().synchronize()
        assert p.tuned
        assert np.array_equal(host_bits(cp, c_buf), host_bits(cp, before)), "timing wrote into C"
        p.execute()
        cp.cuda.Device().synchronize()
    want = 0.5 * np.matmul(f64(cp, A), f64(cp, B)) - 1.5 * f64(cp, before[:, :M, :])
    assert rel_err(C.get(), want) < 1e-5
    assert np.array_equal(host_bits(cp, c_buf[:, M:, :]), host_bits(cp, before[:, M:, :])), "execute wrote between matrices"


def _median_ms(run, reps=7):
    times = []
    for _ in range(reps):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


@pytest.mark.gpu
def test_an_exhaustively_tuned_plan_runs_no_slower_than_either_default(gpu):
    """The finalists include both defaults (cuBLASLt's first choice, cublasGemmEx), and one is
    left only for a candidate at least 1% faster: the tuned plan is not slower than either (here
    within 10%, timed back to back in interleaved rounds), and computes right."""
    n = 4096
    A, B = rand(cp, (n, n)), rand(cp, (n, n))
    outs = [poisoned(cp, (n, n)) for _ in range(3)]
    tuned = cygemm.GemmPlan(A, B, outs[0]).autotune("exhaustive")
    tuning.force_routes(gemm="cublasLt")
    first = cygemm.GemmPlan(A, B, outs[1]).plan()
    tuning.force_routes(gemm="cublasGemmEx")
    gemmex = cygemm.GemmPlan(A, B, outs[2]).plan()
    tuning.force_routes()
    assert tuned.tuned and first.route == "cublasLt" and not first.tuned and gemmex.route == "cublasGemmEx"
    runs = {"tuned": tuned, "cuBLASLt's first": first, "cublasGemmEx": gemmex}
    for p in runs.values():
        p.execute()                                 # kernels loaded
    times = {name: [] for name in runs}
    for _ in range(5):
        for name, p in runs.items():
            times[name].append(_median_ms(p.execute))
    ms = {name: min(t) for name, t in times.items()}
    print(f"ms per run: {ms} (tuned_ms {tuned.tuned_ms:.3f}, route {tuned.route})")
    assert ms["tuned"] <= 1.1 * min(ms["cuBLASLt's first"], ms["cublasGemmEx"]), ms
    cp.cuda.Device().synchronize()
    ref = f64(cp, A[:64]) @ f64(cp, B)
    for out in outs:
        assert rel_err(out[:64].get(), ref) < 2e-3 * (n / 256) ** 0.5       # TF32
    for p in runs.values():
        p.close()
