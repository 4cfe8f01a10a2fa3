"""cygemm.engine.families: the kernel families of the determinism policies, and the size buckets of
batch_invariant (cdef: tested through cygemm.GemmPlan, cygemm.gemm with determinism=, and the
tuning table's records, whose algorithms cuBLASLt's own getter reads).

GPU: every algorithm a batch_invariant plan chooses or its bucket keeps, at sizes from one row
to 4096, is a split-free kernel of one cuBLASLt algorithm; each member a bucket keeps, run in
turn through the tuning table, gives the rows bitwise, those of every other size too; the rows
are bitwise those of the full result for M on both sides of every power-of-two bucket boundary,
with a linear layer's (N, K) weight; the columns do not depend on N either; sizes share the
bucket their M and N round up to (K kept, leading dimensions not part of it); run_to_run gives
the same bits untuned and exhaustively tuned, a deep-K problem included. CPU: GemmPlan checks
determinism= when made. (tests/properties/test_determinism.py holds the promise for every entry
point and dtype, across processes, threads and graphs.)"""
import numpy as np
import pytest

import cygemm
from cygemm.engine import plans, tuning
from fakes import BASE, FakeDeviceArray
from gpu_util import f64, host_bits, poisoned, rand, rel_err, tol
from tuning_util import CONFIG_ID, CONFIG_SPLITK_NUM, algo_config, gpu_name, write_tuning_file


# ------------------------------------------------------------------ CPU

def test_gemm_plan_checks_determinism_when_made_before_any_gpu_work():
    a = FakeDeviceArray((4, 6))
    b = FakeDeviceArray((6, 5), ptr=BASE + 4096)
    out = FakeDeviceArray((4, 5), ptr=BASE + 8192)
    for mode in (None, "off", "run_to_run", "batch_invariant"):
        p = cygemm.GemmPlan(a, b, out, determinism=mode)
        assert p.route is None and not p.tuned
        p.close()
    with pytest.raises(ValueError, match=r"^determinism: expected None, 'off', 'run_to_run' or 'batch_invariant', "
                                         r"got 'bitwise'"):
        cygemm.GemmPlan(a, b, out, determinism="bitwise")


# ------------------------------------------------------------------ GPU

cp = None


@pytest.fixture
def gpu(gpu):
    """tests/engine/conftest.py's, with this thread's plans fresh too."""
    plans.clear_plan_cache()
    yield


def _gemm_entries():
    return [e for e in tuning.tuning_entries() if e["kind"] == "gemm"]


def _is_bucket(entry):
    return entry["key"][-1] == "bucket"


def _algorithms(entry):
    return entry.get("members", []) + ([entry["algo"]] if entry.get("route") == "cublasLt" and "algo" in entry else [])


def _power_of_two_at_least(x):
    b = 1
    while b < x:
        b <<= 1
    return b


def _bucket_of(key):
    """The bucket key of a plan key (a list, as tuning_entries gives it), by its definition: the
    first five fields, M and N (cuBLAS's m, n) rounded up to powers of two, K, then everything
    after the leading dimensions, and "bucket"."""
    return tuple(key[:5] + [_power_of_two_at_least(key[5]), _power_of_two_at_least(key[6]), key[7]]
                 + key[11:] + ["bucket"])


