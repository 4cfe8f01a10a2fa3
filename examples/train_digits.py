"""Train an MLP on scikit-learn's digits with cygemm.nn, the whole step in one CUDA graph, and
the same model in torch (same initialisation, same batch order) for comparison.

    python examples/train_digits.py [--epochs 40] [--precision bf16-mixed] [--save digits.npz]
                                    [--plot digits.png] [--curves digits.json]

Prints a line per epoch, the test accuracies, and the step time eager against captured.
``--precision bf16-mixed`` trains with bfloat16 GEMMs on float32 master weights (torch then
runs under bfloat16 autocast); ``fp8-tensor``, ``fp8-rowwise`` and ``fp8-block`` with FP8 GEMMs
on them (the layers whose sizes are multiples of 16; torch runs under bfloat16 autocast, the
reference an FP8 run should stay within a point of); ``--save`` writes the captured run's model and optimizer state
(``cygemm.nn.save``: an .npz file NumPy reads); ``--plot`` draws the loss curves and, below
them, each run's difference to the reference run (torch, else cygemm eager), since the curves
coincide; ``--curves`` keeps them as JSON.
"""
import argparse
import sys
import time

import numpy as np


def load(seed=0):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    return train_test_split(X, y.astype(np.int32), test_size=0.25, random_state=seed, stratify=y)


