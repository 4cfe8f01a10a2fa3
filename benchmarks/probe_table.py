"""The table of cygemm's small-matrix kernel against cuBLAS from a run of
benchmarks/small_batched_probe.cu (its text output): for each dtype and shape, cuBLAS's time and
share of the copy's bandwidth, the kernel's (the launch shape its rule picks), and the ratio.

    python benchmarks/probe_table.py benchmarks/results/small_batched_probe_run2.txt [--rst]
    python benchmarks/probe_table.py RUN.txt --json RUN.json --date 2026-12-04T04:01

No GPU needed: it reads the text only. --json writes the run as the benchmark suite's files are
written (environment, rows of case / contender / metric / value), so that the figures quoted from
it are checked as the suite's are (tests/contracts/test_figures.py); --date is when the run
started (UTC), which the probe's output does not say."""
import json
import re
import sys

LINE = re.compile(r"^(\S+)\s+(\d+x\d+x\d+) (\S\S)( bcastB)?\s+batch\s+(\d+) (cublas|rule \S+|\S+)\s+([\d.]+) ms\s+"
                  r"([\d.]+) GB/s\s+([\d.]+)% of copy\s+([\d.]+)x cuBLAS")


def rows(path):
    """(dtype, shape, ops, batch, cublas (ms, %), kernel (ms, %, ratio)) per problem, in file order."""
    found = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            dtype, shape, ops, bcast, batch, who, ms, _, pct, ratio = m.groups()
            key = (dtype, shape, ops + (" B broadcast" if bcast else ""), int(batch))
            entry = found.setdefault(key, {})
            if who == "cublas":
                entry["cublas"] = (float(ms), float(pct))
            elif who.startswith("rule"):
                entry["kernel"] = (float(ms), float(pct), float(ratio))
    return [(k, v) for k, v in found.items() if "cublas" in v and "kernel" in v]


def as_json(path, date):
    """The run as {"environment": {...}, "rows": [...]}: each problem's case is "dtype MxNxK ops
    batch B", its contenders "cuBLAS strided-batched" and "cygemm kernel", metric gpu_ms."""
    with open(path) as f:
        first = f.readline().strip()        # "GPU NVIDIA H200, 132 SMs, cuBLAS 130100"
    out = []
    for (dtype, shape, ops, batch), v in rows(path):
        case = f"{dtype} {shape} {ops} batch {batch}"
        out.append(dict(case=case, contender="cuBLAS strided-batched", metric="gpu_ms", value=v["cublas"][0],
                        of_copy=v["cublas"][1] / 100))
        out.append(dict(case=case, contender="cygemm kernel", metric="gpu_ms", value=v["kernel"][0],
                        of_copy=v["kernel"][1] / 100, vs_cublas=v["kernel"][2]))
    return {"environment": {"date": date, "device": first, "source": path.split("/")[-1]}, "rows": out}


def table(path, rst=False):
    head = ["dtype", "m x n x k", "ops", "batch", "cuBLAS ms", "cuBLAS % of copy", "kernel ms",
            "kernel % of copy", "kernel vs cuBLAS"]
    body = []
    for (dtype, shape, ops, batch), v in rows(path):
        c, k = v["cublas"], v["kernel"]
        body.append([dtype, shape.replace("x", " x "), ops, str(batch), f"{c[0]:.3f}", f"{c[1]:.0f}%", f"{k[0]:.3f}",
                     f"{k[1]:.0f}%", f"{k[2]:.2f}x"])
    if not rst:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    rule = "  ".join("=" * w for w in widths)
    fmt = lambda r: "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip()      # noqa: E731
    return "\n".join([rule, fmt(head), rule] + [fmt(r) for r in body] + [rule])


if __name__ == "__main__":
    if "--json" in sys.argv:
        target, date = sys.argv[sys.argv.index("--json") + 1], sys.argv[sys.argv.index("--date") + 1]
        with open(target, "w") as f:
            json.dump(as_json(sys.argv[1], date), f, indent=1)
    else:
        print(table(sys.argv[1], rst="--rst" in sys.argv))
