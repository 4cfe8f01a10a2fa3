"""The "host" section: host time per call at 64^3 for every API, beside the C++ floor;
host_section runs before torch and nvmath-python are imported, host_section_late after."""
import statistics

import cupy as cp

import cygemm
from cygemm import gemm_ops
from cygemm.gemm_ops import backward_into, forward_into
import contenders as C
from common import host_us, run_floor


def host_section(R, s, floor):
    """Host time per call at 64^3 for every API, interleaved with the C++ floor."""
    n = 64
    A, B, bias, gY = (C.operand(sh, "tf32", i) for i, sh in enumerate(((n, n), (n, n), (n,), (n, n))))
    Y, gA, gB, gb = (cp.empty(sh, cp.float32) for sh in ((n, n), (n, n), (n, n), (n,)))
    A4, B4, C4 = (C.operand((4, n, n), "tf32", 10 + i) for i in range(3))
    ws = gemm_ops.ensure_workspaces(n, n, stream=s)
    ptr = s.ptr
    s.use()      # CuPy's current stream, for stream=None and for cp.matmul
    ours = {
        "cygemm.gemm (stream=None)": lambda: cygemm.gemm(A, B, Y),
        "cygemm.gemm (stream=int)": lambda: cygemm.gemm(A, B, Y, stream=ptr),
        "cygemm.gemm_strided_batched 4x": lambda: cygemm.gemm_strided_batched(A4, B4, C4, stream=ptr),
        "cygemm forward_into relu+bias": lambda: forward_into(A, B, Y, bias, act="relu", stream=ptr),
        "cygemm backward_into relu (gA, gB, gBias)": lambda: backward_into(
            A, B, gY, None, y=Y, act="relu", gA_out=gA, gB_out=gB, gBias_out=gb, work_dZ=ws.dZ, stream=ptr),
        "cygemm gemm_ops.forward (allocating)": lambda: gemm_ops.forward(A, B, bias, act="relu", stream=ptr),
        "cp.matmul(out=)": lambda: cp.matmul(A, B, out=Y),
        "CuPy unfused relu+bias forward": lambda: cp.maximum(cp.add(cp.matmul(A, B), bias), 0, out=Y),
    }
    floor_lines = ["gemm 64 64 64 tf32 0 0 host", "lt 64 64 64 relu_bias host", "batched 64 64 64 4 tf32 0 host"]
    rounds = 3 if R.quick else 5
    per = {k: [] for k in ours}
    floors = {k: [] for k in floor_lines}
    for r in range(rounds):
        R.progress(f"host-time round {r + 1}/{rounds}")
        for line, v in run_floor(floor, floor_lines).items():
            floors[line].append(v)
        for name, fn in ours.items():
            per[name].append(host_us(fn, s.synchronize, calls=1000 if R.quick else 3000))
    cp.cuda.Stream.null.use()
    floor_names = {"gemm 64 64 64 tf32 0 0 host": "C++ cublasGemmEx",
                   "lt 64 64 64 relu_bias host": "C++ cublasLtMatmul RELU_BIAS",
                   "batched 64 64 64 4 tf32 0 host": "C++ cublasGemmStridedBatchedEx 4x"}
    for line, vals in floors.items():
        R.add("64^3 host us/call", floor_names[line], "host_us", statistics.median(vals), min(vals), max(vals), floor=True)
    for name, vals in per.items():
        R.add("64^3 host us/call", name, "host_us", statistics.median(vals), min(vals), max(vals))
    return A, B, Y, bias


def host_section_late(R, s, floor, A, B, Y, bias):
    """The contenders that need torch / nvmath, after their import, again interleaved."""
    ptr = s.ptr
    theirs = {"cygemm.gemm (stream=int)": lambda: cygemm.gemm(A, B, Y, stream=ptr)}
    if C.torch is not None:
        tA, tB, tY, tb = (C.as_torch(x) for x in (A, B, Y, bias))
        ts = C.torch.cuda.ExternalStream(ptr)
        C.torch.backends.cuda.matmul.allow_tf32 = True
        C.torch.cuda.set_stream(ts)
        theirs["torch.mm(out=)"] = lambda: C.torch.mm(tA, tB, out=tY)
        theirs["torch._addmm_activation relu"] = lambda: C.torch._addmm_activation(tb, tA, tB)
    else:
        R.skip("64^3 host us/call (after torch/nvmath import)", "torch", C.IMPORT_ERRORS.get("torch"))
    try:
        theirs["nvmath Matmul.execute (planned)"] = C.nvmath_matmul(A, B, Y, "tf32", False, False, s)
    except Exception as exc:
        R.skip("64^3 host us/call (after torch/nvmath import)", "nvmath Matmul", exc)
    per = {k: [] for k in theirs}
    floors = []
    rounds = 3 if R.quick else 5
    for r in range(rounds):
        R.progress(f"host-time round {r + 1}/{rounds} (torch, nvmath)")
        floors.append(run_floor(floor, ["gemm 64 64 64 tf32 0 0 host"])["gemm 64 64 64 tf32 0 0 host"])
        for name, fn in theirs.items():
            per[name].append(host_us(fn, s.synchronize, calls=1000 if R.quick else 3000))
    if C.torch is not None:
        C.torch.cuda.set_stream(C.torch.cuda.default_stream())
    case = "64^3 host us/call (after torch/nvmath import)"
    R.add(case, "C++ cublasGemmEx", "host_us", statistics.median(floors), min(floors), max(floors), floor=True)
    for name, vals in per.items():
        R.add(case, name, "host_us", statistics.median(vals), min(vals), max(vals))
