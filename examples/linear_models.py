"""Ridge regression and multinomial logistic regression written once against the
cygemm.backend protocol, run on NumPy and on the GPU, and checked against scikit-learn.

    python examples/linear_models.py [--backends numpy,cuda] [--iters N]

It needs scikit-learn (its data and its reference fits): pip install scikit-learn.

Ridge: closed form through ``cholesky_solve`` on scikit-learn's diabetes data. Logistic
regression: full-batch accelerated gradient descent (Nesterov, step 1/L) on the digits data,
with the same objective as ``LogisticRegression(C=C)``: ``C * sum(log loss) + ||W||^2 / 2``.
Nothing inside an iteration reads a value back to the host.
"""
import argparse
import sys
import time

import numpy as np


# ---------------------------------------------------------------- models (backend code only)

def fit_ridge(be, X, y, alpha):
    """Coefficients and intercept of ridge regression (as sklearn.linear_model.Ridge)."""
    return be.ridge(X, y, alpha)


def power_iteration_max_eig(be, G, iters=50):
    """The largest eigenvalue of the symmetric PSD matrix G, as a 0-d array (no sync)."""
    v = be.l2_normalize(be.asarray(np.ones(G.shape[0])))
    for _ in range(iters):
        v = be.l2_normalize(be.matmul(G, v))
    return be.dot(v, be.matmul(G, v))


def logreg_objective(be, X1, Y, W, C):
    """C * sum of log losses + ||W without its intercept row||^2 / 2, a 0-d array."""
    logp = be.log_softmax(be.matmul(X1, W))
    return -C * (logp * Y).sum() + 0.5 * be.sum_squares(W[:-1])


def logreg_setup(be, X, labels, classes, C=1.0):
    """What the iterations need: X with a column of ones, one-hot labels, the step 1/L and
    Nesterov's momentum for a strongly convex objective (all device values: nothing is read
    back)."""
    n, d = X.shape
    X1 = be.zeros((n, d + 1))
    X1[:, :d] = X
    X1[:, d] = 1
    # The objective's Hessian is at most C * 0.5 * lambda_max(X1^T X1) + 1 (the penalty's).
    L = 0.5 * C * power_iteration_max_eig(be, be.gram(X1)) + 1.0
    q = 1.0 / L                                     # strong convexity 1 (the penalty) over L
    mask = be.zeros((d + 1, 1))
    mask[:d] = 1                                    # the intercept is not penalised
    W = be.zeros((d + 1, classes))
    return dict(X1=X1, Y=be.one_hot(labels, classes), C=C, L=L, mask=mask,
                momentum=(1 - q ** 0.5) / (1 + q ** 0.5), W=W, V=W.copy())


def logreg_iterate(be, st, iters):
    """`iters` accelerated gradient steps on the state from logreg_setup; no value read back."""
    X1, Y, C, L, mask, momentum, W, V = (st[k] for k in ("X1", "Y", "C", "L", "mask", "momentum", "W", "V"))
    for _ in range(iters):
        P = be.softmax(be.matmul(X1, V))
        grad = C * be.matmul(X1.T, P - Y) + mask * V
        W_next = V - grad / L
        V = W_next + momentum * (W_next - W)
        W = W_next
    st["W"], st["V"] = W, V
    return st


def fit_logreg(be, X, labels, classes, C=1.0, iters=1000):
    """Multinomial logistic regression with an intercept (the last row of W); returns W and
    the objective (a 0-d array)."""
    st = logreg_iterate(be, logreg_setup(be, X, labels, classes, C), iters)
    return st["W"], logreg_objective(be, st["X1"], st["Y"], st["W"], C)


def predict_logreg(be, X, W):
    return be.to_numpy(be.matmul(X, W[:-1]) + W[-1]).argmax(axis=1)


# ---------------------------------------------------------------- the runs

def make_backend(name):
    import cygemm.backend as B
    if name == "numpy":
        return B.NumPyBackend()
    return B.CUDABackend(math="fp32")


