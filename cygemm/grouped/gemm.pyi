from typing import Any, Dict, Literal, Optional, Sequence, TypeVar

from cygemm.typing import Autotune, Determinism, DeviceArray, Math, StreamLike
from cygemm.rowmajor.gemm import Trans

_Outs = TypeVar("_Outs", bound=Sequence[DeviceArray])
Route = Optional[Literal["batched", "grouped", "loop", "streams"]]

ROUTES: Dict[str, str]
LT_NEEDS_DEVICE_OFFSETS: str

def last_route() -> Optional[str]: ...
def grouped_gemm(As: Sequence[DeviceArray], Bs: Sequence[DeviceArray], outs: _Outs, *, trans_a: Trans = False,
                 trans_b: Trans = False, alpha: float = 1.0, beta: float = 0.0, math: Math = "tf32",
                 stream: StreamLike = None, route: Route = None, autotune: Autotune = None,
                 determinism: Determinism = None) -> _Outs: ...
def describe_grouped(As: Sequence[Any], Bs: Sequence[Any], outs: Sequence[Any], *, trans_a: Trans = False,
                     trans_b: Trans = False, alpha: float = 1.0, beta: float = 0.0, math: Math = "tf32",
                     stream: StreamLike = None, route: Route = None, autotune: Autotune = None,
                     determinism: Determinism = None) -> Dict[str, Any]: ...
