"""cygemm.engine.operands: the GEMM reader of gemm, gemm_strided_batched, describe_gemm and GemmPlan.

What is checked here, on fake device arrays, host arrays and (shape, dtype) pairs, before
anything launches (the mapping to cuBLAS itself is tests/engine/test_mapping*.py's):
- trans_a / trans_b: Python's and NumPy's booleans, 0 and 1, and 'N'/'T'/'H'/'C' in either case
  mean the same; anything else is refused by name, the value shown;
- alpha and beta: any number (NumPy scalars, Fractions, complex with no imaginary part for real
  operands); not-numbers and complex values for real operands refused by name; a nonzero beta,
  its imaginary part alone included, needs an out, and -0.0 is zero (GPU);
- shapes: the inner-dimension message shows op(A), op(B) and both flags; out's expected shape,
  batched or not;
- batches: one operand of batch 1 (2-D or 3-D) is broadcast with batch stride 0; other batches
  must match; an input may have a negative or zero batch stride, a batched out neither;
- ConjugateLayoutError: the ValueError a conjugate in the wrong memory order raises, naming the
  operand in its `operand` attribute.
GPU: a reversed batch and a broadcast operand, NumPy scalars as alpha and beta, and -0.0 as
beta with out=None, against float64 references with NaN-poisoned outputs.
"""
from fractions import Fraction

import numpy as np
import pytest

import cygemm
from cygemm.engine.operands import ConjugateLayoutError
from fakes import BASE, FakeDeviceArray as F
from gpu_util import f64, poisoned, rand, rel_err

MB = 1 << 20


def _at(i):
    return BASE + i * MB


def _described(**kw):
    """describe_gemm of A (3, 4) and B (2, 3), which multiply as A.T @ B.T: (4, 2)."""
    return cygemm.describe_gemm(((3, 4), "float32"), ((2, 3), "float32"), **kw)


def _cublas_args(d):
    return {k: d[k] for k in ("opa", "opb", "m", "n", "k", "lda", "ldb", "ldc")}


# ------------------------------------------------------------------ transposes

@pytest.mark.parametrize("true", [True, 1, np.True_, np.int64(1), "T", "t", "H", "h", "C", "c"])
def test_every_spelling_of_a_transpose_means_true_for_real_operands(true):
    assert _cublas_args(_described(trans_a=true, trans_b=true)) == _cublas_args(_described(trans_a=True, trans_b=True))


@pytest.mark.parametrize("false", [False, 0, np.False_, np.int64(0), "N", "n"])
def test_every_spelling_of_no_transpose_means_false(false):
    a, b = ((4, 3), "float32"), ((3, 2), "float32")
    d = cygemm.describe_gemm(a, b, trans_a=false, trans_b=false)
    assert _cublas_args(d) == _cublas_args(cygemm.describe_gemm(a, b))
    assert (d["opa"], d["opb"], d["k"]) == ("N", "N", 3)


@pytest.mark.parametrize("value", [0.5, -1, 2, b"T", "", "TN", "yes", [True]])
def test_any_other_transpose_is_refused_showing_the_value(value):
    with pytest.raises(ValueError) as info:
        cygemm.describe_gemm(((4, 3), "float32"), ((3, 2), "float32"), trans_a=value)
    assert str(info.value) == f"trans_a: expected False/True or 'N', 'T', 'H' (conjugate transpose), got {value!r}"


def test_a_conjugate_in_a_memory_order_cublas_cannot_conjugate_names_its_operand():
    """With a row-major out, an F-ordered A under 'H' needs conj(A) without a transpose:
    ConjugateLayoutError, a ValueError, with operand 'A' (gemm then copies A conjugated;
    describe_gemm and GemmPlan refuse). The C-ordered A maps (cuBLAS's op 'C')."""
    B = np.zeros((3, 2), np.complex64)
    d = cygemm.describe_gemm(np.zeros((3, 4), np.complex64), B, trans_a="H")
    assert "C" in (d["opa"], d["opb"]) and (d["M"], d["K"]) == (4, 3)
    for name, kw in (("A", dict(A=np.zeros((3, 4), np.complex64, order="F"), B=B, trans_a="H")),
                     ("B", dict(A=np.zeros((4, 3), np.complex64), B=np.zeros((2, 3), np.complex64, order="F"),
                                trans_b="H"))):
        with pytest.raises(ConjugateLayoutError) as info:
            cygemm.describe_gemm(**kw)
        assert isinstance(info.value, ValueError) and info.value.operand == name
        assert str(info.value).startswith(f"{name}: its conjugate transpose ('H') in this memory order needs "
                                          f"conj({name}) without a transpose")


# ------------------------------------------------------------------ alpha and beta

def _gemm_fakes(typestr="<f4"):
    return F((4, 3), typestr, ptr=_at(0)), F((3, 2), typestr, ptr=_at(1)), F((4, 2), typestr, ptr=_at(2))


@pytest.mark.parametrize("value, shown", [(None, "NoneType"), ([1.0], "list"), (np.array([2.0]), "ndarray"),
                                          ({}, "dict"), ("x", "str"), ("2", "str"), (b"1", "bytes")])
