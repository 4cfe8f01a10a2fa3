"""CPU: errors, array views and stream resolution of the C core."""
import pickle

import numpy as np
import pytest

import cygemm
from cygemm import _arrays
from fakes import BASE, FakeDeviceArray


def test_cublas_error_names_status_and_call_and_pickles():
    err = cygemm.CublasError(7, "cublasGemmEx")   # 7 = CUBLAS_STATUS_INVALID_VALUE
    assert err.name == "CUBLAS_STATUS_INVALID_VALUE"
    assert "cublasGemmEx" in str(err) and "CUBLAS_STATUS_INVALID_VALUE" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert (type(again), again.status, again.call, str(again)) == (type(err), 7, "cublasGemmEx", str(err))
    assert isinstance(err, cygemm.CygemmError) and isinstance(err, RuntimeError)


def test_cuda_error_names_status_and_call_and_pickles():
    err = cygemm.CudaError(2, "cudaMalloc")        # 2 = cudaErrorMemoryAllocation
    assert err.name == "cudaErrorMemoryAllocation" and "cudaMalloc" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert (again.status, again.call, again.name) == (2, "cudaMalloc", err.name)


def test_describe_array_reads_cai_in_elements():
    x = FakeDeviceArray((3, 4, 5), "<f2", strides=(80, 20, 2), ptr=BASE + 64)
    d = _arrays.describe_array(x)
    assert d == dict(ptr=BASE + 64, batch=3, rows=4, cols=5, batch_stride=40,
                     row_stride=10, col_stride=1, dtype="float16")


def test_describe_array_c_contiguous_when_strides_missing():
    d = _arrays.describe_array(FakeDeviceArray((6, 7)))
    assert (d["batch"], d["row_stride"], d["col_stride"], d["batch_stride"]) == (1, 7, 1, 0)


@pytest.mark.parametrize("bad,exc,words", [
    (np.ones((2, 2), np.float32), TypeError, ["x:", "NumPy array in host memory", "cupy.asarray"]),
    ([[1.0]], TypeError, ["x:", "list"]),
    (FakeDeviceArray((2, 2), "<f8"), TypeError, ["x:", "expected float16, bfloat16 or float32, got float64"]),
    (FakeDeviceArray((4,)), ValueError, ["x:", "1-D"]),
    (FakeDeviceArray((2, 2, 2, 2)), ValueError, ["x:", "4-D"]),
    (FakeDeviceArray((2, 2), strides=(8, 2)), ValueError, ["x:", "multiple"]),
])
def test_describe_array_rejects_with_named_argument(bad, exc, words):
    with pytest.raises(exc) as info:
        _arrays.describe_array(bad, "x")
    for w in words:
        assert w in str(info.value)


def test_stream_resolution_without_touching_the_gpu():
    class CudaStreamProtocol:
        def __cuda_stream__(self):
            return (0, 1234)

    class HasPtr:
        ptr = 5678

    assert cygemm.stream_pointer(99) == 99
    assert cygemm.stream_pointer(CudaStreamProtocol()) == 1234
    assert cygemm.stream_pointer(HasPtr()) == 5678
    with pytest.raises(TypeError, match="stream:"):
        cygemm.stream_pointer("default")
    with pytest.raises(ValueError, match="stream:"):
        cygemm.stream_pointer(-1)


@pytest.mark.nogpu
def test_stream_none_without_gpu_raises_cygemms_cuda_error_not_cupys():
    a = FakeDeviceArray((4, 4))
    out = FakeDeviceArray((4, 4), ptr=a.__cuda_array_interface__["data"][0] + 4096)
    for call in (lambda: cygemm.gemm(a, a, out), lambda: cygemm.matmul(a, a, out)):
        with pytest.raises(cygemm.CudaError) as info:
            call()
        assert info.value.name.startswith("cuda") and "stream=None" in info.value.call


