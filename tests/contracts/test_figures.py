"""The performance figures of the README and docs/performance.rst come from the benchmark runs
kept in benchmarks/results/: one table, the same on both pages, each row naming its run; every
figure in it is a measurement of that run, and "fastest other" is the fastest contender other
than cygemm in that run's case."""
import json
import os
import re

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
RUN_FILES = {"A": "bench.json", "B": "training.json", "C": "hopper.json", "E": "dtypes.json",
             "F": "small_batched_probe_run2.json"}     # (F: the probe's text, as JSON by benchmarks/probe_table.py)

# Each row of the table (by the start of its case cell) -> the run's case it quotes, and which of
# its contenders compare (the host case times several APIs: the GEMM row compares GEMM calls).
CASES = {
    "64³ float32 GEMM, host time per call": ("64^3 host us/call", r"cublasGemmEx|cp\.matmul|cygemm\.gemm \(stream=int\)"),
    "matmul, 4096³ with a a column slice": ("matmul 4096^3 a column slice tf32", ""),
    "dense forward relu+bias": ("fwd 8192x8192x1024 tf32 relu", ""),
    "cygemm.nn training step": ("train step 64-256-256-10 b64 Adam, wall us/step", ""),
    "FP8 E4M3 GEMM, 4096³": ("fp8 4096x4096x4096", ""),
    "grouped bfloat16 GEMMs, 64 experts": ("grouped bf16 64 x 256, K=4096, N=1024", ""),
    "grouped bfloat16 GEMMs, 16 experts": ("grouped bf16 16 ragged, K=4096, N=1024", ""),
    "int8 GEMM, 8192³": ("int8 8192x8192x8192", ""),
    "complex128 GEMM, 8192³": ("complex128 8192^3", ""),
    "8.4 million float32 2×2 GEMMs": ("float32 2x2x2 NN batch 8388608", ""),
    "262,144 float64 8×8 GEMMs": ("float64 8x8x8 NN batch 262144", ""),
    "262,144 float16 16×16 GEMMs": ("float16 16x16x16 NN batch 262144", ""),
}
UNIT = {"host_us": "µs", "step_us": "µs", "gpu_ms": "ms"}


def _plain(text):
    return re.sub(r"`+", "", text).strip()


def readme_rows():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text[text.index("## Performance"):text.index("## Contributing")]
    rows = [[_plain(c) for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    assert rows[0] == ["case", "cygemm", "fastest other", "run"], rows[0]
    return [r for r in rows[2:]]


def performance_rows():
    text = open(os.path.join(ROOT, "docs", "performance.rst"), encoding="utf-8").read()
    block = text[text.index("The README's table"):]
    block = block[block.index(".. list-table::"):]
    rows, row = [], None
    for line in block.splitlines()[3:]:
        if line.startswith("   * - "):
            row = [_plain(line[7:])]
            rows.append(row)
        elif line.startswith("     - "):
            row.append(_plain(line[7:]))
        elif not line.strip():
            break
    return rows[1:]


def _run_rows(run):
    with open(os.path.join(ROOT, "benchmarks", "results", RUN_FILES[run])) as f:
        return json.load(f)["rows"]


def _figures(cell):
    """(value, unit) of each time a cell quotes."""
    return [(float(v), u) for v, u in re.findall(r"(\d+(?:\.\d+)?) (µs|ms)\b", cell)]


def _same(quoted, measured):
    """quoted is measured written to three significant digits (or to the digits quoted)."""
    digits = len(re.sub(r"^0\.0*", "", f"{quoted:g}").replace(".", ""))
    return float(f"{measured:.{max(3, digits)}g}") == quoted


ROWS = readme_rows()


def test_the_readme_and_the_performance_page_show_one_table():
    assert ROWS == performance_rows()
    assert len(ROWS) == len(CASES)


@pytest.mark.parametrize("row", ROWS, ids=[r[0][:40] for r in ROWS])
def test_every_figure_is_a_measurement_of_the_run_the_row_names(row):
    case_cell, ours, others, run = row
    assert run in RUN_FILES, f"{case_cell}: the run column says {run!r}"
    key = next(k for k in CASES if case_cell.startswith(k))
    name, contenders = CASES[key]
    case = [r for r in _run_rows(run) if r["case"] == name and r.get("value") is not None
            and re.search(contenders, r["contender"])]
    assert case, f"run {run} has no case {name!r}"
    figures = _figures(ours) + _figures(others)
    assert figures, row
    for value, unit in figures:
        # A figure may come from another case of the same run (e.g. the bfloat16 GEMM beside FP8).
        candidates = [r for r in _run_rows(run) if UNIT.get(r["metric"]) == unit and r.get("value") is not None]
        assert any(_same(value, r["value"]) for r in candidates), f"{value} {unit} is not in run {run}"
    # "fastest other": the first figure is the fastest contender but cygemm in this case.
    others_measured = [r["value"] for r in case if not r["contender"].startswith("cygemm")]
    first = _figures(others)[0][0]
    assert _same(first, min(others_measured)), f"{case_cell}: fastest other is {min(others_measured):.4g}, not {first}"
    mine = [r["value"] for r in case if r["contender"].startswith("cygemm")]
    assert any(_same(_figures(ours)[0][0], v) for v in mine), f"{case_cell}: cygemm's figure"


def test_each_run_is_described_with_its_date_and_command_on_both_pages():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    perf = open(os.path.join(ROOT, "docs", "performance.rst"), encoding="utf-8").read()
    for run, name in RUN_FILES.items():
        with open(os.path.join(ROOT, "benchmarks", "results", name)) as f:
            env = json.load(f)["environment"]
        hhmm = env["date"][11:16]
        for page, text in (("README.md", readme), ("performance.rst", perf)):
            assert name in text and hhmm in text, f"{page}: run {run} ({name}, {hhmm} UTC) is not described"
