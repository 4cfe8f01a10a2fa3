"""cygemm.engine.args: the one preparation of every call (CallArgs, prepare_call).

What is checked here, through the entry points that read their buffers into a CallArgs (gemm,
gemm_strided_batched, matmul, GemmPlan, dense.forward_into, elementwise.bias_act/act_backward,
grouped_gemm, describe_grouped, fp8.quantize) on fake device arrays, before anything launches:
- math: one parser and one message for every entry point that computes a GEMM; "cupy" read from
  CUPY_TF32 at each call (GPU);
- the stream: resolved alike by every entry point, whatever it computes;
- overlaps by role: inputs may share memory, an output may share none with what comes before
  it (naming the first it meets), an output may be exactly its input only where the entry point
  allows it (the elementwise passes), and never a shifted or re-strided view of it;
- a workspace: contiguous, 256-byte aligned (an empty one has no address to align), sharing
  memory with no other buffer;
- the shared readers: a device float32 scalar is one element, never a host number; the
  shape, layout and dtype messages of add_matrix / add_vector;
- devices (two GPUs): a pointer into host memory is refused, naming the argument.
GPU: in-place elementwise passes compute the right values; each stream form reaches the stream.
"""
import numpy as np
import pytest

import cygemm
from cygemm import dense, elementwise, fp8
from fakes import BASE, FakeDeviceArray as F, fake_view
from gpu_util import f64, poisoned, rand, rel_err

MB = 1 << 20


def _at(i):
    """The fake address of slot i: slots 1 MiB apart never overlap."""
    return BASE + i * MB


def _gemm_fakes():
    return F((4, 3), ptr=_at(0)), F((3, 2), ptr=_at(1)), F((4, 2), ptr=_at(2))


def _calls_taking_math():
    a, b, o = _gemm_fakes()
    a3, b3, o3 = F((2, 4, 3), ptr=_at(3)), F((2, 3, 2), ptr=_at(4)), F((2, 4, 2), ptr=_at(5))
    return {
        "gemm": lambda m: cygemm.gemm(a, b, o, math=m),
        "gemm_strided_batched": lambda m: cygemm.gemm_strided_batched(a3, b3, o3, math=m),
        "matmul": lambda m: cygemm.matmul(a, b, o, math=m),
        "GemmPlan": lambda m: cygemm.GemmPlan(a, b, o, math=m),
        "dense.forward_into": lambda m: dense.forward_into(a, b, o, math=m),
        "grouped_gemm": lambda m: cygemm.grouped_gemm([a], [b], [o], math=m),
        "describe_grouped": lambda m: cygemm.describe_grouped([a], [b], [o], math=m),
    }


@pytest.mark.parametrize("value", ["fp16", "TF32", "", "fp32 "])
@pytest.mark.parametrize("entry", list(_calls_taking_math()))
def test_every_gemm_entry_point_refuses_an_unknown_math_in_one_message(entry, value):
    with pytest.raises(ValueError) as info:
        _calls_taking_math()[entry](value)
    assert str(info.value) == f"math: expected 'tf32', 'fp32' or 'cupy', got {value!r}"


def _calls_taking_stream():
    a, b, o = _gemm_fakes()
    x, y = F((4, 8), ptr=_at(6)), F((4, 8), ptr=_at(7))
    return {
        "gemm": lambda s: cygemm.gemm(a, b, o, stream=s),
        "matmul": lambda s: cygemm.matmul(a, b, o, stream=s),
        "dense.forward_into": lambda s: dense.forward_into(a, b, o, stream=s),
        "grouped_gemm": lambda s: cygemm.grouped_gemm([a], [b], [o], stream=s),
        "elementwise.bias_act": lambda s: elementwise.bias_act(x, out=y, stream=s),
        "fp8.quantize": lambda s: fp8.quantize(x, F((), ptr=_at(8)), out=F((4, 8), "|u1", ptr=_at(9)), stream=s),
    }


@pytest.mark.parametrize("entry", list(_calls_taking_stream()))
def test_every_entry_point_resolves_its_stream_alike(entry):
    call = _calls_taking_stream()[entry]
    with pytest.raises(ValueError) as info:
        call(-1)
    assert str(info.value) == "stream: expected a cudaStream_t handle (int >= 0), got -1"
    with pytest.raises(TypeError) as info:
        call(2.5)
    assert str(info.value) == ("stream: expected None, a cupy.cuda.Stream, an object with __cuda_stream__, "
                               "or an int cudaStream_t; got float")


