"""Tables, plots and the summary from the suite's JSON.

    python benchmarks/report.py DIR [--md PATH] [--rst PATH]

Reads DIR/bench.json (and, when there, DIR/hopper.json for the FP8 and grouped figures); writes
DIR/*.png (benchmarks/plots.py), the Markdown (DIR/RESULTS.md, or PATH) and, with --rst,
the documentation's page of every measurement; prints the summary: cygemm against the best
other contender, case by case. Values have three significant digits; the fastest of each case
is in bold.
"""
import argparse
import json
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plots as P  # noqa: E402

PEAK_TFLOPS = {"tf32": 494.7, "fp32": 66.9, "fp16": 989.4, "bf16": 989.4}   # H200 SXM datasheet, dense
UNITS = {"gpu_ms": "ms", "host_us": "µs", "graph_us": "µs", "step_us": "µs", "fit_ms": "ms", "gbps": "GB/s",
         "tflops_peak": "TFLOP/s", "gbps_peak": "GB/s"}


def load(d):
    with open(os.path.join(d, "bench.json")) as f:
        return json.load(f)


def is_ours(contender):
    return contender.startswith("cygemm")


def precision(row):
    if row.get("prec"):
        return row["prec"]
    for p in ("tf32", "fp32", "fp16", "bf16"):
        if f" {p}" in row["case"]:
            return p
    return None


def host_api(contender):
    """Which API a host-time row measures, so that like is compared with like."""
    c = contender
    if "gemm_ops.forward" in c:
        return "allocating forward"
    if "forward_into" in c or "relu+bias" in c or "_addmm_activation" in c or "RELU_BIAS" in c:
        return "relu+bias forward"
    if "backward_into" in c:
        return "relu backward"
    if "batched" in c.lower():
        return "4x batched GEMM"
    return "GEMM"


def by_case(rows):
    cases = OrderedDict()
    for r in rows:
        if r["metric"] in ("gpu_ms", "host_us", "graph_us", "step_us", "fit_ms"):
            case = f"{r['case']}: {host_api(r['contender'])}" if r["metric"] == "host_us" else r["case"]
            cases.setdefault((r["section"], case), []).append(r)
    return cases


def comparisons(rows):
    """Per case with a cygemm row and another timed row: cygemm's best against the best
    other contender and against the C++ floor. ratio > 1: cygemm is faster."""
    out = []
    for (section, case), rs in by_case(rows).items():
        ours = [r for r in rs if is_ours(r["contender"]) and "plain" not in r["contender"]]
        others = [r for r in rs if not is_ours(r["contender"]) and not r.get("floor")]
        floors = [r for r in rs if r.get("floor")]
        if not ours or not (others or floors):
            continue
        best = min(ours, key=lambda r: r["value"])
        item = dict(section=section, case=case, ours=best)
        if others:
            item["other"] = min(others, key=lambda r: r["value"])
            item["ratio"] = item["other"]["value"] / best["value"]
        if floors:
            item["floor"] = min(floors, key=lambda r: r["value"])
            item["floor_ratio"] = item["floor"]["value"] / best["value"]
        out.append(item)
    return out


def fmt(v):
    """Three significant digits (whole numbers from 1000)."""
    if v is None:
        return ""
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def fastest_in_case(rows):
    """id() of the fastest timed row of each case (the winner to mark)."""
    best = {}
    for r in rows:
        if r.get("value") is None or r["metric"] not in ("gpu_ms", "host_us", "graph_us", "step_us", "fit_ms"):
            continue
        key = (r["section"], r["case"], r["metric"] == "host_us" and host_api(r["contender"]))
        if key not in best or r["value"] < best[key]["value"]:
            best[key] = r
    return {id(r) for r in best.values()}


def pct_of_peak(r):
    p = precision(r)
    if r.get("tflops") and p in PEAK_TFLOPS:
        return f"{100 * r['tflops'] / PEAK_TFLOPS[p]:.0f}%"
    return ""


def env_lines(env):
    keys = ["gpu", "driver", "cuda_runtime", "cuda_driver_api", "cublasLt", "cupy", "torch", "nvmath", "python",
            "date", "clocks_before", "clocks_after", "quick", "seconds"]
    # One line per key: on a host with several GPUs, nvidia-smi gives a line per GPU.
    return [f"- {k}: " + "; ".join(str(env.get(k)).splitlines()) for k in keys if k in env]


