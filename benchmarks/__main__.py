"""cygemm's benchmark suite: cygemm against cp.matmul, PyTorch, nvmath-python and a C++
cuBLAS floor, in one process and one run.

    python -m benchmarks [--out DIR] [--quick] [--only host,square,...]

Writes DIR/bench.json (every measurement and the environment), DIR/RESULTS.md and
DIR/*.png (regenerate both from the JSON with `python -m benchmarks.report DIR`), and
prints the ratios that matter last. GPU times: CUDA events after warm-up, median of
repeats; host times: wall time per call over thousands of back-to-back calls, one sync.
"""
import os

os.environ.setdefault("CUPY_TF32", "1")    # cp.matmul's float32 default is TF32, as cygemm's

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

import cygemm  # noqa: E402
from cygemm import gemm_ops  # noqa: E402
from cygemm.gemm_ops import backward_into, forward_into  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import contenders as C  # noqa: E402
from common import L2_BYTES, build_floor, clocks, environment, gpu_ms, host_us, run_floor  # noqa: E402
from mlp import MLP  # noqa: E402
from training import backend_section, train_section  # noqa: E402,F401  (run by name below)
from hopper import elementwise_section, fp8_section, grouped_section  # noqa: E402,F401

SECTIONS = ["host", "ceilings", "square", "shapes", "transposes", "batched", "matmul", "fused", "mlp", "graph",
            "train", "backend", "fp8", "grouped", "elementwise"]


class Recorder:
    def __init__(self, quick):
        self.rows, self.quick, self.t0 = [], quick, time.time()
        self.floor = None     # the C++ floor process (common.Floor)
        self.section = ""

    def progress(self, what):
        print(f"[{time.time() - self.t0:6.1f}s] {self.section}: {what}", flush=True)

    def add(self, case, contender, metric, value, lo=None, hi=None, **extra):
        row = dict(section=self.section, case=case, contender=contender, metric=metric, value=value,
                   lo=value if lo is None else lo, hi=value if hi is None else hi, **extra)
        self.rows.append(row)
        return row

    def skip(self, case, contender, reason):
        self.rows.append(dict(section=self.section, case=case, contender=contender, metric="skipped",
                              value=None, reason=str(reason)))

    def measure(self, case, contenders, stream, flop=None, inner=1, reps=30, floors=(), rounds=None, **extra):
        """GPU-time several contenders on one case in interleaved rounds: each round runs
        every contender once (the order rotated), so that drifts of clock or temperature
        fall on all alike. contenders: name -> callable(s) or a Skip; floors: (name, line)
        pairs for the C++ floor. Value: median of the round medians (min, max of them)."""
        entries = []
        for name, calls in contenders.items():
            if isinstance(calls, Exception):
                self.skip(case, name, calls)
            else:
                entries.append((False, name, calls))
        entries += [(True, name, line) for name, line in floors]
        got, failed = {name: [] for _, name, _ in entries}, {}
        rounds = rounds or (2 if self.quick else 3)
        for r in range(rounds):
            k = r % max(1, len(entries))
            for is_floor, name, x in entries[k:] + entries[:k]:
                if name in failed:
                    continue
                try:
                    got[name].append(self.floor(x) if is_floor else
                                     gpu_ms(cp, x, stream, inner=inner, reps=reps, warm_s=0.05 if r == 0 else 0.02)[0])
                except Exception as exc:   # a contender that fails is recorded, the suite goes on
                    failed[name] = exc
        if floors:
            self.floor.free()
        rows = []
        for is_floor, name, _ in entries:
            if name in failed:
                exc = failed[name]
                self.skip(case, name, exc if isinstance(exc, C.Skip) else f"failed: {type(exc).__name__}: {str(exc)[:160]}")
                continue
            v = got[name]
            med = statistics.median(v)
            more = dict(extra, rounds=v)
            if is_floor:
                more["floor"] = True
            if flop:
                more["tflops"] = flop / med / 1e9
            rows.append(self.add(case, name, "gpu_ms", med, min(v), max(v), **more))
        return rows


def n_sets(bytes_per_set):
    """Operand sets to rotate: several when one set would sit in L2 between calls."""
    return 1 if bytes_per_set >= L2_BYTES else 4


def inner_for(flop):
    return 1 if flop > 1e10 else (10 if flop > 1e8 else 50)


# ---------------------------------------------------------------- sections

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


