"""Fused dense layer (cygemm.gemm_ops) against plain GEMMs, CuPy unfused and PyTorch, one run.

    python benchmarks/bench_fused.py [--out DIR]

Writes DIR/bench_fused.json and prints the table.
"""
import os

os.environ.setdefault("CUPY_TF32", "1")

import argparse
import json
import sys

import cupy as cp
import numpy as np

import cygemm
from cygemm import gemm_ops
from cygemm.gemm_ops import backward_into, forward_into

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import build_floor, environment, gpu_ms, interleaved_host_us, run_floor  # noqa: E402
from mlp import MLP  # noqa: E402

torch = None   # imported after the host-time section: its threads made our host timings noisy


def import_torch():
    global torch
    try:
        import torch as t
        torch = t
    except ImportError:  # a missing contender is reported as skipped
        torch = None


def rand(shape, seed=0):
    return cp.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    rows = []
    s = cp.cuda.Stream(non_blocking=True)
    import tempfile
    here = os.path.dirname(os.path.abspath(__file__))
    exe = build_floor(os.path.join(here, "cublas_floor.cu"), os.path.join(tempfile.mkdtemp(), "cublas_floor"))
    floor = {(r["case"], r.get("math")): r for r in run_floor(exe)}

    def add(case, contender, t, unit="ms", **kw):
        med, lo, hi = t if isinstance(t, tuple) else (t, t, t)
        rows.append(dict(case=case, contender=contender, value=med, lo=lo, hi=hi, unit=unit, **kw))
        print(f"  {case:38s} {contender:44s} {med:9.4f} {unit}", flush=True)

    # ---- small layer: host time per call, 64 x 64 x 64
    m = 64
    A, B, bias = rand((m, m), 5), rand((m, m), 6), rand((m,), 7)
    Y, Z = cp.empty((m, m), cp.float32), cp.empty((m, m), cp.float32)
    ptr = s.ptr
    case = "fwd 64^3 host us/call"
    s.use()
    ours = {"cygemm.gemm (plain)": lambda: cygemm.gemm(A, B, Y, stream=ptr),
            "cygemm forward_into relu+bias": lambda: forward_into(A, B, Y, bias, act="relu", stream=ptr),
            "CuPy unfused relu": cupy_fwd_small(A, B, bias, Y, Z)}
    floors, mine = interleaved_host_us(exe, ours, s.synchronize)
    cp.cuda.Stream.null.use()
    raw = floors[("lt_relu_bias_host_per_call_64", None)]
    add(case, "C++ cuBLASLt RELU_BIAS (floor)", (float(np.median(raw)), min(raw), max(raw)), "us")
    for name, per_round in mine.items():
        add(case, name, (float(np.median(per_round)), min(per_round), max(per_round)), "us")
    import_torch()
    if torch is not None:   # after the interleaved rounds, so that torch's threads are not running then
        torch.backends.cuda.matmul.allow_tf32 = True
        tA, tB, tb = (torch.as_tensor(x, device="cuda") for x in (A, B, bias))
        torch.cuda.set_stream(torch.cuda.ExternalStream(s.ptr))
        _, theirs = interleaved_host_us(exe, {"t": lambda: torch._addmm_activation(tb, tA, tB)}, s.synchronize)
        add(case, "torch._addmm_activation relu", (float(np.median(theirs["t"])), min(theirs["t"]),
                                                    max(theirs["t"])), "us")
        torch.cuda.set_stream(torch.cuda.default_stream())
    del A, B, bias, Y, Z

    # ---- large layer: M x N x K = 8192 x 8192 x 1024, TF32
    M, N, K = 8192, 8192, 1024
    A, B, bias, gY = rand((M, K), 1), rand((K, N), 2), rand((N,), 3), rand((M, N), 4)
    Y, Z, gA, gB, gb = (cp.empty(sh, cp.float32) for sh in ((M, N), (M, N), (M, K), (K, N), (N,)))
    ws = gemm_ops.ensure_workspaces(M, N, stream=s)
    case = "fwd 8192x8192x1024"
    plain = gpu_ms(cp, lambda: cygemm.gemm(A, B, Y, stream=s), s)
    add(case, "plain GEMM (cygemm.gemm)", plain)
    for act in ("relu", "gelu", "silu"):
        t = gpu_ms(cp, lambda: forward_into(A, B, Y, bias, act=act, lt_workspace=ws.lt_ws, stream=s), s)
        add(case, f"cygemm forward_into {act}+bias", t, ratio_plain=t[0] / plain[0])
        t = gpu_ms(cp, lambda: forward_into(A, B, Y, bias, act=act, save_z=True, z_out=Z, lt_workspace=ws.lt_ws,
                                            stream=s), s)
        add(case, f"cygemm forward_into {act}+bias save_z", t, ratio_plain=t[0] / plain[0])

    add(case, "C++ cuBLASLt RELU_BIAS (floor)", floor[("lt_relu_bias_8192x8192x1024", None)]["ms"])

    def cupy_fwd():
        cp.matmul(A, B, out=Z)
        Z.__iadd__(bias)
        cp.maximum(Z, 0, out=Y)
    with s:
        cupy_f = gpu_ms(cp, cupy_fwd, s)
    add(case, "CuPy unfused relu (matmul, +=, maximum)", cupy_f)
    if torch is not None:
        tA, tB, tb = (torch.as_tensor(x, device="cuda") for x in (A, B, bias))
        torch.backends.cuda.matmul.allow_tf32 = True
        ts = torch.cuda.ExternalStream(s.ptr)
        with torch.cuda.stream(ts):
            add(case, "torch._addmm_activation relu", gpu_ms(cp, lambda: torch._addmm_activation(tb, tA, tB), s))

    case = "bwd 8192x8192x1024"
    two = gpu_ms(cp, lambda: (cygemm.gemm(gY, B, gA, trans_b=True, stream=s), cygemm.gemm(A, gY, gB, trans_a=True, stream=s)), s)
    add(case, "two plain GEMMs (cygemm.gemm)", two)
    for act in ("none", "relu", "gelu"):
        t = gpu_ms(cp, lambda: backward_into(A, B, gY, Z, act=act, gA_out=gA, gB_out=gB, gBias_out=gb,
                                             work_dZ=ws.dZ, lt_workspace=ws.lt_ws, stream=s), s)
        add(case, f"cygemm backward_into {act} (gA, gB, gBias)", t, ratio_plain=t[0] / two[0])
    dZ = ws.dZ

    def cupy_bwd():
        cp.multiply(gY, Z > 0, out=dZ)
        cp.sum(dZ, axis=0, out=gb)
        cp.matmul(dZ, B.T, out=gA)
        cp.matmul(A.T, dZ, out=gB)
    with s:
        cupy_b = gpu_ms(cp, cupy_bwd, s)
    add(case, "CuPy unfused relu backward", cupy_b)
    del A, B, bias, gY, Y, Z, gA, gB, gb, dZ, ws
    gemm_ops.clear_ws_cache()
    cp.get_default_memory_pool().free_all_blocks()

    # ---- a GEMM replayed from a CUDA graph: time per GEMM
    A, B, Y = rand((64, 64), 5), rand((64, 64), 6), cp.empty((64, 64), cp.float32)
    reps = 100
    with cygemm.graph.capture(s) as g:
        for _ in range(reps):
            cygemm.gemm(A, B, Y, stream=s)
    t = gpu_ms(cp, lambda: g.launch(s), s, reps=50)
    add("64^3 GEMM inside a CUDA graph", "cygemm.gemm x100 captured, per GEMM", tuple(x * 1000 / reps for x in t), "us")

    # ---- 3-layer MLP training step 64 -> 256 -> 256 -> 10, batch 64
    case = "MLP step 64-256-256-10 b64"
    mlp = MLP()
    mlp.x[...] = rand((64, 64), 8)
    mlp.target[...] = rand((64, 10), 9)
    add(case, "cygemm eager", tuple(x * 1000 for x in gpu_ms(cp, lambda: mlp.step(s), s, reps=50)), "us")
    mlp.step(s)
    s.synchronize()
    try:
        with cygemm.graph.capture(s) as g:
            mlp.step(s)
        add(case, "cygemm CUDA graph", tuple(x * 1000 for x in gpu_ms(cp, lambda: g.launch(s), s, reps=200)), "us")
    except Exception as exc:  # reported, so that the rest of the suite still runs
        print(f"  {case}: cygemm CUDA graph FAILED: {type(exc).__name__}: {exc}", flush=True)
    with s:
        add(case, "CuPy eager (unfused)", tuple(x * 1000 for x in gpu_ms(cp, cupy_mlp_step(mlp), s, reps=50)), "us")
    if torch is not None:
        eager_t, graph_t = torch_mlp_times(s)
        add(case, "torch eager", eager_t, "us")
        add(case, "torch.cuda.CUDAGraph", graph_t, "us")

    env = environment(cp)
    env["torch"] = torch.__version__ if torch is not None else "not installed"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_fused.json"), "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=1)
    md = render(env, rows)
    print(md)


