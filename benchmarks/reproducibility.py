"""Benchmark section: what reproducibility costs. The same GEMM under each determinism mode
("off", "run_to_run", "batch_invariant"), on the same operands in interleaved rounds, at
M in {1, 16, 128, 1024, 8192} rows against weights of 4096 x 4096 and 8192 x 8192, in TF32,
bfloat16 and FP8 (E4M3 in, bfloat16 out). Each row's ``vs_off`` is its time over "off"'s in
the same case.

Before timing, every mode runs once outside the timed rounds: "off" times its candidates then
(as any first call of a large problem does), the other modes choose within their family."""
import cupy as cp
import numpy as np

import cygemm
from cygemm import fp8
from recorder import inner_for

MODES = ("off", "run_to_run", "batch_invariant")
ROWS = (1, 16, 128, 1024, 8192)
WEIGHTS = (4096, 8192)


def _gemm_contenders(x, wt, out, math, stream):
    return {f"cygemm determinism={mode}": (lambda mode=mode: cygemm.gemm(x, wt, out, trans_b=True, math=math, stream=stream,
                                                 determinism=mode)) for mode in MODES}


def _fp8_contenders(a, wt, sa, sb, out, stream):
    return {f"cygemm determinism={mode}": (lambda mode=mode: fp8.scaled_matmul(
        a, wt.T, sa, sb, out=out, format_a="e4m3", format_b="e4m3", determinism=mode, stream=stream))
        for mode in MODES}


def determinism_section(R, s, floor):
    """Each mode's time on the same GEMM (x (M, K) @ w.T, w stored (N, K) as a linear layer's)."""
    import ml_dtypes
    rng = np.random.default_rng(0)
    weights = WEIGHTS[:1] if R.quick else WEIGHTS
    rows = ROWS[::2] if R.quick else ROWS
    old = cygemm.get_options()["determinism"]
    try:
        for n in weights:
            k = n
            w32 = rng.standard_normal((n, k)).astype(np.float32)
            x32 = rng.standard_normal((max(rows), k)).astype(np.float32)
            kinds = {"tf32": (cp.asarray(x32), cp.asarray(w32), "tf32", cp.float32),
                     "bf16": (cp.asarray(x32.astype(ml_dtypes.bfloat16)), cp.asarray(w32.astype(ml_dtypes.bfloat16)),
                              "tf32", ml_dtypes.bfloat16)}
            for kind, (x, w, math, out_dtype) in kinds.items():
                for m in rows:
                    case = f"{kind} M={m} N=K={n}"
                    R.progress(case)
                    out = cp.empty((m, n), dtype=out_dtype)
                    contenders = _gemm_contenders(x[:m], w, out, math, s.ptr)
                    for call in contenders.values():
                        call()
                    s.synchronize()
                    _measure(R, case, contenders, s, 2.0 * m * n * k)
                del x, w
            quarter = cp.asarray([0.25], cp.float32)
            a8 = fp8.quantize(cp.asarray(x32), quarter, format="e4m3", stream=s.ptr)
            w8 = fp8.quantize(cp.asarray(w32), quarter, format="e4m3", stream=s.ptr)
            sa, sb = cp.asarray([4.0], cp.float32), cp.asarray([4.0], cp.float32)
            for m in rows:
                case = f"fp8 M={m} N=K={n}"
                R.progress(case)
                out = cp.empty((m, n), dtype=ml_dtypes.bfloat16)
                contenders = _fp8_contenders(a8[:m], w8, sa, sb, out, s.ptr)
                for call in contenders.values():
                    call()
                s.synchronize()
                _measure(R, case, contenders, s, 2.0 * m * n * k)
            del a8, w8
            cp.get_default_memory_pool().free_all_blocks()
    finally:
        cygemm.set_options(determinism=old)


def _measure(R, case, contenders, s, flop):
    rows = R.measure(case, contenders, s, flop=flop, inner=inner_for(flop), reps=15 if flop < 1e10 else 10,
                     rounds=5)
    off = next((r["value"] for r in rows if r["contender"] == "cygemm determinism=off"), None)
    for r in rows:
        if off:
            r["vs_off"] = r["value"] / off
