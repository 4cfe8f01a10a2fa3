"""CPU: the benchmark report writes its figures from a results folder (bench.json, and the FP8
and grouped figures from hopper.json beside it); the digits example draws its curves and their
differences; the suite's progress lines number the sections without changing the rows."""
import importlib.util
import json
import os
import shutil
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import report  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def needs_matplotlib():
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the bench extra: pip install -e '.[bench]')")


def assert_png(path, max_bytes=400_000):
    assert os.path.exists(path), path
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == PNG_MAGIC, path
    assert 10_000 < len(data) <= max_bytes, (path, len(data))     # drawn, and of modest size


def row(section, case, contender, value, metric="gpu_ms", **kw):
    return dict(section=section, case=case, contender=contender, metric=metric, value=value, lo=value, hi=value, **kw)


SYNTHETIC = [
    row("host", "64^3 host us/call", "C++ cublasGemmEx", 10.0, "host_us", floor=True),
    row("host", "64^3 host us/call", "cygemm.gemm (stream=int)", 12.0, "host_us"),
    row("host", "64^3 host us/call", "cp.matmul(out=)", 20.0, "host_us"),
    row("square", "square 256^3 tf32", "cygemm.gemm", 0.010, group="square tf32", size=[256] * 3, prec="tf32"),
    row("square", "square 256^3 tf32", "torch.mm", 0.0095, group="square tf32", size=[256] * 3, prec="tf32"),
    row("square", "square 512^3 tf32", "cygemm.gemm", 0.020, group="square tf32", size=[512] * 3, prec="tf32"),
    row("square", "square 512^3 tf32", "torch.mm", 0.021, group="square tf32", size=[512] * 3, prec="tf32"),
    row("fused", "fwd 64x64x64 tf32", "plain GEMM (cygemm.gemm)", 0.9),
    row("fused", "fwd 64x64x64 tf32 relu", "cygemm forward_into", 1.0),
    row("fused", "fwd 64x64x64 tf32 relu", "torch F.linear + activation", 1.05),
    row("fused", "fwd 64x64x64 tf32 relu", "CuPy unfused", 7.0),
    row("fused", "fwd 64x64x64 tf32 relu (save Z)", "cygemm forward_into save_z", 1.1),
]


def test_the_plots_are_written_from_a_results_folder(tmp_path):
    needs_matplotlib()
    (tmp_path / "bench.json").write_text(json.dumps(
        {"environment": {"gpu": "TestGPU", "date": "2026-01-02T03:04:05+00:00"}, "rows": SYNTHETIC}))
    md = open(report.write(str(tmp_path))).read()
    for png in ("relative.png", "host.png", "fused.png"):
        assert_png(str(tmp_path / png))
        assert f"![{png}](./{png})" in md
    # No hopper.json in this folder: no FP8 or grouped figure, and none claimed.
    assert not (tmp_path / "fp8.png").exists() and "fp8.png" not in md


def test_the_fp8_and_grouped_plots_come_from_the_stored_runs(tmp_path):
    needs_matplotlib()
    for name in ("bench.json", "hopper.json"):
        shutil.copy(os.path.join(RESULTS, name), tmp_path / name)
    md = open(report.write(str(tmp_path))).read()
    for png in ("relative.png", "host.png", "fused.png", "fp8.png", "grouped.png"):
        assert_png(str(tmp_path / png))
    # The Markdown names the run the FP8 and grouped figures come from (hopper.json's start).
    with open(os.path.join(RESULTS, "hopper.json")) as f:
        date = json.load(f)["environment"]["date"]
    line = next(line for line in md.splitlines() if "its FP8 and grouped sections" in line)
    assert "hopper.json" in line and date[:10] in line and date[11:16] in line
    assert md.index(line) < md.index("![fp8.png](./fp8.png)") < md.index("![grouped.png](./grouped.png)")


def test_the_committed_figures_are_the_reports(tmp_path):
    """Every figure the report writes is committed beside the runs, and the pages show them."""
    for png in ("relative.png", "host.png", "fused.png", "fp8.png", "grouped.png"):
        assert_png(os.path.join(RESULTS, png))
    perf = open(os.path.join(ROOT, "docs", "performance.rst"), encoding="utf-8").read()
    results = open(os.path.join(ROOT, "docs", "results.rst"), encoding="utf-8").read()
    for png in ("fp8.png", "grouped.png"):
        assert f".. image:: ../benchmarks/results/{png}" in perf
        assert f".. image:: ../benchmarks/results/{png}" in results


def _train_digits():
    spec = importlib.util.spec_from_file_location("train_digits", os.path.join(ROOT, "examples", "train_digits.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_digits_plot_draws_the_curves_and_their_differences(tmp_path):
    needs_matplotlib()
    import matplotlib.pyplot as plt
    train_digits = _train_digits()
    res = {"cygemm eager": dict(curve=[1.0, 0.5, 0.25], accuracy=0.975),
           "cygemm captured": dict(curve=[1.0, 0.5, 0.25], accuracy=0.975),
           "torch eager": dict(curve=[1.0, 0.51, 0.24], accuracy=0.973)}
    settings = dict(gpu="TestGPU", date="2026-01-02 03:04 UTC", sizes=[64, 128, 10], batch=64, lr=1e-3, epochs=3,
                    seed=0, precision="fp32")
    drawn = []
    savefig = plt.Figure.savefig

    def keep(fig, *args, **kwargs):      # the figure as written, to read its panels back
        drawn.append(fig)
        return savefig(fig, *args, **kwargs)
    plt.Figure.savefig = keep
    try:
        train_digits.plot_curves(res, settings, str(tmp_path / "digits.png"))
    finally:
        plt.Figure.savefig = savefig
    assert_png(str(tmp_path / "digits.png"))
    top, bottom = drawn[0].axes
    assert "TestGPU" in top.get_title() and "fp32" in top.get_title() and "2026-01-02" in top.get_title()
    diffs = {line.get_label().split(" − ")[0]: list(line.get_ydata()) for line in bottom.get_lines()
             if " − " in line.get_label()}
    # Against torch (the reference): cygemm's curves differ by (0, -0.01, +0.01).
    assert set(diffs) == {"cygemm eager", "cygemm captured"}
    assert diffs["cygemm captured"] == pytest.approx([0.0, -0.01, 0.01])


def test_progress_lines_number_the_sections_and_leave_the_rows_alone(capsys):
    pytest.importorskip("cupy", reason="the benchmark suite's Recorder imports CuPy")
    from recorder import Recorder
    R = Recorder(quick=True)
    R.start("square", 3, 15)
    R.progress("square 256^3 tf32")
    R.progress("square 512^3 tf32")
    R.add("square 256^3 tf32", "cygemm.gemm", "gpu_ms", 0.01)
    R.start("report")
    R.progress("wrote bench.json")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("] section 3/15, step 1: square: square 256^3 tf32")
    assert lines[1].endswith("] section 3/15, step 2: square: square 512^3 tf32")
    assert lines[2].endswith("] step 1: report: wrote bench.json")
    assert R.rows == [dict(section="square", case="square 256^3 tf32", contender="cygemm.gemm", metric="gpu_ms",
                           value=0.01, lo=0.01, hi=0.01)]
