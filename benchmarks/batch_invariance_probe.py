"""Probe: cuBLASLt's own batch invariance (CUBLASLT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS, 13.10)
through cygemm's batch_invariance="cublas", with the first-use check of "batch_invariant" set
aside so that the flag itself is what answers. For each dtype, math, shape and layout: whether
cuBLASLt offers an algorithm under the flag, and whether the rows of M = 1, 7, 300, 1000 are
bitwise the first rows of M = 2048's. Also the kernel families' way, for comparison.
    python benchmarks/batch_invariance_probe.py"""
import json

import cupy as cp
import numpy as np

import cygemm
from cygemm.engine import promises


def probe(way):
    cygemm.set_options(batch_invariance=way)
    rows = []
    rng = np.random.default_rng(0)
    kinds = [(t, "tf32") for t in promises.half_dtypes(cp)] + [(cp.float32, "tf32"), (cp.float32, "fp32")]
    for dtype, math in kinds:
        for n, k in ((768, 1024), (1024, 1024), (4096, 4096)):
            for trans_b in (False, True):
                x = cp.asarray(rng.standard_normal((2048, k)).astype(np.float32)).astype(dtype)
                w = cp.asarray(rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)).astype(dtype)
                row = {"way": way, "dtype": np.dtype(dtype).name, "math": math, "n": n, "k": k, "trans_b": trans_b}
                try:
                    full = cygemm.gemm(x, w, trans_b=trans_b, math=math, determinism="batch_invariant")
                    same = {}
                    for m in (1, 7, 300, 1000):
                        part = cygemm.gemm(x[:m], w, trans_b=trans_b, math=math, determinism="batch_invariant")
                        bits = cp.uint32 if part.dtype.itemsize == 4 else cp.uint16
                        same[m] = bool((part.view(bits) == full[:m].view(bits)).all())
                    row["same_bits"] = same
                except Exception as e:          # (what the probe is for: which problems the flag refuses)
                    row["error"] = f"{type(e).__name__}: {e}"[:220]
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def main():
    promises._checking.add("batch_invariant")       # the flag answers, not the first-use check
    print(json.dumps(cygemm.versions(), default=str)[:300])
    probe("cublas")
    probe("families")


if __name__ == "__main__":
    main()
