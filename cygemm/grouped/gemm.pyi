from typing import Any, Dict, Literal, Optional, Sequence, TypeVar, Union

from cygemm.engine.typing import Autotune, Determinism, DeviceArray, Math, StreamLike
from cygemm.rowmajor.gemm import Trans

_Outs = TypeVar("_Outs", bound=Sequence[DeviceArray])
_Out = TypeVar("_Out", bound=DeviceArray)
Route = Optional[Literal["batched", "grouped", "loop", "streams"]]

ROUTES: Dict[str, str]
DEVICE_OFFSET_ROUTES: Dict[str, str]
_MoeRoute = Optional[Literal["batched", "grouped", "loop", "streams", "lt_grouped", "host_offsets"]]

def last_route() -> Optional[str]: ...
def grouped_gemm(As: Sequence[DeviceArray], Bs: Sequence[DeviceArray], outs: _Outs, *, trans_a: Trans = False,
                 trans_b: Trans = False, alpha: float = 1.0, beta: float = 0.0, math: Math = "tf32",
                 stream: StreamLike = None, route: Route = None, autotune: Autotune = None,
                 determinism: Determinism = None) -> _Outs: ...
def moe_gemm(x: DeviceArray, w: DeviceArray, group_offsets: Union[Sequence[int], DeviceArray], out: _Out, *,
             w_layout: Literal["kn", "nk"] = "kn", math: Math = "tf32", stream: StreamLike = None,
             route: _MoeRoute = None, autotune: Autotune = None, determinism: Determinism = None,
             check_offsets: bool = False) -> _Out: ...
def moe_gemm_wgrad(x: DeviceArray, dy: DeviceArray, group_offsets: Union[Sequence[int], DeviceArray], dw: _Out, *,
                   dw_layout: Literal["kn", "nk"] = "kn", math: Math = "tf32", stream: StreamLike = None,
                   route: _MoeRoute = None, autotune: Autotune = None, determinism: Determinism = None,
                   check_offsets: bool = False) -> _Out: ...
def describe_moe(a: Any, b: Any, group_offsets: Any, out: Any, *, kind: Literal["forward", "wgrad"] = "forward",
                 layout: Literal["kn", "nk"] = "kn", math: Math = "tf32", autotune: Autotune = None,
                 determinism: Determinism = None, capturing: bool = False) -> Dict[str, Any]: ...
def describe_grouped(As: Sequence[Any], Bs: Sequence[Any], outs: Sequence[Any], *, trans_a: Trans = False,
                     trans_b: Trans = False, math: Math = "tf32", autotune: Autotune = None,
                     determinism: Determinism = None) -> Dict[str, Any]: ...
