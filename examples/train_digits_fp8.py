"""A two-layer MLP trained on scikit-learn's digits with every GEMM in FP8, forward and backward,
with delayed scaling (each tensor's scale from the amax history of earlier steps, as Transformer
Engine does it), beside the same network with bfloat16 GEMMs.

    python examples/train_digits_fp8.py [--epochs 40]

Forward: x and the weights in E4M3, one cygemm.fp8.scaled_matmul per layer with the bias (and
relu) in cuBLASLt's epilogue. Backward: the gradients in E5M2 against E4M3 activations and
weights. FP8 GEMMs read both operands K-contiguous, so the backward quantizes transposed copies
(what Transformer Engine's cast-transpose does). The bfloat16 network computes the same steps
with bfloat16 operands and float32 accumulation.
"""
import argparse
import sys

import cupy as cp
import numpy as np

from cygemm import fp8

HIDDEN, CLASSES, PAD = 256, 10, 16      # logits padded to 16 columns: FP8 rows are 16-byte multiples
HISTORY, MARGIN = 16, 0


def load_digits(seed=0):
    from sklearn.datasets import load_digits as load
    from sklearn.model_selection import train_test_split
    X, y = load(return_X_y=True)
    X = (X / 16.0 - 0.5).astype(np.float32)
    return train_test_split(X, y, test_size=0.25, random_state=seed, stratify=y)


def init(seed):
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((HIDDEN, 64)) * np.sqrt(2 / 64)).astype(np.float32)      # (N, K)
    w2 = np.zeros((PAD, HIDDEN), np.float32)
    w2[:CLASSES] = rng.standard_normal((CLASSES, HIDDEN)) * np.sqrt(1 / HIDDEN)
    return {k: cp.asarray(v) for k, v in dict(w1=w1, b1=np.zeros(HIDDEN, np.float32), w2=w2,
                                               b2=np.zeros(PAD, np.float32)).items()}


class Scaling:
    """Delayed scaling of one tensor: its quantizing scale is fp8_max / max(amax of the last
    HISTORY steps) / 2**MARGIN; quantize() records this step's amax."""

    def __init__(self, fmt):
        self.fmt, self.fp8_max = fmt, fp8.FP8_MAX[fmt]
        self.history = cp.zeros(HISTORY, cp.float32)
        self.scale, self.scale_inv = cp.ones(1, cp.float32), cp.ones(1, cp.float32)
        self.amax, self.step = cp.zeros(1, cp.float32), 0

    def quantize(self, x):
        q = fp8.quantize(cp.ascontiguousarray(x), self.scale, format=self.fmt, amax=self.amax)
        return q

    def update(self):
        self.history[self.step % HISTORY] = self.amax[0]
        self.step += 1
        top = cp.maximum(self.history.max(), cp.float32(1e-12))
        self.scale[...] = self.fp8_max / top / 2 ** MARGIN
        self.scale_inv[...] = 1 / self.scale


