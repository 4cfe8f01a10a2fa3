"""Types for cygemm's stubs: what cygemm accepts as a device array and as a stream.

Protocols, so a type checker accepts CuPy arrays, torch tensors, Numba and JAX arrays alike
without cygemm importing any of them.
"""
from typing import Any, Literal, Optional, Protocol, Sequence, Tuple, Union, runtime_checkable

__all__ = ["CudaArrayInterface", "DLPackArray", "DeviceArray", "CudaStreamProtocol", "StreamLike", "Math",
           "MatmulMath", "Activation", "Autotune", "Determinism", "HostArray", "GroupOffsets"]


@runtime_checkable
class CudaArrayInterface(Protocol):
    """An array exposing ``__cuda_array_interface__`` (CuPy, Numba, torch)."""

    @property
    def __cuda_array_interface__(self) -> dict: ...


@runtime_checkable
class DLPackArray(Protocol):
    """An array exposing DLPack on a CUDA device (torch, JAX, CuPy)."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...

    def __dlpack_device__(self) -> Tuple[int, int]: ...


DeviceArray = Union[CudaArrayInterface, DLPackArray]



@runtime_checkable
class HostArray(Protocol):
    """A host array exposing ``__array__`` (NumPy's)."""

    def __array__(self, *args: Any, **kwargs: Any) -> Any: ...


# The group offsets of the grouped and MoE GEMMs: host ints (a sequence, or a host array such as
# NumPy's) or a device array of int32/int64.
GroupOffsets = Union[Sequence[int], HostArray, DeviceArray]


@runtime_checkable
class CudaStreamProtocol(Protocol):
    """A stream exposing the CUDA stream protocol (cuda.core, Numba)."""

    def __cuda_stream__(self) -> Tuple[int, int]: ...


# None (the current stream), an int cudaStream_t, a cupy.cuda.Stream (``.ptr``), a torch
# stream (``.cuda_stream``) or a CudaStreamProtocol object.
StreamLike = Union[None, int, CudaStreamProtocol, Any]
Math = Literal["tf32", "fp32", "cupy"]
MatmulMath = Math          # (the same options: one name for each entry point's math)
Activation = Literal["none", "identity", "relu", "leaky_relu", "gelu", "gelu_erf", "sigmoid", "tanh", "silu"]

Autotune = Optional[Literal["off", "auto", "exhaustive"]]
Determinism = Optional[Literal["off", "run_to_run", "batch_invariant"]]
