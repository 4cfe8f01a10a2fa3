"""The benchmark report's figures, from a run's JSON.

Every contender here calls cuBLAS, so absolute times often lie within a few percent of one
another; each figure therefore shows a contender's time divided by the fastest one's in the
same case, on a linear axis, and says its settings (GPU, dtype, what was measured, which run).

    relative.png  square GEMMs: speed relative to the fastest at each size (bench.json)
    host.png      host time per call, per API, relative to the fastest (bench.json)
    fused.png     dense layer forward/backward, relative to the fastest (bench.json)
    fp8.png       FP8 GEMMs, relative to the fastest (hopper.json)
    grouped.png   grouped GEMMs, relative to the fastest (hopper.json)
"""
import os
import sys
from collections import OrderedDict

# A ratio above this is drawn cut at the axis' end with its value written: CuPy's unfused layers
# take up to 7x the fused ones and would flatten every other difference.
CLIP_RATIO = 2.0
COLORS = {"cygemm": "tab:blue", "floor": "tab:gray", "other": "tab:orange", "reference": "white"}
DPI = 90


def pyplot():
    """matplotlib.pyplot with the file-only backend, or None (with a note) when not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: no plots (matplotlib is not installed: pip install -e \".[bench]\")", file=sys.stderr)
        return None
    return plt


def run_label(env, filename):
    """Which run a figure shows: its file and its start (UTC, to the minute)."""
    date = str(env.get("date", "date unknown"))[:16].replace("T", " ")
    return f"run {filename}, {date} UTC"


def _fmt(v):
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def kind(contender, row=None):
    """cygemm, floor (cuBLAS called from C++) or other: the bar's colour."""
    if row is not None and row.get("floor"):
        return "floor"
    return "cygemm" if contender.startswith("cygemm") else "other"