def plots(data, d):
    """relative.png, host.png, fused.png from the run's bench.json (data) in d; returns the files
    written (none without matplotlib)."""
    plt = P.pyplot()
    if plt is None:
        return []
    rows = [r for r in data["rows"] if r.get("value") is not None]
    env, label = data["environment"], P.run_label(data["environment"], "bench.json")
    made = [P.relative_plot(plt, rows, env, label, os.path.join(d, "relative.png")),
            P.host_plot(plt, rows, env, label, os.path.join(d, "host.png"), host_api),
            P.fused_plot(plt, rows, env, label, os.path.join(d, "fused.png"), precision)]
    return [name for name, ok in zip(("relative.png", "host.png", "fused.png"), made) if ok]


# Runs kept beside bench.json whose sections have their own figures: file -> [(png, plot)].
OTHER_RUNS = {"hopper.json": [("fp8.png", P.fp8_plot), ("grouped.png", P.grouped_plot)]}


def other_run_plots(d):
    """fp8.png and grouped.png from d/hopper.json when it is there; returns (file, date, pngs)
    per run plotted."""
    plt = P.pyplot()
    out = []
    for filename, figures in OTHER_RUNS.items():
        path = os.path.join(d, filename)
        if plt is None or not os.path.exists(path):
            continue
        with open(path) as f:
            data = json.load(f)
        rows = [r for r in data["rows"] if r.get("value") is not None]
        env = data["environment"]
        label = P.run_label(env, filename)
        pngs = [png for png, plot in figures if plot(plt, rows, env, label, os.path.join(d, png))]
        if pngs:
            out.append((filename, label, pngs))
    return out


