"""cygemm.engine.seed_helpers: the dense layer's deprecated helpers (re-exported by cygemm.gemm_ops).

CPU, on fake device arrays: each call warns exactly once (never twice through a helper that
builds a TensorDesc), every time, at the caller's line, naming itself and what to use instead;
the wrappers keep each helper's name, docstring and signature; TensorDesc stays an immutable
5-field tuple; errors name the argument as the caller called it; a column vector may have any
column stride; get_stream_ptr is cygemm.stream_pointer's answer. GPU: empty_2d and
empty_like_2d give CuPy arrays of the asked shape and dtype, made on the stream, that a GEMM
on that stream fills right. (tests/test_gemm_ops.py has the descriptors' values, the capsule,
and that gemm_ops re-exports these without exporting or warning at import.)
"""
import inspect
import warnings

import numpy as np
import pytest

import cygemm
from cygemm.engine import seed_helpers as sh
from fakes import BASE, FakeDeviceArray as F
from gpu_util import f64, rand, rel_err, tol

# What each helper's warning tells the caller to use instead.
INSTEAD = {
    "TensorDesc": "__cuda_array_interface__",
    "as_tensor_2d": "shape, dtype and __cuda_array_interface__",
    "assert_f32_2d": "check the array's shape and dtype",
    "empty_2d": "cupy.empty",
    "empty_like_2d": "cupy.empty_like",
    "get_stream_ptr": "cygemm.stream_pointer",
    "to_voidp_capsule": "ctypes.pythonapi.PyCapsule_New",
    "ensure_cuda_dlls": "nothing is needed",
}


def _cpu_calls():
    """A call of each helper that needs no GPU."""
    return {
        "TensorDesc": lambda: sh.TensorDesc(BASE, 2, 3, 3, "float32"),
        "as_tensor_2d": lambda: sh.as_tensor_2d(F((5, 7), strides=(40, 4))),
        "assert_f32_2d": lambda: sh.assert_f32_2d(F((3, 4))),
        "get_stream_ptr": lambda: sh.get_stream_ptr(77),
        "to_voidp_capsule": lambda: sh.to_voidp_capsule(0x1234),
        "ensure_cuda_dlls": lambda: sh.ensure_cuda_dlls(),
    }


def _recorded(call):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = call()
    return result, [w for w in record if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("name", sorted(_cpu_calls()))
def test_each_call_warns_exactly_once_at_the_callers_line_naming_itself_and_the_replacement(name):
    call = _cpu_calls()[name]
    for _ in range(2):                                   # every call, not only the first
        _, record = _recorded(call)
        assert len(record) == 1, [str(w.message) for w in record]
        message = str(record[0].message)
        assert message.startswith(f"cygemm.gemm_ops.{name} is deprecated and will be removed in the next release: ")
        assert INSTEAD[name] in message
        assert record[0].filename == __file__


def test_the_module_exports_every_helper_and_the_table_covers_them():
    assert set(sh.__all__) == set(INSTEAD)
    for name in sh.__all__:
        assert callable(getattr(sh, name)), name


@pytest.mark.parametrize("name", [n for n in sorted(INSTEAD) if n != "TensorDesc"])
def test_the_wrappers_keep_each_helpers_name_docstring_and_signature(name):
    helper = getattr(sh, name)
    wrapped = helper.__wrapped__
    assert helper.__name__ == wrapped.__name__ == name
    assert helper.__doc__ and helper.__doc__ == wrapped.__doc__
    assert inspect.signature(helper) == inspect.signature(wrapped)
    assert helper.__module__ == sh.__name__


def test_tensor_desc_is_an_immutable_five_field_tuple_made_without_a_second_warning():
    assert sh.TensorDesc._fields == ("ptr", "rows", "cols", "ld", "dtype")
    made, record = _recorded(lambda: sh.TensorDesc._make((BASE, 2, 3, 4, "float16")))
    assert record == []                                  # the helpers build it this way
    assert type(made) is sh.TensorDesc and tuple(made) == (BASE, 2, 3, 4, "float16")
    with pytest.raises(AttributeError):
        made.rows = 9
    with pytest.raises(AttributeError):
        made.extra = 1                                   # __slots__ = (): no instance dict
    ptr, rows, cols, ld, dtype = made
    assert (ptr, rows, cols, ld, dtype) == (made.ptr, made.rows, made.cols, made.ld, made.dtype)


def test_errors_name_the_argument_as_the_caller_called_it():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ValueError, match=r"^weight: expected a 2-D array, got shape \(2, 3, 4\)"):
            sh.as_tensor_2d(F((2, 3, 4)), name="weight")
        with pytest.raises(ValueError, match=r"^weight: expected unit stride along the last axis, got 3 elements"):
            sh.as_tensor_2d(F((4, 5), strides=(60, 12)), name="weight")
        with pytest.raises(TypeError, match=r"^W: expected float32, got float16"):
            sh.assert_f32_2d(F((3, 4), "<f2"), name="W")
        with pytest.raises(ValueError, match=r"^W: expected a 2-D array"):
            sh.assert_f32_2d(F((1, 3, 4)), name="W")


