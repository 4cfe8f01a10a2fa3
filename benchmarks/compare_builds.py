"""Two builds of cygemm in one process, interleaved on the same operands: this tree's
(`cygemm`) and another commit's, built as `cygemm_old` by scripts/build_renamed.sh.

    bash scripts/build_renamed.sh 9579766 /tmp/old
    PYTHONPATH=/tmp/old python3 -m benchmarks.compare_builds --out DIR

Bits rows: the same calls through both builds in every determinism mode ("off" with autotune
off, "run_to_run", "batch_invariant"), on the same seeded operands: whether the results are
bitwise equal. Host rows: 64^3 float32 calls timed on the host (median of interleaved rounds of 300 calls
each, enqueued behind a sleeping kernel so that only the host's time counts, the calls in a
shuffled order each round), with torch.mm(out=) and cp.matmul(out=) in the same rounds; and each
call's new/old ratio per round (median, min, max: what one run's figure varies by). Where this
tree is built a second time as `cygemm_same`, its calls join the rounds and new/same is the A/A
ratio: what the method reads where the code is the same. Large rows: CUDA-event time per GEMM (median of interleaved rounds, each
contender warmed up, i.e. tuned, first). Writes compare_builds.json and .md to --out.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def host_rows(cp, builds, torch, rounds):
    """Host time per 64^3 float32 call of each build in `builds` ({"new": module, "old": ...,
    "same": ...}), cp.matmul and torch.mm, interleaved. Each timed batch of calls is enqueued
    behind a sleeping kernel that outlasts it, so the figure is the host's alone (what the
    call costs before the GPU could start), not the GPU's throughput on tiny kernels: a
    difference of half a microsecond in a 13 us call is otherwise lost in launch gaps.
    Returns the medians, the paired ratios, and what each build's describe_gemm says it runs."""
    from benchmarks.common import spin
    rng = np.random.default_rng(0)
    a, b, bias = (cp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((64, 64), (64, 64), (64,)))
    c = cp.empty((64, 64), cp.float32)
    calls = {}
    for tag, m in builds.items():
        calls[f"gemm(a, b, out=c) {tag}"] = lambda m=m: m.gemm(a, b, c)
        calls[f"forward_into relu+bias {tag}"] = lambda m=m: m.gemm_ops.forward_into(a, b, c, bias, act="relu")
        calls[f"matmul(a, b, out=c) {tag}"] = lambda m=m: m.matmul(a, b, c)
    calls["cp.matmul(a, b, out=c)"] = lambda: cp.matmul(a, b, out=c)
    if torch is not None:
        ta, tb, tc = (torch.as_tensor(x, device="cuda") for x in (a, b, c))
        torch.backends.cuda.matmul.allow_tf32 = True
        calls["torch.mm(a, b, out=c)"] = lambda: torch.mm(ta, tb, out=tc)
    described = {}
    for tag, m in builds.items():        # what each build says it runs (its route, its kernels)
        d = m.describe_gemm(a, b, c)
        described[tag] = {k: v for k, v in d.items() if k in ("route", "kernels", "compute", "determinism")}
    stream = cp.cuda.get_current_stream()
    n = 300                 # well inside the driver's queue of pending launches: enqueueing never waits
    times = {k: [] for k in calls}
    for fn in calls.values():
        for _ in range(300):
            fn()
    cp.cuda.Device().synchronize()
    order = list(calls)
    shuffle = np.random.default_rng(1)
    for _ in range(rounds):
        shuffle.shuffle(order)          # (no call always runs first, or right after another)
        for name in order:
            fn = calls[name]
            spin(cp, stream, n * 60)     # 60 us a call: several times any call's host time
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            t1 = time.perf_counter()
            cp.cuda.Device().synchronize()
            times[name].append((t1 - t0) / n * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}, _paired_ratios(times, list(builds)[1:]), described


def _paired_ratios(times, others):
    """Per call and other build, new/other time of each round (both timed in it): the median
    and the range over the rounds, which says how far one run's figure can be trusted. The
    ratio to `same` (this tree built twice) is what the method reads where nothing differs."""
    out = {}
    for name in times:
        if name.endswith(" new"):
            base = name[:-4]
            for other in others:
                ratios = sorted(a / b for a, b in zip(times[name], times[f"{base} {other}"]))
                out[f"{base} new/{other}"] = {"median": statistics.median(ratios), "min": ratios[0],
                                              "max": ratios[-1]}
    return out


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