def _bf16(x):
    """x rounded to bfloat16 (to nearest even), kept in float32: a bfloat16 GEMM's operands."""
    u = cp.ascontiguousarray(x, cp.float32).view(cp.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & cp.uint32(0xFFFF0000)
    return u.view(cp.float32)


class FP8Net:
    names = ("x", "w1", "h", "w2", "dlogits", "dh")

    def __init__(self, params):
        self.p = params
        self.s = {n: Scaling("e5m2" if n.startswith("d") else "e4m3") for n in self.names}
        self.s["xT"], self.s["hT"], self.s["w2T"] = Scaling("e4m3"), Scaling("e4m3"), Scaling("e4m3")
        self.s["dlogitsT"], self.s["dz1T"] = Scaling("e5m2"), Scaling("e5m2")

    def mm(self, a_name, a, b_name, b_nk, bias=None, act="none", out_dtype="float32"):
        """a (M, K) @ b_nk.T (b_nk: (N, K)) with both in FP8 by their scalings."""
        sa, sb = self.s[a_name], self.s[b_name]
        qa, qb = sa.quantize(a), sb.quantize(b_nk)
        return fp8.scaled_matmul(qa, qb.T, sa.scale_inv, sb.scale_inv, format_a=sa.fmt, format_b=sb.fmt,
                                 bias=None if bias is None else _bias_bf16(bias), act=act, out_dtype=out_dtype)

    def forward(self, x):
        h = self.mm("x", x, "w1", self.p["w1"], self.p["b1"], act="relu")
        logits = self.mm("h", h, "w2", self.p["w2"], self.p["b2"])
        return h, logits

    def step(self, x, y, lr):
        h, logits = self.forward(x)
        dlogits = _softmax_xent_grad(logits, y)
        # dW2 (PAD, H) = dlogits.T @ h;  dh (B, H) = dlogits @ W2;  dW1 = dz1.T @ x
        dw2 = self.mm("dlogitsT", dlogits.T, "hT", h.T)
        dh = self.mm("dlogits", dlogits, "w2T", self.p["w2"].T)
        dz1 = dh * (h > 0)
        dw1 = self.mm("dz1T", dz1.T, "xT", x.T)
        self.p["w2"] -= lr * dw2
        self.p["b2"] -= lr * dlogits.sum(axis=0)
        self.p["w1"] -= lr * dw1
        self.p["b1"] -= lr * dz1.sum(axis=0)
        for s in self.s.values():
            s.update()

    def predict(self, x):
        return self.forward(x)[1][:, :CLASSES].argmax(axis=1)


class BF16Net:
    def __init__(self, params):
        self.p = params

    def forward(self, x):
        h = cp.maximum(_bf16(x) @ _bf16(self.p["w1"]).T + self.p["b1"], 0)
        return h, _bf16(h) @ _bf16(self.p["w2"]).T + self.p["b2"]

    def step(self, x, y, lr):
        h, logits = self.forward(x)
        dlogits = _softmax_xent_grad(logits, y)
        dw2 = _bf16(dlogits).T @ _bf16(h)
        dh = _bf16(dlogits) @ _bf16(self.p["w2"])
        dz1 = dh * (h > 0)
        dw1 = _bf16(dz1).T @ _bf16(x)
        self.p["w2"] -= lr * dw2
        self.p["b2"] -= lr * dlogits.sum(axis=0)
        self.p["w1"] -= lr * dw1
        self.p["b1"] -= lr * dz1.sum(axis=0)

    def predict(self, x):
        return self.forward(x)[1][:, :CLASSES].argmax(axis=1)


def _bias_bf16(b):
    """A float32 bias as the bfloat16 an FP8 GEMM takes (torch when present, else ml_dtypes)."""
    try:
        import torch
        return torch.as_tensor(b, device="cuda").to(torch.bfloat16)
    except ImportError:
        import ml_dtypes
        return cp.asarray(cp.asnumpy(b).astype(ml_dtypes.bfloat16))


def _softmax_xent_grad(logits, y):
    z = logits[:, :CLASSES]
    z = z - z.max(axis=1, keepdims=True)
    p = cp.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    p[cp.arange(len(y)), y] -= 1
    g = cp.zeros(logits.shape, cp.float32)
    g[:, :CLASSES] = p / len(y)
    return g


def train(net_cls, epochs, batch=64, lr=0.1, seed=0):
    Xtr, Xte, ytr, yte = load_digits(seed)
    net = net_cls(init(seed))
    Xtr_d, ytr_d = cp.asarray(Xtr), cp.asarray(ytr)
    rng = np.random.default_rng(seed)
    n = len(Xtr) // batch * batch           # full batches: FP8 GEMMs over the batch need K % 16 == 0
    for _ in range(epochs):
        order = cp.asarray(rng.permutation(len(Xtr))[:n])
        for i in range(0, n, batch):
            idx = order[i:i + batch]
            net.step(Xtr_d[idx], ytr_d[idx], lr)
    pred = cp.asnumpy(net.predict(cp.asarray(Xte)))
    return float((pred == yte).mean() * 100)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=40)
    args = ap.parse_args(argv)
    import cygemm
    reason = cygemm.gpu_unavailable_reason()
    if reason:                     # before loading data: one line that says why, no traceback
        sys.exit(f"train_digits_fp8.py: {reason}")
    acc_fp8 = train(FP8Net, args.epochs)
    acc_bf16 = train(BF16Net, args.epochs)
    print(f"digits test accuracy after {args.epochs} epochs: FP8 {acc_fp8:.2f}%, bfloat16 {acc_bf16:.2f}% "
          f"(difference {acc_fp8 - acc_bf16:+.2f} points)")
    return acc_fp8, acc_bf16


if __name__ == "__main__":
    main()