@pytest.mark.nogpu
def test_gemm_without_gpu_raises_cuda_error_naming_the_call_in_plain_words():
    a = FakeDeviceArray((4, 4))
    with pytest.raises(cygemm.CudaError) as info:
        cygemm.gemm(a, a, FakeDeviceArray((4, 4), ptr=a.__cuda_array_interface__["data"][0] + 4096), stream=0)
    assert info.value.call in ("cudaGetDevice", "cudaGetDeviceCount", "cublasCreate")
    assert info.value.name.startswith("cuda")
    # Not only "CUDA driver version is insufficient": what gpu_unavailable_reason says too.
    assert cygemm.gpu_unavailable_reason() in str(info.value)


@pytest.mark.nogpu
def test_device_count_is_zero_without_a_gpu():
    assert cygemm.device_count() == 0


def test_a_driver_failure_is_its_own_error_type_naming_the_call():
    err = cygemm.CudaDriverError(400, "cuStreamGetCtx")
    assert isinstance(err, cygemm.CygemmError) and "CUresult 400" in str(err) and err.call == "cuStreamGetCtx"
    import pickle
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


def test_capture_refusals_are_one_exception_type():
    assert issubclass(cygemm.CaptureError, cygemm.CygemmError) and issubclass(cygemm.CaptureError, RuntimeError)


def test_get_include_lists_existing_folders_with_pxd_and_headers():
    import os
    dirs = cygemm.get_include()
    assert dirs and all(os.path.isdir(d) for d in dirs)
    for needed in ("cygemm/rowmajor.pxd", "cygemm/_context.pxd", "cygemm/kernels.h", "cublas_v2.h",
                   "cublasLt.h", "cuda_runtime_api.h"):
        assert any(os.path.exists(os.path.join(d, needed)) for d in dirs), needed


def test_get_include_names_missing_cublas_headers_and_the_remedy(monkeypatch):
    from cuda import pathfinder
    from cygemm import _cuda_paths
    real = pathfinder.find_nvidia_header_directory
    monkeypatch.setattr(pathfinder, "find_nvidia_header_directory",
                        lambda name: None if name == "cublas" else real(name))
    monkeypatch.setattr(_cuda_paths, "_wheel_dirs", lambda sub: [])
    with pytest.raises(FileNotFoundError) as info:
        cygemm.get_include()
    assert "cublas_v2.h" in str(info.value) and "pip install nvidia-cublas" in str(info.value)


def test_cublas_is_loaded_from_where_cuda_pathfinder_finds_it():
    import ctypes
    import os
    from cygemm import _cuda_paths
    loaded = _cuda_paths.load_cublas()
    assert set(loaded) == {"cublas", "cublasLt"}
    for name, path in loaded.items():
        assert os.path.basename(path) == f"lib{name}.so.13" and os.path.isfile(path)
        ctypes.CDLL(path)   # loadable from that path


@pytest.mark.nogpu
def test_no_gpu_reason_is_plain_words():
    import ctypes
    reason = cygemm.gpu_unavailable_reason()
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        assert reason.startswith("no NVIDIA GPU/driver found")
    else:
        assert reason and "NVIDIA" in reason


def test_every_compiled_module_has_a_stub_naming_its_public_functions():
    import ast
    import importlib
    import importlib.machinery
    import os
    root = os.path.dirname(cygemm.__file__)
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    modules = sorted({os.path.join(sub, n.split(".")[0]) for sub in ("", "nn", "backend")
                      for n in os.listdir(os.path.join(root, sub)) if n.endswith(suffixes)})
    # The compiled modules, installed or built, those of the subpackages too.
    assert {"_context", "plans", "nn/_kernels", "backend/_kernels"} <= set(modules)
    for name in modules:
        stub = os.path.join(root, f"{name}.pyi")
        assert os.path.isfile(stub), f"{name}: no stub"
        declared = {n.name for n in ast.walk(ast.parse(open(stub).read()))
                    if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        mod = importlib.import_module("cygemm." + name.replace("/", "."))
        public = {k for k, v in vars(mod).items() if not k.startswith("_") and callable(v)
                  and getattr(v, "__module__", None) == mod.__name__}
        assert public <= declared, f"{name}.pyi lacks {sorted(public - declared)}"
