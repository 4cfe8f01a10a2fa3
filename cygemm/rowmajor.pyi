from typing import Any, Dict, Optional, TypeVar, overload

from cygemm._typing import Autotune, DeviceArray, Math, StreamLike

_Out = TypeVar("_Out", bound=DeviceArray)

@overload
def gemm(A: DeviceArray, B: DeviceArray, out: None = None, *, trans_a: bool = False, trans_b: bool = False,
         alpha: float = 1.0, beta: float = 0.0, math: Math = "tf32", stream: StreamLike = None, autotune: Autotune = None) -> DeviceArray: ...
@overload
def gemm(A: DeviceArray, B: DeviceArray, out: _Out, *, trans_a: bool = False, trans_b: bool = False,
         alpha: float = 1.0, beta: float = 0.0, math: Math = "tf32", stream: StreamLike = None, autotune: Autotune = None) -> _Out: ...
@overload
def gemm_strided_batched(A: DeviceArray, B: DeviceArray, out: None = None, *, trans_a: bool = False,
                         trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0, math: Math = "tf32",
                         stream: StreamLike = None, autotune: Autotune = None) -> DeviceArray: ...
@overload
def gemm_strided_batched(A: DeviceArray, B: DeviceArray, out: _Out, *, trans_a: bool = False,
                         trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0, math: Math = "tf32",
                         stream: StreamLike = None, autotune: Autotune = None) -> _Out: ...
def describe_gemm(A: Any, B: Any, out: Any = None, *, trans_a: bool = False,
                  trans_b: bool = False, batched: bool = False) -> Dict[str, Any]: ...
