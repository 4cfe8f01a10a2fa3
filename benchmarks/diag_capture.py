"""Diagnostic: which conditions make a cuBLASLt call invalidate a stream capture.
Each variant runs in a fresh process; prints one line per variant."""
import os
import subprocess
import sys

VARIANT = r'''
import os, sys
sys.path.insert(0, "benchmarks")
import cupy as cp, numpy as np
import cygemm
from mlp import MLP
v = sys.argv[1]
if "torch" in v:
    import torch
s = cp.cuda.Stream(non_blocking=True)
if "big" in v:
    from cygemm.gemm_ops import forward_into, ensure_workspaces
    A, B, b = cp.ones((8192, 1024), cp.float32), cp.ones((1024, 8192), cp.float32), cp.ones(8192, cp.float32)
    Y = cp.empty((8192, 8192), cp.float32)
    forward_into(A, B, Y, b, act="relu", stream=s); s.synchronize()
m = MLP(math=os.environ.get("MATH", "tf32"))
m.x[...] = cp.asarray(np.random.default_rng(0).standard_normal((64, 64), dtype=np.float32))
m.target[...] = 0.5
steps = 50 if "many" in v else 1
for _ in range(steps):
    m.step(s)
s.synchronize()
mode = "relaxed" if "relaxed" in v else "thread_local"
try:
    with cygemm.graph.capture(s, mode=mode) as g:
        m.step(s)
    g.launch(s); s.synchronize()
    print("OK", g.num_nodes)
except Exception as e:
    print("FAIL", type(e).__name__, str(e)[:150])
'''

for v in ["plain", "many", "torch", "big", "big-many", "big-relaxed", "plain-relaxed"]:
    for env_extra in ({}, {"MATH": "fp32"}):
        env = dict(os.environ, **env_extra)
        p = subprocess.run([sys.executable, "-c", VARIANT, v], capture_output=True, text=True, env=env, timeout=120)
        tail = (p.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"{v:15s} {env_extra.get('MATH', 'tf32'):5s} rc={p.returncode} {tail}", p.stderr.strip()[-300:] if p.returncode else "", flush=True)
# With the API trace of cuBLASLt for the first variant that fails.
env = dict(os.environ, CUBLASLT_LOG_LEVEL="5")
p = subprocess.run([sys.executable, "-c", VARIANT, "big"], capture_output=True, text=True, env=env, timeout=120)
lines = p.stdout.splitlines()
print("---- Lt trace (last 25 lines) ----")
print("\n".join(l[:300] for l in lines[-25:]))
