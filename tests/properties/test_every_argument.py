"""CPU: every argument of every entry point, given nonsense, is refused naming that argument.

For each entry point a call that is valid but for one argument (operands are fakes with
``__cuda_array_interface__``, so a valid call would reach the GPU check and raise NoGpuError),
every parameter in turn gets a value of the wrong type (an object of a class of its own), and,
where the parameter is a number, a flag or a size, the wrong kinds of those too (a string, a
number for a flag, a string for a number or a name). The call must raise TypeError or ValueError whose message names the
parameter, before the GPU check. No GPU is needed: where there is one the valid calls would run,
so the test skips there (the bad-input table runs the same refusals on the GPU).
"""
import inspect

import numpy as np
import pytest

import cygemm
from cygemm import fp8, gemm_ops
from test_bad_input import Fakes

pytestmark = pytest.mark.nogpu


class Nonsense:
    """A value no argument takes."""

    def __repr__(self):
        return "Nonsense()"


M, K, N = 8, 16, 4


def _gemm(mk):
    return (mk.arr((M, K)), mk.arr((K, N)), mk.out((M, N))), {}


def _layer(mk):
    return (mk.arr((M, K)), mk.arr((K, N)), mk.out((M, N))), {}


def _bwd(mk):
    return (mk.arr((M, K)), mk.arr((K, N)), mk.arr((M, N)), None), {"gA_out": mk.out((M, K))}


def _grouped(mk):
    return ([mk.arr((M, K))], [mk.arr((K, N))], [mk.out((M, N))]), {}


def _moe(mk):
    return (mk.arr((M, K)), mk.arr((2, K, N)), [0, 3, M], mk.out((M, N))), {}


def _scaled(mk):
    n = 16                              # (FP8's rows of out start 16 bytes apart)
    a, w = mk.arr((M, K), "uint8"), mk.arr((n, K), "uint8")
    return (a, mk.transpose(w), mk.arr((1,)), mk.arr((1,))), {"format_a": "e4m3", "format_b": "e4m3",
                                                              "out": mk.out((M, n), "float16")}


# entry point -> (valid call builder, parameters left out: why)
ENTRIES = {
    "gemm": (cygemm.gemm, _gemm, {}),
    "gemm_strided_batched": (cygemm.gemm_strided_batched,
                             lambda mk: ((mk.arr((2, M, K)), mk.arr((2, K, N)), mk.out((2, M, N))), {}), {}),
    "int_mm": (cygemm.int_mm, lambda mk: ((mk.arr((M, K), "int8"), mk.transpose(mk.arr((N, K), "int8")),
                                          mk.out((M, N), "int32")), {}), {}),
    "matmul": (cygemm.matmul, _gemm, {}),
    "forward_into": (gemm_ops.forward_into, _layer, {}),
    "backward_into": (gemm_ops.backward_into, _bwd, {"Z": "None is its valid value here (no activation)"}),
    "grouped_gemm": (cygemm.grouped_gemm, _grouped, {}),
    "moe_gemm": (cygemm.moe_gemm, _moe, {}),
    "scaled_matmul": (fp8.scaled_matmul, _scaled, {}),
    "describe_gemm": (cygemm.describe_gemm, lambda mk: ((mk.arr((M, K)), mk.arr((K, N))), {}), {}),
    "describe_matmul": (cygemm.describe_matmul, lambda mk: ((mk.arr((M, K)), mk.arr((K, N))), {}), {}),
    "describe_grouped": (cygemm.describe_grouped, _grouped, {}),
    "describe_scaled_matmul": (fp8.describe_scaled_matmul, _scaled, {}),
}

# Kinds of wrong values beyond Nonsense() for the parameters of a kind.
WRONG_BY_KIND = {
    "flag": ["yes", 2],
    "number": ["1.0"],
    "name": [3],
}
FLAGS = {"with_bias", "save_z", "accumulate", "batched", "fast_accum", "check_offsets", "capturing"}
NUMBERS = {"alpha", "beta", "leaky_slope"}
NAMES = {"math", "act", "autotune", "determinism", "route", "format_a", "format_b", "format_out", "out_dtype",
         "scale_mode", "w_layout", "trans_a", "trans_b"}


def _cases():
    for entry, (fn, build, skip) in ENTRIES.items():
        for p in inspect.signature(fn).parameters.values():
            if p.name in skip:
                continue
            wrongs = [Nonsense()]
            for kind, names in (("flag", FLAGS), ("number", NUMBERS), ("name", NAMES)):
                if p.name in names:
                    wrongs += WRONG_BY_KIND[kind]
            for w in wrongs:
                yield pytest.param(entry, p.name, w, id=f"{entry}-{p.name}-{w!r}")


@pytest.mark.parametrize("entry, param, wrong", list(_cases()))
def test_nonsense_in_any_argument_is_refused_naming_it(entry, param, wrong):
    fn, build, _ = ENTRIES[entry]
    args, kwargs = build(Fakes())
    sig = inspect.signature(fn)
    bound = sig.bind_partial(*args, **kwargs)
    bound.arguments[param] = wrong
    with pytest.raises((TypeError, ValueError)) as info:
        fn(*bound.args, **bound.kwargs)
    assert not isinstance(info.value, cygemm.CygemmError), f"{entry}({param}={wrong!r}) reached {info.value!r}"
    assert param in str(info.value), f"{entry}({param}={wrong!r}): {type(info.value).__name__}: {info.value}"


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_each_valid_call_reaches_the_gpu_check(entry):
    """The calls above are valid: only the missing GPU stops them (so each refusal is the argument's)."""
    fn, build, _ = ENTRIES[entry]
    args, kwargs = build(Fakes())
    if entry.startswith("describe_"):
        assert fn(*args, **kwargs) is not None
        return
    with pytest.raises(cygemm.CygemmError):
        fn(*args, **kwargs)


def test_a_nan_or_negative_number_where_a_slope_is_expected_is_refused():
    for bad in (np.nan, -1.0, np.inf):
        with pytest.raises(ValueError, match="leaky_slope"):
            gemm_ops.forward_into(*_layer(Fakes())[0], act="leaky_relu", leaky_slope=bad)