def test_a_column_vector_may_have_any_column_stride_and_its_ld_is_the_row_stride():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        d = sh.as_tensor_2d(F((5, 1), strides=(48, 12), ptr=BASE + 64))
        assert tuple(d) == (BASE + 64, 5, 1, 12, "float32")
        assert sh.assert_f32_2d(F((5, 1), strides=(48, 12))) == (5, 1)
        # a half-precision view of a wider buffer: ld counts elements, not bytes
        d = sh.as_tensor_2d(F((4, 3), "<f2", strides=(16, 2)))
        assert (d.rows, d.cols, d.ld, d.dtype) == (4, 3, 8, "float16")


def test_get_stream_ptr_is_cygemms_stream_pointer():
    class CoreStream:
        def __cuda_stream__(self):
            return (0, 0xBEEF)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for stream in (0, 1, 2, 0x7F00, CoreStream()):
            assert sh.get_stream_ptr(stream) == cygemm.stream_pointer(stream)
        assert sh.get_stream_ptr(CoreStream()) == 0xBEEF
        with pytest.raises(TypeError, match="^stream: expected"):
            sh.get_stream_ptr("the default one")


# ---------------------------------------------------------------- on the GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, "float32"])
def test_empty_2d_is_a_cupy_array_made_on_the_stream_that_a_gemm_fills(dtype):
    import cupy as cp
    M, K, N = 96, 72, 40
    s = cp.cuda.Stream(non_blocking=True)
    A, B = rand(cp, (M, K)), rand(cp, (K, N))
    cp.cuda.Device().synchronize()
    with pytest.warns(DeprecationWarning, match="empty_2d"):
        out = sh.empty_2d(M, N, dtype=dtype, stream=s)
    assert isinstance(out, cp.ndarray) and out.shape == (M, N) and out.dtype == np.float32
    assert out.flags.c_contiguous
    with s:
        out[...] = cp.nan
    cygemm.gemm(A, B, out, math="fp32", stream=s)
    s.synchronize()
    assert rel_err(out.get(), f64(cp, A) @ f64(cp, B)) < tol("float32", "fp32", K)
    # Its memory came from `s`'s part of CuPy's pool: freed, it is handed out again on `s`.
    ptr = out.data.ptr
    del out
    with s:
        again = cp.empty((M, N), cp.float32)
    assert again.data.ptr == ptr


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_empty_like_2d_of_a_view_is_a_new_contiguous_array_of_its_shape_and_dtype(dtype):
    import cupy as cp
    M, K, N = 64, 48, 80
    s = cp.cuda.Stream(non_blocking=True)
    A, B = rand(cp, (M, K), dtype), rand(cp, (K, N), dtype)
    wide = rand(cp, (M, 2 * N), dtype)
    view = wide[:, 3:3 + N]                              # strided: rows of 2N elements
    cp.cuda.Device().synchronize()
    with pytest.warns(DeprecationWarning, match="empty_like_2d"):
        out = sh.empty_like_2d(view, stream=s)
    assert out.shape == (M, N) and out.dtype == np.dtype(dtype) and out.flags.c_contiguous
    assert out.data.ptr != view.data.ptr
    with s:
        out[...] = cp.nan
    cygemm.gemm(A, B, out, math="fp32", stream=s)
    s.synchronize()
    assert rel_err(out.get(), f64(cp, A) @ f64(cp, B)) < tol(dtype, "fp32", K)
    with pytest.warns(DeprecationWarning, match="as_tensor_2d"):
        d = sh.as_tensor_2d(view)
    assert (d.ptr, d.rows, d.cols, d.ld, d.dtype) == (view.data.ptr, M, N, 2 * N, dtype)
