"""CPU: each entry's docstring names exactly the `math` values its error lists as accepted (the
error lists what is accepted), so neither the docs nor the message promise what the other lacks."""
import inspect
import re

import pytest

import cygemm
from cygemm import dense
from fakes import BASE, FakeDeviceArray


def _fake(shape, i):
    return FakeDeviceArray(shape, "<f4", None, BASE + i * (1 << 20))


ENTRIES = {
    "gemm": (cygemm.gemm, lambda f: f(_fake((2, 2), 0), _fake((2, 2), 1), _fake((2, 2), 2), math="fp16")),
    "gemm_strided_batched": (cygemm.gemm_strided_batched,
                             lambda f: f(_fake((2, 2, 2), 0), _fake((2, 2, 2), 1), _fake((2, 2, 2), 2), math="fp16")),
    "matmul": (cygemm.matmul, lambda f: f(_fake((2, 2), 0), _fake((2, 2), 1), _fake((2, 2), 2), math="fp16")),
    "forward_into": (dense.forward_into,
                     lambda f: f(_fake((2, 2), 0), _fake((2, 2), 1), _fake((2, 2), 2), _fake((2,), 3), math="fp16")),
    "grouped_gemm": (cygemm.grouped_gemm,
                     lambda f: f([_fake((2, 2), 0)], [_fake((2, 2), 1)], [_fake((2, 2), 2)], math="fp16")),
}


def _documented(fn):
    """The values `math : {...}` names; for a docstring whose `math` is "as gemm"'s, gemm's."""
    lines = inspect.getdoc(fn).splitlines()
    line = next((ln for ln in lines if ln.startswith("math : {")), None)
    if line is None:
        i = next(i for i, ln in enumerate(lines) if re.match(r"[\w, ]*\bmath\b[\w, ]*$", ln))
        assert ":func:`gemm`" in lines[i + 1] or ":func:`cygemm.gemm`" in lines[i + 1], lines[i + 1]
        return _documented(cygemm.gemm)
    return set(re.findall(r'"(\w+)"', line))


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_math_values_in_the_docs_are_those_the_error_accepts(entry):
    fn, call = ENTRIES[entry]
    with pytest.raises(ValueError) as info:
        call(fn)
    message = str(info.value)
    assert message.startswith("math: expected ") and message.endswith("got 'fp16'")
    accepted = set(re.findall(r"'(\w+)'", message.split(", got")[0]))
    assert accepted == {"tf32", "fp32", "cupy"}
    assert _documented(fn) == accepted
