"""cygemm.gemm / gemm_strided_batched against cp.matmul and the C++ cuBLAS floor, in one run.

    python benchmarks/bench_gemm.py [--out DIR]

Prints a Markdown table and writes DIR/bench_gemm.json.
"""
import os

os.environ.setdefault("CUPY_TF32", "1")   # cp.matmul's float32 rows use TF32, like cygemm's default

import argparse
import json
import sys
import tempfile

import cupy as cp
import numpy as np

import cygemm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import build_floor, environment, gpu_ms, interleaved_host_us, run_floor  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def rand(shape):
    return cp.asarray(np.random.default_rng(0).standard_normal(shape, dtype=np.float32))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []

    exe = build_floor(os.path.join(HERE, "cublas_floor.cu"), os.path.join(tempfile.mkdtemp(), "cublas_floor"))
    floor = {(r["case"], r.get("math")): r for r in run_floor(exe)}

    s = cp.cuda.Stream(non_blocking=True)
    sync = s.synchronize

    # Host time per call at 64^3, interleaved with the C++ floor (same moments).
    A, B, C = rand((64, 64)), rand((64, 64)), rand((64, 64))
    ptr = s.ptr
    s.use()      # CuPy's current stream for the stream=None and cp.matmul rows
    ours = {}
    for math in ("tf32", "fp32"):
        ours[("cygemm.gemm (stream=None)", math)] = lambda m=math: cygemm.gemm(A, B, C, math=m)
        ours[("cygemm.gemm (stream=int)", math)] = lambda m=math: cygemm.gemm(A, B, C, math=m, stream=ptr)
    ours[("cp.matmul(out=) CUPY_TF32=1", "tf32")] = lambda: cp.matmul(A, B, out=C)
    floors, mine = interleaved_host_us(exe, ours, sync)
    # Where cygemm's own host time goes (pure Python/Cython work, nothing launched).
    import timeit
    from cygemm import _core, rowmajor
    parts = {"resolve stream=None": lambda: cygemm.stream_pointer(None),
             "read one CuPy array": lambda: _core.describe_array(A),
             "validate + map 3 arrays (describe_gemm)": lambda: rowmajor.describe_gemm(A, B, C)}
    for name, fn in parts.items():
        us = min(timeit.repeat(fn, number=20000, repeat=5)) / 20000 * 1e6
        rows.append(dict(case="cygemm host overhead parts", contender=name, value=us, unit="us"))
    cp.cuda.Stream.null.use()
    for math in ("tf32", "fp32"):
        raw = floors[("host_per_call_64", math)]
        raw_med = float(np.median(raw))
        case = f"64^3 host us/call ({math})"
        for (name, m), per_round in mine.items():
            if m == math:
                rows.append(dict(case=case, contender=name, value=float(np.median(per_round)),
                                 lo=min(per_round), hi=max(per_round), unit="us", floor=raw_med))
        rows.append(dict(case=case, contender="C++ cublasGemmEx", value=raw_med, lo=min(raw), hi=max(raw),
                         unit="us", floor=raw_med))

    # 8192^3 TF32 throughput.
    n = 8192
    A, B, C = rand((n, n)), rand((n, n)), rand((n, n))
    flops = 2.0 * n ** 3
    med, lo, hi = gpu_ms(cp, lambda: cygemm.gemm(A, B, C, stream=s), s)
    rows.append(dict(case="8192^3 TF32 ms", contender="cygemm.gemm", value=med, lo=lo, hi=hi, unit="ms", tflops=flops / med / 1e9))
    with s:
        med, lo, hi = gpu_ms(cp, lambda: cp.matmul(A, B, out=C), s)
    rows.append(dict(case="8192^3 TF32 ms", contender="cp.matmul CUPY_TF32=1", value=med, lo=lo, hi=hi, unit="ms", tflops=flops / med / 1e9))
    raw = floor[("square_8192_tf32", None)]["ms"]
    rows.append(dict(case="8192^3 TF32 ms", contender="C++ cublasGemmEx", value=raw, unit="ms", tflops=flops / raw / 1e9))
    del A, B, C

    # 16384 batched 64^3 TF32.
    batch = 16384
    A, B, C = rand((batch, 64, 64)), rand((batch, 64, 64)), rand((batch, 64, 64))
    med, lo, hi = gpu_ms(cp, lambda: cygemm.gemm_strided_batched(A, B, C, stream=s), s, reps=50)
    rows.append(dict(case="16384 x 64^3 batched TF32 ms", contender="cygemm.gemm_strided_batched", value=med, lo=lo, hi=hi, unit="ms"))
    with s:
        med, lo, hi = gpu_ms(cp, lambda: cp.matmul(A, B, out=C), s, reps=50)
    rows.append(dict(case="16384 x 64^3 batched TF32 ms", contender="cp.matmul (3-D) CUPY_TF32=1", value=med, lo=lo, hi=hi, unit="ms"))
    rows.append(dict(case="16384 x 64^3 batched TF32 ms", contender="C++ cublasGemmStridedBatchedEx",
                     value=floor[("batched_16384x64_tf32", None)]["ms"], unit="ms"))

    env = environment(cp)
    with open(os.path.join(args.out, "bench_gemm.json"), "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=1)
    md = render(env, rows)
    print(md)


def render(env, rows):
    lines = [f"GPU {env['gpu']}, driver {env['driver']}, CUDA runtime {env['cuda_runtime']}, "
             f"cuBLASLt {env['cublasLt']}, CuPy {env['cupy']}, {env['date']}, clocks {env['clocks_sm_mem_mhz']}", "",
             "| case | contender | median | min | max | note |", "|---|---|---|---|---|---|"]
    for r in rows:
        note = ""
        if "tflops" in r:
            note = f"{r['tflops']:.1f} TFLOP/s"
        elif r.get("floor") and "C++" not in r["contender"]:
            note = f"{r['value'] - r['floor']:+.2f} us vs C++"
        fmt = (lambda v: f"{v:.2f}") if r["unit"] == "us" else (lambda v: f"{v:.4f}")
        lo = fmt(r["lo"]) if "lo" in r else ""
        hi = fmt(r["hi"]) if "hi" in r else ""
        lines.append(f"| {r['case']} | {r['contender']} | {fmt(r['value'])} | {lo} | {hi} | {note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