def cupy_fwd_small(A, B, bias, Y, Z):
    def fn():
        cp.matmul(A, B, out=Z)
        Z.__iadd__(bias)
        cp.maximum(Z, 0, out=Y)
    return fn


def cupy_mlp_step(mlp):
    """The same step with CuPy's unfused operations (allocating, as CuPy code is written)."""
    def fn():
        xs, zs = [mlp.x], []
        for i, (W, b) in enumerate(zip(mlp.W, mlp.b)):
            z = xs[-1] @ W + b
            zs.append(z)
            xs.append(cp.maximum(z, 0) if i < len(mlp.W) - 1 else z)
        g = 2.0 * (xs[-1] - mlp.target) / xs[-1].size
        for i in reversed(range(len(mlp.W))):
            if i < len(mlp.W) - 1:
                g = g * (zs[i] > 0)
            gW, gb = xs[i].T @ g, g.sum(0)
            if i > 0:
                g = g @ mlp.W[i].T
            mlp.W[i] -= mlp.lr * gW
            mlp.b[i] -= mlp.lr * gb
    return fn


def torch_mlp_times(s):
    import torch.nn as nn
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, t = torch.randn(64, 64, device="cuda"), torch.randn(64, 10, device="cuda")
    loss_fn = nn.MSELoss()
    ts = torch.cuda.ExternalStream(s.ptr)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), t).backward()
        opt.step()
    with torch.cuda.stream(ts):
        for _ in range(5):
            step()
        eager = tuple(v * 1000 for v in gpu_ms(cp, step, s, reps=50))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        loss_fn(model(x), t).backward()
        opt.step()
    with torch.cuda.stream(ts):
        graph = tuple(v * 1000 for v in gpu_ms(cp, g.replay, s, reps=200))
    return eager, graph


def render(env, rows):
    lines = [f"GPU {env['gpu']}, driver {env['driver']}, CUDA runtime {env['cuda_runtime']}, cuBLASLt "
             f"{env['cublasLt']}, CuPy {env['cupy']}, torch {env['torch']}, {env['date']}, clocks "
             f"{env['clocks_sm_mem_mhz']}", "", "| case | contender | median | min | max | unit | vs plain |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ratio_plain']:.3f}x" if "ratio_plain" in r else ""
        lines.append(f"| {r['case']} | {r['contender']} | {r['value']:.4f} | {r['lo']:.4f} | {r['hi']:.4f} | "
                     f"{r['unit']} | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
