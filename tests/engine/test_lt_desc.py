"""cygemm.engine.lt_desc: a plan's cuBLASLt descriptors, and algo_hex / algo_from_hex (cdef: tested
through cygemm.GemmPlan, cygemm.gemm and the tuning table).

The descriptors: leading dimensions, the strided batch (count and offsets, gaps between the
matrices), the epilogue's aux leading dimension (GELU's Z with padded rows) and the pointers'
alignments reach cuBLASLt as given: results against float64 on seeded inputs, and the padding
and gaps of NaN-poisoned outputs left NaN (an exact check: a wrong ld or batch offset writes
there). The algorithm as text: a tuned algorithm read back from the tuning file runs the same
kernel (the same bits, tuned_ms kept); a record whose algorithm is not one (not a string, not
hex, another length, missing) is ignored and the plan runs the heuristic's choice. CPU: the
table keeps a record's algorithm as its text until a plan reads it."""
import numpy as np
import pytest

import cygemm
from cygemm.engine import plans, tuning
from gpu_util import f64, host_bits, poisoned, rand, rel_err
from tuning_util import CONFIG_SPLITK_NUM, algo_config, gpu_name, write_tuning_file
from refs import activations

ALGO_BYTES = 64                 # sizeof(cublasLtMatmulAlgo_t): uint64_t data[8] (cublasLt.h)


# ------------------------------------------------------------------ CPU

def test_a_recorded_algorithm_is_kept_as_its_text_until_a_plan_reads_it(tmp_path):
    """Reading a tuning file parses no algorithm: a record whose "algo" is no algorithm is held
    as written (a plan's algo_from_hex decides at its first use, on the GPU below)."""
    path = tmp_path / "t.jsonl"
    records = {(1, 2, 3): {"route": "cublasLt", "algo": "zz" * ALGO_BYTES, "ws": 0, "ms": 0.5},
               (1, 2, 4): {"route": "cublasLt", "algo": "00", "ws": 0, "ms": 0.5}}
    write_tuning_file(path, "Some GPU sm_90", records)
    try:
        assert tuning.load_tuning(path) == 2
        got = {tuple(e["key"]): e["algo"] for e in tuning.tuning_entries() if e["gpu"] == "Some GPU sm_90"}
        assert got == {key: r["algo"] for key, r in records.items()}
    finally:
        tuning.clear_tuning()


# ------------------------------------------------------------------ GPU

cp = None


# (the gpu fixture: tests/engine/conftest.py)


def _gemm_entries():
    return [e for e in tuning.tuning_entries() if e["kind"] == "gemm"]


@pytest.mark.gpu
@pytest.mark.parametrize("policy, dtype, M, K, N", [("run_to_run", "float16", 1024, 1024, 1024),
                                                    ("batch_invariant", "float16", 8, 1024, 768)])
def test_a_tuned_algorithm_read_back_from_the_tuning_file_runs_the_same_kernel(gpu, tmp_path, policy, dtype, M, K, N):
    """algo_hex then algo_from_hex: the record is the algorithm's 64 bytes in hex; a new plan that
    reads it from a saved file takes it (tuned, the same time) and gives the first plan's bits
    (a determinism policy's kernels are split-free: their results do not vary from run to run)."""
    A, B = rand(cp, (M, K), dtype), rand(cp, (K, N), dtype)
    first, again = poisoned(cp, (M, N), dtype), poisoned(cp, (M, N), dtype)
    with cygemm.GemmPlan(A, B, first, determinism=policy) as p:
        p.autotune("exhaustive")
        assert p.tuned and p.route == "cublasLt"
        p.execute()
        tuned_ms = p.tuned_ms
    (entry,) = [e for e in _gemm_entries() if e["key"][-1] != "bucket"]
    algo = entry["algo"]
    assert isinstance(algo, str) and len(algo) == 2 * ALGO_BYTES and bytes.fromhex(algo)
    assert algo_config(algo, CONFIG_SPLITK_NUM) == 1
    path = tmp_path / "t.jsonl"
    tuning.save_tuning(path)
    tuning.clear_tuning()
    assert _gemm_entries() == []
    tuning.load_tuning(path)
    assert algo in [e.get("algo") for e in _gemm_entries()]
    with cygemm.GemmPlan(A, B, again, determinism=policy) as q:
        q.plan()
        assert q.tuned and q.route == "cublasLt" and q.tuned_ms == tuned_ms
        q.execute()
    cp.cuda.Device().synchronize()
    assert np.array_equal(host_bits(cp, again), host_bits(cp, first))
    assert rel_err(first.get(), f64(cp, A) @ f64(cp, B)) < 1e-2


