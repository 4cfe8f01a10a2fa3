"""CPU: bad arguments to gemm / gemm_strided_batched raise before anything touches the GPU,
with a message that names the argument and says what was expected. The arrays are fakes
whose pointers are never dereferenced."""
import numpy as np
import pytest

import cygemm
from fakes import FakeDeviceArray as F

CASES = [
    # (function, args, kwargs, exception, words the message must contain)
    ("gemm", (np.ones((2, 2), np.float32), F((2, 2))), {}, TypeError, ["A:", "numpy"]),
    ("gemm", (F((2, 2)), [[1.0, 2.0]]), {}, TypeError, ["B:", "list"]),
    ("gemm", (F((2, 2)), F((2, 2), "<f2")), {}, TypeError, ["B:", "float32", "float16"]),
    ("gemm", (F((2, 2), "<f8"), F((2, 2))), {}, TypeError, ["A:", "<f8"]),
    ("gemm", (F((2, 2, 2)), F((2, 2))), {}, ValueError, ["A:", "2-D", "3-D"]),
    ("gemm", (F((2, 3)), F((4, 5))), {}, ValueError, ["B:", "3 rows", "4x5"]),
    ("gemm", (F((2, 3)), F((5, 3))), {"trans_b": False}, ValueError, ["B:"]),
    ("gemm", (F((2, 3)), F((3, 5)), F((2, 4))), {}, ValueError, ["out:", "(2, 5)", "(2, 4)"]),
    ("gemm", (F((2, 3)), F((3, 5)), F((2, 5), "<f2")), {}, TypeError, ["out:", "float32"]),
    ("gemm", (F((4, 4), strides=(32, 8)), F((4, 4))), {}, ValueError, ["A:", "layout"]),
    ("gemm", (F((4, 4)), F((4, 4), strides=(4, 8))), {}, ValueError, ["B:", "layout"]),
    ("gemm", (F((4, 4)), F((4, 4)), F((4, 4), strides=(0, 4))), {}, ValueError, ["out:", "layout"]),
    ("gemm", (F((4, 4)), F((4, 4))), {"math": "fp16"}, ValueError, ["math:", "'tf32'"]),
    ("gemm", (F((4, 4)), F((4, 4))), {"beta": 1.0}, ValueError, ["beta:", "out="]),
    ("gemm", (F((4, 4)), F((4, 4)), F((4, 4))), {"stream": "s"}, TypeError, ["stream:"]),
    ("gemm_strided_batched", (F((3, 2, 2)), F((4, 2, 2))), {}, ValueError, ["batch", "3", "4"]),
    ("gemm_strided_batched", (F((3, 2, 2)), F((3, 2, 2)), F((2, 2))), {}, ValueError, ["out:", "3-D"]),
    ("gemm_strided_batched", (F((3, 2, 2)), F((3, 2, 2)), F((3, 2, 2), strides=(8, 8, 4))), {},
     ValueError, ["out:", "overlap"]),
    ("gemm_strided_batched", (F((3, 2, 2)), F((3, 2, 2)), F((2, 2, 2))), {}, ValueError,
     ["out:", "(3, 2, 2)"]),
]


@pytest.mark.parametrize("fn,args,kwargs,exc,words", CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_bad_input_raises_named_error_before_launch(fn, args, kwargs, exc, words):
    with pytest.raises(exc) as info:
        getattr(cygemm, fn)(*args, **kwargs)
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_too_large_for_32bit_cublas_is_refused():
    n = 2**31
    with pytest.raises(ValueError, match="2\\*\\*31"):
        cygemm.gemm(F((2, n)), F((n, 2)), F((2, 2)))