def ratio_chart(plt, groups, unit, title, path, note=None):
    """One horizontal bar per contender, grouped by case, at its time / the fastest time in its
    case (1.0 = fastest); contenders sorted fastest first.

    Parameters
    ----------
    plt : module
        matplotlib.pyplot.
    groups : list of (str, list of (str, float, str))
        Per case: its heading and its entries (name, time, kind). kind "reference" marks a row
        drawn for scale but not in the race (e.g. the plain GEMM without the activation): it is
        left out of "the fastest" and drawn hollow.
    unit : str
        The times' unit, for the labels.
    title, path : str
        The figure's title (its settings) and the PNG to write.
    note : str, optional
        A line under the axis.
    """
    ys, labels, ratios, kinds, heads = [], [], [], [], []
    y = 0.0
    for heading, entries in groups:
        fastest = min(v for _, v, k in entries if k != "reference")
        heads.append((y, f"{heading}  (fastest: {_fmt(fastest)} {unit})"))
        y += 1
        for name, v, k in sorted(entries, key=lambda e: e[1]):
            ys.append(y)
            labels.append(f"{name}  {_fmt(v)} {unit}  ({v / fastest:.3f}×)")
            ratios.append(v / fastest)
            kinds.append(k)
            y += 1
        y += 0.5
    inside = [r for r in ratios if r <= CLIP_RATIO]
    right = max(inside + [1.02]) + 0.04 * (max(inside + [1.02]) - 1 + 0.1)
    clipped = any(r > CLIP_RATIO for r in ratios)
    if clipped:
        right = max(right, 1.1) * 1.04
    left = min(min(ratios) - 0.02, 0.99)
    fig, ax = plt.subplots(figsize=(11, 0.24 * len(ys) + 0.3 * len(heads) + 1.8))
    for yy, r, k in zip(ys, ratios, kinds):
        shown = min(r, right)
        ax.barh(yy, shown - 1.0, left=1.0, height=0.62, color=COLORS[k],
                edgecolor="black" if k == "reference" else COLORS[k], hatch="//" if k == "reference" else None)
        ax.plot([shown], [yy], marker=">" if r > right else "o", ms=5, color="black")
        if r > right:    # cut: say how far it goes
            ax.text(shown, yy, f"{r:.2f}×  ", ha="right", va="center", fontsize=7, color="white",
                    fontweight="bold")
    for yy, text in heads:
        ax.text(left, yy, " " + text, ha="left", va="center", fontsize=8.5, fontweight="bold")
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=7.5)
    ax.set_ylim(y - 0.3, -0.7)
    ax.set_xlim(left, right)
    ax.axvline(1.0, color="black", lw=0.9)
    ax.grid(axis="x", alpha=0.35)
    ax.set_xlabel("time / the fastest time in its case (1.0 = fastest; linear)" + (f"\n{note}" if note else ""),
                  fontsize=8.5)
    ax.set_title(title, fontsize=9.5)
    from matplotlib.patches import Patch
    legend = [Patch(facecolor=COLORS[k], edgecolor="black" if k == "reference" else COLORS[k],
                    hatch="//" if k == "reference" else None, label=lbl)
              for k, lbl in (("cygemm", "cygemm"), ("floor", "cuBLAS from C++"), ("other", "others"),
                             ("reference", "for scale, not in the race")) if k in kinds]
    ax.legend(handles=legend, fontsize=7.5, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")     # long contender names: keep every label whole
    plt.close(fig)


def _rounds(rows):
    """'median of N rounds' from the rows' kept rounds (the most common count)."""
    counts = [len(r["rounds"]) for r in rows if r.get("rounds")]
    if not counts:
        return "median"
    return f"median of {max(set(counts), key=counts.count)} interleaved rounds"


def relative_plot(plt, rows, env, label, path):
    """Square GEMMs: each contender's speed relative to the fastest at each size, a panel per
    precision."""
    sq = [r for r in rows if str(r.get("group", "")).startswith("square") and r["metric"] == "gpu_ms"]
    if not sq:
        return False
    precisions = [p for p in ("tf32", "fp32", "fp16", "bf16") if any(r["group"] == f"square {p}" for r in sq)]
    fig, axes = plt.subplots(1, len(precisions), figsize=(4.2 * len(precisions), 4.0), sharey=True, squeeze=False)
    handles = {}
    for ax, p in zip(axes[0], precisions):
        group = [r for r in sq if r["group"] == f"square {p}"]
        best = {}
        for r in group:
            best[r["size"][0]] = min(best.get(r["size"][0], float("inf")), r["value"])
        series = OrderedDict()
        for r in group:
            series.setdefault(r["contender"], []).append((r["size"][0], best[r["size"][0]] / r["value"]))
        for name, pts in series.items():
            pts.sort()
            (line,) = ax.plot([x for x, _ in pts], [v for _, v in pts], marker="o", ms=4,
                              lw=2.4 if name.startswith("cygemm") else 1.2, ls="--" if "C++" in name else "-")
            handles.setdefault(name, line)
            line.set_color(handles[name].get_color())
        ax.set_xscale("log", base=2)
        ax.set_title(f"square GEMM, {p}" + (" (fp32 accumulate)" if p in ("fp16", "bf16") else ""), fontsize=9.5)
        ax.set_xlabel("n (n×n×n, float32 operands)" if p in ("tf32", "fp32") else f"n (n×n×n, {p} operands)",
                      fontsize=8.5)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fastest time / this time (1.0 = fastest; linear)", fontsize=8.5)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(6, len(handles)), fontsize=8)
    fig.suptitle(f"{env.get('gpu', 'GPU')}: square GEMMs, each contender's speed relative to the fastest at each "
                 f"size (GPU time, CUDA events, {_rounds(sq)}); {label}", fontsize=10)
    fig.tight_layout(rect=(0, 0.09, 1, 0.95))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


def host_plot(plt, rows, env, label, path, host_api):
    """Host time per call, grouped by the API a row measures (host_api), relative to the fastest
    call of that API; an API with a single contender has nothing to compare and is left out."""
    host = [r for r in rows if r["metric"] == "host_us"]
    groups = OrderedDict()
    for r in host:
        heading = f"{r['case']}: {host_api(r['contender'])}"
        groups.setdefault(heading, []).append((r["contender"], r["value"], kind(r["contender"], r)))
    groups = [(h, e) for h, e in groups.items() if len(e) > 1]
    if not groups:
        return False
    ratio_chart(plt, groups, "µs",
                f"{env.get('gpu', 'GPU')}: host time per call, 64×64×64 float32 (TF32) operands, thousands of "
                f"back-to-back calls, one sync\n(wall time, median of rounds); each call against the fastest "
                f"call of the same API\n{label}", path)
    return True


def fused_plot(plt, rows, env, label, path, precision):
    """The dense layer's forward and backward per activation, relative to the fastest; the plain
    GEMMs (no activation) and the forward that also writes Z are drawn for scale."""
    fused = [r for r in rows if r["section"] == "fused" and r["metric"] == "gpu_ms"]
    raced = OrderedDict()
    for r in fused:
        if "plain" in r["contender"] or "save Z" in r["case"]:
            continue
        raced.setdefault(r["case"], []).append((r["contender"], r["value"], kind(r["contender"], r)))
    if not raced:
        return False
    for r in fused:        # the scale rows: a case that is the start of a raced case
        if "plain" in r["contender"] or "save Z" in r["case"]:
            for case in raced:
                base = r["case"].replace(" (save Z)", "")
                if case == base or (case.startswith(base + " ") and "save Z" not in r["case"]):
                    extra = " (also writes Z)" if "save Z" in r["case"] else " (no activation)"
                    raced[case].append((r["contender"] + extra, r["value"], "reference"))
    precs = sorted({precision(r) or "?" for r in fused})
    ratio_chart(plt, list(raced.items()), "ms",
                f"{env.get('gpu', 'GPU')}: dense layer Y = act(A·B + bias) forward, and its backward, "
                f"{', '.join(p.upper() for p in precs)}, float32 operands\nGPU time per call (CUDA events, "
                f"{_rounds(fused)}) against the fastest in its case\n{label}", path)
    return True


def _section_plot(plt, rows, section, what, label, path, note, case_label=lambda case: case):
    """A section's GPU times per case (case_label names each), each against the fastest in its
    case, titled what (the measurement), the method, then label; False when the run has none."""
    timed = [r for r in rows if r["section"] == section and r["metric"] == "gpu_ms"]
    groups = OrderedDict()
    for r in timed:
        groups.setdefault(case_label(r["case"]), []).append((r["contender"], r["value"], kind(r["contender"], r)))
    if not groups:
        return False
    ratio_chart(plt, list(groups.items()), "ms",
                f"{what}\nGPU time per call (CUDA events, {_rounds(timed)}) against the fastest in its case\n{label}",
                path, note=note)
    return True


def fp8_plot(plt, rows, env, label, path):
    """FP8 GEMMs per shape, with the bfloat16 GEMMs of the same shape, relative to the fastest."""
    return _section_plot(plt, rows, "fp8", f"{env.get('gpu', 'GPU')}: FP8 E4M3 GEMMs (a (M, K), w (N, K), "
                         "bfloat16 out, unit scales) and bfloat16 GEMMs of the same shapes", label, path,
                         "C++ rows: cuBLASLt called directly, the fastest of its first eight algorithms",
                         case_label=lambda case: case.replace("fp8 ", "M×N×K = "))


def grouped_plot(plt, rows, env, label, path):
    """Grouped bfloat16 GEMMs per shape, relative to the fastest; cygemm's row names the route
    it measured and chose."""
    return _section_plot(plt, rows, "grouped", f"{env.get('gpu', 'GPU')}: grouped bfloat16 GEMMs out_g = x_g · "
                         "W_gᵀ (mixture-of-experts form, fp32 accumulate)", label, path,
                         "cygemm moe_gemm (route): the route it timed and chose; C++ rows: cuBLAS's loop, "
                         "grouped and batched calls")