NOT_AN_ALGORITHM = {
    "not hex": {"algo": "zz" * ALGO_BYTES},
    "one byte": {"algo": "00"},
    "a byte short": {"algo": "ab" * (ALGO_BYTES - 1)},
    "a byte long": {"algo": "ab" * (ALGO_BYTES + 1)},
    "a number": {"algo": 12345},
    "null": {"algo": None},
    "missing": {},
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(NOT_AN_ALGORITHM) + ["control: a cublasGemmEx record"])
def test_a_record_whose_algorithm_is_not_one_is_ignored_and_the_heuristic_runs(gpu, tmp_path, case):
    """The record sits under the plan's own key on this GPU, so a plan reads it (the control, a
    valid record there, is taken); algo_from_hex refuses each malformed one and nothing raises."""
    A, B = rand(cp, (160, 96)), rand(cp, (96, 224))
    out = poisoned(cp, (160, 224))
    with cygemm.GemmPlan(A, B, poisoned(cp, (160, 224)), math="fp32") as p:
        p.plan()
        key = p.key
    if case in NOT_AN_ALGORITHM:
        record = dict({"route": "cublasLt", "ws": 0, "ms": 0.25}, **NOT_AN_ALGORITHM[case])
    else:
        record = {"route": "cublasGemmEx", "ms": 0.25}
    write_tuning_file(tmp_path / "t.jsonl", gpu_name(cp), {key: record})
    assert tuning.load_tuning(tmp_path / "t.jsonl") == 1
    with cygemm.GemmPlan(A, B, out, math="fp32") as q:
        q.plan()
        assert q.key == key
        if case in NOT_AN_ALGORITHM:
            assert not q.tuned and q.tuned_ms == 0 and q.route == "cublasLt", case
        else:
            assert q.tuned and q.tuned_ms == 0.25 and q.route == "cublasGemmEx"
        q.execute()
        cp.cuda.Device().synchronize()
    assert rel_err(out.get(), f64(cp, A) @ f64(cp, B)) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_padded_leading_dimensions_reach_cublaslt_and_out_padding_stays_untouched(gpu, ta, tb):
    tuning.force_routes(gemm="cublasLt")
    M, K, N = 72, 56, 88
    a_buf = rand(cp, (K, M + 8) if ta else (M, K + 8))
    b_buf = rand(cp, (N, K + 16) if tb else (K, N + 16))
    c_buf = poisoned(cp, (M, N + 8))
    A = a_buf[:, :M] if ta else a_buf[:, :K]
    B = b_buf[:, :K] if tb else b_buf[:, :N]
    C = c_buf[:, :N]
    with cygemm.GemmPlan(A, B, C, trans_a=ta, trans_b=tb, math="fp32") as p:
        assert p.plan().route == "cublasLt"
        p.execute()
        cp.cuda.Device().synchronize()
    a, b = f64(cp, A), f64(cp, B)
    assert rel_err(C.get(), (a.T if ta else a) @ (b.T if tb else b)) < 1e-5
    assert bool(cp.isnan(c_buf[:, N:]).all()), "written past a row of out"


