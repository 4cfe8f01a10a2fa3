"""cygemm.engine.arrays: what every describe_* shares (layout_operand, Addresses, describe_call).

What is checked here, on the CPU (tests/properties/test_describe.py holds the contract every
describe_* keeps alike: keys, the three ways to give an operand, pointers, the mapping run by a
NumPy model; these are the reader's own rules):
- a dtype by any name or object NumPy reads ("f4", np.float32, np.dtype), torch's dtypes by
  name without torch imported, the table's names and aliases; refused naming the operand
  otherwise, and dtypes cygemm does not compute with are refused by the readers by name;
- a shape of non-negative ints (an int is a 1-D shape; NumPy ints and lists too), at most 64
  dimensions; a pair is a tuple or list of two items, anything else that is not an array goes to
  the device-array readers, which name it;
- a host array's strides in whole elements (an empty one's strides are ignored);
- the pairs of one call get addresses of their own, so they never overlap, even the same pair
  given twice; a host array given twice does;
- describe_call: `why` in the caller's names with op() under a transpose, K from op(A), and
  cuBLAS's arguments None for an empty group whose layout maps to nothing.
GPU: device arrays are described as host arrays of the same layout are, with their device
addresses, and describing writes nothing.
"""
import numpy as np
import pytest

import cygemm
from cygemm import fp8
from gpu_util import f64, poisoned, rand, rel_err

