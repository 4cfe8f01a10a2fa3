from typing import Any, List, Optional, TypeVar, overload

from cygemm.typing import Autotune, Determinism, DeviceArray, MatmulMath, StreamLike

_Out = TypeVar("_Out", bound=DeviceArray)

@overload
def matmul(a: DeviceArray, b: DeviceArray, out: None = None, *, math: MatmulMath = "tf32",
           stream: StreamLike = None, autotune: Autotune = None, determinism: Determinism = None) -> DeviceArray: ...
@overload
def matmul(a: DeviceArray, b: DeviceArray, out: _Out, *, math: MatmulMath = "tf32",
           stream: StreamLike = None, autotune: Autotune = None, determinism: Determinism = None) -> _Out: ...
def describe_matmul(a: Any, b: Any, out: Any = None) -> List[dict]: ...