@pytest.mark.gpu
def test_a_strided_batch_with_gaps_between_matrices_is_read_and_written_where_its_strides_say(gpu):
    """Batch count and strided batch offsets: every matrix right, the rows between the output
    matrices and the padding of each row left NaN, by a GemmPlan and by gemm_strided_batched."""
    tuning.force_routes(gemm="cublasLt")
    nb, M, K, N = 3, 40, 24, 56
    a_buf = rand(cp, (nb, M + 3, K + 8))
    A = a_buf[:, :M, :K]                             # a gap of 3 rows after each matrix, rows padded
    B = rand(cp, (nb, K, N))
    ref = np.matmul(f64(cp, A), f64(cp, B))
    for how in ("GemmPlan", "gemm_strided_batched"):
        c_buf = poisoned(cp, (nb, M + 5, N + 8))
        C = c_buf[:, :M, :N]
        if how == "GemmPlan":
            with cygemm.GemmPlan(A, B, C, batched=True, math="fp32") as p:
                assert p.plan().route == "cublasLt"
                p.execute()
        else:
            cygemm.gemm_strided_batched(A, B, C, math="fp32")
        cp.cuda.Device().synchronize()
        assert rel_err(C.get(), ref) < 1e-5, how
        assert bool(cp.isnan(c_buf[:, M:, :]).all()), f"{how}: written between the batch's matrices"
        assert bool(cp.isnan(c_buf[:, :, N:]).all()), f"{how}: written past a row of out"


@pytest.mark.gpu
def test_gelu_z_with_padded_rows_is_written_at_its_own_leading_dimension(gpu):
    """The epilogue's aux leading dimension: Z with rows 8 elements longer than N (GELU_AUX's
    rule: a multiple of 8), beside a padded out; both right, neither's padding written."""
    M, K, N = 64, 96, 48
    A, B, bias = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (N,))
    z_buf, out_buf = poisoned(cp, (M, N + 8)), poisoned(cp, (M, N + 4))
    Z, out = z_buf[:, :N], out_buf[:, :N]
    with cygemm.GemmPlan(A, B, out, bias=bias, act="gelu", z_out=Z, math="fp32") as p:
        assert p.plan().route == "cublasLt"
        p.execute()
        cp.cuda.Device().synchronize()
    z = f64(cp, A) @ f64(cp, B) + f64(cp, bias)
    assert rel_err(Z.get(), z) < 1e-5
    assert rel_err(out.get(), activations.act("gelu", z)) < 1e-5
    assert bool(cp.isnan(z_buf[:, N:]).all()), "Z written past its rows: a wrong aux leading dimension"
    assert bool(cp.isnan(out_buf[:, N:]).all())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_operands_less_aligned_than_a_planned_problem_get_a_plan_of_their_own(gpu, dtype):
    """The pointers' alignments are the descriptors' preferences and part of the plan's key: the
    same shapes one element off a 16-byte boundary make a new plan, computed right (a plan made
    for aligned pointers would run kernels that need them)."""
    tuning.force_routes(gemm="cublasLt")
    M = K = N = 64
    tol = 1e-5 if dtype == "float32" else 1e-2
    A, B, C = rand(cp, (M, K), dtype), rand(cp, (K, N), dtype), poisoned(cp, (M, N), dtype)
    cygemm.gemm(A, B, C, math="fp32")
    assert rel_err(C.get(), f64(cp, A) @ f64(cp, B)) < tol
    n_plans = plans.plan_cache_size()
    a_buf, b_buf = rand(cp, (M * K + 1,), dtype), rand(cp, (K * N + 1,), dtype)
    c_buf = poisoned(cp, (M * N + 2,), dtype)
    Am, Bm = a_buf[1:].reshape(M, K), b_buf[1:].reshape(K, N)
    Cm = c_buf[1:-1].reshape(M, N)
    cygemm.gemm(Am, Bm, Cm, math="fp32")
    cp.cuda.Device().synchronize()
    assert plans.plan_cache_size() == n_plans + 1, "the misaligned call reused the aligned call's plan"
    assert rel_err(Cm.get(), f64(cp, Am) @ f64(cp, Bm)) < tol
    assert bool(cp.isnan(c_buf[0])) and bool(cp.isnan(c_buf[-1]))