# ------------------------------------------------------------------ overlaps by role

def test_inputs_may_share_memory_and_an_output_is_refused_naming_the_first_input_it_meets():
    buf = np.zeros((4, 10), np.float32)
    A, B = buf[:, :4], buf[:, 2:6]              # the inputs share columns 2 and 3
    d = cygemm.describe_gemm(A, B, np.zeros((4, 4), np.float32))
    assert (d["M"], d["N"], d["K"]) == (4, 4, 4)
    assert cygemm.describe_gemm(A, A, np.zeros((4, 4), np.float32))["K"] == 4      # A @ A
    with pytest.raises(ValueError, match="^out: its memory overlaps A "):          # A first, though B too
        cygemm.describe_gemm(A, B, buf[:, 3:7])
    with pytest.raises(ValueError, match="^out: its memory overlaps B "):
        cygemm.describe_gemm(A, B, buf[:, 5:9])          # B's last column alone


def test_an_output_is_checked_against_the_outputs_before_it():
    a, b, o = _gemm_fakes()
    with pytest.raises(ValueError, match="^z_out: its memory overlaps out "):
        dense.forward_into(a, b, o, save_z=True, z_out=F((4, 2), strides=(8, 4), ptr=_at(2) + 4))
    with pytest.raises(ValueError, match="^outs\\[1\\]: its memory overlaps outs\\[0\\] "):
        cygemm.grouped_gemm([a, F((4, 3), ptr=_at(3))], [b, b], [o, F((4, 2), ptr=_at(2) + 28)])


def test_an_output_may_be_exactly_its_input_only_where_the_entry_point_allows_it():
    """bias_act may write out (or z_out) over x itself and act_backward dz_out over gy: each
    element is read before it is written. Anything else that shares memory is refused: the
    same pointer with other strides, dz_out over z (not allowed in place), out and z_out both
    over x (then they share memory with each other), an output over the bias or a bias output
    inside gy."""
    buf = np.zeros((8, 16), np.float32)
    x = fake_view(buf, buf[:, :8])
    relaid = F((8, 8), "<f4", (32, 4), BASE)     # x's pointer and shape, leading dimension 8
    with pytest.raises(ValueError, match="^out: its memory overlaps x "):
        elementwise.bias_act(x, out=relaid)
    z = fake_view(buf, buf[:, 8:])
    with pytest.raises(ValueError, match="^dz_out: its memory overlaps z "):
        elementwise.act_backward(x, z, dz_out=fake_view(buf, buf[:, 8:]), act="relu")
    with pytest.raises(ValueError, match="^z_out: its memory overlaps out "):
        elementwise.bias_act(x, out=fake_view(buf, buf[:, :8]), z_out=fake_view(buf, buf[:, :8]))
    with pytest.raises(ValueError, match="^out: its memory overlaps bias "):
        elementwise.bias_act(x, fake_view(buf, buf[0, :8]), out=fake_view(buf, buf[:, :8]))
    with pytest.raises(ValueError, match="^dbias_out: its memory overlaps gy "):
        elementwise.act_backward(x, None, dbias_out=fake_view(buf, buf[3, :8]))
    # gemm never writes in place: out exactly A is refused as any overlap
    X = F((4, 4), ptr=_at(4))
    with pytest.raises(ValueError, match="^out: its memory overlaps A "):
        cygemm.gemm(X, F((4, 4), ptr=_at(5)), X)


def test_a_workspace_is_contiguous_aligned_and_shares_memory_with_nothing():
    a, b, o = _gemm_fakes()
    with pytest.raises(ValueError) as info:
        dense.forward_into(a, b, o, lt_workspace=F((1024,), "|u1", ptr=_at(3) + 4))
    assert str(info.value) == ("lt_workspace: expected a workspace aligned to 256 bytes, got address "
                               f"{_at(3) + 4:#x} (4 bytes past a boundary)")
    with pytest.raises(ValueError) as info:
        dense.forward_into(a, b, o, lt_workspace=F((64,), "<f4", strides=(8,), ptr=_at(3)))
    assert str(info.value) == "lt_workspace: expected a contiguous buffer, got strides (8,) bytes for shape (64,)"
    bias = F((2,), ptr=_at(3))                  # the workspace is checked against inputs and outputs
    with pytest.raises(ValueError, match="^lt_workspace: its memory overlaps bias "):
        dense.forward_into(a, b, o, bias, lt_workspace=F((1024,), "|u1", ptr=_at(3)))
    with pytest.raises(ValueError, match="^lt_workspace: its memory overlaps z_out "):
        dense.forward_into(a, b, o, save_z=True, z_out=F((4, 2), ptr=_at(4)),
                           lt_workspace=F((1024,), "|u1", ptr=_at(4) - 256))


