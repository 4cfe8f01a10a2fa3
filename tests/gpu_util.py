"""Helpers for GPU tests: seeded random inputs, NaN-poisoned outputs, float64 references."""
import os
import threading
import zlib

import numpy as np
import pytest

# ||out - ref|| / ||ref|| bounds by precision: strict fp32 ~1e-5, TF32 ~1e-3 growing with sqrt(K),
# fp16/bf16 ~1e-2 (the project's test standard).
RTOL = {"fp32": 1e-5, "tf32": 2e-3, "float16": 1e-2, "bfloat16": 2e-2}


def tol(dtype, math="tf32", k=64):
    if dtype == "float16":
        return RTOL["float16"]
    if dtype == "bfloat16":
        return RTOL["bfloat16"]
    return RTOL[math] * max(1.0, (k / 256) ** 0.5)


# rand()'s seeds: BASE_SEED (CYGEMM_TEST_SEED overrides it, to run the tests on other data) and,
# per test, the phase (setup, call, teardown) it runs in and a counter of rand's calls in it.
BASE_SEED = int(os.environ.get("CYGEMM_TEST_SEED", "20240611"))
_phase = [None, 0]          # (pytest's current test and phase, rand's calls in it so far)
_phase_lock = threading.Lock()


def seed_for(test, n, base=None):
    """The seed of the n-th rand() call (from 0) of `test`: pytest's PYTEST_CURRENT_TEST for
    it, e.g. "tests/dense/test_layer.py::test_x[8] (call)" ("" outside pytest)."""
    return zlib.crc32(f"{BASE_SEED if base is None else base}:{test}:{n}".encode())


def rand(cp, shape, dtype="float32", rng=None):
    """Standard normal values of `shape` and `dtype` on the device, from `rng` when given, else
    reproducibly: the n-th call of a test's phase draws from ``default_rng(seed_for(test, n))``,
    so a test run alone, or again, gets the same inputs. The first call of each test phase
    prints the base seed and the test (pytest shows a failed test's captured output)."""
    if rng is None:
        test = os.environ.get("PYTEST_CURRENT_TEST", "")
        with _phase_lock:
            if _phase[0] != test:
                _phase[0], _phase[1] = test, 0
                print(f"gpu_util.rand: CYGEMM_TEST_SEED={BASE_SEED}; call n of {test or 'this process'} "
                      f"draws from seed_for({test!r}, n)")
            n = _phase[1]
            _phase[1] += 1
        seed = seed_for(test, n)
        rng = np.random.default_rng(seed)
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


def host_bits(cp, x):
    """x's elements as unsigned integers on the host: equal bits, not equal values (-0.0, NaN)."""
    x = cp.ascontiguousarray(x)
    return cp.asnumpy(x).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def skip_without_lt_grouped():
    """Skip the calling GPU test, with the feature gate's reason, where cuBLASLt's grouped matmul
    (the lt_grouped route) is not available."""
    from cygemm.engine import lt_features
    why = lt_features.feature_gate("grouped_gemm")
    if why is not None:
        pytest.skip(f"lt_grouped: {why}")


def jax_has_gpu(jax):
    """Whether JAX sees a CUDA GPU (the JAX GPU tests' skip condition)."""
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False
