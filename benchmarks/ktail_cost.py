"""What the K-tail guard costs: GPU time per GEMM with the guard and without it (cuBLAS alone),
on the shapes where it acts and on shapes where it must not (the same bits there).

Each case is captured as a CUDA graph of 20 cygemm.gemm calls and launched 5 times per round;
rounds alternate guard on / off, 5 rounds, medians. python -m benchmarks.ktail_cost [--out FILE]
"""
import argparse
import statistics

import cupy as cp

import cygemm
from cygemm import plans
from cygemm.engine import ktail as _ktail
from cygemm.graph import capture
from benchmarks.common import write_probe_results

ACTS = [(64, 256, 32776), (256, 128, 32776), (16, 512, 24584), (8, 128, 40968), (1, 1024, 32776),
        (1, 64, 40968), (128, 256, 32776), (64, 1024, 32776)]
CONTROLS = [(64, 256, 32768), (64, 256, 32780), (4096, 4096, 4100), (1024, 1024, 1000), (64, 64, 64)]


def detector(dtype, m, n, k):
    a = cp.zeros((m, k), dtype)
    a[:, 0] = 1
    a[:, -1] = 1
    return a, cp.ones((k, n), dtype)


def graph_us(a, b, c, stream, reps=20):
    cygemm.gemm(a, b, out=c, stream=stream)
    stream.synchronize()
    with capture(stream) as g:
        for _ in range(reps):
            cygemm.gemm(a, b, out=c, stream=stream)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(5):
        e0.record(stream)
        g.launch(stream)
        e1.record(stream)
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1) * 1000 / reps)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from cygemm.engine.alloc import numpy_dtype
    stream = cp.cuda.Stream(non_blocking=True)
    rows = []
    for dtype in (numpy_dtype("bfloat16"), cp.float16):
        for kind, shapes in (("acts", ACTS), ("control", CONTROLS)):
            for m, n, k in shapes:
                a, b = detector(dtype, m, n, k)
                times = {True: [], False: []}
                outs = {}
                for r in range(args.rounds):
                    for on in ((True, False) if r % 2 == 0 else (False, True)):
                        _ktail.set_enabled(on)
                        plans.clear_plan_cache()
                        c = cp.full((m, n), cp.nan, dtype)
                        times[on].append(graph_us(a, b, c, stream))
                        outs[on] = c.copy()
                _ktail.set_enabled(True)
                plans.clear_plan_cache()
                on, off = statistics.median(times[True]), statistics.median(times[False])
                row = {"dtype": cp.dtype(dtype).name, "kind": kind, "M": m, "N": n, "K": k,
                       "guarded_us": round(on, 3), "cublas_us": round(off, 3), "ratio": round(on / off, 4),
                       "guarded_wrong": int((outs[True].astype(cp.float32) != 2).sum()),
                       "cublas_wrong": int((outs[False].astype(cp.float32) != 2).sum()),
                       "same_bits": bool((outs[True].view(cp.uint16) == outs[False].view(cp.uint16)).all()),
                       "spread_guarded": [round(min(times[True]), 3), round(max(times[True]), 3)],
                       "spread_cublas": [round(min(times[False]), 3), round(max(times[False]), 3)]}
                rows.append(row)
                print(f"{row['dtype']:9s} {kind:7s} M={m:<5d} N={n:<5d} K={k:<6d} guarded {on:8.2f} us  "
                      f"cuBLAS {off:8.2f} us  {on / off:.3f}x  wrong {row['guarded_wrong']}/{row['cublas_wrong']}  "
                      f"same bits {row['same_bits']}", flush=True)
    if args.out:
        write_probe_results(args.out, rows)


if __name__ == "__main__":
    main()
