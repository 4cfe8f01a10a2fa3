"""cygemm.engine.alloc: new arrays of the caller's library, allocated on the call's stream.

What is checked here:
- CPU: alloc.empty resolves its stream as every entry point does, before it touches the GPU;
  without a GPU it says only cygemm's no-GPU reason; out=None's result is described as the
  new C-ordered array the call allocates ((M, N), or (batch, M, N) of matrices one after
  another), whose address is not known yet;
- GPU: alloc.empty gives C-ordered CuPy arrays of every result dtype and refuses other dtypes
  by name; its block comes from the pool of the stream it is given, CuPy's current stream left
  as it was (stream_context makes a stream current inside it only); it is refused while that
  stream is being captured, naming what it was for, and the capture survives; torch tensors in
  `like` give torch tensors on their device; as_cupy wraps other arrays without a copy; the
  out=None results of gemm_strided_batched and matmul are new arrays from the call's stream,
  against float64 references.
"""
import numpy as np
import pytest

import cygemm
from cygemm.engine import alloc
from gpu_util import f64, poisoned, rand, rel_err


# ------------------------------------------------------------------ CPU

def test_empty_resolves_its_stream_before_touching_the_gpu():
    with pytest.raises(ValueError) as info:
        alloc.empty((2, 2), "float32", -1)
    assert str(info.value) == "stream: expected a cudaStream_t handle (int >= 0), got -1"
    with pytest.raises(TypeError) as info:
        alloc.empty((2, 2), "float32", "default")
    assert str(info.value) == ("stream: expected None, a cupy.cuda.Stream, an object with __cuda_stream__, "
                               "or an int cudaStream_t; got str")


@pytest.mark.nogpu
@pytest.mark.parametrize("stream", [None, 0])
def test_empty_without_a_gpu_says_only_the_no_gpu_reason(stream):
    with pytest.raises(cygemm.CudaError) as info:
        alloc.empty((2, 2), "float32", stream)
    assert str(info.value) == cygemm.gpu_unavailable_reason()


def test_out_none_is_described_as_a_new_c_ordered_result_without_an_address():
    M, K, N = 6, 5, 4
    d = cygemm.describe_gemm(((M, K), "float32"), np.zeros((K, N), np.float32))
    assert d["c"] is None and d["swapped"] and (d["ldc"], d["m"], d["n"]) == (N, N, M)
    # batched, A broadcast: batch from B, matrices one after another (stride M * N)
    d = cygemm.describe_gemm(((M, K), "float32"), ((3, K, N), "float32"), batched=True)
    assert (d["batch"], d["stride_c"], d["ldc"], d["c"]) == (3, M * N, N, None)
    # matmul's result: NumPy's broadcast shape (2, 3, M, N), C-ordered. a broadcast over the 3:
    # one batched call per a[i], over out[i]'s 3 matrices one after another
    calls = cygemm.describe_matmul(((2, 1, M, K), "float32"), ((3, K, N), "float32"))
    assert [(c["batch"], c["stride_c"], c["ldc"], c["c"]) for c in calls] == [(3, M * N, N, None)] * 2
    # b 2-D: the (2, 3, M, N) result is one C-ordered (6 M, N) matrix, written by one GEMM
    [tall] = cygemm.describe_matmul(((2, 3, M, K), "float32"), ((K, N), "float32"))
    assert (tall["M"], tall["batch"], tall["ldc"], tall["c"]) == (6 * M, 1, N, None)


# ------------------------------------------------------------------ GPU

def _dtype_or_skip(name):
    """The NumPy dtype of a result name (bfloat16 through ml_dtypes, where it is installed)."""
    if name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(alloc.RESULT_DTYPES))
def test_empty_gives_a_c_ordered_cupy_array_of_every_result_dtype(name):
    import cupy as cp
    want = _dtype_or_skip(name)
    for spelling in (name, want):
        x = alloc.empty((3, 5, 7), spelling)
        assert type(x) is cp.ndarray and x.shape == (3, 5, 7) and x.dtype == want
        assert x.flags.c_contiguous


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, name", [("int16", "int16"), ("uint8", "uint8"), (np.bool_, "bool"),
                                         (np.uint16, "uint16")])
def test_empty_refuses_a_dtype_no_gemm_writes(dtype, name):
    with pytest.raises(TypeError) as info:
        alloc.empty((2, 2), dtype)
    assert str(info.value) == ("dtype: expected one of float16, bfloat16, float32, float64, complex64, complex128, "
                               f"int8, int32, got {name}")


@pytest.mark.gpu
def test_empty_takes_its_block_from_the_given_streams_pool_and_leaves_the_current_stream():
    import cupy as cp
    s = cp.cuda.Stream(non_blocking=True)
    before = cp.cuda.get_current_stream()
    n = 123_457                                  # a size of its own: no other block of it in the pool
    for stream in (s, s.ptr):
        x = alloc.empty((n,), "float32", stream)
        assert cp.cuda.get_current_stream().ptr == before.ptr
        ptr = x.data.ptr
        del x
        with s:
            again = cp.empty((n,), cp.float32)   # s's part of the pool hands the freed block out again
        assert again.data.ptr == ptr
        del again