K, N = 1024, 768
CASES = [("float32", "tf32"), ("float16", "tf32")]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", CASES)
def test_batch_invariant_choices_at_every_size_are_split_free_kernels_of_one_algorithm(gpu, dtype, math):
    """The family is chosen at 4096 x 4096, whatever this M: every algorithm a timed plan chose
    and every member its bucket kept, for M from 1 to 4096, has one CONFIG_ID and SPLITK_NUM 1."""
    x, w = rand(cp, (4096, K), dtype), rand(cp, (K, N), dtype)
    full = poisoned(cp, (4096, N), dtype)
    sizes = (1, 3, 8, 100, 1000, 4096)
    outs = {}
    for m in sizes:
        outs[m] = full if m == 4096 else poisoned(cp, (m, N), dtype)
        with cygemm.GemmPlan(x[:m], w, outs[m], math=math, determinism="batch_invariant") as p:
            p.autotune()
            assert p.route == "cublasLt"
            p.execute()
    cp.cuda.Device().synchronize()
    assert rel_err(full.get(), f64(cp, x) @ f64(cp, w)) < tol(dtype, math, K)
    for m in sizes:
        assert np.array_equal(host_bits(cp, outs[m]), host_bits(cp, full[:m])), f"rows of M={m} differ from M=4096's"
    algorithms = {a for e in _gemm_entries() for a in _algorithms(e)}
    assert len({tuple(e["key"][5:7]) for e in _gemm_entries() if not _is_bucket(e)}) >= 2, _gemm_entries()
    configs = {(algo_config(a, CONFIG_ID), algo_config(a, CONFIG_SPLITK_NUM)) for a in algorithms}
    assert len(algorithms) >= 2 and len({c[0] for c in configs}) == 1, configs
    assert {c[1] for c in configs} == {1}, configs


@pytest.mark.gpu
def test_each_member_a_bucket_keeps_gives_the_same_rows(gpu, tmp_path):
    """M = 8 (few rows: the family's small and retiled tiles are its candidates) is timed and its
    bucket keeps its fastest members. Each member in turn, put in the tuning table as the plan's
    choice, runs (tuned), and gives the untuned plan's bits, which are the rows of M = 4096."""
    x, w = rand(cp, (4096, K), "float16"), rand(cp, (K, N), "float16")
    full = cygemm.gemm(x, w, determinism="batch_invariant")
    untuned = poisoned(cp, (8, N), "float16")
    with cygemm.GemmPlan(x[:8], w, untuned, determinism="batch_invariant") as p:
        p.plan()
        assert not p.tuned
        p.execute()
        p.autotune()                        # timed: the plan's record and its bucket's
        key = p.key
    cp.cuda.Device().synchronize()
    assert np.array_equal(host_bits(cp, untuned), host_bits(cp, full[:8]))
    (bucket,) = [e for e in _gemm_entries() if tuple(e["key"]) == _bucket_of(list(key))]
    members = bucket["members"]
    assert 1 <= len(members) <= 4 and len(set(members)) == len(members), members
    for i, algo in enumerate(members):
        path = tmp_path / f"member{i}.jsonl"
        write_tuning_file(path, gpu_name(cp), {tuple(key): {"route": "cublasLt", "algo": algo, "ws": 0, "ms": 0.5 + i}})
        assert tuning.load_tuning(path) == 1
        out = poisoned(cp, (8, N), "float16")
        with cygemm.GemmPlan(x[:8], w, out, determinism="batch_invariant") as q:
            q.plan()
            assert q.tuned and q.tuned_ms == 0.5 + i, f"member {i} was not taken"
            q.execute()
        cp.cuda.Device().synchronize()
        assert np.array_equal(host_bits(cp, out), host_bits(cp, untuned)), f"member {i} of the bucket gave other bits"


BOUNDARIES = [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512, 513, 1024, 1025, 2048]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", CASES)
def test_rows_are_bitwise_the_same_on_both_sides_of_every_bucket_boundary(gpu, dtype, math):
    """cygemm.gemm with a linear layer's (N, K) weight (trans_b): M on both sides of each power
    of two lies in two buckets, each timed on its own members; every result is the first M rows
    of M = 2048's, which is right against float64."""
    x, wt = rand(cp, (2048, K), dtype), rand(cp, (N, K), dtype)
    full = poisoned(cp, (2048, N), dtype)
    cygemm.gemm(x, wt, full, trans_b=True, math=math, determinism="batch_invariant")
    cp.cuda.Device().synchronize()
    assert rel_err(full.get(), f64(cp, x) @ f64(cp, wt).T) < tol(dtype, math, K)
    for m in BOUNDARIES:
        out = poisoned(cp, (m, N), dtype)
        cygemm.gemm(x[:m], wt, out, trans_b=True, math=math, determinism="batch_invariant")
        assert np.array_equal(host_bits(cp, out), host_bits(cp, full[:m])), f"rows of M={m} differ from M=2048's"
    buckets = {tuple(e["key"][5:7]) for e in _gemm_entries() if _is_bucket(e)}
    assert len(buckets) >= 8, buckets                   # the sizes were timed in buckets of their own


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", CASES)
def test_columns_are_bitwise_the_same_whatever_the_number_of_columns(gpu, dtype, math):
    """The family is chosen at 4096 x 4096 for N as for M: column j of x @ w[:, :n] is column j of
    x @ w, bit for bit, for n in different buckets."""
    x, w = rand(cp, (512, K), dtype), rand(cp, (K, 1024), dtype)
    full = cygemm.gemm(x, w, math=math, determinism="batch_invariant")
    cp.cuda.Device().synchronize()
    assert rel_err(full.get(), f64(cp, x) @ f64(cp, w)) < tol(dtype, math, K)
    for n in (8, 64, 128, 520, 1000):
        part = cygemm.gemm(x, cp.ascontiguousarray(w[:, :n]), math=math, determinism="batch_invariant")
        assert np.array_equal(host_bits(cp, part), host_bits(cp, full[:, :n])), f"columns of N={n} differ from N=1024's"


