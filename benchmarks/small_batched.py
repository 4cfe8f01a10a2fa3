"""Benchmark section "small_batched": strided batches of small GEMMs, 384 MiB of A, B and C in
all, every contender on the same operands in one interleaved run. Contenders:
cygemm.gemm_strided_batched (its chosen route: cygemm's kernel or cuBLAS), the same call with the
cuBLAS route forced (cygemm's previous route), torch.bmm and cp.matmul; a device-to-device copy of
256 MiB in the same rounds gives the bandwidth a GEMM of these bytes could reach. GPU time: a CUDA
graph of up to GRAPH_CALLS calls (fewer where cuBLAS takes milliseconds a call: every contender
of a case the same number; cp.matmul, which cannot be captured: as many eager calls), timed by
CUDA events with the GPU held while they are enqueued, per call; eager: wall time per call over
back-to-back calls with one sync. Rows carry ``gbps`` (bytes of A, B and C over the GPU time) and
``of_copy`` (that over the copy's 2 x bytes / time).

Then the two costs measured beside it: int_mm at M = 32, N = K = 4096 against torch._int_mm, and
the host time of fp8.scaled_matmul against a bfloat16 gemm of the same torch tensors and
torch._scaled_mm."""
import os
import statistics

import cupy as cp
import numpy as np

import cygemm
import contenders as C
from common import host_us
from hopper import _on_torch_stream

GRAPH_CALLS = 10
GRAPH_MS = 20           # a graph's calls are capped at this much of cuBLAS's time
# CYGEMM_SMALL_BATCHED_DTYPES=float32,float64 runs some of the dtypes (a run in parts).
DTYPES = tuple(os.environ.get("CYGEMM_SMALL_BATCHED_DTYPES", "float32,float16,bfloat16,float64").split(","))
TOTAL_BYTES = 384 << 20
COPY_BYTES = 256 << 20
SQUARE = (2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
SHAPES = tuple((n, n, n) for n in SQUARE) + ((4, 4, 16), (16, 64, 16), (8, 32, 8), (32, 8, 32), (3, 3, 1))
QUICK = ((2, 2, 2), (8, 8, 8), (32, 32, 32))


def _graph(s, fn, calls=GRAPH_CALLS):
    fn()                                   # warm-up: routes decided, plans made, nothing allocates
    s.synchronize()
    with cygemm.graph.capture(s) as g:
        for _ in range(calls):
            fn()
    return g


def _torch_graph(torch, s, fn, calls):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.ExternalStream(s.ptr)):
        for _ in range(calls):
            fn()
    return g


def _once_ms(s, fn):
    """GPU time of one call (after one warm-up), to size the graphs."""
    fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(s)
    fn()
    end.record(s)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end)


def _operands(torch, rng, dtype, shape):
    x = rng.standard_normal(shape, dtype=np.float32)
    if dtype == "bfloat16":
        return torch.from_numpy(x).to(device="cuda", dtype=torch.bfloat16)
    return cp.asarray(x.astype(dtype))


def small_batched_section(R, s, floor):
    torch = C.torch
    rng = np.random.default_rng(39)
    src, dst = cp.empty(COPY_BYTES, cp.uint8), cp.empty(COPY_BYTES, cp.uint8)
    copy = _graph(s, lambda: cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, COPY_BYTES, 3, s.ptr))
    for dtype in DTYPES:
        if dtype == "bfloat16" and torch is None:        # (bfloat16 operands are torch tensors)
            R.skip(f"{dtype} small batches", "all", C.IMPORT_ERRORS.get("torch"))
            continue
        itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
        for m, n, k in (QUICK if R.quick else SHAPES):
            per = (m * k + k * n + m * n) * itemsize
            batch = TOTAL_BYTES // per
            case = f"{dtype} {m}x{n}x{k} batch {batch}"
            R.progress(case)
            with s:
                a, b = _operands(torch, rng, dtype, (batch, m, k)), _operands(torch, rng, dtype, (batch, k, n))
                out = (torch.empty((batch, m, n), dtype=torch.bfloat16, device="cuda") if dtype == "bfloat16"
                       else cp.empty((batch, m, n), dtype))
            s.synchronize()
            torch.cuda.synchronize() if torch is not None else None

            def ours(a=a, b=b, out=out):
                cygemm.gemm_strided_batched(a, b, out, math="fp32", stream=s)

            ours()                          # the route decided (timed once where worth it)
            route = cygemm.describe_gemm(a, b, out, batched=True)["route"]
            cygemm.tuning.force_routes(small_batched="cublas")
            try:
                calls = max(2, min(GRAPH_CALLS, int(GRAPH_MS / max(_once_ms(s, ours), 1e-3))))
                cublas_graph = _graph(s, ours, calls)
            finally:
                cygemm.tuning.force_routes()
            graphs = {"cygemm": _graph(s, ours, calls), "cygemm, cuBLAS route": cublas_graph}
            if torch is not None:
                ta, tb, tout = (x if dtype == "bfloat16" else torch.from_dlpack(x) for x in (a, b, out))
                tg = _torch_graph(torch, s, lambda: torch.bmm(ta, tb, out=tout), calls)
                graphs["torch.bmm"] = tg
            contenders = {name: (lambda g=g: g.launch(s)) if name != "torch.bmm" else
                          _on_torch_stream(s, lambda g=g: g.replay()) for name, g in graphs.items()}
            if dtype != "bfloat16":
                def theirs(a=a, b=b, out=out):
                    with s:
                        cp.matmul(a, b, out=out)

                def theirs_repeated(calls=calls):
                    for _ in range(calls):
                        theirs()
                # cp.matmul calls cuBLAS's stream setter, which refuses a capture: as many eager
                # calls, timed as every GPU time here is (the GPU held while they are enqueued).
                contenders["cp.matmul"] = theirs_repeated
            contenders["copy 256 MiB"] = lambda: copy.launch(s)      # (GRAPH_CALLS copies)
            rows = R.measure(case, contenders, s, reps=3, rounds=3, inner=1)
            copy_ms = next(r["value"] for r in rows if r["contender"] == "copy 256 MiB") / GRAPH_CALLS
            copy_gbps = 2 * COPY_BYTES / (copy_ms * 1e-3) / 1e9
            for r in rows:
                per_graph = GRAPH_CALLS if r["contender"] == "copy 256 MiB" else calls
                r["value"] /= per_graph
                r["lo"] /= per_graph
                r["hi"] /= per_graph
                r["rounds"] = [v / per_graph for v in r["rounds"]]
                r["calls_per_graph"] = per_graph
                bytes_ = 2 * COPY_BYTES if r["contender"] == "copy 256 MiB" else per * batch
                r["gbps"] = bytes_ / (r["value"] * 1e-3) / 1e9
                r["of_copy"] = r["gbps"] / copy_gbps
                r["route"] = route
            # Eager wall time per call (the GPU time plus whatever launch cost shows).
            eager = {"cygemm": ours}
            if torch is not None:
                eager["torch.bmm"] = _on_torch_stream(s, lambda: torch.bmm(ta, tb, out=tout))
            if dtype != "bfloat16":
                eager["cp.matmul"] = theirs
            for name, fn in eager.items():
                vals = [host_us(fn, s.synchronize, calls=5, reps=1, warmup=2) for _ in range(3)]
                R.add(case, name + " eager", "wall_us", statistics.median(vals), min(vals), max(vals),
                      route=route)
            del graphs, contenders, eager, a, b, out
            if torch is not None:
                del ta, tb, tout
                torch.cuda.empty_cache()
            cp.get_default_memory_pool().free_all_blocks()
    int_mm_and_fp8_costs(R, s, torch)