def ceilings_section(R, s, floor):
    """Datasheet figures and measured ones: copy bandwidth here, matrix rates from the
    best measured GEMM of each precision (filled in by the report)."""
    R.add("datasheet", "H200 SXM TF32 dense", "tflops_peak", 494.7)
    R.add("datasheet", "H200 SXM BF16/FP16 dense", "tflops_peak", 989.4)
    R.add("datasheet", "H200 SXM FP32 (no tensor cores)", "tflops_peak", 66.9)
    R.add("datasheet", "H200 HBM3e bandwidth", "gbps_peak", 4800.0)
    nbytes = (1 << 28) if R.quick else (1 << 30)
    src, dst = cp.ones(nbytes // 4, cp.float32), cp.empty(nbytes // 4, cp.float32)
    R.progress(f"copy bandwidth, {nbytes >> 20} MiB")
    with s:
        med, lo, hi = gpu_ms(cp, lambda: dst.__setitem__(Ellipsis, src), s, reps=20)
    # Read + write: 2 bytes moved per byte copied.
    R.add("measured copy bandwidth", "device-to-device copy (read+write)", "gbps", 2 * nbytes / med / 1e6,
          2 * nbytes / hi / 1e6, 2 * nbytes / lo / 1e6, ms=med)
    del src, dst


def gemm_case(R, s, case, m, n, k, prec, ta=False, tb=False, group=None):
    """Every GEMM contender on one problem, the C++ floor among them, in interleaved rounds."""
    flop = 2.0 * m * n * k
    itemsize = 2 if prec in ("fp16", "bf16") else 4
    sets = n_sets(itemsize * (m * k + k * n + m * n))
    try:
        ops = [(C.operand((k, m) if ta else (m, k), prec, 3 * i), C.operand((n, k) if tb else (k, n), prec, 3 * i + 1),
                C.operand((m, n), prec, 3 * i + 2)) for i in range(sets)]
    except C.Skip as sk:
        for name in C.GEMM_CONTENDERS:
            R.skip(case, name, sk)
        return
    R.progress(case)
    contenders = {}
    for name, make in C.GEMM_CONTENDERS.items():
        try:
            contenders[name] = [make(A, B, Cc, prec, ta, tb, s) for A, B, Cc in ops]
        except Exception as exc:
            contenders[name] = exc if isinstance(exc, C.Skip) else C.Skip(f"{type(exc).__name__}: {str(exc)[:160]}")
    R.measure(case, contenders, s, flop, inner=inner_for(flop), reps=15 if flop > 1e12 else 30,
              floors=[("C++ cublasGemmEx", f"gemm {m} {n} {k} {prec} {int(ta)} {int(tb)} gpu")],
              group=group, size=(m, n, k), prec=prec)
    del contenders, ops


def square_section(R, s, floor):
    sizes = [256, 2048] if R.quick else [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    for prec in ("tf32", "fp32", "fp16", "bf16"):
        for n in sizes:
            gemm_case(R, s, f"square {n}^3 {prec}", n, n, n, prec, group=f"square {prec}")
        cp.get_default_memory_pool().free_all_blocks()


def shapes_section(R, s, floor):
    shapes = [(8192, 8192, 1024)] if R.quick else [(32768, 1024, 1024), (8192, 8192, 1024), (64, 4096, 4096)]
    for prec in ("tf32", "bf16"):
        for m, n, k in shapes:
            gemm_case(R, s, f"MLP layer {m}x{n}x{k} {prec}", m, n, k, prec, group=f"shapes {prec}")
    cp.get_default_memory_pool().free_all_blocks()


def transposes_section(R, s, floor):
    n = 2048 if R.quick else 4096
    for ta, tb in ((False, False), (False, True), (True, False), (True, True)):
        tag = ("T" if ta else "N") + ("T" if tb else "N")
        gemm_case(R, s, f"{n}^3 tf32 op(A)op(B)={tag}", n, n, n, "tf32", ta, tb, group="transposes")


def batched_section(R, s, floor):
    cases = [(32, 16384), (64, 16384), (128, 4096)] if not R.quick else [(64, 4096)]
    for n, batch in cases:
        for bcast in (False, True):
            for prec in ("tf32", "fp32"):
                case = f"batched {batch}x{n}^3 {prec}" + (" (B broadcast)" if bcast else "")
                flop = 2.0 * n ** 3 * batch
                A = C.operand((batch, n, n), prec, 1)
                B = C.operand((1 if bcast else batch, n, n), prec, 2)
                Cc = C.operand((batch, n, n), prec, 3)
                R.progress(case)
                R.measure(case, C.batched_contenders(A, B, Cc, prec, s), s, flop, inner=10,
                          floors=[("C++ cublasGemmStridedBatchedEx", f"batched {n} {n} {n} {batch} {prec} {int(bcast)} gpu")],
                          group="batched")
                del A, B, Cc
    cp.get_default_memory_pool().free_all_blocks()


def alloc_bytes(fn, stream):
    """Device bytes CuPy's allocator hands out during one call of fn (with out= given: the
    copies the call makes)."""
    pool = cp.get_default_memory_pool()
    got = [0]

    def counting(nbytes):
        got[0] += nbytes
        return pool.malloc(nbytes)
    cp.cuda.set_allocator(counting)
    try:
        fn()
        stream.synchronize()
    finally:
        cp.cuda.set_allocator(pool.malloc)
    return got[0]


def matmul_section(R, s, floor):
    """cygemm.matmul against cp.matmul (TF32 for both), out= given, on layouts cp.matmul
    copies and layouts it does not; and the bytes each call allocates (its copies)."""
    from cupy._core import _routines_linalg as cupy_linalg
    sq = [256, 4096] if R.quick else [64, 256, 1024, 4096, 8192]
    n = 2048 if R.quick else 4096
    rng = np.random.default_rng(5)

    def arr(*shape):
        return cp.asarray(rng.standard_normal(shape, dtype=np.float32))
    cases = [(f"matmul square {k}^3", arr(k, k), arr(k, k), 2.0 * k ** 3) for k in sq]
    cases += [
        (f"matmul {n}^3 a transposed view", arr(n, n).T, arr(n, n), 2.0 * n ** 3),
        (f"matmul {n}^3 a column slice", arr(n, 2 * n)[:, :n], arr(n, n), 2.0 * n ** 3),
        (f"matmul {n}^3 b transposed view, a row slice", arr(2 * n, n)[::2], arr(n, n).T, 2.0 * n ** 3),
        ("matmul batched 16384x64^3", arr(16384, 64, 64), arr(16384, 64, 64), 2.0 * 64 ** 3 * 16384),
        ("matmul batched 16384x64^3 (b broadcast)", arr(16384, 64, 64), arr(64, 64), 2.0 * 64 ** 3 * 16384),
        ("matmul batched 64x8x128x128 (b broadcast over 8)", arr(64, 8, 128, 128), arr(64, 1, 128, 128),
         2.0 * 128 ** 3 * 512),
        (f"matmul 1-D . 2-D ({n},)@({n},{n})", arr(n), arr(n, n), 2.0 * n * n),
        (f"matmul 2-D . 1-D ({n},{n})@({n},)", arr(n, n), arr(n), 2.0 * n * n),
        (f"matmul 2-D . strided 1-D ({n},{n})@x[::2]", arr(n, n), arr(2 * n)[::2], 2.0 * n * n),
        (f"matmul 2-D . transposed view: ({n},{n})@x.T", arr(n, n), arr(n, n).T, 2.0 * n ** 3),
    ]
    for case, a, b, flop in cases:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) if max(a.ndim, b.ndim) > 2 else ()
        out = cp.empty(batch + a.shape[-2:-1] + b.shape[-1:] if b.ndim > 1 else batch + a.shape[-2:-1], cp.float32)

        def ours(a=a, b=b, out=out):
            cygemm.matmul(a, b, out, stream=s)

        def theirs(a=a, b=b, out=out):
            cupy_linalg.set_compute_type(cp.float32, cupy_linalg.COMPUTE_TYPE_TF32)
            with s:
                cp.matmul(a, b, out=out)
        R.progress(case)
        rows = R.measure(case, {"cygemm.matmul": ours, "cp.matmul": theirs}, s, flop,
                         inner=inner_for(flop), reps=15 if flop > 1e12 else 30, group="matmul")
        for name, fn in (("cygemm.matmul", ours), ("cp.matmul", theirs)):
            R.add(case + " (bytes allocated per call)", name, "bytes", alloc_bytes(fn, s))
        del out, rows
    A, B, Y = arr(64, 64), arr(64, 64), cp.empty((64, 64), cp.float32)
    s.use()
    fns = {"cygemm.matmul(out=)": lambda: cygemm.matmul(A, B, Y), "cp.matmul(out=)": lambda: cp.matmul(A, B, out=Y)}
    per = {name: [] for name in fns}
    for r in range(3 if R.quick else 5):
        R.progress(f"matmul host-time round {r + 1}")
        for name, fn in fns.items():
            per[name].append(host_us(fn, s.synchronize, calls=1000 if R.quick else 3000))
    cp.cuda.Stream.null.use()
    for name, vals in per.items():
        R.add("64^3 host us/call: matmul", name, "host_us", statistics.median(vals), min(vals), max(vals))
    cp.get_default_memory_pool().free_all_blocks()


def fused_section(R, s, floor):
    M, N, K = (2048, 2048, 512) if R.quick else (8192, 8192, 1024)
    A, B, bias, gY = (C.operand(sh, "tf32", 20 + i) for i, sh in enumerate(((M, K), (K, N), (N,), (M, N))))
    Y, Z, gA, gB, gb = (cp.empty(sh, cp.float32) for sh in ((M, N), (M, N), (M, K), (K, N), (N,)))
    ws = gemm_ops.ensure_workspaces(M, N, stream=s)
    Wnk = cp.ascontiguousarray(B.T)
    flop = 2.0 * M * N * K
    inner = inner_for(flop)
    fwd, bwd = f"fwd {M}x{N}x{K} tf32", f"bwd {M}x{N}x{K} tf32"
    torch = C.torch
    if torch is not None:
        F = torch.nn.functional
        ts = torch.cuda.ExternalStream(s.ptr)
        tA, tB, tb = (C.as_torch(x) for x in (A, B, bias))
        tW = tB.T.contiguous()
        torch_act = {"relu": F.relu, "gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}

        def on_ts(fn):
            def call():
                torch.backends.cuda.matmul.allow_tf32 = True
                with torch.cuda.stream(ts):
                    fn()
            return call

    def on_s(fn):
        def call():
            with s:
                fn()
        return call

    R.progress(fwd)
    R.measure(fwd, {"plain GEMM (cygemm.gemm)": lambda: cygemm.gemm(A, B, Y, stream=s)}, s, flop, inner)
    for act in ("relu", "gelu", "silu"):
        case = f"{fwd} {act}"
        R.progress(case)
        cs = {"cygemm forward_into": lambda: forward_into(A, B, Y, bias, act=act, lt_workspace=ws.lt_ws, stream=s),
              # torch's F.linear takes its weight as (N, K); the same layout through cygemm (W.T):
              "cygemm forward_into, weight (N, K) as torch's": lambda: forward_into(
                  A, Wnk.T, Y, bias, act=act, lt_workspace=ws.lt_ws, stream=s),
              "CuPy unfused": on_s(cupy_forward(A, B, bias, Y, Z, act))}
        if torch is not None:
            if act in ("relu", "gelu"):
                cs["torch._addmm_activation"] = on_ts(lambda: torch._addmm_activation(tb, tA, tB, use_gelu=act == "gelu"))
            cs["torch F.linear + activation"] = on_ts(lambda: torch_act[act](F.linear(tA, tW, tb)))
        else:
            cs["torch"] = C.Skip(C.IMPORT_ERRORS.get("torch"))
        if act in ("relu", "gelu"):
            try:
                # nvmath's bias runs along the result's rows (cuBLASLt's M): compute Y^T = B^T A^T.
                cs["nvmath Matmul epilog"] = C.nvmath_matmul(B.T, A.T, None, "tf32", False, False, s,
                                                            epilog=f"{act.upper()}_BIAS", bias=bias.reshape(N, 1))
            except Exception as exc:
                cs["nvmath Matmul epilog"] = C.Skip(f"{type(exc).__name__}: {str(exc)[:160]}")
            floors = [("C++ cublasLtMatmul epilogue", f"lt {M} {N} {K} {act}_bias gpu")]
        else:
            floors = []     # cuBLASLt has no SiLU epilogue: no floor does the same work
        R.measure(case, cs, s, flop, inner, floors=floors)
        R.measure(f"{case} (save Z)", {"cygemm forward_into save_z": lambda: forward_into(
            A, B, Y, bias, act=act, save_z=True, z_out=Z, lt_workspace=ws.lt_ws, stream=s)}, s, flop, inner)

    R.progress(bwd)
    R.measure(bwd, {"two plain GEMMs (cygemm.gemm)": lambda: (
        cygemm.gemm(gY, B, gA, trans_b=True, stream=s), cygemm.gemm(A, gY, gB, trans_a=True, stream=s))},
        s, 2 * flop, inner)
    for act in ("relu", "gelu", "silu"):
        case = f"{bwd} {act}"
        R.progress(case)
        forward_into(A, B, Y, bias, act=act, save_z=True, z_out=Z, stream=s)
        kw = dict(y=Y) if act == "relu" else {}
        cs = {"cygemm backward_into": lambda: backward_into(
                  A, B, gY, None if act == "relu" else Z, act=act, gA_out=gA, gB_out=gB, gBias_out=gb,
                  work_dZ=ws.dZ, lt_workspace=ws.lt_ws, stream=s, **kw),
              "CuPy unfused": on_s(cupy_backward(A, B, gY, Z, ws.dZ, gA, gB, gb, act))}
        if torch is not None:
            cs["torch autograd backward"] = torch_backward(A, B, bias, gY, act, s)
        R.measure(case, cs, s, 2 * flop, inner)
    del A, B, bias, gY, Y, Z, gA, gB, gb, ws, Wnk
    gemm_ops.clear_ws_cache()
    cp.get_default_memory_pool().free_all_blocks()


def mlp_section(R, s, floor):
    """A two-layer MLP's forward and backward (six GEMMs) against the same six GEMMs run plain
    and against torch autograd, in one interleaved run."""
    M, D = (2048, 512) if R.quick else (8192, 1024)
    X, W1, W2, gY2 = (C.operand(sh, "tf32", 40 + i) for i, sh in enumerate(((M, D), (D, D), (D, D), (M, D))))
    b1, b2 = C.operand((D,), "tf32", 44), C.operand((D,), "tf32", 45)
    Y1, Z1, Y2, Z2, gY1, gX, dZ1, dZ2, T = (cp.empty((M, D), cp.float32) for _ in range(9))
    gW1, gW2 = cp.empty((D, D), cp.float32), cp.empty((D, D), cp.float32)
    gb1, gb2 = cp.empty(D, cp.float32), cp.empty(D, cp.float32)
    flop = 6 * 2.0 * M * D * D
    for act in ("relu", "gelu"):
        case = f"2-layer MLP fwd+bwd {M}x{D}-{D}-{D} tf32 {act}"
        R.progress(case)
        save = act != "relu"        # relu's derivative is read from the output

        def ours():
            forward_into(X, W1, Y1, b1, act=act, save_z=save, z_out=Z1 if save else None, stream=s)
            forward_into(Y1, W2, Y2, b2, act=act, save_z=save, z_out=Z2 if save else None, stream=s)
            backward_into(Y1, W2, gY2, Z2 if save else None, y=None if save else Y2, act=act, gA_out=gY1,
                          gB_out=gW2, gBias_out=gb2, work_dZ=dZ2, stream=s)
            backward_into(X, W1, gY1, Z1 if save else None, y=None if save else Y1, act=act, gA_out=gX,
                          gB_out=gW1, gBias_out=gb1, work_dZ=dZ1, stream=s)

        def plain():
            cygemm.gemm(X, W1, Y1, stream=s)
            cygemm.gemm(Y1, W2, Y2, stream=s)
            cygemm.gemm(gY2, W2, gY1, trans_b=True, stream=s)
            cygemm.gemm(Y1, gY2, gW2, trans_a=True, stream=s)
            cygemm.gemm(gY1, W1, gX, trans_b=True, stream=s)
            cygemm.gemm(X, gY1, gW1, trans_a=True, stream=s)
        cs = {"cygemm forward_into + backward_into": ours, "six plain GEMMs (cygemm.gemm)": plain}
        if C.torch is not None:
            cs["torch autograd"] = torch_mlp2(X, W1, b1, W2, b2, gY2, act, s)
        else:
            cs["torch autograd"] = C.Skip(C.IMPORT_ERRORS.get("torch"))
        R.measure(case, cs, s, flop, 1)
    del X, W1, W2, gY2, Y1, Z1, Y2, Z2, gY1, gX, dZ1, dZ2, T


def torch_mlp2(X, W1, b1, W2, b2, gY2, act, s):
    """F.linear + activation twice and its backward by autograd (input gradient included)."""
    torch = C.torch
    F = torch.nn.functional
    f = {"relu": F.relu, "gelu": lambda x: F.gelu(x, approximate="tanh")}[act]
    tX = C.as_torch(X).clone().requires_grad_(True)
    params = [C.as_torch(w).T.contiguous().requires_grad_(True) for w in (W1, W2)]
    biases = [C.as_torch(b).clone().requires_grad_(True) for b in (b1, b2)]
    tg = C.as_torch(gY2)
    ts = torch.cuda.ExternalStream(s.ptr)

    def fn():
        torch.backends.cuda.matmul.allow_tf32 = True
        with torch.cuda.stream(ts):
            out = f(F.linear(f(F.linear(tX, params[0], biases[0])), params[1], biases[1]))
            torch.autograd.grad(out, (tX, *params, *biases), tg)
    return fn


def cupy_act(z, act):
    if act == "relu":
        return cp.maximum(z, 0)
    if act == "gelu":
        return 0.5 * z * (1 + cp.tanh(0.7978845608 * (z + 0.044715 * z ** 3)))
    return z / (1 + cp.exp(-z))


def cupy_act_grad(z, act):
    if act == "relu":
        return z > 0
    if act == "gelu":
        u = 0.7978845608 * (z + 0.044715 * z ** 3)
        t = cp.tanh(u)
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * 0.7978845608 * (1 + 3 * 0.044715 * z * z)
    sg = 1 / (1 + cp.exp(-z))
    return sg * (1 + z * (1 - sg))


def cupy_forward(A, B, bias, Y, Z, act):
    """How CuPy code writes it: matmul, add the bias, apply the activation (unfused)."""
    def fn():
        cp.matmul(A, B, out=Z)
        Z.__iadd__(bias)
        Y[...] = cupy_act(Z, act)
    return fn


def cupy_backward(A, B, gY, Z, dZ, gA, gB, gb, act):
    def fn():
        cp.multiply(gY, cupy_act_grad(Z, act), out=dZ)
        cp.sum(dZ, axis=0, out=gb)
        cp.matmul(dZ, B.T, out=gA)
        cp.matmul(A.T, dZ, out=gB)
    return fn


def torch_backward(A, B, bias, gY, act, s):
    """The backward of F.linear + activation by autograd (the forward run once, outside the timing)."""
    torch = C.torch
    F = torch.nn.functional
    tA = C.as_torch(A).clone().requires_grad_(True)
    tW = C.as_torch(B).T.contiguous().requires_grad_(True)
    tb = C.as_torch(bias).clone().requires_grad_(True)
    tg = C.as_torch(gY)
    f = {"relu": F.relu, "gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}[act]
    ts = torch.cuda.ExternalStream(s.ptr)
    with torch.cuda.stream(ts):
        out = f(F.linear(tA, tW, tb))

    def fn():
        with torch.cuda.stream(ts):
            torch.autograd.grad(out, (tA, tW, tb), tg, retain_graph=True)
    return fn


def graph_section(R, s, floor):
    A, B, Y = C.operand((64, 64), "tf32", 1), C.operand((64, 64), "tf32", 2), cp.empty((64, 64), cp.float32)
    reps = 100
    R.progress("64^3 GEMM inside a CUDA graph")
    cygemm.gemm(A, B, Y, stream=s)
    s.synchronize()
    with cygemm.graph.capture(s) as g:
        for _ in range(reps):
            cygemm.gemm(A, B, Y, stream=s)
    med, lo, hi = gpu_ms(cp, lambda: g.launch(s), s, reps=50)
    case = "64^3 GEMM in a CUDA graph, us per GEMM"
    R.add(case, "cygemm.gemm x100 captured", "graph_us", med * 1000 / reps, lo * 1000 / reps, hi * 1000 / reps)
    got = run_floor(floor, ["gemm 64 64 64 tf32 0 0 graph"])
    R.add(case, "C++ cublasGemmEx x100 captured", "graph_us", got["gemm 64 64 64 tf32 0 0 graph"], floor=True)

    # A training step is host-bound when eager: its time is wall time per step over
    # back-to-back steps with one sync at the end, for every contender alike.
    steps = 100 if R.quick else 500

    def wall(fn):
        vals = [host_us(fn, s.synchronize, calls=steps, reps=1, warmup=20) for _ in range(5)]
        return statistics.median(vals), min(vals), max(vals)
    for sizes, batch in (((64, 256, 256, 10), 64), ((784, 1024, 1024, 10), 256)):
        case = f"MLP step {'-'.join(map(str, sizes))} b{batch}, wall us/step"
        R.progress(case)
        mlp = MLP(sizes=sizes, batch=batch)
        mlp.x[...] = C.operand((batch, sizes[0]), "tf32", 8)
        mlp.target[...] = C.operand((batch, sizes[-1]), "tf32", 9)
        R.add(case, "cygemm eager", "step_us", *wall(lambda: mlp.step(s)))
        mlp.step(s)
        s.synchronize()
        with cygemm.graph.capture(s) as g2:
            mlp.step(s)
        R.add(case, "cygemm CUDA graph", "step_us", *wall(lambda: g2.launch(s)))
        cupy_step = cupy_mlp_step(mlp)

        def cupy_on_s():
            with s:
                cupy_step()
        R.add(case, "CuPy eager (unfused)", "step_us", *wall(cupy_on_s))
        if C.torch is not None:
            for name, fn in torch_mlp_steps(s, sizes, batch).items():
                R.add(case, name, "step_us", *wall(fn))
        else:
            R.skip(case, "torch", C.IMPORT_ERRORS.get("torch"))
        del g2


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


def torch_mlp_steps(s, sizes, batch):
    """torch's eager step and the same step captured in a torch.cuda.CUDAGraph, on stream s."""
    torch = C.torch
    nn = torch.nn
    torch.backends.cuda.matmul.allow_tf32 = True
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    model = nn.Sequential(*layers).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, t = torch.randn(batch, sizes[0], device="cuda"), torch.randn(batch, sizes[-1], device="cuda")
    loss_fn = nn.MSELoss()
    ts = torch.cuda.ExternalStream(s.ptr)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), t).backward()
        opt.step()

    def eager():
        with torch.cuda.stream(ts):
            step()
    def captured():
        loss_fn(model(x), t).backward()
        opt.step()

    def warm_then_clear():
        step()
        opt.zero_grad(set_to_none=True)       # the graph's backward allocates its own gradients
    g = C.torch_cuda_graph(warm_then_clear, captured)

    def replay():
        with torch.cuda.stream(ts):
            g.replay()
    return {"torch eager": eager, "torch.cuda.CUDAGraph": replay}


# ---------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="cygemm against cp.matmul, PyTorch, nvmath-python and a C++ cuBLAS floor, in one "
                    "process and one run. Needs a GPU, CuPy and nvcc; torch and nvmath-python are used "
                    "when importable.")
    ap.add_argument("--out", default=os.environ.get("OUT") or "benchmark-results",
                    help="folder for bench.json, RESULTS.md and the plots (default: ./benchmark-results; "
                         "the committed results are in benchmarks/results)")
    ap.add_argument("--quick", action="store_true", help="a run under a minute: fewer sizes and rounds")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {SECTIONS}")
    args = ap.parse_args(argv)
    reason = cygemm.gpu_unavailable_reason()
    if reason:
        ap.exit(1, f"python -m benchmarks needs a GPU: {reason}\n")
    only = [x for x in args.only.split(",") if x]
    bad = set(only) - set(SECTIONS)
    if bad:
        ap.error(f"--only: unknown sections {sorted(bad)}; expected some of {SECTIONS}")
    os.makedirs(args.out, exist_ok=True)
    R = Recorder(args.quick)
    clocks_before = clocks()
    R.section = "setup"
    R.progress("building the C++ floor")
    floor = R.floor = build_floor(os.path.join(tempfile.mkdtemp(), "cublas_floor"))
    s = cp.cuda.Stream(non_blocking=True)
    late = None
    if "host" in only:      # before torch is imported: its threads made host timings noisier
        R.section = "host"
        late = host_section(R, s, floor)
    R.section = "setup"
    R.progress("importing torch and nvmath-python")
    C.import_optional()
    for name in SECTIONS:
        if name not in only:
            continue
        R.section = name
        if name == "host":
            host_section_late(R, s, floor, *late)
        else:
            globals()[f"{name}_section"](R, s, floor)
    env = environment(cp, dict(C.versions(), clocks_before=clocks_before, clocks_after=clocks(),
                               quick=args.quick, sections=only, seconds=round(time.time() - R.t0, 1)))
    floor.close()
    path = os.path.join(args.out, "bench.json")
    with open(path, "w") as f:
        json.dump({"environment": env, "rows": R.rows, "tuning": cygemm.tuning.tuning_entries()}, f, indent=1)
    R.section = "report"
    R.progress(f"wrote {path}")
    import report
    report.write(args.out)


if __name__ == "__main__":
    main()