@pytest.mark.nogpu
def test_an_empty_workspace_or_one_apart_from_the_bias_passes_the_checks():
    """An empty workspace needs no alignment (nothing is read there); an aligned one 256 bytes
    past the bias shares nothing with it: the call goes on to the GPU, which this machine lacks."""
    a, b, o = _gemm_fakes()
    for kw in (dict(lt_workspace=F((0,), "|u1", ptr=_at(3) + 4)),
               dict(bias=F((2,), ptr=_at(3)), lt_workspace=F((1024,), "|u1", ptr=_at(3) + 256))):
        with pytest.raises(cygemm.CudaError) as info:
            dense.forward_into(a, b, o, **kw)
        assert str(info.value) == cygemm.gpu_unavailable_reason()


# ------------------------------------------------------------------ the shared readers

def test_a_device_scalar_is_one_float32_element_never_a_host_number():
    x, q = F((4, 8), ptr=_at(0)), F((4, 8), "|u1", ptr=_at(1))
    for host, shown, as_float in ((2.0, "2.0", "2.0"), (3, "3", "3.0"),
                                  (np.float32(0.5), repr(np.float32(0.5)), "0.5")):
        with pytest.raises(TypeError) as info:
            fp8.quantize(x, host, out=q)
        assert str(info.value) == ("scale: expected a device float32 scalar (one element, read on the GPU when "
                                   f"the call runs), got a host number {shown}: pass "
                                   f"cupy.asarray({as_float}, cupy.float32)")
    with pytest.raises(TypeError, match=r"^scale: expected a CUDA device array .*got builtins\.bool$"):
        fp8.quantize(x, True, out=q)             # a bool is not taken for a number
    with pytest.raises(ValueError) as info:
        fp8.quantize(x, F((2,), ptr=_at(2)), out=q)
    assert str(info.value) == "scale: expected a device float32 scalar (one element), got float32 of shape (2,)"
    with pytest.raises(ValueError) as info:
        fp8.quantize(x, F((), "<f2", ptr=_at(2)), out=q)
    assert str(info.value) == "scale: expected a device float32 scalar (one element), got float16 of shape ()"
    # a written scalar (amax) is an output: it may share memory with nothing before it
    scale = F((1, 1), ptr=_at(2))               # one element in any shape
    with pytest.raises(ValueError, match="^amax: its memory overlaps scale "):
        fp8.quantize(x, scale, out=q, amax=F((), ptr=_at(2)))
    with pytest.raises(ValueError, match="^amax: its memory overlaps out "):
        fp8.quantize(x, scale, out=q, amax=F((), ptr=_at(1) + 28))       # q's last 4 bytes


def test_matrix_and_vector_readers_say_what_they_expected_and_got():
    a, b, o = _gemm_fakes()
    cases = [
        (dict(bias=F((3,), ptr=_at(3))), ValueError, "bias: expected shape (2,) or (1, 2), got (3,)"),
        (dict(bias=F((2, 2), ptr=_at(3))), ValueError, "bias: expected shape (2,) or (1, 2), got (2, 2)"),
        (dict(bias=F((1, 2), strides=(8, 8), ptr=_at(3))), ValueError,
         "bias: expected a contiguous vector, got element stride 2"),
        (dict(bias=F((2,), "<f2", ptr=_at(3))), TypeError, "bias: expected dtype float32, got float16"),
        (dict(out=F((4, 2), strides=(4, 16), ptr=_at(2))), ValueError,
         "out: expected a row-major array (unit stride along the last axis, rows not overlapping), "
         "got element strides (1, 4)"),
        (dict(out=F((4, 2), "<f2", ptr=_at(2))), TypeError, "out: expected dtype float32, got float16"),
        (dict(out=F((4, 3), ptr=_at(2))), ValueError, "out: expected shape (4, 2), got (4, 3)"),
        (dict(B=F((3, 2), "<f2", ptr=_at(1))), TypeError, "B: expected the dtype of A (float32), got float16"),
    ]
    for kw, exc, message in cases:
        args = dict(A=a, B=b, out=o)
        args.update(kw)
        with pytest.raises(exc) as info:
            dense.forward_into(**args)
        assert str(info.value) == message, kw