def test_alpha_and_beta_that_are_no_number_are_refused_by_name(value, shown):
    A, B, out = _gemm_fakes()
    for name in ("alpha", "beta"):
        with pytest.raises(TypeError) as info:
            cygemm.gemm(A, B, out, **{name: value})
        assert str(info.value) == f"{name}: expected a number, got {shown}"


@pytest.mark.parametrize("typestr, dtype", [("<f4", "float32"), ("<f8", "float64"), ("<f2", "float16")])
def test_a_complex_alpha_or_beta_needs_complex_operands(typestr, dtype):
    A, B, out = _gemm_fakes(typestr)
    for name, value in (("alpha", 1j), ("beta", 2 + 1j), ("beta", np.complex64(0.5 - 0.25j))):
        with pytest.raises(ValueError) as info:
            cygemm.gemm(A, B, out, **{name: value})
        assert str(info.value) == f"{name}: a complex value ({value!r}) needs complex operands, got {dtype} ones"


@pytest.mark.nogpu
@pytest.mark.parametrize("alpha, beta", [(np.float32(2), np.float64(0.5)), (Fraction(1, 3), 1 + 0j),
                                         (np.complex64(2), np.int8(-1)), (np.array(2.0), True)])
def test_any_real_number_is_taken_for_real_operands(alpha, beta):
    """The scalars are read and the call goes on to the GPU (which this machine lacks)."""
    A, B, out = _gemm_fakes()
    with pytest.raises(cygemm.CudaError) as info:
        cygemm.gemm(A, B, out, alpha=alpha, beta=beta)
    assert str(info.value) == cygemm.gpu_unavailable_reason()


def test_a_nonzero_beta_needs_an_existing_out():
    A, B, _ = _gemm_fakes()
    with pytest.raises(ValueError) as info:
        cygemm.gemm(A, B, beta=0.5)
    assert str(info.value) == "beta: a nonzero beta (0.5) needs an existing out=, got out=None"
    Ac, Bc, _ = _gemm_fakes("<c8")
    with pytest.raises(ValueError) as info:           # its imaginary part alone is nonzero
        cygemm.gemm(Ac, Bc, beta=1j)
    assert str(info.value) == "beta: a nonzero beta (1j) needs an existing out=, got out=None"
    A3, B3 = F((2, 4, 3), ptr=_at(3)), F((2, 3, 2), ptr=_at(4))
    with pytest.raises(ValueError, match=r"^beta: a nonzero beta \(-1\) needs an existing out="):
        cygemm.gemm_strided_batched(A3, B3, beta=-1)


# ------------------------------------------------------------------ shapes

@pytest.mark.parametrize("a_shape, b_shape, ta, tb, message", [
    ((4, 3), (2, 3), False, False,
     "B: A is 4x3 so B must have 3 rows, got 2x3"),
    ((3, 4), (5, 2), True, False, "B: op(A) is 4x3 (trans_a=True) so op(B) must have 3 rows, got 5x2 (trans_b=False)"),
    ((4, 3), (3, 2), False, True, "B: op(A) is 4x3 (trans_a=False) so op(B) must have 3 rows, got 2x3 (trans_b=True)"),
    ((3, 4), (2, 4), "T", "H", "B: op(A) is 4x3 (trans_a=True) so op(B) must have 3 rows, got 4x2 (trans_b=True)"),
])
def test_inner_dimensions_that_disagree_show_both_ops_and_flags(a_shape, b_shape, ta, tb, message):
    with pytest.raises(ValueError) as info:
        cygemm.describe_gemm((a_shape, "float32"), (b_shape, "float32"), trans_a=ta, trans_b=tb)
    assert str(info.value) == message


def test_out_must_have_the_products_shape_and_rank():
    with pytest.raises(ValueError) as info:
        cygemm.describe_gemm(((4, 3), "float32"), ((3, 2), "float32"), ((4, 6), "float32"))
    assert str(info.value) == "out: expected shape (4, 2), got (4, 6)"
    with pytest.raises(ValueError) as info:
        cygemm.describe_gemm(((3, 4, 3), "float32"), ((3, 3, 2), "float32"), ((3, 4, 6), "float32"), batched=True)
    assert str(info.value) == "out: expected shape (3, 4, 2), got (3, 4, 6)"
    with pytest.raises(ValueError) as info:           # one of batch 3: the batch is 3, not 1
        cygemm.describe_gemm(((3, 4, 3), "float32"), ((3, 2), "float32"), ((1, 4, 2), "float32"), batched=True)
    assert str(info.value) == "out: expected shape (3, 4, 2), got (1, 4, 2)"
    with pytest.raises(ValueError) as info:
        cygemm.describe_gemm(((3, 4, 3), "float32"), ((3, 3, 2), "float32"), ((4, 2), "float32"), batched=True)
    assert str(info.value) == "out: expected a 3-D array, got 2-D with shape (4, 2)"


# ------------------------------------------------------------------ batches