def batch_orders(n, batch, epochs, seed=0):
    """For each epoch, the sample indices of its full batches (the remainder is dropped)."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(n)[: n // batch * batch].reshape(-1, batch) for _ in range(epochs)]


def train_cygemm(Xtr, ytr, orders, sizes, lr, eager, seed, log, precision="fp32"):
    import cupy as cp
    import cygemm.nn as nn
    model = nn.MLP(sizes, act="relu", seed=seed, precision=precision)
    init = [(layer.weight.get(), layer.bias.get()) for layer in model.layers]
    step = nn.compile_step(model, nn.SoftmaxCrossEntropy(), nn.Adam(model, lr=lr), batch=orders[0].shape[1],
                           eager=eager)
    Xd, yd = cp.asarray(Xtr), cp.asarray(ytr)
    curve = []
    with step.stream:
        epoch_loss = cp.zeros((), cp.float32)
    for e, order in enumerate(orders):
        with step.stream:
            epoch_loss.fill(0)
            Xe, ye = Xd[cp.asarray(order.reshape(-1))], yd[cp.asarray(order.reshape(-1))]
        b = order.shape[1]
        for i in range(order.shape[0]):
            loss = step(Xe[i * b:(i + 1) * b], ye[i * b:(i + 1) * b])
            with step.stream:
                epoch_loss += loss                    # on the device: no synchronisation
        curve.append(float(epoch_loss.get(stream=step.stream)) / order.shape[0])
        if log:
            log(e, curve[-1])
    step.check()
    return model, step, curve, init


def accuracy_cygemm(model, Xte, yte):
    import cupy as cp
    logits = model.predict(cp.asarray(Xte))
    return float((logits.argmax(axis=1).get() == yte).mean())


def train_torch(Xtr, ytr, orders, sizes, lr, init, precision="fp32"):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    layers = []
    for k, (i, o) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [torch.nn.Linear(i, o)] + ([torch.nn.ReLU()] if k < len(sizes) - 2 else [])
    model = torch.nn.Sequential(*layers).cuda()
    with torch.no_grad():
        for lin, (w, b) in zip([m for m in model if isinstance(m, torch.nn.Linear)], init):
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    Xd, yd = torch.from_numpy(Xtr).cuda(), torch.from_numpy(ytr.astype(np.int64)).cuda()
    curve = []
    for order in orders:
        total = torch.zeros((), device="cuda")
        for idx in order:
            idx = torch.from_numpy(idx).cuda()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision != "fp32"):
                loss = loss_fn(model(Xd[idx]), yd[idx])
            loss.backward()
            opt.step()
            total += loss.detach()
        curve.append(float(total) / order.shape[0])
    return model, curve


def accuracy_torch(model, Xte, yte):
    import torch
    with torch.no_grad():
        return float((model(torch.from_numpy(Xte).cuda()).argmax(1).cpu().numpy() == yte).mean())


def step_time_us(step, reps=500):
    """Wall time per step over back-to-back replays (one synchronisation at the end)."""
    step.replay()
    step.stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        step.replay()
    step.stream.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def _gpu_name():
    import cupy as cp
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def plot_curves(res, settings, path):
    """The runs' loss curves (top) and each run's difference to the reference run (bottom), in
    one PNG; the reference is torch when it ran, else cygemm eager.

    Parameters
    ----------
    res : dict
        Run name -> dict with "curve" (mean training loss per epoch) and "accuracy" (test, 0..1).
    settings : dict
        gpu, date, sizes, batch, lr, epochs, seed, precision: written in the title.
    path : str
        The PNG to write.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    # The curves agree to a few parts in a thousand, so the top panel shows one line; the bottom
    # panel shows how far apart they are.
    ref = "torch eager" if "torch eager" in res else "cygemm eager"
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.4), sharex=True, gridspec_kw={"height_ratios": (3, 2)})
    for name, r in res.items():
        epochs = np.arange(1, len(r["curve"]) + 1)
        style = dict(linestyle="--" if name == "cygemm eager" else "-", marker="." if name == ref else None)
        top.plot(epochs, r["curve"], label=f"{name} ({r['accuracy'] * 100:.2f}% test accuracy)", **style)
        diff = np.asarray(r["curve"]) - np.asarray(res[ref]["curve"])
        if name != ref:
            bottom.plot(epochs, diff, label=f"{name} − {ref} (largest |difference| {np.abs(diff).max():.2g})",
                        **style)
    bottom.axhline(0.0, color="black", lw=0.8)
    top.set_yscale("log")
    top.set_ylabel("mean training loss (cross-entropy)")
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    bottom.set_xlabel("epoch")
    bottom.set_ylabel(f"loss − {ref}'s loss")
    bottom.legend(fontsize=8)
    bottom.grid(alpha=0.3)
    st = settings
    gemms = ("bfloat16 GEMMs on float32 master weights" if st["precision"] == "bf16-mixed"
             else "float32 GEMMs in TF32" if st["precision"] == "fp32"
             else "FP8 GEMMs on float32 master weights")
    top.set_title(f"{st['gpu']}: scikit-learn digits, MLP {'-'.join(map(str, st['sizes']))}, batch {st['batch']},\n"
                  f"Adam lr {st['lr']}, {st['epochs']} epochs, seed {st['seed']}, {st['precision']} ({gemms}),\n"
                  f"same initialisation and batch order; {st['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--sizes", default="64,128,128,10")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default=None, help="write the loss curves and their differences to this PNG")
    ap.add_argument("--curves", default=None, metavar="PATH",
                    help="write the runs' loss curves, test accuracies and settings to this JSON file")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch run (torch is not in the examples extra)")
    ap.add_argument("--precision", choices=["fp32", "bf16-mixed", "fp8-tensor", "fp8-rowwise", "fp8-block"],
                    default="fp32", help="fp32, or bfloat16 or FP8 GEMMs on float32 master weights (default fp32)")
    ap.add_argument("--save", default=None, metavar="PATH",
                    help="write the captured run's model and optimizer state to this .npz file")
    args = ap.parse_args(argv)
    import cygemm
    reason = cygemm.gpu_unavailable_reason()
    if reason:                     # before loading data: one line that says why, no traceback
        sys.exit(f"train_digits.py: {reason}")
    sizes = [int(s) for s in args.sizes.split(",")]
    Xtr, Xte, ytr, yte = load(args.seed)
    orders = batch_orders(len(Xtr), args.batch, args.epochs, args.seed)
    res = {}
    for eager in (True, False):
        name = "cygemm eager" if eager else "cygemm captured"
        t0 = time.perf_counter()
        model, step, curve, init = train_cygemm(
            Xtr, ytr, orders, sizes, args.lr, eager, args.seed,
            lambda e, l: print(f"{name}: epoch {e + 1:3d}/{args.epochs}  loss {l:.4f}", flush=True)
            if (e + 1) % 5 == 0 or e == 0 else None, args.precision)
        acc = accuracy_cygemm(model, Xte, yte)
        res[name] = dict(curve=curve, accuracy=acc, seconds=time.perf_counter() - t0,
                         step_us=step_time_us(step))
        print(f"{name}: test accuracy {acc * 100:.2f}%, step {res[name]['step_us']:.1f} us", flush=True)
        if args.save and not eager:
            import cygemm.nn as nn
            nn.save(args.save, model, step.optimizer)
            print(f"{name}: saved the model and optimizer state to {args.save}", flush=True)
    if not args.no_torch:
        t0 = time.perf_counter()
        tmodel, tcurve = train_torch(Xtr, ytr, orders, sizes, args.lr, init, args.precision)
        res["torch eager"] = dict(curve=tcurve, accuracy=accuracy_torch(tmodel, Xte, yte),
                                  seconds=time.perf_counter() - t0)
        print(f"torch eager: test accuracy {res['torch eager']['accuracy'] * 100:.2f}%", flush=True)
    speedup = res["cygemm eager"]["step_us"] / res["cygemm captured"]["step_us"]
    print(f"step: eager {res['cygemm eager']['step_us']:.1f} us, captured {res['cygemm captured']['step_us']:.1f} us "
          f"({speedup:.1f}x)", flush=True)
    settings = dict(gpu=_gpu_name(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), sizes=sizes,
                    batch=args.batch, lr=args.lr, epochs=args.epochs, seed=args.seed, precision=args.precision)
    if args.curves:
        import json
        with open(args.curves, "w") as f:
            json.dump(dict(settings, runs={k: dict(curve=r["curve"], accuracy=r["accuracy"]) for k, r in res.items()}),
                      f, indent=1)
        print(f"wrote {args.curves}")
    if args.plot:
        plot_curves(res, settings, args.plot)
        print(f"wrote {args.plot}")
    return res


if __name__ == "__main__":
    main()