def timed(be, fn):
    be.synchronize()
    t0 = time.perf_counter()
    out = fn()
    be.synchronize()
    return out, time.perf_counter() - t0


def run_ridge(be, alpha=1.0):
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import Ridge
    X, y = load_diabetes(return_X_y=True)
    Xb, yb = be.asarray(X), be.asarray(y)
    fit_ridge(be, Xb, yb, alpha)                     # warm-up (compiles, plans)
    (coef, intercept), secs = timed(be, lambda: fit_ridge(be, Xb, yb, alpha))
    ref = Ridge(alpha=alpha).fit(X, y)
    coef = be.to_numpy(coef).astype(np.float64)
    rel = np.abs(coef - ref.coef_).max() / np.abs(ref.coef_).max()
    print(f"[{be.name}] ridge on diabetes {X.shape}: max coefficient difference from sklearn "
          f"{rel:.2e} (relative to the largest), intercept {float(be.to_numpy(intercept)):.4f} vs "
          f"{ref.intercept_:.4f}, fit {secs * 1e3:.2f} ms", flush=True)
    return {"coef_rel": rel, "seconds": secs}


def run_logreg(be, C=1.0, iters=1000):
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    Xb = be.asarray(Xtr)
    fit_logreg(be, Xb, ytr, 10, C, iters=5)          # warm-up
    (W, obj), secs = timed(be, lambda: fit_logreg(be, Xb, ytr, 10, C, iters))
    ref = LogisticRegression(C=C, max_iter=5000, tol=1e-10).fit(Xtr, ytr)
    Wref = np.vstack([ref.coef_.T, ref.intercept_[None, :]])
    nb = make_reference_backend()
    X1 = np.hstack([Xtr, np.ones((len(Xtr), 1))])
    ref_obj = float(logreg_objective(nb, X1, nb.one_hot(ytr, 10), Wref, C))
    ours = float(logreg_objective(nb, X1, nb.one_hot(ytr, 10), be.to_numpy(W).astype(np.float64), C))
    acc = (predict_logreg(be, be.asarray(Xte), W) == yte).mean()
    ref_acc = ref.score(Xte, yte)
    print(f"[{be.name}] logistic regression on digits {Xtr.shape}, {iters} iterations: objective "
          f"{ours:.4f} vs sklearn {ref_obj:.4f} (relative {abs(ours - ref_obj) / ref_obj:.2e}), test accuracy "
          f"{acc * 100:.2f}% vs {ref_acc * 100:.2f}%, fit {secs * 1e3:.1f} ms", flush=True)
    return {"objective": ours, "sklearn_objective": ref_obj, "accuracy": acc, "sklearn_accuracy": ref_acc,
            "seconds": secs, "objective_rel": abs(ours - ref_obj) / ref_obj}


def make_reference_backend():
    import cygemm.backend as B
    return B.NumPyBackend()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="numpy,cuda", help="comma list of numpy, cuda")
    ap.add_argument("--iters", type=int, default=1000, help="logistic regression iterations")
    args = ap.parse_args(argv)
    names = args.backends.split(",")
    unknown = [n for n in names if n not in ("numpy", "cuda")]
    if unknown:
        ap.error(f"--backends: expected a comma list of numpy, cuda; got {', '.join(map(repr, unknown))}")
    if "cuda" in names:
        import cygemm
        reason = cygemm.gpu_unavailable_reason()
        if reason:                 # before any work: one line that says why, no traceback
            sys.exit(f"linear_models.py: {reason} (run with --backends numpy for the CPU)")
    try:
        import sklearn  # noqa: F401
    except ModuleNotFoundError:
        sys.exit("linear_models.py: needs scikit-learn for its data and reference fits: pip install scikit-learn")
    results = {}
    for name in names:
        be = make_backend(name)
        results[name] = {"ridge": run_ridge(be), "logreg": run_logreg(be, iters=args.iters)}
    return results


if __name__ == "__main__":
    main()