def write(d, md_path=None):
    data = load(d)
    env, rows = data["environment"], data["rows"]
    md_path = md_path or os.path.join(d, "RESULTS.md")
    pngs = plots(data, d)
    rel = os.path.relpath(d, os.path.dirname(os.path.abspath(md_path)))
    comps = comparisons(rows)
    L = ["# Benchmark results", "",
         "Produced by `python -m benchmarks` (on a GPU machine: `bash scripts/gpu_suite.sh DIR`), regenerated "
         "by `python benchmarks/report.py DIR`. GPU times: CUDA events around the timed calls after a warm-up of "
         "at least 50 ms, median (min, max) of 15-30 repeats; a sleeping kernel queued ahead of the first event "
         "holds the GPU while the host enqueues, so GPU times exclude launch gaps and host overhead, for every "
         "contender alike; below 50 MB of operands, four operand sets are rotated. Host times: wall time per "
         "call over thousands of back-to-back calls with one sync, in alternating rounds with the C++ floor "
         "(median of rounds). MLP steps (the graph section; not cygemm.nn): a relu MLP step written on `forward_into`/`backward_into` with a mean-squared-error loss and SGD without momentum, against the same step in torch (nn.MSELoss, torch.optim.SGD); wall time per step over 500 back-to-back steps, one sync, median of 5 rounds. Inputs random, never zeros. Clocks never changed. TF32 rows: cygemm "
         "`math=\"tf32\"`, CuPy with CUPY_TF32 (compute type TF32), torch `allow_tf32`, nvmath "
         "`COMPUTE_32F_FAST_TF32`; fp32 rows strict everywhere; fp16/bf16 accumulate in fp32 everywhere "
         "(torch's reduced-precision reductions off).", ""]
    L += env_lines(env)
    L += ["", "## Summary: cygemm against the best other contender", "",
          "Ratio = the other's time / cygemm's time (> 1: cygemm faster).", "",
          "| case | cygemm | best other | ratio | C++ floor | cygemm / floor |", "|---|---|---|---|---|---|"]
    for c in comps:
        o = c.get("other")
        unit = UNITS[c["ours"]["metric"]]
        ours_wins = not o or c["ratio"] >= 1
        mine = f"{fmt(c['ours']['value'])} {unit}"
        L.append(f"| {c['case']} | {'**' + mine + '**' if ours_wins else mine} | "
                 + (f"{o['contender']}: {fmt(o['value']) if ours_wins else '**' + fmt(o['value']) + '**'} | "
                    f"{c['ratio']:.2f}× |" if o else " | |")
                 + (f" {fmt(c['floor']['value'])} | {1 / c['floor_ratio']:.2f}× |" if c.get("floor") else " | |"))
    L += ["", "## Where cygemm is slower than a contender", "",
          "Every case where another contender's median time is below cygemm's, the C++ floor included.", ""]
    slower = []
    for c in comps:
        for key, rk in (("other", "ratio"), ("floor", "floor_ratio")):
            if c.get(key) and c[rk] < 1:
                slower.append((c, c[key], 1 / c[rk] - 1))
    if slower:
        L += ["| case | cygemm | faster contender | cygemm slower by |", "|---|---|---|---|"]
        L += [f"| {c['case']} | {fmt(c['ours']['value'])} | {v['contender']}: {fmt(v['value'])} | {100 * by:.1f}% |"
              for c, v, by in slower]
    else:
        L.append("None in this run.")
    L += routes_table(data.get("tuning", []))
    # Ceilings.
    best = {}
    for r in rows:
        p = precision(r)
        if r.get("tflops") and p:
            if r["tflops"] > best.get(p, (0, None))[0]:
                best[p] = (r["tflops"], f"{r['contender']}, {r['case']}")
    L += ["", "## Ceilings", "", "| what | datasheet | measured | best measured by |", "|---|---|---|---|"]
    for p in ("tf32", "fp32", "fp16", "bf16"):
        if p in best:
            L.append(f"| {p} matrix rate, TFLOP/s | {PEAK_TFLOPS[p]} | {best[p][0]:.0f} "
                     f"({100 * best[p][0] / PEAK_TFLOPS[p]:.0f}%) | {best[p][1]} |")
    bw = [r for r in rows if r["metric"] == "gbps"]
    if bw:
        L.append(f"| copy bandwidth, GB/s | 4800 | {bw[0]['value']:.0f} ({100 * bw[0]['value'] / 4800:.0f}%) | "
                 f"{bw[0]['contender']} |")
    for png in pngs:
        L += ["", f"![{png}]({os.path.join(rel, png)})"]
    for filename, label, others in other_run_plots(d):
        L += ["", f"From the {label} (its FP8 and grouped sections), each contender against the fastest "
              "in its case:"]
        L += [s for png in others for s in ("", f"![{png}]({os.path.join(rel, png)})")]
    # Full tables, section by section.
    sections = OrderedDict()
    for r in rows:
        sections.setdefault(r["section"], []).append(r)
    winners = fastest_in_case(rows)
    for sec, rs in sections.items():
        L += ["", f"## {sec}", "", "| case | contender | median | min | max | unit | TFLOP/s | of peak |",
              "|---|---|---|---|---|---|---|---|"]
        for r in rs:
            if r["metric"] == "skipped":
                L.append(f"| {r['case']} | {r['contender']} | skipped: {r['reason']} | | | | | |")
                continue
            med = fmt(r["value"])
            L.append(f"| {r['case']} | {r['contender']} | {'**' + med + '**' if id(r) in winners else med} | "
                     f"{fmt(r.get('lo'))} | {fmt(r.get('hi'))} | "
                     f"{UNITS.get(r['metric'], r['metric'])} | {fmt(r.get('tflops'))} | {pct_of_peak(r)} |")
    with open(md_path, "w") as f:
        f.write("\n".join(L) + "\n")
    print_summary(comps, env)
    return md_path


_DTYPES = {0: "fp32", 2: "fp16", 14: "bf16"}     # cudaDataType codes in the plan keys
_TF32 = 77                                       # CUBLAS_COMPUTE_32F_FAST_TF32


def _prec(dtype, compute):
    name = _DTYPES.get(dtype, str(dtype))
    return "tf32" if name == "fp32" and compute == _TF32 else name