def int_mm_and_fp8_costs(R, s, torch):
    if torch is None:
        R.skip("int_mm 32x4096x4096", "all", C.IMPORT_ERRORS.get("torch"))
        return
    rng = np.random.default_rng(40)
    case = "int_mm 32x4096x4096"
    R.progress(case)
    with s:
        a = cp.asarray(rng.integers(-128, 128, (32, 4096), dtype=np.int8))
        w = cp.asarray(rng.integers(-128, 128, (4096, 4096), dtype=np.int8))
        out = cp.empty((32, 4096), cp.int32)
    ta, tw, tout = (torch.from_dlpack(x) for x in (a, w, out))
    ours = lambda: cygemm.int_mm(a, w.T, out, stream=s)          # noqa: E731
    theirs = _on_torch_stream(s, lambda: torch._int_mm(ta, tw.t(), out=tout))
    R.measure(case, {"cygemm.int_mm": ours, "torch._int_mm": theirs}, s, reps=50, rounds=5)
    for name, fn in (("cygemm.int_mm", ours), ("torch._int_mm", theirs)):
        vals = [host_us(fn, s.synchronize, calls=2000, reps=1, warmup=100) for _ in range(3)]
        R.add(case, name + " eager", "wall_us", statistics.median(vals), min(vals), max(vals))
    # The same with 8 weights in turn (128 MiB, past the L2 cache): each call reads its weight from
    # memory, as a model's layers do; above, one weight stays in L2 from call to call (cygemm times
    # its candidates with L2 flushed).
    case = "int_mm 32x4096x4096, 8 weights in turn"
    R.progress(case)
    with s:
        ws = [cp.asarray(rng.integers(-128, 128, (4096, 4096), dtype=np.int8)) for _ in range(8)]
    tws = [torch.from_dlpack(x) for x in ws]
    ours = [lambda w=w: cygemm.int_mm(a, w.T, out, stream=s) for w in ws]
    theirs = [_on_torch_stream(s, lambda tw=tw: torch._int_mm(ta, tw.t(), out=tout)) for tw in tws]
    R.measure(case, {"cygemm.int_mm": ours, "torch._int_mm": theirs}, s, inner=8, reps=50, rounds=5)
    del ws, tws
    if not (hasattr(torch, "float8_e4m3fn") and torch.cuda.get_device_capability() >= (8, 9)):
        return
    case = "host cost 1024x1024x1024 fp8 vs bf16"
    R.progress(case)
    x = torch.randn(1024, 1024, device="cuda")
    a8, w8 = x.to(torch.float8_e4m3fn), x.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    y = torch.empty(1024, 1024, device="cuda", dtype=torch.bfloat16)
    xb = x.to(torch.bfloat16)
    w8t = w8.t()        # (once: a view made in each call would add one of torch's ops to the FP8 rows alone)
    calls = {
        "cygemm.fp8.scaled_matmul": lambda: cygemm.fp8.scaled_matmul(a8, w8t, one, one, out=y, stream=s),
        "cygemm.gemm bf16": lambda: cygemm.gemm(xb, xb, y, stream=s),
        "torch._scaled_mm": _on_torch_stream(s, lambda: torch._scaled_mm(a8, w8t, one, one, out_dtype=torch.bfloat16,
                                                                          out=y)),
    }
    for name, fn in calls.items():
        vals = [host_us(fn, s.synchronize, calls=2000, reps=1, warmup=100) for _ in range(5)]
        R.add(case, name, "wall_us", statistics.median(vals), min(vals), max(vals))