class TorchLikeDtype:
    """What str(torch.<dtype>) gives, without torch: 'torch.bfloat16' and so on."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


def _mapping(d):
    return {k: d[k] for k in ("M", "N", "K", "batch", "swapped", "opa", "opb", "m", "n", "k", "lda", "ldb", "ldc")}


def _address(x):
    return x.__array_interface__["data"][0]


# ------------------------------------------------------------------ dtypes

@pytest.mark.parametrize("spelling", ["float32", "f4", "<f4", np.float32, np.dtype(np.float32),
                                      TorchLikeDtype("float32")])
def test_a_dtype_is_read_by_any_name_numpy_or_torch_gives_it(spelling):
    want = _mapping(cygemm.describe_gemm(((4, 3), "float32"), ((3, 5), "float32")))
    assert _mapping(cygemm.describe_gemm(((4, 3), spelling), ((3, 5), spelling))) == want


def test_torch_dtypes_are_read_by_name_without_torch():
    bf16 = _mapping(cygemm.describe_gemm(((4, 3), "bfloat16"), ((3, 5), "bfloat16")))
    assert _mapping(cygemm.describe_gemm(((4, 3), TorchLikeDtype("bfloat16")), ((3, 5), "bfloat16"))) == bf16
    with pytest.raises(TypeError) as info:          # read as bfloat16: not float16
        cygemm.describe_gemm(((4, 3), TorchLikeDtype("bfloat16")), ((3, 5), "float16"))
    assert str(info.value) == "B: expected the dtype of A (bfloat16), got float16"
    w = np.zeros((32, 128), np.uint8)
    one = ((), "float32")
    by_name = fp8.describe_scaled_matmul(((64, 128), "e4m3"), w.T, one, one, format_b="e5m2")
    by_torch = fp8.describe_scaled_matmul(((64, 128), TorchLikeDtype("float8_e4m3fn")), w.T, one, one, format_b="e5m2")
    assert by_torch["b_type"] == by_name["b_type"] == "float8_e4m3fn"        # cuBLAS's b is a
    assert _mapping(by_torch) == _mapping(by_name)


class Unreadable:
    def __repr__(self):
        return "Unreadable()"


def test_a_dtype_nothing_reads_is_refused_naming_the_operand_and_what_is_taken():
    names = ("float16, bfloat16, float32, float64, complex64, complex128, int8, int32, float8_e4m3fn, "
             "float8_e5m2, int64, e4m3, e5m2")
    with pytest.raises(TypeError) as info:
        cygemm.describe_gemm(((4, 3), "float32"), ((3, 5), Unreadable()))
    assert str(info.value) == (f"B: expected a dtype (one of {names}, or a NumPy, ml_dtypes or torch dtype), "
                               "got Unreadable()")


@pytest.mark.parametrize("dtype, shown", [("int16", "int16"), (np.bool_, "bool"), ("uint8", "uint8"),
                                          ("e4m3", "float8_e4m3fn"), ("e5m2", "float8_e5m2"), ("int32", "int32")])
def test_dtypes_a_gemm_does_not_take_are_refused_by_the_reader_with_their_table_name(dtype, shown):
    """Read by the layout reader (int16 and bool as 'other' dtypes, uint8 as FP8 bytes, the FP8
    aliases by the table's names), then refused by gemm's reader as a device array would be."""
    with pytest.raises(TypeError) as info:
        cygemm.describe_gemm(((4, 3), dtype), ((3, 5), "float32"))
    assert str(info.value).startswith("A: expected float16, bfloat16, float32, float64, complex64, complex128 or int8, "
                                      f"got {shown}")


def test_torch_dtype_objects_in_pairs_are_read_by_their_names():
    torch = pytest.importorskip("torch")
    for dtype, name in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16"), (torch.float64, "float64")):
        want = _mapping(cygemm.describe_gemm(((4, 3), name), ((3, 5), name)))
        assert _mapping(cygemm.describe_gemm(((4, 3), dtype), ((3, 5), name))) == want
    with pytest.raises(TypeError, match=r"^B: expected the dtype of A \(bfloat16\), got float16$"):
        cygemm.describe_gemm(((4, 3), torch.bfloat16), ((3, 5), torch.float16))


# ------------------------------------------------------------------ shapes and pairs

def test_a_shape_is_non_negative_ints_in_any_sequence_and_an_int_is_one_dimension():
    [vec] = cygemm.describe_matmul((3, "float32"), ((3, 2), "float32"))            # (3,) @ (3, 2)
    assert (vec["M"], vec["N"], vec["K"]) == (1, 2, 3)
    listed = cygemm.describe_gemm(([4, 3], "float32"), ((np.int64(3), np.int32(5)), "float32"))
    assert (listed["M"], listed["N"], listed["K"]) == (4, 5, 3)
    assert cygemm.describe_gemm(((0, 3), "float32"), ((3, 5), "float32"))["M"] == 0
    for bad in ((4.5, 3), "ab", (4, None)):
        with pytest.raises(ValueError) as info:
            cygemm.describe_gemm((bad, "float32"), ((3, 5), "float32"))
        assert str(info.value) == f"A: expected a shape of non-negative ints in its (shape, dtype) pair, got {bad!r}"
    with pytest.raises(ValueError) as info:
        cygemm.describe_matmul(((1,) * 65, "float32"), ((3, 2), "float32"))
    assert str(info.value) == "a: expected at most 64 dimensions, got 65"


def test_a_pair_is_two_items_and_anything_else_goes_to_the_device_array_readers():
    assert cygemm.describe_gemm([(4, 3), "float32"], [[3, 5], np.float32])["K"] == 3      # lists too
    with pytest.raises(TypeError) as info:
        cygemm.describe_gemm(((4, 3),), ((3, 5), "float32"))
    assert str(info.value) == ("A: expected a device array, a host (NumPy) array or tensor, or a (shape, dtype) pair, got a "
                               "tuple that is no (shape, dtype) pair (for host data, pass numpy.asarray of it)")
    with pytest.raises(TypeError) as info:
        cygemm.describe_gemm(((4, 3), "float32"), 5)
    assert str(info.value) == ("B: expected a device array, a host (NumPy) array or tensor, or a (shape, dtype) pair, got "
                               "builtins.int")


def test_a_host_arrays_strides_must_be_whole_elements_unless_it_is_empty():
    raw = np.zeros(256, np.uint8)
    odd = np.lib.stride_tricks.as_strided(raw.view(np.float32), (2, 3), (6, 4))     # rows 6 bytes apart
    with pytest.raises(ValueError) as info:
        cygemm.describe_gemm(odd, ((3, 5), "float32"))
    assert str(info.value) == "A: stride 6 bytes on axis 0 is not a multiple of the element size (4 bytes)"
    empty = np.lib.stride_tricks.as_strided(raw.view(np.float32), (0, 3), (6, 4))   # its strides mean nothing
    d = cygemm.describe_gemm(empty, ((3, 5), "float32"))
    assert (d["M"], d["K"], d["lda"]) == (0, 3, 5) and d["b"] == _address(raw)     # swapped: cuBLAS's b is A


def test_the_pairs_of_one_call_never_overlap_but_one_host_array_given_twice_does():
    pair = ((4, 4), "float32")
    d = cygemm.describe_gemm(pair, pair, pair)              # each pair at its own made-up address
    assert (d["M"], d["N"], d["K"], d["c"]) == (4, 4, 4, None)
    assert cygemm.describe_grouped([pair, pair], [pair, pair], [pair, pair])["groups"] == 2
    host = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match="^out: its memory overlaps A "):
        cygemm.describe_gemm(host, pair, host)


# ------------------------------------------------------------------ describe_call

def test_why_names_the_callers_arguments_with_op_under_a_transpose():
    swapped = cygemm.describe_gemm(((3, 4), "float32"), ((3, 5), "float32"), trans_a=True)
    assert swapped["why"] == ("out is row-major, which column-major cuBLAS reads as out^T: it computes "
                              "out^T = op(B)^T @ op(A)^T, so its first operand is B and its m, n are out's "
                              "columns, rows")
    assert (swapped["M"], swapped["K"], swapped["cublas_a"], swapped["cublas_b"]) == (4, 3, "B", "A")
    out_f = np.zeros((5, 4), np.float32).T          # (4, 5), column-major
    plain = cygemm.describe_gemm(((4, 3), "float32"), ((3, 5), "float32"), out_f)
    assert plain["why"] == "out is column-major as cuBLAS is: it computes out = A @ B as written"
    assert (plain["swapped"], plain["cublas_a"], plain["cublas_b"], plain["c"]) == (False, "A", "B", _address(out_f))
    [mm] = cygemm.describe_matmul(((4, 3), "float32"), ((3, 5), "float32"), out_f)
    assert mm["why"] == "out is column-major as cuBLAS is: it computes out = a @ b as written"


def test_an_empty_group_whose_layout_maps_to_nothing_has_no_cublas_arguments():
    """Group 0 has N = 0 and an A with no unit-stride axis, which maps to no cuBLAS call (gemm
    would refuse it): described with its sizes and every cuBLAS argument None."""
    host = np.zeros((8, 8), np.float32)
    d = cygemm.describe_grouped([host[::2, ::2], ((4, 4), "float32")], [((4, 0), "float32"), ((4, 3), "float32")],
                                [((4, 0), "float32"), ((4, 3), "float32")])
    empty, full = d["per_group"]
    assert (empty["M"], empty["N"], empty["K"], empty["route"]) == (4, 0, 4, None)
    cublas = ("opa", "opb", "m", "n", "k", "lda", "ldb", "ldc", "stride_a", "stride_b", "stride_c", "a", "b", "c")
    assert all(empty[k] is None for k in cublas), {k: empty[k] for k in cublas}
    assert (full["opa"], full["m"], full["n"], full["k"]) == ("N", 3, 4, 4)
    with pytest.raises(ValueError, match="^A: a layout cuBLAS cannot read in place"):
        cygemm.describe_gemm(host[::2, ::2], ((4, 0), "float32"))


# ------------------------------------------------------------------ GPU

@pytest.mark.gpu
def test_device_arrays_are_described_as_host_arrays_of_their_layout_and_left_untouched():
    import cupy as cp
    M, K, N = 24, 40, 16
    A = rand(cp, (K + 3, M))[1:K + 1].T                  # (M, K) column-major, leading dimension M
    B = rand(cp, (K, N + 5))[:, 2:N + 2]                 # (K, N) row-major, padded
    out = poisoned(cp, (M, N))
    hA = np.zeros((K + 3, M), np.float32)[1:K + 1].T
    hB = np.zeros((K, N + 5), np.float32)[:, 2:N + 2]
    device = cygemm.describe_gemm(A, B, out)
    host = cygemm.describe_gemm(hA, hB, np.zeros((M, N), np.float32))
    assert _mapping(device) == _mapping(host)
    assert (device["a"], device["b"], device["c"]) == (B.data.ptr, A.data.ptr, out.data.ptr)   # swapped
    cp.cuda.Device().synchronize()
    assert bool(cp.isnan(out).all())                     # describing wrote nothing
    cygemm.gemm(A, B, out, math="fp32")
    assert rel_err(cp.asnumpy(out), f64(cp, A) @ f64(cp, B)) < 1e-5


@pytest.mark.gpu
def test_torch_tensors_are_described_as_host_arrays_of_their_layout():
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = torch.zeros((32, 48), dtype=torch.bfloat16, device="cuda")
    w = torch.zeros((16, 48), dtype=torch.bfloat16, device="cuda")      # a linear layer's weight
    ha, hw = np.zeros((32, 48), ml_dtypes.bfloat16), np.zeros((16, 48), ml_dtypes.bfloat16)
    d = cygemm.describe_gemm(a, w.t())
    assert _mapping(d) == _mapping(cygemm.describe_gemm(ha, hw.T))
    assert (d["opa"], d["lda"]) == ("T", 48)             # cuBLAS's a is w.t(), read transposed in place
    assert (d["a"], d["b"], d["c"]) == (w.data_ptr(), a.data_ptr(), None)
