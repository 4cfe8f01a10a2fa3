"""Tables, plots and the summary from the suite's JSON.

    python benchmarks/report.py DIR [--md PATH]

Reads DIR/bench.json; writes DIR/*.png and the Markdown (DIR/RESULTS.md, or PATH),
and prints the summary: cygemm against the best other contender, case by case.
"""
import argparse
import json
import os
import sys
from collections import OrderedDict

PEAK_TFLOPS = {"tf32": 494.7, "fp32": 66.9, "fp16": 989.4, "bf16": 989.4}   # H200 SXM datasheet, dense
UNITS = {"gpu_ms": "ms", "host_us": "µs", "graph_us": "µs", "step_us": "µs", "gbps": "GB/s",
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
        if r["metric"] in ("gpu_ms", "host_us", "graph_us", "step_us"):
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
    if v is None:
        return ""
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"


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
    """throughput.png, host.png, fused.png in d; returns the files written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: no plots (matplotlib is not installed: pip install -e \".[bench]\")", file=sys.stderr)
        return []
    rows = [r for r in data["rows"] if r.get("value") is not None]
    written = []
    sq = [r for r in rows if r.get("group", "") and str(r.get("group")).startswith("square") and r.get("tflops")]
    if sq:
        fig, axes = plt.subplots(1, 4, figsize=(18, 4.2), sharex=True)
        for ax, p in zip(axes, ("tf32", "fp32", "fp16", "bf16")):
            series = OrderedDict()
            for r in sq:
                if r["group"] == f"square {p}":
                    series.setdefault(r["contender"], []).append((r["size"][0], r["tflops"]))
            for name, pts in series.items():
                pts.sort()
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", lw=2.2 if is_ours(name) else 1.2,
                        ls="-" if is_ours(name) else ("--" if "C++" in name else "-"), label=name)
            ax.axhline(PEAK_TFLOPS[p], color="gray", ls=":", lw=1)
            ax.text(64, PEAK_TFLOPS[p] * 0.92, "datasheet peak", color="gray", fontsize=8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"square GEMM, {p}")
            ax.set_xlabel("n (n×n×n)")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("TFLOP/s (median)")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{data['environment']['gpu']}: throughput against size (higher is better)")
        fig.tight_layout()
        fig.savefig(os.path.join(d, "throughput.png"), dpi=110)
        plt.close(fig)
        written.append("throughput.png")
    host = [r for r in rows if r["metric"] == "host_us"]
    if host:
        fig, ax = plt.subplots(figsize=(9, 0.32 * len(host) + 1.2))
        labels = [f"{r['contender']}" + ("  [after torch import]" if "after" in r["case"] else "") for r in host]
        colors = ["tab:blue" if is_ours(r["contender"]) else ("tab:gray" if r.get("floor") else "tab:orange")
                  for r in host]
        ax.barh(range(len(host)), [r["value"] for r in host], color=colors,
                xerr=[[r["value"] - r["lo"] for r in host], [r["hi"] - r["value"] for r in host]])
        ax.set_yticks(range(len(host)))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("host µs per call, 64×64×64, back-to-back (median; bars: min–max of rounds)")
        ax.set_title("Host time per call (lower is better): cygemm blue, C++ floor gray, others orange")
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(d, "host.png"), dpi=110)
        plt.close(fig)
        written.append("host.png")
    fused = [r for r in rows if r["section"] == "fused" and r["metric"] == "gpu_ms"]
    if fused:
        cases = list(OrderedDict.fromkeys(r["case"] for r in fused if "plain" not in r["contender"]
                                          and "save Z" not in r["case"]))
        names = list(OrderedDict.fromkeys(r["contender"] for r in fused if r["case"] in cases))
        fig, ax = plt.subplots(figsize=(13, 4.5))
        w = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            xs, ys = [], []
            for j, c in enumerate(cases):
                v = [r["value"] for r in fused if r["case"] == c and r["contender"] == name]
                if v:
                    xs.append(j + i * w)
                    ys.append(v[0])
            ax.bar(xs, ys, w, label=name)
        for r in fused:
            if "plain" in r["contender"]:
                j = [k for k, c in enumerate(cases) if c.startswith(r["case"])]
                for k in j:
                    ax.hlines(r["value"], k - 0.1, k + 0.8, colors="black", linestyles="dashed", lw=1)
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(cases))])
        ax.set_xticklabels([c.split(" ", 2)[0] + " " + c.split(" ")[-1] for c in cases])
        ax.set_ylabel("ms (median)")
        ax.set_title(f"Dense layer {cases[0].split(' ')[1]}: fused vs unfused (lower is better; dashed: plain GEMM(s))")
        ax.legend(fontsize=8, ncol=3)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(d, "fused.png"), dpi=110)
        plt.close(fig)
        written.append("fused.png")
    return written


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
         "(median of rounds). MLP steps: wall time per step over 500 back-to-back steps, one sync. Inputs random, never zeros. Clocks never changed. TF32 rows: cygemm "
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
        L.append(f"| {c['case']} | {fmt(c['ours']['value'])} {unit} | "
                 + (f"{o['contender']}: {fmt(o['value'])} | **{c['ratio']:.2f}×** |" if o else " | |")
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
    # Full tables, section by section.
    sections = OrderedDict()
    for r in rows:
        sections.setdefault(r["section"], []).append(r)
    for sec, rs in sections.items():
        L += ["", f"## {sec}", "", "| case | contender | median | min | max | unit | TFLOP/s | of peak |",
              "|---|---|---|---|---|---|---|---|"]
        for r in rs:
            if r["metric"] == "skipped":
                L.append(f"| {r['case']} | {r['contender']} | skipped: {r['reason']} | | | | | |")
                continue
            L.append(f"| {r['case']} | {r['contender']} | {fmt(r['value'])} | {fmt(r.get('lo'))} | {fmt(r.get('hi'))} | "
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
         "the column-major call, batch); forward/backward: the layer's routes (fused.FORWARD_ROUTES, "
         "BACKWARD_ROUTES).", "",
         "| kind | problem | chosen | times (ms) |", "|---|---|---|---|"]
    order = {"forward": 0, "backward": 1, "gemm": 2}
    for e in sorted(entries, key=lambda e: (order.get(e["kind"], 3), e["key"])):
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


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--md", default=None)
    a = ap.parse_args()
    write(a.dir, a.md)