@pytest.mark.gpu
def test_stream_context_makes_the_stream_current_only_inside():
    import contextlib

    import cupy as cp
    s = cp.cuda.Stream(non_blocking=True)
    before = cp.cuda.get_current_stream()
    assert isinstance(alloc.stream_context(before.ptr), contextlib.nullcontext)     # already current
    with alloc.stream_context(s.ptr):
        assert cp.cuda.get_current_stream().ptr == s.ptr
        inside = alloc.empty_on((4, 4), np.float32, s.ptr)
    assert cp.cuda.get_current_stream().ptr == before.ptr
    assert inside.shape == (4, 4) and inside.dtype == np.float32


@pytest.mark.gpu
def test_empty_while_its_stream_is_captured_is_refused_naming_what_it_was_for():
    import cupy as cp
    s = cp.cuda.Stream(non_blocking=True)
    A, B = rand(cp, (16, 8)), rand(cp, (8, 12))
    out = poisoned(cp, (16, 12))
    cygemm.gemm(A, B, out, math="fp32", stream=s)        # warm: handles and workspace exist
    s.synchronize()
    out.fill(cp.nan)
    cp.cuda.Device().synchronize()
    with cygemm.graph.capture(s) as graph:
        with pytest.raises(cygemm.CaptureError) as info:
            alloc.empty((16, 12), "float32", s, what="the scratch of my step")
        cygemm.gemm(A, B, out, math="fp32", stream=s)     # the capture is still alive
    assert str(info.value).startswith("the scratch of my step: allocating it uses device memory, which is not "
                                      "allowed while the stream is being captured")
    assert bool(cp.isnan(out).all())
    graph.launch(s)
    s.synchronize()
    assert rel_err(cp.asnumpy(out), f64(cp, A) @ f64(cp, B)) < 1e-5


@pytest.mark.gpu
def test_a_torch_tensor_in_like_gives_a_torch_tensor_on_its_device_from_the_streams_pool():
    import cupy as cp
    torch = pytest.importorskip("torch")
    t = torch.zeros(3, device="cuda")
    s = cp.cuda.Stream(non_blocking=True)
    x = alloc.empty((5, 7), "bfloat16", s, like=(cp.zeros(3), t))       # the first torch tensor in like
    assert isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 and x.device == t.device
    assert x.shape == (5, 7) and x.is_contiguous()
    ptr = x.data_ptr()
    del x
    with torch.cuda.stream(torch.cuda.ExternalStream(s.ptr, device=t.device)):
        again = torch.empty((5, 7), dtype=torch.bfloat16, device=t.device)
    assert again.data_ptr() == ptr                      # freed into s's pool: handed out again there
    y = alloc.empty((2, 3), "float32", None, like=cp.zeros(3))           # no torch tensor: CuPy
    assert type(y) is cp.ndarray


@pytest.mark.gpu
def test_as_cupy_wraps_other_device_arrays_without_a_copy():
    import cupy as cp
    x = rand(cp, (4, 6))
    assert alloc.as_cupy(x) is x

    class CAI:
        def __init__(self, arr):
            self.__cuda_array_interface__ = arr.__cuda_array_interface__

    view = alloc.as_cupy(CAI(x[:, 1:4]))
    assert type(view) is cp.ndarray and view.data.ptr == x[:, 1:4].data.ptr and view.shape == (4, 3)
    view[...] = 7.0
    assert bool((x[:, 1:4] == 7.0).all()) and not bool((x[:, 0] == 7.0).any())


@pytest.mark.gpu
def test_out_none_results_are_new_arrays_from_the_call_streams_pool():
    """gemm_strided_batched with a broadcast A and matmul, on a stream that is not current: a new
    C-ordered (batch, M, N) result, its block freed back into that stream's pool."""
    import cupy as cp
    s = cp.cuda.Stream(non_blocking=True)
    batch, M, K, N = 3, 37, 29, 23
    A, B = rand(cp, (M, K)), rand(cp, (batch, K, N))
    ref = np.matmul(f64(cp, A), f64(cp, B))
    cp.cuda.Device().synchronize()
    for call in (lambda: cygemm.gemm_strided_batched(A, B, math="fp32", stream=s),
                 lambda: cygemm.matmul(A, B, math="fp32", stream=s)):
        got = call()
        s.synchronize()
        assert type(got) is cp.ndarray and got.shape == (batch, M, N) and got.flags.c_contiguous
        assert rel_err(cp.asnumpy(got), ref) < 1e-5
        ptr = got.data.ptr
        del got
        with s:
            again = cp.empty((batch, M, N), cp.float32)
        assert again.data.ptr == ptr
        del again
