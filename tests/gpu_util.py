"""Helpers for GPU tests: fresh random inputs, NaN-poisoned outputs, float64 references."""
import numpy as np

# ||out - ref|| / ||ref|| bounds by precision: strict fp32 ~1e-5, TF32 ~1e-3 growing with sqrt(K),
# fp16/bf16 ~1e-2 (the project's test standard).
RTOL = {"fp32": 1e-5, "tf32": 2e-3, "float16": 1e-2, "bfloat16": 2e-2}


def tol(dtype, math="tf32", k=64):
    if dtype == "float16":
        return RTOL["float16"]
    if dtype == "bfloat16":
        return RTOL["bfloat16"]
    return RTOL[math] * max(1.0, (k / 256) ** 0.5)


def rand(cp, shape, dtype="float32", rng=None):
    rng = rng or np.random.default_rng()
    return cp.asarray(rng.standard_normal(shape).astype(dtype))


def poisoned(cp, shape, dtype="float32"):
    return cp.full(shape, cp.nan, dtype=dtype)


def rel_err(out, ref):
    out = np.asarray(out, dtype=np.float64)
    assert not np.isnan(out).any(), "output has NaN: some elements were not written"
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


def f64(cp, x):
    return cp.asnumpy(x).astype(np.float64)


def err_vs_scale(out, ref, scale):
    """||out - ref|| / ||scale||, where scale holds the magnitudes that went into each result
    (|x| @ |y| for a product, sums of |terms| for a sum). Floating-point error is bounded by
    those, not by the result, which may cancel to ~0; NaN (an unwritten element) fails."""
    out = np.asarray(out, dtype=np.float64)
    assert not np.isnan(out).any(), "output has NaN: some elements were not written"
    return np.linalg.norm(out - ref) / max(np.linalg.norm(scale), 1e-30)
