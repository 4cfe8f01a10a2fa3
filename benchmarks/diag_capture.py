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
if "torchmm" in v:
    tA = torch.randn(64, 64, device="cuda"); tb = torch.randn(64, device="cuda")
    with torch.cuda.stream(torch.cuda.ExternalStream(s.ptr)):
        for _ in range(100):
            torch._addmm_activation(tb, tA, tA)
    torch.cuda.synchronize()
if "graph100" in v:
    A = cp.ones((64, 64), cp.float32); Y = cp.empty((64, 64), cp.float32)
    cygemm.gemm(A, A, Y, stream=s); s.synchronize()
    with cygemm.graph.capture(s) as g:   # rebound by the next capture: destroyed inside it
        for _ in range(100):
            cygemm.gemm(A, A, Y, stream=s)
    g.launch(s); s.synchronize()
if "host64" in v:
    from cygemm.gemm_ops import forward_into
    A = cp.ones((64, 64), cp.float32); Y = cp.empty((64, 64), cp.float32); b = cp.ones(64, cp.float32)
    for _ in range(1000):
        cygemm.gemm(A, A, Y, stream=s.ptr)
        forward_into(A, A, Y, b, act="relu", stream=s.ptr)
    s.synchronize()
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

variants = sys.argv[1:] or ["plain", "torch-torchmm", "graph100", "host64", "big"]
failing = None
for v in variants:
    p = subprocess.run([sys.executable, "-c", VARIANT, v], capture_output=True, text=True, timeout=120)
    tail = (p.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(f"{v:22s} rc={p.returncode} {tail}", p.stderr.strip()[-300:] if p.returncode else "", flush=True)
    if failing is None and not tail.startswith("OK"):
        failing = v
if failing:
    # The API trace of cuBLASLt and CUDA errors around the failing call.
    env = dict(os.environ, CUBLASLT_LOG_LEVEL="5")
    p = subprocess.run([sys.executable, "-c", VARIANT, failing], capture_output=True, text=True, env=env, timeout=120)
    lines = [l for l in p.stdout.splitlines() if "Destroy" not in l]
    print(f"---- Lt trace of {failing} (last 14 lines) ----")
    print("\n".join(l[:400] for l in lines[-14:]))