@pytest.mark.parametrize("a_shape", [(4, 3), (1, 4, 3)])
def test_an_operand_of_batch_1_is_broadcast_with_batch_stride_0(a_shape):
    d = cygemm.describe_gemm((a_shape, "float32"), ((5, 3, 2), "float32"), batched=True)
    # swapped (out is row-major): cuBLAS's a is B, its b is the broadcast A
    assert (d["batch"], d["stride_a"], d["stride_b"], d["stride_c"]) == (5, 6, 0, 8)
    assert d["strided_batched"] and (d["M"], d["N"], d["K"]) == (4, 2, 3)
    both = cygemm.describe_gemm((a_shape, "float32"), ((1, 3, 2), "float32"), batched=True)
    assert both["batch"] == 1


def test_batches_other_than_1_must_match():
    with pytest.raises(ValueError) as info:
        cygemm.describe_gemm(((3, 4, 3), "float32"), ((5, 3, 2), "float32"), batched=True)
    assert str(info.value) == "B: batch 5 does not match A's batch 3 (nor is either 1)"


def test_an_input_may_have_a_negative_or_zero_batch_stride():
    """A read backwards through its batch (A[::-1]) or one matrix repeated (broadcast_to):
    cuBLAS takes either stride as given."""
    A_rev = F((3, 2, 2), strides=(-16, 8, 4), ptr=_at(0) + 32)      # matrix i at A - 4 * i elements
    A_rep = F((3, 2, 2), strides=(0, 8, 4), ptr=_at(0))
    B, out = F((3, 2, 2), ptr=_at(1)), F((3, 2, 2), ptr=_at(2))
    rev = cygemm.describe_gemm(A_rev, B, out, batched=True)
    rep = cygemm.describe_gemm(A_rep, B, out, batched=True)
    assert (rev["stride_a"], rev["stride_b"], rev["b"]) == (4, -4, _at(0) + 32)    # cuBLAS's b is A
    assert (rep["stride_a"], rep["stride_b"], rep["stride_c"]) == (4, 0, 4)


def test_a_batched_out_of_batch_stride_0_or_negative_is_refused():
    A, B = F((3, 2, 2), ptr=_at(0)), F((3, 2, 2), ptr=_at(1))
    with pytest.raises(ValueError) as info:
        cygemm.gemm_strided_batched(A, B, F((3, 2, 2), strides=(0, 8, 4), ptr=_at(2)))
    assert str(info.value) == "out: batch stride 0 writes every matrix of the batch to the same memory"
    with pytest.raises(ValueError) as info:
        cygemm.gemm_strided_batched(A, B, F((3, 2, 2), strides=(-16, 8, 4), ptr=_at(2) + 32))
    assert str(info.value) == "out: expected a batch stride >= 0, got -4 elements"
    # one matrix: its batch stride means nothing
    assert cygemm.describe_gemm(F((1, 2, 2), ptr=_at(0)), F((1, 2, 2), ptr=_at(1)),
                                F((1, 2, 2), strides=(0, 8, 4), ptr=_at(2)), batched=True)["batch"] == 1


# ------------------------------------------------------------------ GPU

@pytest.mark.gpu
def test_a_reversed_batch_and_a_broadcast_operand_match_float64():
    import cupy as cp
    batch, M, K, N = 4, 33, 20, 17
    A = rand(cp, (batch, M, K))[::-1]                  # batch stride < 0
    B = rand(cp, (1, K, N))                            # broadcast over the batch
    out = poisoned(cp, (batch, M, N))
    assert cygemm.gemm_strided_batched(A, B, out, math="fp32") is out
    assert rel_err(cp.asnumpy(out), np.matmul(f64(cp, A), f64(cp, B))) < 1e-5
    W = rand(cp, (K, N))
    Ab = cp.broadcast_to(rand(cp, (M, K)), (batch, M, K))    # batch stride 0
    got = cygemm.gemm_strided_batched(Ab, W, math="fp32")     # out=None: (batch, M, N)
    assert got.shape == (batch, M, N)
    assert rel_err(cp.asnumpy(got), np.matmul(f64(cp, Ab), f64(cp, W))) < 1e-5


@pytest.mark.gpu
def test_numpy_scalars_as_alpha_and_beta_and_minus_zero_beta_without_out():
    import cupy as cp
    M, K, N = 40, 50, 30
    A, B, C0 = rand(cp, (M, K)), rand(cp, (K, N)), rand(cp, (M, N))
    out = C0.copy()
    cygemm.gemm(A, B, out, alpha=np.float32(-0.5), beta=np.complex64(2 + 0j), math="fp32")
    ref = -0.5 * (f64(cp, A) @ f64(cp, B)) + 2.0 * f64(cp, C0)
    assert rel_err(cp.asnumpy(out), ref) < 1e-5
    got = cygemm.gemm(A, B, alpha=Fraction(1, 4), beta=-0.0, math="fp32")     # -0.0 is zero
    assert rel_err(cp.asnumpy(got), 0.25 * (f64(cp, A) @ f64(cp, B))) < 1e-5