@pytest.mark.gpu
def test_sizes_share_the_bucket_their_m_and_n_round_up_to(gpu):
    """The bucket key is the plan's key with M and N rounded up to powers of two, K kept and no
    leading dimensions: M = 100 and 120 (and 100 with padded rows) share one, M = 129 has another."""
    x, w = rand(cp, (256, K), "float16"), rand(cp, (K, N), "float16")
    padded = poisoned(cp, (100, K + 64), "float16")[:, :K]
    padded[...] = x[:100]

    def run(a):
        out = poisoned(cp, (a.shape[0], N), "float16")
        cygemm.gemm(a, w, out, determinism="batch_invariant")
        return out

    got = {m: run(x[:m]) for m in (100, 120, 129)}
    run(padded)
    entries = _gemm_entries()
    plan_keys = [e["key"] for e in entries if not _is_bucket(e)]
    bucket_keys = {tuple(e["key"]) for e in entries if _is_bucket(e)}
    assert plan_keys and {_bucket_of(k) for k in plan_keys} <= bucket_keys, (plan_keys, bucket_keys)
    assert len(bucket_keys) == 2, bucket_keys           # {100, 120, padded 100}: one; 129: another
    b1, b2 = sorted(bucket_keys)
    differ = [i for i in range(len(b1)) if b1[i] != b2[i]]
    assert len(differ) == 1 and differ[0] in (5, 6), (b1, b2)       # M's side alone (cuBLAS m or n)
    assert {b1[differ[0]], b2[differ[0]]} == {128, 256}
    assert b1[11 - differ[0]] == _power_of_two_at_least(N) and b1[7] == K     # N's side rounded, K kept
    cp.cuda.Device().synchronize()
    assert np.array_equal(host_bits(cp, got[100]), host_bits(cp, got[120][:100])) and np.array_equal(
        host_bits(cp, got[120]), host_bits(cp, got[129][:120]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, M, Kd, Nd, math", [("float16", 1024, 1024, 1024, "tf32"),
                                                   ("float32", 512, 384, 640, "tf32"),
                                                   ("float32", 64, 16384, 64, "fp32")])
def test_run_to_run_gives_the_same_bits_untuned_and_exhaustively_tuned(gpu, dtype, M, Kd, Nd, math):
    """Whatever kernel of the family timing picks (or, where the heuristic's first splits K, that
    kernel alone), the bits are those of the heuristic's own first choice; right against float64."""
    A, B = rand(cp, (M, Kd), dtype), rand(cp, (Kd, Nd), dtype)
    untuned, tuned = poisoned(cp, (M, Nd), dtype), poisoned(cp, (M, Nd), dtype)
    with cygemm.GemmPlan(A, B, untuned, math=math, determinism="run_to_run") as p:
        assert p.plan().route == "cublasLt"
        p.execute()
    with cygemm.GemmPlan(A, B, tuned, math=math, determinism="run_to_run") as q:
        q.autotune("exhaustive")
        assert q.route == "cublasLt"
        q.execute()
        print(f"{dtype} {M}x{Kd}x{Nd}: tuned {q.tuned}")
    cp.cuda.Device().synchronize()
    assert np.array_equal(host_bits(cp, tuned), host_bits(cp, untuned))
    assert rel_err(untuned.get(), f64(cp, A) @ f64(cp, B)) < tol(dtype, math, Kd)
    for e in _gemm_entries():
        if e.get("route") == "cublasLt":
            assert algo_config(e["algo"], CONFIG_SPLITK_NUM) == 1, e


