from typing import Any, Dict, Literal, Optional, TypeVar, Union, overload

from cygemm.typing import Autotune, Determinism, DeviceArray, Math, StreamLike

_Out = TypeVar("_Out", bound=DeviceArray)
# A result made by the call is an array of the first operand's library (CuPy in, CuPy out; a
# torch tensor in, a tensor out).
_In = TypeVar("_In", bound=DeviceArray)
# False/True, or BLAS's names ("H"/"C": the conjugate transpose)
Trans = Union[bool, Literal["N", "T", "H", "C", "n", "t", "h", "c"]]

@overload
def gemm(A: _In, B: DeviceArray, out: None = None, *, trans_a: Trans = False, trans_b: Trans = False,
         alpha: complex = 1.0, beta: complex = 0.0, math: Math = "tf32", stream: StreamLike = None, autotune: Autotune = None,
         determinism: Determinism = None) -> _In: ...
@overload
def gemm(A: DeviceArray, B: DeviceArray, out: _Out, *, trans_a: Trans = False, trans_b: Trans = False,
         alpha: complex = 1.0, beta: complex = 0.0, math: Math = "tf32", stream: StreamLike = None, autotune: Autotune = None,
         determinism: Determinism = None) -> _Out: ...
@overload
def gemm_strided_batched(A: _In, B: DeviceArray, out: None = None, *, trans_a: Trans = False,
                         trans_b: Trans = False, alpha: complex = 1.0, beta: complex = 0.0, math: Math = "tf32",
                         stream: StreamLike = None, autotune: Autotune = None,
         determinism: Determinism = None) -> _In: ...
@overload
def gemm_strided_batched(A: DeviceArray, B: DeviceArray, out: _Out, *, trans_a: Trans = False,
                         trans_b: Trans = False, alpha: complex = 1.0, beta: complex = 0.0, math: Math = "tf32",
                         stream: StreamLike = None, autotune: Autotune = None,
         determinism: Determinism = None) -> _Out: ...
@overload
def int_mm(A: _In, B: DeviceArray, out: None = None, *, stream: StreamLike = None, autotune: Autotune = None,
           determinism: Determinism = None) -> _In: ...
@overload
def int_mm(A: DeviceArray, B: DeviceArray, out: _Out, *, stream: StreamLike = None, autotune: Autotune = None,
           determinism: Determinism = None) -> _Out: ...
def describe_gemm(A: Any, B: Any, out: Any = None, *, trans_a: Trans = False,
                  trans_b: Trans = False, alpha: complex = 1.0, beta: complex = 0.0, math: Math = "tf32",
                  stream: StreamLike = None, autotune: Autotune = None, determinism: Determinism = None,
                  batched: bool = False) -> Dict[str, Any]: ...
