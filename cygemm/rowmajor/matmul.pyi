from typing import Any, Dict, List, Optional, TypeVar, overload

from cygemm.typing import Autotune, Determinism, DeviceArray, MatmulMath, StreamLike

_Out = TypeVar("_Out", bound=DeviceArray)
# A result made by the call is an array of the first operand's library (CuPy in, CuPy out; a
# torch tensor in, a tensor out).
_In = TypeVar("_In", bound=DeviceArray)

@overload
def matmul(a: _In, b: DeviceArray, out: None = None, *, math: MatmulMath = "tf32",
           stream: StreamLike = None, autotune: Autotune = None, determinism: Determinism = None) -> _In: ...
@overload
def matmul(a: DeviceArray, b: DeviceArray, out: _Out, *, math: MatmulMath = "tf32",
           stream: StreamLike = None, autotune: Autotune = None, determinism: Determinism = None) -> _Out: ...
def describe_matmul(a: Any, b: Any, out: Any = None, *, math: MatmulMath = "tf32", stream: StreamLike = None,
                    autotune: Autotune = None, determinism: Determinism = None) -> List[Dict[str, Any]]: ...