# ------------------------------------------------------------------ cuBLASLt's own batch invariance

@pytest.mark.parametrize("lds,als,itemsize,flags", [
    ((1024, 768, 768), (256, 256, 256), 2, 0x4),       # every row and start on 16 bytes: ALIGN_16B
    ((1024, 768, 764), (256, 256, 256), 2, 0x3),       # C's rows 1528 bytes apart: 8
    ((1024, 768, 768), (256, 4, 256), 4, 0x2),         # B starts on 4 bytes
    ((1023, 768, 768), (256, 256, 256), 2, 0x1),       # A's rows 2046 bytes apart: 2
    ((1023, 768, 768), (256, 256, 256), 1, -1),        # 1-byte rows at odd strides: none
])
def test_the_alignment_class_is_the_largest_that_every_pointer_and_row_keeps(lds, als, itemsize, flags):
    from cygemm.engine.families import _alignment_class_of
    assert _alignment_class_of(*lds, *als, itemsize) == flags


def test_describe_names_cublas_own_invariance_where_the_option_asks_and_the_library_takes_it():
    from cygemm.engine import lt_features
    a, b = FakeDeviceArray((64, 32), ptr=BASE), FakeDeviceArray((32, 16), ptr=BASE + 0x10000)
    old = cygemm.set_options(determinism="batch_invariant", batch_invariance="cublas")
    try:
        took = lt_features.feature_gate("batch_invariance") is None
        kernels = cygemm.describe_gemm(a, b)["kernels"]
        assert ("CUBLASLT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS" in kernels) == took, kernels
        with lt_features._pretend(batch_invariance=False):
            assert "split-free kernels" in cygemm.describe_gemm(a, b)["kernels"]
    finally:
        cygemm.set_options(**old)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", CASES + [("bfloat16", "tf32")])
def test_cublas_own_batch_invariance_gives_each_row_the_same_bits_at_every_m(gpu, dtype, math):
    """batch_invariance="cublas" (cuBLASLt 13.10's flag): the rows of M = 1 .. 2048 are bitwise
    the first rows of M = 2048's, which is right against float64; or, where cuBLASLt offers no
    algorithm under the flag (13.10 on the H100 and H200 offered none for any problem probed:
    benchmarks/batch_invariance_probe.py), a refusal that says so and writes nothing."""
    from cygemm.engine import lt_features
    why = lt_features.feature_gate("batch_invariance")
    if why:
        pytest.skip(why)
    old = cygemm.set_options(batch_invariance="cublas")
    try:
        x, wt = rand(cp, (2048, K), dtype), rand(cp, (N, K), dtype)
        full = poisoned(cp, (2048, N), dtype)
        try:
            cygemm.gemm(x, wt, full, trans_b=True, math=math, determinism="batch_invariant")
        except cygemm.CygemmError as e:
            assert "batch_invariant" in str(e) and "cuBLASLt" in str(e), e
            cp.cuda.Device().synchronize()
            assert bool(cp.isnan(full).all()), "a refused call wrote its output"
            return
        cp.cuda.Device().synchronize()
        assert rel_err(full.get(), f64(cp, x) @ f64(cp, wt).T) < tol(dtype, math, K)
        for m in BOUNDARIES + [7, 300, 1000]:
            out = poisoned(cp, (m, N), dtype)
            cygemm.gemm(x[:m], wt, out, trans_b=True, math=math, determinism="batch_invariant")
            assert np.array_equal(host_bits(cp, out), host_bits(cp, full[:m])), f"rows of M={m} differ from M=2048's"
    finally:
        cygemm.set_options(**old)