# ------------------------------------------------------------------ devices

@pytest.mark.gpu
@pytest.mark.multigpu
def test_a_pointer_into_host_memory_is_refused_naming_the_argument():
    """With several GPUs every buffer's device is asked of CUDA: host memory is none of them."""
    import cupy as cp
    host = np.ones((4, 4), np.float32)
    A = F((4, 4), "<f4", None, host.__array_interface__["data"][0])
    B, out = rand(cp, (4, 4)), poisoned(cp, (4, 4))
    with pytest.raises(ValueError, match=r"^A: expected device memory, got a pointer of memory type \d+ "
                                         r"\(host memory\)$"):
        cygemm.gemm(A, B, out)
    cp.cuda.Device().synchronize()
    assert bool(cp.isnan(out).all())


# ------------------------------------------------------------------ GPU

@pytest.mark.gpu
@pytest.mark.parametrize("entry", ["gemm", "forward_into"])
def test_math_cupy_is_read_from_cupy_tf32_at_each_call(entry, monkeypatch):
    """math='cupy' is strict fp32 unless CUPY_TF32=1, then TF32: read when the call is prepared."""
    import cupy as cp
    A, B = rand(cp, (256, 1024)), rand(cp, (1024, 256))
    ref = f64(cp, A) @ f64(cp, B)

    def run():
        out = poisoned(cp, (256, 256))
        if entry == "gemm":
            cygemm.gemm(A, B, out, math="cupy")
        else:
            dense.forward_into(A, B, out, math="cupy")
        return rel_err(cp.asnumpy(out), ref)

    monkeypatch.setenv("CUPY_TF32", "0")
    strict = run()
    monkeypatch.setenv("CUPY_TF32", "1")
    tf32 = run()
    monkeypatch.delenv("CUPY_TF32")
    unset = run()
    assert strict < 1e-5 and unset < 1e-5 < tf32 < 5e-3


@pytest.mark.gpu
def test_elementwise_passes_in_place_compute_the_right_values():
    import cupy as cp
    M, N = 300, 96
    x, bias = rand(cp, (M, N)), rand(cp, (N,))
    z_ref = f64(cp, x) + f64(cp, bias)
    elementwise.bias_act(x, bias, out=x, act="relu")             # out is x
    assert rel_err(cp.asnumpy(x), np.maximum(z_ref, 0.0)) < 1e-6
    x2 = rand(cp, (M, N))
    z_ref = f64(cp, x2) + f64(cp, bias)
    out = poisoned(cp, (M, N))
    elementwise.bias_act(x2, bias, out=out, z_out=x2, act="relu")  # z_out is x
    assert rel_err(cp.asnumpy(x2), z_ref) < 1e-6
    assert rel_err(cp.asnumpy(out), np.maximum(z_ref, 0.0)) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["cupy stream", "int", "__cuda_stream__"])
def test_a_call_is_enqueued_on_its_stream_in_every_form_it_is_given(form):
    """Captured on s in each form: nothing runs until the graph is launched, so the GEMM went to s."""
    import cupy as cp
    s = cp.cuda.Stream(non_blocking=True)

    class Protocol:
        def __cuda_stream__(self):
            return (0, s.ptr)

    given = {"cupy stream": s, "int": s.ptr, "__cuda_stream__": Protocol()}[form]
    A, B = rand(cp, (64, 48)), rand(cp, (48, 32))
    out = poisoned(cp, (64, 32))
    cp.cuda.Device().synchronize()
    cygemm.gemm(A, B, out, math="fp32", stream=given)            # once eagerly: handles, workspace
    s.synchronize()
    assert rel_err(cp.asnumpy(out), f64(cp, A) @ f64(cp, B)) < 1e-5
    out.fill(cp.nan)
    cp.cuda.Device().synchronize()
    with cygemm.graph.capture(s) as graph:
        cygemm.gemm(A, B, out, math="fp32", stream=given)
    assert bool(cp.isnan(out).all())                             # captured, not run
    graph.launch(s)
    s.synchronize()
    assert rel_err(cp.asnumpy(out), f64(cp, A) @ f64(cp, B)) < 1e-5
