"""cygemm.backend without a GPU (CPU, skipped where one is present): CUDABackend() says cygemm's
plain-words reason as the first and only line of its error, with no "Exception ignored in
Stream.__del__" noise; examples/linear_models.py exits with that line alone, and its NumPy
backend still runs."""
import gc
import os
import subprocess
import sys

import pytest

import cygemm
from no_gpu_util import EXAMPLES, child_env as _env, gpu_reason as _reason

pytestmark = pytest.mark.nogpu


@pytest.mark.parametrize("kwargs", [{}, {"dtype": "float64", "math": "fp32"}])
def test_cuda_backend_says_only_cygemms_no_gpu_reason(kwargs, monkeypatch):
    reason = _reason()
    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: ignored.append(u))
    import cygemm.backend as B
    with pytest.raises(cygemm.CygemmError) as info:
        B.CUDABackend(**kwargs)
    assert str(info.value).splitlines()[0] == reason
    assert str(info.value) == reason
    info = None
    gc.collect()
    assert ignored == []


def test_cuda_backend_in_a_fresh_process_leaves_no_noise_on_stderr():
    # A fresh interpreter: the first CUDA call of the process, and its exit, where a failed
    # stream's __del__ would print "Exception ignored".
    code = ("import cygemm, cygemm.backend as B\n"
            "try:\n    B.CUDABackend()\nexcept cygemm.CygemmError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == _reason() + "\n"
    assert proc.stderr == ""


def test_linear_models_exits_with_the_reason_and_no_traceback():
    reason = _reason()
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, "linear_models.py")],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"linear_models.py: {reason}"), proc.stderr


def test_linear_models_names_a_wrong_backend_and_a_missing_scikit_learn():
    """A typo in --backends is an argparse error naming it; --backends numpy without scikit-learn
    is one line saying what to install (CPU)."""
    script = os.path.join(EXAMPLES, "linear_models.py")
    proc = subprocess.run([sys.executable, script, "--backends", "gpu"], capture_output=True, text=True,
                          timeout=300, env=_env())
    assert proc.returncode == 2 and "--backends: expected a comma list of numpy, cuda; got 'gpu'" in proc.stderr
    try:
        import sklearn  # noqa: F401
        return                              # (installed: nothing to refuse)
    except ModuleNotFoundError:
        pass
    proc = subprocess.run([sys.executable, script, "--backends", "numpy"], capture_output=True, text=True,
                          timeout=300, env=_env())
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        "linear_models.py: needs scikit-learn for its data and reference fits: pip install scikit-learn"]
