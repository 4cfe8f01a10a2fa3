"""CPU: the benchmark report's comparisons (cygemm vs the best other contender, and the
list of cases where cygemm is slower) from a small synthetic bench.json."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import report  # noqa: E402


def row(section, case, contender, metric, value, **kw):
    return dict(section=section, case=case, contender=contender, metric=metric, value=value, lo=value, hi=value, **kw)


ROWS = [
    row("host", "64^3 host us/call", "C++ cublasGemmEx", "host_us", 10.0, floor=True),
    row("host", "64^3 host us/call", "C++ cublasLtMatmul RELU_BIAS", "host_us", 9.0, floor=True),
    row("host", "64^3 host us/call", "cygemm.gemm (stream=int)", "host_us", 12.0),
    row("host", "64^3 host us/call", "cygemm forward_into relu+bias", "host_us", 11.0),
    row("host", "64^3 host us/call", "cp.matmul(out=)", "host_us", 20.0),
    row("square", "square 256^3 tf32", "cygemm.gemm", "gpu_ms", 0.010, tflops=3.4, prec="tf32",
        group="square tf32", size=[256, 256, 256]),
    row("square", "square 256^3 tf32", "torch.mm", "gpu_ms", 0.008, tflops=4.2, prec="tf32",
        group="square tf32", size=[256, 256, 256]),
    row("square", "square 256^3 tf32", "C++ cublasGemmEx", "gpu_ms", 0.0101, floor=True, tflops=3.3, prec="tf32",
        group="square tf32", size=[256, 256, 256]),
    dict(section="square", case="square 256^3 bf16", contender="cp.matmul", metric="skipped", value=None,
         reason="CuPy has no bfloat16"),
    row("ceilings", "measured copy bandwidth", "device-to-device copy (read+write)", "gbps", 4000.0),
]


def test_report_compares_like_with_like_and_lists_slower_cases(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps({"environment": {"gpu": "TestGPU", "date": "d"}, "rows": ROWS}))
    comps = {c["case"]: c for c in report.comparisons(ROWS)}
    # Host rows are compared per API: the GEMM against cp.matmul and cublasGemmEx only.
    gemm = comps["64^3 host us/call: GEMM"]
    assert gemm["ours"]["contender"] == "cygemm.gemm (stream=int)"
    assert gemm["other"]["contender"] == "cp.matmul(out=)" and abs(gemm["ratio"] - 20 / 12) < 1e-12
    assert gemm["floor"]["contender"] == "C++ cublasGemmEx"
    fwd = comps["64^3 host us/call: relu+bias forward"]
    assert fwd["floor"]["contender"] == "C++ cublasLtMatmul RELU_BIAS" and "other" not in fwd
    sq = comps["square 256^3 tf32"]
    assert sq["other"]["contender"] == "torch.mm" and sq["ratio"] < 1
    md = open(report.write(str(tmp_path))).read()
    slower = md.split("## Where cygemm is slower")[1].split("## Ceilings")[0]
    assert "square 256^3 tf32 | 0.01 | torch.mm" in slower
    assert "GEMM | 12 | C++ cublasGemmEx: 10 | 20.0%" in slower
    assert "C++ cublasGemmEx: 0.0101" not in slower          # cygemm is faster than that floor
    assert "skipped: CuPy has no bfloat16" in md
    assert "| tf32 matrix rate, TFLOP/s | 494.7 | 4 (1%) | torch.mm" in md


def test_report_marks_winners_rounds_to_three_digits_and_writes_the_docs_page(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps({"environment": {"gpu": "TestGPU", "date": "d"}, "rows": ROWS}))
    md = open(report.write(str(tmp_path))).read()
    summary = md.split("## Summary")[1].split("## Where")[0]
    assert "| **12 µs** | cp.matmul(out=): 20 | 1.67× |" in summary          # cygemm wins: in bold
    assert "| 0.01 ms | torch.mm: **0.008** | 0.80× |" in summary            # torch wins: in bold
    square = md.split("## square")[1]
    assert "| square 256^3 tf32 | torch.mm | **0.008** |" in square and "| cygemm.gemm | 0.01 |" in square
    rst = report.md_to_rst(md, "../results")
    assert ".. list-table::" in rst and "   * - case" in rst and "Summary: cygemm against the best other contender\n---" in rst
    assert "|" not in "".join(l for l in rst.splitlines() if l.startswith("   * -") or l.startswith("     -"))


def test_the_routes_table_lists_timed_choices_beside_promise_verdicts_and_buckets():
    """The tuning table at the end of a run also holds promise verdicts and remembered buckets
    (keys of strings): they are left out, not compared with the problems' keys of ints."""
    gemm_key = ["CUDA_R_16BF", "COMPUTE_32F", 1, 0, 0, 64, 64, 64, 0, 0, 0, 0, 1]
    entries = [{"kind": "gemm", "key": gemm_key, "route": "cublasLt", "ms": 0.01},
               {"kind": "promise", "key": ["batch_invariant"], "holds": True},
               {"kind": "gemm", "key": gemm_key[:5] + ["bucket"], "route": "cublasLt"}]
    lines = report.routes_table(entries)
    rows = [line for line in lines if line.startswith("| gemm")]
    assert len(rows) == 1 and "64x64x64" in rows[0]


def test_compare_builds_reports_each_calls_new_over_old_ratio_per_round_with_its_range():
    from benchmarks.compare_builds import _paired_ratios
    times = {"gemm new": [10.0, 12.0, 11.0], "gemm old": [10.0, 10.0, 10.0], "gemm same": [10.0, 12.0, 11.0],
             "cp.matmul": [20.0, 21.0, 19.0]}
    assert _paired_ratios(times, ["old"]) == {"gemm new/old": {"median": 1.1, "min": 1.0, "max": 1.2}}
    assert _paired_ratios(times, ["old", "same"])["gemm new/same"] == {"median": 1.0, "min": 1.0, "max": 1.0}