def bits_rows(cp, new, old):
    """{call: {mode: equal bits}} for gemm, gemm_strided_batched, matmul and the dense forward."""
    import ml_dtypes
    rng = np.random.default_rng(2)

    def arr(shape, dt):
        return cp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(
            ml_dtypes.bfloat16 if dt == "bfloat16" else dt)

    cases = {
        "gemm 1000x768x1024 float32 tf32": (lambda m: m.gemm, (arr((1000, 1024), "float32"), arr((1024, 768), "float32")), {}),
        "gemm 300x1024x4096 bfloat16": (lambda m: m.gemm, (arr((300, 4096), "bfloat16"), arr((4096, 1024), "bfloat16")), {}),
        "gemm 7x4096x1024 float16": (lambda m: m.gemm, (arr((7, 1024), "float16"), arr((1024, 4096), "float16")), {}),
        "gemm 2048^3 float32 fp32": (lambda m: m.gemm, (arr((2048, 2048), "float32"), arr((2048, 2048), "float32")),
                                     {"math": "fp32"}),
        "gemm_strided_batched 64x(64^3) float32": (lambda m: m.gemm_strided_batched,
                                                   (arr((64, 64, 64), "float32"), arr((64, 64, 64), "float32")), {}),
        "matmul (4,128,256)@(256,512) bfloat16": (lambda m: m.matmul, (arr((4, 128, 256), "bfloat16"),
                                                                       arr((256, 512), "bfloat16")), {}),
        "forward_into relu+bias 512x1024x768 bfloat16": (
            lambda m: (lambda x, w, **kw: forward(m, x, w, **kw)),
            (arr((512, 768), "bfloat16"), arr((768, 1024), "bfloat16")), {}),
    }
    bias = arr((1024,), "bfloat16")

    def forward(m, x, w, **kw):
        y = cp.full((x.shape[0], w.shape[1]), np.nan, x.dtype)
        m.gemm_ops.forward_into(x, w, y, bias, act="relu", **kw)
        return y
    modes = {"off": {"determinism": "off", "autotune": "off"}, "run_to_run": {"determinism": "run_to_run"},
             "batch_invariant": {"determinism": "batch_invariant"}}
    out = {}
    for name, (entry, args, kw) in cases.items():
        out[name] = {}
        for mode, policy in modes.items():
            r_new = entry(new)(*args, **kw, **policy)
            r_old = entry(old)(*args, **kw, **policy)
            r_new, r_old = (r[0] if isinstance(r, tuple) else r for r in (r_new, r_old))
            view = cp.uint16 if r_new.dtype.itemsize == 2 else cp.uint32
            out[name][mode] = bool(cp.array_equal(cp.ascontiguousarray(r_new).view(view),
                                                  cp.ascontiguousarray(r_old).view(view)))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description="This build of cygemm against another (cygemm_old), interleaved.")
    p.add_argument("--out", default="out", help="folder for compare_builds.json/.md (default: ./out)")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds per row (default 15)")
    p.add_argument("--rows", default="bits,host,large", help="which rows (default bits,host,large)")
    args = p.parse_args(argv)
    rows = args.rows.split(",")
    import cupy as cp
    import cygemm as new
    import cygemm_old as old
    builds = {"new": new, "old": old}
    try:
        import cygemm_same          # this tree built again (scripts/build_renamed.sh HEAD DIR cygemm_same)
        builds["same"] = cygemm_same
    except ImportError:
        pass
    try:
        import torch
    except ImportError:
        torch = None
    from benchmarks.common import environment
    env = environment(cp, {"torch": getattr(torch, "__version__", None), "new": new.__file__, "old": old.__file__})
    bits = bits_rows(cp, new, old) if "bits" in rows else {}
    host, ratios, described = host_rows(cp, builds, torch, args.rounds) if "host" in rows else ({}, {}, {})
    large = large_rows(cp, new, old, torch, args.rounds) if "large" in rows else {}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compare_builds.json"), "w") as f:
        json.dump({"environment": env, "bits": bits, "host_us": host, "host_new_over_old": ratios,
                   "described": described, "large": large},
                  f, indent=1)
    lines = [f"GPU {env['gpu']}, driver {env['driver']}, cuBLASLt {env['cublasLt']}, CuPy {env['cupy']}, "
             f"torch {env['torch']}, {env['date']}", "", "| host, 64^3 float32 | us per call |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in host.items()]
    lines += [f"| described: {k} | {v} |" for k, v in described.items()]
    lines += ["", "| host, new/other per round | median | min | max |", "|---|---|---|---|"]
    lines += [f"| {k} | {r['median']:.3f} | {r['min']:.3f} | {r['max']:.3f} |" for k, r in ratios.items()]
    lines += ["", "| large GEMM | new ms | old ms | new/old time | torch ms |", "|---|---|---|---|---|"]
    for shape, r in large.items():
        lines.append(f"| {shape} | {r['new']['ms']:.4f} | {r['old']['ms']:.4f} | "
                     f"{r['new']['ms'] / r['old']['ms']:.3f} | {r.get('torch', {}).get('ms', float('nan')):.4f} |")
    if bits:
        lines += ["", "| same bits, new and old | " + " | ".join(next(iter(bits.values()))) + " |",
                  "|---|" + "---|" * len(next(iter(bits.values())))]
        lines += [f"| {k} | " + " | ".join("yes" if v else "**no**" for v in r.values()) + " |" for k, r in bits.items()]
    text = "\n".join(lines)
    with open(os.path.join(args.out, "compare_builds.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