def routes_table(entries):
    """What the plan layer chose in this run, per problem, with the times it measured (ms,
    median of the timed rounds, L2 flushed)."""
    if not entries:
        return []
    L = ["", "## Routes chosen by measurement", "",
         "The plan layer's table at the end of the run: for each problem it timed, the choice and the "
         "times (ms) it measured. gemm: cuBLASLt's best candidate against cublasGemmEx (key: m, n, k of "
         "the column-major call, batch); forward/backward: the layer's routes (dense.FORWARD_ROUTES, "
         "BACKWARD_ROUTES).", "",
         "| kind | problem | chosen | times (ms) |", "|---|---|---|---|"]
    order = {"forward": 0, "backward": 1, "gemm": 2}
    # The table also keeps promise verdicts and remembered buckets (keys of other shapes): only
    # the timed choices of a problem are listed.
    timed = [e for e in entries if e["kind"] in order and not isinstance(e["key"][-1], str)]
    for e in sorted(timed, key=lambda e: (order[e["kind"]], [str(x) for x in e["key"]])):
        k = e["key"]
        if e["kind"] == "gemm":
            what = f"{k[5]}x{k[6]}x{k[7]}" + (f" batch {k[12]}" if k[12] > 1 else "") + f" {_prec(k[0], k[1])}" \
                + (f" epilogue {k[2]}" if k[2] != 1 else "")
            times = f"{e['ms']:.4g}" if isinstance(e.get("ms"), (int, float)) else ""
        elif e["kind"] == "forward":
            what = f"{k[5]}x{k[6]}x{k[7]} {_prec(k[0], k[1])} act {k[2]}{' bias' if k[3] else ''}" \
                   f"{' save_z' if k[4] else ''}"
            times = ", ".join(f"{n} {v:.4g}" for n, v in e["ms"].items())
        else:
            what = f"{k[2]}x{k[3]}x{k[4]} {_prec(k[0], k[1])}"
            times = ", ".join(f"{n} {v:.4g}" for n, v in e["ms"].items())
        L.append(f"| {e['kind']} | {what} | {e['route']} | {times} |")
    return L


def print_summary(comps, env):
    print(f"\n== Summary ({env.get('gpu')}, {env.get('date')}): cygemm vs the best other contender "
          "(ratio > 1: cygemm faster)")
    for c in comps:
        o = c.get("other")
        left = f"{c['case'][:52]:52s} {c['ours']['value']:10.4g}"
        right = f"  vs {o['contender'][:30]:30s} {c['ratio']:5.2f}x" if o else " " * 41
        fl = f"  floor {1 / c['floor_ratio']:5.2f}x of C++" if c.get("floor") else ""
        print(left + right + fl)


def md_to_rst(md, image_dir):
    """The report's Markdown as reStructuredText for the documentation: headings, paragraphs,
    bullets, pipe tables (list-tables), images (from image_dir, relative to the page)."""
    import re
    out, lines, i = [], md.splitlines(), 0
    inline = lambda t: re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", t)
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            level, title = len(line) - len(line.lstrip("#")), inline(line.lstrip("#").strip())
            out += [title, ("=" if level == 1 else "-" if level == 2 else "~") * len(title), ""]
        elif line.startswith("|"):
            table = []
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(set(c) <= set("-: ") for c in cells):
                    table.append(cells)
                i += 1
            width = max(len(r) for r in table)
            out += [".. list-table::", "   :header-rows: 1", ""]
            for r in table:
                r = r + [""] * (width - len(r))
                out.append(f"   * - {inline(r[0]) or '..'}")
                out += [f"     - {inline(c) if c else '..'}" for c in r[1:]]
            out.append("")
            continue
        elif line.startswith("!["):
            path = re.match(r"!\[[^\]]*\]\(([^)]+)\)", line).group(1)
            out += [f".. image:: {image_dir}/{os.path.basename(path)}", ""]
        else:
            out.append(inline(line))
        i += 1
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Tables, plots and the summary from a benchmark run's bench.json.")
    ap.add_argument("dir", help="the run's folder (its bench.json; the plots are written there)")
    ap.add_argument("--md", default=None, help="where to write the Markdown (default: DIR/RESULTS.md)")
    ap.add_argument("--rst", default=None, help="also write the documentation's page of every measurement here")
    a = ap.parse_args()
    md_path = write(a.dir, a.md)
    if a.rst:
        images = os.path.relpath(os.path.abspath(a.dir), os.path.dirname(os.path.abspath(a.rst)))
        with open(md_path) as f, open(a.rst, "w") as g:
            g.write(".. This page is generated by benchmarks/report.py from the run's bench.json.\n\n")
            g.write(md_to_rst(f.read(), images))
