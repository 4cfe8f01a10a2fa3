"""Two builds of cygemm in one process, interleaved on the same operands: this tree's
(`cygemm`) and another commit's, built as `cygemm_old` by scripts/build_renamed.sh.

    bash scripts/build_renamed.sh 9579766 /tmp/old
    PYTHONPATH=/tmp/old python3 -m benchmarks.compare_builds --out DIR

Host rows: 64^3 float32 calls timed on the host (median of interleaved rounds of 2000 calls
each, synchronizing at the end of a round), with torch.mm(out=) and cp.matmul(out=) in the
same rounds. Large rows: CUDA-event time per GEMM (median of interleaved rounds, each
contender warmed up, i.e. tuned, first). Writes compare_builds.json and .md to --out.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def host_rows(cp, new, old, torch, rounds):
    rng = np.random.default_rng(0)
    a, b, bias = (cp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((64, 64), (64, 64), (64,)))
    c = cp.empty((64, 64), cp.float32)
    calls = {
        "gemm(a, b, out=c) new": lambda: new.gemm(a, b, c),
        "gemm(a, b, out=c) old": lambda: old.gemm(a, b, c),
        "forward_into relu+bias new": lambda: new.gemm_ops.forward_into(a, b, c, bias, act="relu"),
        "forward_into relu+bias old": lambda: old.gemm_ops.forward_into(a, b, c, bias, act="relu"),
        "matmul(a, b, out=c) new": lambda: new.matmul(a, b, c),
        "matmul(a, b, out=c) old": lambda: old.matmul(a, b, c),
        "cp.matmul(a, b, out=c)": lambda: cp.matmul(a, b, out=c),
    }
    if torch is not None:
        ta, tb, tc = (torch.as_tensor(x, device="cuda") for x in (a, b, c))
        torch.backends.cuda.matmul.allow_tf32 = True
        calls["torch.mm(a, b, out=c)"] = lambda: torch.mm(ta, tb, out=tc)
    n = 2000
    times = {k: [] for k in calls}
    for fn in calls.values():
        for _ in range(300):
            fn()
    cp.cuda.Device().synchronize()
    for _ in range(rounds):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            cp.cuda.Device().synchronize()
            times[name].append((time.perf_counter() - t0) / n * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def large_rows(cp, new, old, torch, rounds):
    shapes = [(4096, 4096, 4096, "float32"), (8192, 8192, 1024, "float32"), (2048, 2048, 2048, "float16"),
              (8192, 4096, 8192, "float32"), (8192, 8192, 8192, "float16")]
    out = {}
    rng = np.random.default_rng(1)
    for M, N, K, dt in shapes:
        a = cp.asarray(rng.standard_normal((M, K)).astype(dt))
        b = cp.asarray(rng.standard_normal((K, N)).astype(dt))
        c = cp.empty((M, N), dt)
        calls = {"new": lambda: new.gemm(a, b, c), "old": lambda: old.gemm(a, b, c)}
        if torch is not None:
            ta, tb, tc = (torch.as_tensor(x, device="cuda") for x in (a, b, c))
            calls["torch"] = lambda: torch.mm(ta, tb, out=tc)
        for fn in calls.values():          # first calls: each build tunes its way
            for _ in range(3):
                fn()
        cp.cuda.Device().synchronize()
        times = {k: [] for k in calls}
        reps = 10
        for r in range(rounds):
            # The order turns every round: at 8192^3 the GPU runs into its power limit, and
            # whoever runs right after another's burst would otherwise always pay for it.
            order = list(calls.items())
            for name, fn in order[r % len(order):] + order[:r % len(order)]:
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record()
                for _ in range(reps):
                    fn()
                e1.record()
                e1.synchronize()
                times[name].append(cp.cuda.get_elapsed_time(e0, e1) / reps)
        med = {k: statistics.median(v) for k, v in times.items()}
        out[f"{M}x{N}x{K} {dt}"] = {k: {"ms": v, "tflops": 2 * M * N * K / v / 1e9} for k, v in med.items()}
        del a, b, c
        cp.get_default_memory_pool().free_all_blocks()
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description="This build of cygemm against another (cygemm_old), interleaved.")
    p.add_argument("--out", default="out", help="folder for compare_builds.json/.md (default: ./out)")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds per row (default 15)")
    args = p.parse_args(argv)
    import cupy as cp
    import cygemm as new
    import cygemm_old as old
    try:
        import torch
    except ImportError:
        torch = None
    from benchmarks.common import environment
    env = environment(cp, {"torch": getattr(torch, "__version__", None), "new": new.__file__, "old": old.__file__})
    host = host_rows(cp, new, old, torch, args.rounds)
    large = large_rows(cp, new, old, torch, args.rounds)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compare_builds.json"), "w") as f:
        json.dump({"environment": env, "host_us": host, "large": large}, f, indent=1)
    lines = [f"GPU {env['gpu']}, driver {env['driver']}, cuBLASLt {env['cublasLt']}, CuPy {env['cupy']}, "
             f"torch {env['torch']}, {env['date']}", "", "| host, 64^3 float32 | us per call |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in host.items()]
    lines += ["", "| large GEMM | new ms | old ms | new/old time | torch ms |", "|---|---|---|---|---|"]
    for shape, r in large.items():
        lines.append(f"| {shape} | {r['new']['ms']:.4f} | {r['old']['ms']:.4f} | "
                     f"{r['new']['ms'] / r['old']['ms']:.3f} | {r.get('torch', {}).get('ms', float('nan')):.4f} |")
    text = "\n".join(lines)
    with open(os.path.join(args.out, "compare_builds.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
