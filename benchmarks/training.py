"""Training steps and the array backend, for the benchmark suite's "train" and "backend"
sections: cygemm.nn (captured and eager) against CuPy's unfused operations, torch eager and a
torch CUDA graph with torch's fused optimizer; CUDABackend against CuPy-only code of the same
algorithms and NumPy."""
import os
import statistics
import sys
import time

import cupy as cp
import numpy as np

import contenders as C
from common import host_us

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))


def _batch(sizes, batch, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, sizes[0])).astype(np.float32),
            rng.integers(0, sizes[-1], batch).astype(np.int32))


def cygemm_steps(sizes, batch, opt_name, x, y):
    import cygemm.nn as nn
    out = {}
    for eager in (True, False):
        model = nn.MLP(list(sizes), act="relu", seed=0)
        opt = nn.SGD(model, lr=1e-2, momentum=0.9) if opt_name == "SGD" else nn.Adam(model, lr=1e-3)
        step = nn.compile_step(model, nn.SoftmaxCrossEntropy(), opt, batch, eager=eager)
        step(x, y)
        out["cygemm eager" if eager else "cygemm captured"] = step
    return out


def cupy_step(sizes, batch, opt_name, x, y):
    """The same step in CuPy's own operations (allocating, as CuPy code is written)."""
    rng = np.random.default_rng(0)
    W = [cp.asarray(rng.uniform(-1, 1, (o, i)).astype(np.float32) / np.sqrt(i)) for i, o in zip(sizes[:-1], sizes[1:])]
    b = [cp.zeros(o, np.float32) for o in sizes[1:]]
    params = W + b
    state = [cp.zeros_like(p) for p in params] + [cp.zeros_like(p) for p in params]
    t = [0]
    X, Y = cp.asarray(x), cp.asarray(y)
    onehot = cp.eye(sizes[-1], dtype=np.float32)[Y]

    def fn():
        acts = [X]
        for i in range(len(W)):
            z = acts[-1] @ W[i].T + b[i]
            acts.append(cp.maximum(z, 0) if i < len(W) - 1 else z)
        z = acts[-1]
        e = cp.exp(z - z.max(1, keepdims=True))
        g = (e / e.sum(1, keepdims=True) - onehot) / batch
        grads_w, grads_b = [None] * len(W), [None] * len(W)
        for i in reversed(range(len(W))):
            grads_w[i], grads_b[i] = g.T @ acts[i], g.sum(0)
            if i > 0:
                g = (g @ W[i]) * (acts[i] > 0)
        t[0] += 1
        for k, (p, gr) in enumerate(zip(params, grads_w + grads_b)):
            if opt_name == "SGD":
                buf = state[k]
                buf *= 0.9
                buf += gr
                p -= 1e-2 * buf
            else:
                m, v = state[k], state[len(params) + k]
                m *= 0.9
                m += 0.1 * gr
                v *= 0.999
                v += 0.001 * gr * gr
                p -= 1e-3 / (1 - 0.9 ** t[0]) * m / (cp.sqrt(v / (1 - 0.999 ** t[0])) + 1e-8)
    return fn


def torch_steps(sizes, batch, opt_name, x, y, s):
    torch = C.torch
    torch.backends.cuda.matmul.allow_tf32 = True
    out = {}
    ts = torch.cuda.ExternalStream(s.ptr)
    X, Y = torch.from_numpy(x).cuda(), torch.from_numpy(y.astype(np.int64)).cuda()
    for graph in (False, True):
        layers = []
        for k, (i, o) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers += [torch.nn.Linear(i, o)] + ([torch.nn.ReLU()] if k < len(sizes) - 2 else [])
        model = torch.nn.Sequential(*layers).cuda()
        if opt_name == "SGD":
            opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, fused=True)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True, capturable=graph)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step():
            opt.zero_grad(set_to_none=not graph)
            loss_fn(model(X), Y).backward()
            opt.step()
        if not graph:
            def eager(step=step):
                with torch.cuda.stream(ts):
                    step()
            out["torch eager (fused optimizer)"] = eager
            continue
        g = C.torch_cuda_graph(step)

        def replay(g=g):
            with torch.cuda.stream(ts):
                g.replay()
        out["torch.cuda.CUDAGraph (fused optimizer)"] = replay
        out["_keep"] = (model, opt, g)
    return out


def train_section(R, s, floor):
    steps = 100 if R.quick else 400
    for sizes, batch in (((64, 256, 256, 10), 64), ((784, 1024, 1024, 10), 256)):
        for opt_name in ("SGD", "Adam"):
            case = f"train step {'-'.join(map(str, sizes))} b{batch} {opt_name}, wall us/step"
            R.progress(case)
            x, y = _batch(sizes, batch)
            fns = {}
            for name, st in cygemm_steps(sizes, batch, opt_name, x, y).items():
                fns[name] = (st.replay, st.stream.synchronize)
            fns["CuPy eager (unfused)"] = (_on(s, cupy_step(sizes, batch, opt_name, x, y)), s.synchronize)
            if C.torch is not None:
                for name, fn in torch_steps(sizes, batch, opt_name, x, y, s).items():
                    if not name.startswith("_"):
                        fns[name] = (fn, s.synchronize)
            else:
                R.skip(case, "torch", C.IMPORT_ERRORS.get("torch"))
            # Interleaved: each round times every contender once.
            vals = {name: [] for name in fns}
            for _ in range(5):
                for name, (fn, sync) in fns.items():
                    vals[name].append(host_us(fn, sync, calls=steps, reps=1, warmup=20))
            for name, v in vals.items():
                R.add(case, name, "step_us", statistics.median(v), min(v), max(v))


