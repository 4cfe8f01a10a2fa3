"""The "graph" section: a 64^3 GEMM captured into a CUDA graph beside the C++ floor's, and
the wall time of an MLP training step eager and captured, against CuPy and torch."""
import statistics

import cupy as cp

import cygemm
import contenders as C
from common import gpu_ms, host_us, run_floor
from mlp import MLP


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
