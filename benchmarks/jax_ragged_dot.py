"""ragged_dot inside jax.jit: cygemm.jax.ragged_dot (cygemm's grouped GEMM, the offsets on the
device) against jax.lax.ragged_dot (XLA's), forward and forward+backward, bf16, interleaved.

    python3 -m benchmarks.jax_ragged_dot [--out DIR]

Each contender is jitted and run once (compiled, tuned) first; then rounds of 20 runs each, in
alternating order, synchronized at the end of each round; the median round per run. Group
sizes are a fixed draw, some empty, summing to M. Effective TFLOP/s count 2*M*K*N (forward)
and 3x that (forward + both gradients). Writes jax_ragged_dot.json and prints a table.
"""
import argparse
import json
import os
import statistics
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import cygemm  # noqa: E402
import cygemm.jax as cj  # noqa: E402

SHAPES = [(65536, 2560, 1280, 64), (16384, 4096, 1536, 32), (4096, 2048, 1024, 8)]


def _sizes(m, g, seed):
    rng = np.random.default_rng(seed)
    w = rng.random(g) * (rng.random(g) > 0.1)               # about a tenth of the groups empty
    s = np.floor(w / w.sum() * m).astype(np.int32)
    s[np.argmax(s)] += m - s.sum()
    return jnp.asarray(s)


def _time(fns, args, rounds=7, per_round=20):
    for f in fns.values():
        jax.block_until_ready(f(*args))
    times = {k: [] for k in fns}
    order = list(fns)
    for r in range(rounds):
        for k in (order if r % 2 == 0 else order[::-1]):
            t = time.perf_counter()
            for _ in range(per_round):
                out = fns[k](*args)
            jax.block_until_ready(out)
            times[k].append((time.perf_counter() - t) / per_round)
    return {k: statistics.median(v) for k, v in times.items()}, {k: (min(v), max(v)) for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    out = ap.parse_args().out
    rows = []
    for m, k, n, g in SHAPES:
        lhs = jax.random.normal(jax.random.key(0), (m, k), jnp.float32).astype(jnp.bfloat16)
        rhs = (jax.random.normal(jax.random.key(1), (g, k, n), jnp.float32) / 32).astype(jnp.bfloat16)
        sizes = _sizes(m, g, 2)

        def loss(f):
            return lambda l, r, s: f(l, r, s).astype(jnp.float32).sum()

        fns = {"cygemm fwd": jax.jit(cj.ragged_dot), "xla fwd": jax.jit(jax.lax.ragged_dot),
               "cygemm fwd+bwd": jax.jit(jax.grad(loss(cj.ragged_dot), (0, 1))),
               "xla fwd+bwd": jax.jit(jax.grad(loss(jax.lax.ragged_dot), (0, 1)))}
        med, span = _time(fns, (lhs, rhs, sizes))
        flops = 2.0 * m * k * n
        for name, t in med.items():
            f = flops * (3 if "bwd" in name else 1)
            rows.append(dict(shape=f"[{m},{k}]x[{g},{k},{n}]", contender=name, ms=t * 1e3,
                             ms_range=[s * 1e3 for s in span[name]], tflops=f / t / 1e12))
            print(f"{rows[-1]['shape']:28s} {name:16s} {t * 1e3:9.3f} ms  {f / t / 1e12:7.1f} TFLOP/s")
    env = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, cygemm=cygemm.__version__,
               versions=cygemm.versions(), date=time.strftime("%Y-%m-%d"))
    with open(os.path.join(out, "jax_ragged_dot.json"), "w") as f:
        json.dump(dict(environment=env, rows=rows), f, indent=1, default=str)


if __name__ == "__main__":
    main()
