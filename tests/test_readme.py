"""GPU: the README's quick start runs as written and computes what it says."""
import os
import re

import numpy as np
import pytest

from gpu_util import f64, rel_err

pytestmark = pytest.mark.gpu


def test_quick_start_runs_and_is_right():
    cp = pytest.importorskip("cupy")
    text = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    code = re.search(r"## Quick start\s+```python\n(.*?)```", text, re.S).group(1)
    ns = {}
    exec(compile(code, "README quick start", "exec"), ns)
    cp.cuda.Device().synchronize()
    A, W, b = f64(cp, ns["A"]), f64(cp, ns["W"]), f64(cp, ns["b"])
    y_tf32 = A @ W.T
    assert rel_err(ns["Y"].get(), 0.5 * y_tf32 + y_tf32) < 3e-3        # Y = A W^T, then 0.5 A W^T + Y
    z = A @ W.T + b
    assert rel_err(ns["Yr"].get(), np.maximum(z, 0)) < 3e-3
    # The backward reads relu' from the forward's TF32 output, so take the mask from it
    # (a float64 z would flip the elements within rounding of zero).
    dz = (ns["Yr"].get() > 0).astype(np.float64)                       # gY = 1
    assert rel_err(ns["gW"].get(), (A.T @ dz).T) < 3e-3
    assert rel_err(ns["gb"].get(), dz.sum(0)) < 3e-3
