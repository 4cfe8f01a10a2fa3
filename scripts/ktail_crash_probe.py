"""Diagnose a crash in the float32 K-tail sweep: run its shapes one by one, logging each first."""
import os
import sys

import cupy as cp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "engine"))
import cygemm
from cygemm import plans
from cygemm.engine import ktail as _ktail
from test_ktail import _sweep_shapes, _detector

guarded = sys.argv[1] == "on"
math = sys.argv[2]
log = open(sys.argv[3], "w")
_ktail.set_enabled(guarded)
for m, n, k, pad in _sweep_shapes(2000, 37):
    log.write(f"{m} {n} {k} {pad}\n")
    log.flush()
    a, b = _detector(cp, "float32", m, n, k)
    if pad:
        a = cp.pad(a, ((0, 0), (0, 1)))[:, :k]
        b = cp.pad(b, ((0, 0), (0, 1)))[:, :n]
        a[:, 0], a[:, k - 1] = 1, 1
    c = cp.full((m, n), cp.nan, a.dtype)
    cygemm.gemm(a, b, out=c, math=math)
    cp.cuda.Device().synchronize()
log.write("all ran\n")