def _on(s, fn):
    def run():
        with s:
            fn()
    return run


# ---------------------------------------------------------------- backend

def cupy_only_logreg(X, Y, C_, iters, L):
    """The seed's CuPy-only code of the same algorithm: clipped softmax with temporaries and a
    host float from cp.dot every iteration (its progress check): one synchronisation each."""
    n, d = X.shape
    X1 = cp.concatenate([X, cp.ones((n, 1), X.dtype)], axis=1)
    W = cp.zeros((d + 1, Y.shape[1]), X.dtype)
    V = W.copy()
    mask = cp.ones((d + 1, 1), X.dtype)
    mask[d] = 0
    q = 1.0 / L
    mom = (1 - q ** 0.5) / (1 + q ** 0.5)
    syncs = 0
    for _ in range(iters):
        z = cp.clip(X1 @ V, -30, 30)
        e = cp.exp(z - z.max(axis=1, keepdims=True))
        P = e / e.sum(axis=1, keepdims=True)
        grad = C_ * (X1.T @ (P - Y)) + mask * V
        W_next = V - grad / L
        V = W_next + mom * (W_next - W)
        W = W_next
        gnorm = float(cp.dot(grad.ravel(), grad.ravel()).get())
        syncs += 1
        if gnorm == 0:
            break
    return W, syncs


def cupy_only_ridge(X, y, alpha):
    Xc, yc = X - X.mean(0), y - y.mean()
    G = Xc.T @ Xc + alpha * cp.eye(X.shape[1], dtype=X.dtype)
    coef = cp.linalg.solve(G, Xc.T @ yc)
    return coef, y.mean() - X.mean(0) @ coef


def backend_section(R, s, floor):
    import cupyx
    import linear_models as lm
    from cygemm.backend import CUDABackend, NumPyBackend
    n, d, k = (16384, 512, 10) if R.quick else (65536, 1024, 10)
    iters = 20 if R.quick else 50
    rng = np.random.default_rng(0)
    Xh = rng.standard_normal((n, d)).astype(np.float32)
    Wtrue = rng.standard_normal((d, k)).astype(np.float32)
    labels = (Xh @ Wtrue + rng.gumbel(size=(n, k))).argmax(1)
    yh = (Xh @ Wtrue[:, 0] + rng.standard_normal(n)).astype(np.float32)
    cb, nb = CUDABackend(stream=s), NumPyBackend("float32")

    def timed(be, fn, reps):
        out = fn()
        be.synchronize()
        ts = []
        for _ in range(reps):
            be.synchronize()
            t0 = time.perf_counter()
            out = fn()
            be.synchronize()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts), min(ts), max(ts), out

    case = f"ridge {n}x{d}, fit ms"
    R.progress(case)
    Xd, yd = cb.asarray(Xh), cb.asarray(yh)
    med, lo, hi, _ = timed(cb, lambda: cb.ridge(Xd, yd, 1.0), 5)
    R.add(case, "CUDABackend (cygemm)", "fit_ms", med, lo, hi)
    with s:
        Xc, yc = cp.asarray(Xh), cp.asarray(yh)
        med, lo, hi, _ = timed(cb, lambda: cupy_only_ridge(Xc, yc, 1.0), 5)
    R.add(case, "CuPy-only code", "fit_ms", med, lo, hi)
    med, lo, hi, _ = timed(nb, lambda: nb.ridge(Xh, yh, 1.0), 2)
    R.add(case, "NumPy (NumPyBackend)", "fit_ms", med, lo, hi)

    case = f"logistic regression {n}x{d}, {k} classes, {iters} iterations, fit ms"
    R.progress(case)
    st = lm.logreg_iterate(cb, lm.logreg_setup(cb, Xd, labels, k), 2)
    cb.synchronize()
    with cupyx.allow_synchronize(False):        # raises on any synchronisation CuPy makes
        lm.logreg_iterate(cb, st, 3)
    med, lo, hi, _ = timed(cb, lambda: lm.fit_logreg(cb, Xd, labels, k, iters=iters), 3)
    R.add(case, "CUDABackend (cygemm)", "fit_ms", med, lo, hi, syncs_per_iteration=0)
    with s:
        Yc = cp.eye(k, dtype=cp.float32)[cp.asarray(labels)]
        Lc = 0.5 * lm_max_eig(Xc) + 1.0
        med, lo, hi, (_, syncs) = timed(cb, lambda: cupy_only_logreg(Xc, Yc, 1.0, iters, Lc), 3)
    R.add(case, "CuPy-only code", "fit_ms", med, lo, hi, syncs_per_iteration=syncs / iters)
    med, lo, hi, _ = timed(nb, lambda: lm.fit_logreg(nb, Xh, labels, k, iters=iters), 1)
    R.add(case, "NumPy (NumPyBackend)", "fit_ms", med, lo, hi, syncs_per_iteration=0)


def lm_max_eig(X):
    X1 = cp.concatenate([X, cp.ones((X.shape[0], 1), X.dtype)], axis=1)
    G = X1.T @ X1
    v = cp.ones(G.shape[0], G.dtype)
    for _ in range(50):
        v = G @ v
        v /= cp.linalg.norm(v)
    return float(v @ (G @ v))
