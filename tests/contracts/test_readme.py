"""The README's quick start runs as written: its >>> example prints what it shows, and the
dense-layer step computes what it says (against float64)."""
import doctest
import os
import re

import numpy as np
import pytest

from gpu_util import f64, rel_err

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def _blocks():
    text = open(README).read()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_quick_start_has_a_printed_example_and_a_script():
    blocks = _blocks()
    assert len(blocks) == 2 and blocks[0].lstrip().startswith(">>>") and "graph.capture" in blocks[1]


@pytest.mark.gpu
def test_quick_start_prints_what_it_shows_and_the_step_is_right():
    cp = pytest.importorskip("cupy")
    printed, script = _blocks()
    test = doctest.DocTestParser().get_doctest(printed, {}, "README quick start", README, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0 and runner.tries >= 3
    ns = {}
    exec(compile(script, "README quick start", "exec"), ns)
    A, W = f64(cp, ns["A"]), f64(cp, ns["W"])
    z = A @ W.T + f64(cp, ns["b"])
    assert rel_err(ns["Y"].get(), np.maximum(z, 0)) < 3e-3
    # relu' is read from the forward's TF32 output: take the mask from it (a float64 z would
    # flip the elements within rounding of zero). gY = 1.
    dz = (ns["Y"].get() > 0).astype(np.float64)
    assert rel_err(ns["gW"].get(), (A.T @ dz).T) < 3e-3
    assert rel_err(ns["gb"].get(), dz.sum(0)) < 3e-3
