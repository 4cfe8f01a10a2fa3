"""What determinism="batch_invariant" costs against "off": GPU time per GEMM from CUDA graphs,
and the host time of the first call of a new M (the plan's decision). Both ways of keeping it
where the loaded cuBLASLt has cuBLAS's own flag: the kernel families ("batch_invariant") and
cuBLASLt's flag ("batch_invariant/cublas": set_options(batch_invariance="cublas")).

The GEMMs are a linear layer's, x (M, K) @ w.T with w stored (N, K). Each case is decided once per
mode outside the timed rounds, then captured as a graph of 20 calls per mode; the modes' graphs
are launched in interleaved rounds (order rotated), medians of --rounds. With --kernels the
kernels each mode runs are listed (torch's profiler, where torch is installed).

    python -m benchmarks.batch_invariant_cost [--out FILE] [--rounds 5] [--kernels]
"""
import argparse
import statistics
import time

import cupy as cp
import numpy as np

import cygemm
from cygemm import plans
from cygemm.graph import capture
from benchmarks.common import write_probe_results

def _modes():
    from cygemm.engine import lt_features
    modes = ("off", "run_to_run", "batch_invariant")
    return modes + (("batch_invariant/cublas",) if lt_features.feature_gate("batch_invariance") is None else ())


MODES = _modes()
# (dtype, N, K, rows): the three cases and their neighbours
CASES = [("tf32", 5120, 5120, (1024, 2048, 8192)),
         ("bf16", 1024, 4096, (1, 2, 4, 3, 8, 5, 16, 12, 64, 48, 256, 200, 1024, 1000)),
         ("bf16", 14336, 4096, (1, 16, 128, 512, 1024, 4096))]
FIRST_CALL_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 24, 31, 32, 33, 48, 64, 100, 128, 200, 256, 300, 1000)


def _operands(kind, n, k, m_max, rng):
    import ml_dtypes
    dtype = np.float32 if kind == "tf32" else ml_dtypes.bfloat16
    x = cp.asarray(rng.standard_normal((m_max, k)).astype(np.float32).astype(dtype))
    w = cp.asarray(rng.standard_normal((n, k)).astype(np.float32).astype(dtype))
    return x, w, dtype


def _call(x, w, out, mode, stream):
    determinism, _, way = mode.partition("/")
    old = cygemm.set_options(batch_invariance=way or "families")
    try:
        cygemm.gemm(x, w, out, trans_b=True, math="tf32", determinism=determinism, stream=stream)
    finally:
        cygemm.set_options(**old)


def _graph(x, w, out, mode, stream, calls):
    with capture(stream) as g:
        for _ in range(calls):
            _call(x, w, out, mode, stream)
    return g


def _time(g, stream, calls):
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record(stream)
    g.launch(stream)
    e1.record(stream)
    e1.synchronize()
    return cp.cuda.get_elapsed_time(e0, e1) * 1000 / calls


def speed(rows_out, rounds, stream, calls=20):
    rng = np.random.default_rng(0)
    for kind, n, k, ms in CASES:
        x, w, dtype = _operands(kind, n, k, max(ms), rng)
        for m in ms:
            out = cp.empty((m, n), dtype)
            first = {}
            for mode in MODES:
                t0 = time.perf_counter()
                _call(x[:m], w, out, mode, stream)
                stream.synchronize()
                first[mode] = (time.perf_counter() - t0) * 1e3
            graphs = {mode: _graph(x[:m], w, out, mode, stream, calls) for mode in MODES}
            times = {mode: [] for mode in MODES}
            for r in range(rounds):
                order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
                for mode in order:
                    graphs[mode].launch(stream)      # (warm)
                    times[mode].append(_time(graphs[mode], stream, calls))
            off = statistics.median(times["off"])
            for mode in MODES:
                t = statistics.median(times[mode])
                row = {"case": f"{kind} M={m} N={n} K={k}", "mode": mode, "gpu_us": round(t, 3),
                       "vs_off": round(t / off, 4), "spread_us": [round(min(times[mode]), 3), round(max(times[mode]), 3)],
                       "first_call_ms": round(first[mode], 2)}
                rows_out.append(row)
                print(f"{row['case']:28s} {mode:16s} {t:9.2f} us  {t / off:6.3f}x off  "
                      f"[{row['spread_us'][0]}, {row['spread_us'][1]}]  first call {first[mode]:7.2f} ms", flush=True)
        del x, w
        cp.get_default_memory_pool().free_all_blocks()


def first_calls(rows_out, stream):
    """Host time of the first call of each new M (bf16, N = 14336, K = 4096), in that order, for
    each way of keeping batch_invariant."""
    rng = np.random.default_rng(1)
    x, w, dtype = _operands("bf16", 14336, 4096, max(FIRST_CALL_ROWS), rng)
    for mode in [m for m in MODES if m.startswith("batch_invariant")]:
        cygemm.tuning.clear_tuning()
        plans.clear_plan_cache()
        for m in FIRST_CALL_ROWS:
            out = cp.empty((m, 14336), dtype)
            t0 = time.perf_counter()
            _call(x[:m], w, out, mode, stream)
            stream.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            t0 = time.perf_counter()
            _call(x[:m], w, out, mode, stream)
            stream.synchronize()
            again = (time.perf_counter() - t0) * 1e3
            rows_out.append({"case": f"first call bf16 M={m} N=14336 K=4096", "mode": mode,
                             "first_call_ms": round(ms, 3), "second_call_ms": round(again, 3)})
            print(f"{mode:24s} first call M={m:<5d} {ms:8.2f} ms (second {again:.3f} ms)", flush=True)


def kernels(stream):
    try:
        import torch
        from torch.profiler import profile, ProfilerActivity
    except ImportError:
        print("kernels: torch not installed")
        return
    rng = np.random.default_rng(2)
    for kind, n, k, m in (("tf32", 5120, 5120, 8192), ("bf16", 1024, 4096, 4), ("bf16", 1024, 4096, 16)):
        x, w, dtype = _operands(kind, n, k, m, rng)
        out = cp.empty((m, n), dtype)
        for mode in MODES:
            _call(x, w, out, mode, stream)
            stream.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    _call(x, w, out, mode, stream)
                stream.synchronize()
            names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
            print(f"kernels {kind} M={m} N={n} K={k} {mode}: {names}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kernels", action="store_true")
    args = ap.parse_args()
    stream = cp.cuda.Stream(non_blocking=True)
    rows = []
    first_calls(rows, stream)
    plans.clear_plan_cache()
    speed(rows, args.rounds, stream)
    if args.kernels:
        kernels(stream)
    if args.out:
        write_probe_results(args.out, rows)


if __name__ == "__main__":
    main()
