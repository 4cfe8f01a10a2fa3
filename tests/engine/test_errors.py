"""CPU: cygemm's exception types (cygemm.engine.errors): each names the status and the call, pickles,
and derives from CygemmError."""
import pickle

import cygemm


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


def test_a_driver_failure_is_its_own_error_type_naming_the_call():
    err = cygemm.CudaDriverError(400, "cuStreamGetCtx")
    assert isinstance(err, cygemm.CygemmError) and "CUresult 400" in str(err) and err.call == "cuStreamGetCtx"
    import pickle
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


def test_capture_refusals_are_one_exception_type():
    assert issubclass(cygemm.CaptureError, cygemm.CygemmError) and issubclass(cygemm.CaptureError, RuntimeError)


def test_no_gpu_error_is_a_cuda_error_with_the_reason_alone_and_pickles():
    from cygemm.engine.errors import NoGpuError
    err = NoGpuError(35, "cudaGetDevice", "no NVIDIA GPU/driver found (the driver library libcuda.so.1 is not installed)")
    assert str(err) == "no NVIDIA GPU/driver found (the driver library libcuda.so.1 is not installed)"
    assert err.name == "cudaErrorInsufficientDriver" and err.call == "cudaGetDevice"
    assert isinstance(err, cygemm.CudaError)
    again = pickle.loads(pickle.dumps(err))
    assert (type(again), again.status, again.call, str(again)) == (type(err), 35, "cudaGetDevice", str(err))
