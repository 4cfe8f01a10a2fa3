"""cygemm.nn without a GPU (CPU, skipped where one is present): every entry that needs a GPU
says cygemm's plain-words reason (cygemm.gpu_unavailable_reason) as the first and only line of
its error, not CuPy's "CUDA driver version is insufficient", and leaves no "Exception ignored"
noise behind; examples/train_digits.py exits with that line alone."""
import gc
import os
import subprocess
import sys

import pytest

import cygemm
from no_gpu_util import EXAMPLES, child_env as _env, gpu_reason as _reason

pytestmark = pytest.mark.nogpu


class _FakeModel:
    """What an optimizer reads of a model, made without a GPU (never reached: the GPU check is first)."""
    flat_parameters = flat_gradients = stream = None


def _entries():
    import cygemm.nn as nn
    return {
        "MLP": lambda: nn.MLP([4, 8, 2]),
        "Dense": lambda: nn.Dense(4, 8),
        "Dense bf16-mixed": lambda: nn.Dense(4, 8, precision="bf16-mixed"),
        "compile_step": lambda: nn.compile_step(_FakeModel(), nn.SoftmaxCrossEntropy(), None, 8),
        "SGD": lambda: nn.SGD(_FakeModel()),
        "Adam": lambda: nn.Adam(_FakeModel()),
        "SoftmaxCrossEntropy.bind": lambda: nn.SoftmaxCrossEntropy().bind(8, 2),
    }


@pytest.mark.parametrize("entry", ["MLP", "Dense", "Dense bf16-mixed", "compile_step", "SGD", "Adam",
                                   "SoftmaxCrossEntropy.bind"])
def test_nn_entries_say_only_cygemms_no_gpu_reason(entry, monkeypatch):
    reason = _reason()
    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: ignored.append(u))
    with pytest.raises(cygemm.CygemmError) as info:
        _entries()[entry]()
    message = str(info.value)
    assert message.splitlines()[0] == reason
    assert message == reason
    assert "insufficient" not in message and "cudaError" not in message
    info = None
    gc.collect()
    assert ignored == []                     # no "Exception ignored in ...__del__"


@pytest.mark.parametrize("example", ["train_digits.py", "train_digits_fp8.py"])
def test_the_training_examples_exit_with_the_reason_and_no_traceback(example):
    reason = _reason()
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, example), "--epochs", "1"],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == f"{example}: {reason}\n"


@pytest.mark.parametrize("call, exc, words", [
    (lambda nn, be: nn.MLP([4, -8, 2]), ValueError, r"^sizes\[1\]: expected a positive int, got -8$"),
    (lambda nn, be: nn.MLP("abc"), TypeError, r"^sizes: expected a sequence of positive ints, got str$"),
    (lambda nn, be: nn.MLP([4]), ValueError, r"^sizes: expected at least two sizes"),
    (lambda nn, be: nn.MLP([4, 8, 2], act="swish"), ValueError, r"^act: expected one of .*got 'swish'$"),
    (lambda nn, be: nn.MLP([4, 8, 2], out_act="swish"), ValueError, r"^out_act: expected one of .*got 'swish'$"),
    (lambda nn, be: nn.MLP([4, 8, 2], precision="fp4"), ValueError, r"^precision: expected one of"),
    (lambda nn, be: nn.Dense(-1, 3), ValueError, r"^in_features: expected a positive int, got -1$"),
    (lambda nn, be: nn.Dense(4, 3, math="x"), ValueError, r"^math: expected 'tf32' or 'fp32', got 'x'$"),
    (lambda nn, be: be.CUDABackend(dtype="int8"), TypeError, r"^dtype: expected one of \['float32', 'float64'\], got int8$"),
    (lambda nn, be: be.CUDABackend(math="x"), ValueError, r"^math: expected 'tf32' or 'fp32', got 'x'$"),
])
def test_bad_arguments_are_refused_before_the_gpu_check(call, exc, words):
    """The argument checks of nn and backend need no GPU: without one (here) a bad argument gets
    its own error, not the no-GPU reason, as every other entry point's."""
    import cygemm.backend as be
    import cygemm.nn as nn
    with pytest.raises(exc, match=words):
        call(nn, be)
