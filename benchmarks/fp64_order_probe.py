"""Probe: float64 GEMMs of cygemm.matmul, cp.matmul and torch.matmul on the same operands, in
rounds whose order rotates, so that a contender's place in the round (the GPU's power state
after the one before) is told apart from the contender. Prints per-contender and per-place
medians (ms). FP64 GEMMs at 8192^3 draw the H200 to its power limit.
    python benchmarks/fp64_order_probe.py [N ...]"""
import statistics
import sys

import cupy as cp
import numpy as np
import torch

import cygemm


def main(sizes):
    s = cp.cuda.Stream(non_blocking=True)
    ts = torch.cuda.ExternalStream(s.ptr)
    for n in sizes:
        rng = np.random.default_rng(1)
        with s:
            a, b = cp.asarray(rng.standard_normal((n, n))), cp.asarray(rng.standard_normal((n, n)))
            out = cp.empty((n, n))
        ta, tb, tout = (torch.from_dlpack(x) for x in (a, b, out))

        def torch_mm():
            with torch.cuda.stream(ts):
                torch.matmul(ta, tb, out=tout)

        def cupy_mm():
            with s:
                cp.matmul(a, b, out=out)

        fns = {"cygemm.matmul": lambda: cygemm.matmul(a, b, out, stream=s), "cp.matmul": cupy_mm,
               "torch.matmul": torch_mm}
        names = list(fns)
        by_name = {k: [] for k in names}
        by_place = {i: [] for i in range(len(names))}
        for r in range(9):
            order = names[r % 3:] + names[:r % 3]
            for place, name in enumerate(order):
                for _ in range(2):
                    fns[name]()
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(s)
                for _ in range(5):
                    fns[name]()
                e1.record(s)
                e1.synchronize()
                ms = cp.cuda.get_elapsed_time(e0, e1) / 5
                by_name[name].append(ms)
                by_place[place].append(ms)
        print(f"float64 {n}^3: " + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in by_name.items())
              + " | by place: " + ", ".join(f"{i}: {statistics.median(v):.3f}" for i, v in by_place.items()))
        print("  " + "; ".join(f"{k} min {min(v):.3f} max {max(v):.3f}" for k, v in by_name.items()))


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [4096, 8192])
