"""A 3-layer MLP training step (forward, MSE loss gradient, backward, SGD) on cygemm's
*_into API, allocation-free so that it can be captured whole into a CUDA graph.
Used by the benchmarks and by tests/engine/test_graph.py."""
import cupy as cp
import numpy as np

from cygemm.gemm_ops import backward_into, ensure_workspaces, forward_into


# One launch per tensor for the loss gradient and the SGD update (as torch's fused optimizers
# do), instead of two CuPy operations each: in a graph every launch costs ~2 us.
_mse_grad = cp.ElementwiseKernel("T y, T t, float32 scale", "T g", "g = scale * (y - t)", "cygemm_mlp_mse_grad")
_sgd = cp.ElementwiseKernel("T g, float32 lr", "T w", "w -= lr * g", "cygemm_mlp_sgd")


class MLP:
    def __init__(self, sizes=(64, 256, 256, 10), batch=64, act="relu", lr=1e-2, seed=0, math="tf32"):
        rng = np.random.default_rng(seed)
        self.act, self.lr, self.math, self.batch = act, lr, math, batch
        f32 = lambda a: cp.asarray(a.astype(np.float32))
        self.W = [f32(rng.standard_normal((i, o)) / np.sqrt(i)) for i, o in zip(sizes[:-1], sizes[1:])]
        self.b = [f32(0.1 * rng.standard_normal(o)) for o in sizes[1:]]
        self.x = cp.empty((batch, sizes[0]), cp.float32)
        self.target = cp.empty((batch, sizes[-1]), cp.float32)
        self.Y = [cp.empty((batch, o), cp.float32) for o in sizes[1:]]
        self.gY = [cp.empty((batch, o), cp.float32) for o in sizes[1:]]
        self.gW = [cp.empty_like(w) for w in self.W]
        self.gb = [cp.empty_like(b) for b in self.b]
        self.ws = [ensure_workspaces(batch, o) for o in sizes[1:]]

    def acts(self):
        return [self.act] * (len(self.W) - 1) + ["none"]

    def step(self, stream):
        """One SGD step on (self.x, self.target); enqueues only, allocates nothing."""
        acts = self.acts()
        inp = self.x
        for W, b, Y, act, ws in zip(self.W, self.b, self.Y, acts, self.ws):
            # relu's derivative is read from Y in the backward: no need to save Z.
            forward_into(inp, W, Y, b, act=act, lt_workspace=ws.lt_ws, math=self.math, stream=stream)
            inp = Y
        with stream:
            # d(mean squared error)/dY = 2 (Y - target) / size, into gY: no allocation.
            _mse_grad(self.Y[-1], self.target, np.float32(2.0 / self.Y[-1].size), self.gY[-1])
        for i in reversed(range(len(self.W))):
            inp = self.x if i == 0 else self.Y[i - 1]
            backward_into(inp, self.W[i], self.gY[i], None, y=self.Y[i], act=acts[i],
                          gA_out=self.gY[i - 1] if i > 0 else None, gB_out=self.gW[i], gBias_out=self.gb[i],
                          work_dZ=self.ws[i].dZ, lt_workspace=self.ws[i].lt_ws, math=self.math, stream=stream)
        with stream:
            lr = np.float32(self.lr)
            for W, gW, b, gb in zip(self.W, self.gW, self.b, self.gb):
                _sgd(gW, lr, W)
                _sgd(gb, lr, b)
