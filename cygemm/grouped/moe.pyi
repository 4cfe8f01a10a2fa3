from typing import Any, Dict, Literal, Optional, Sequence, TypeVar, Union

from cygemm.typing import GroupOffsets, Autotune, Determinism, DeviceArray, Math, StreamLike

_Out = TypeVar("_Out", bound=DeviceArray)
_MoeRoute = Optional[Literal["batched", "grouped", "loop", "streams", "lt_grouped", "host_offsets"]]

DEVICE_OFFSET_ROUTES: Dict[str, str]

def moe_gemm(x: DeviceArray, w: DeviceArray, group_offsets: GroupOffsets, out: _Out, *,
             w_layout: Literal["kn", "nk"] = "kn", math: Math = "tf32", stream: StreamLike = None,
             route: _MoeRoute = None, autotune: Autotune = None, determinism: Determinism = None,
             check_offsets: bool = False) -> _Out: ...
def moe_gemm_wgrad(x: DeviceArray, dy: DeviceArray, group_offsets: GroupOffsets, dw: _Out, *,
                   dw_layout: Literal["kn", "nk"] = "kn", math: Math = "tf32", stream: StreamLike = None,
                   route: _MoeRoute = None, autotune: Autotune = None, determinism: Determinism = None,
                   check_offsets: bool = False) -> _Out: ...
def describe_moe(a: Any, b: Any, group_offsets: Any, out: Any, *, kind: Literal["forward", "wgrad"] = "forward",
                 w_layout: Literal["kn", "nk"] = "kn", dw_layout: Literal["kn", "nk"] = "kn", math: Math = "tf32",
                 stream: StreamLike = None, route: _MoeRoute = None, autotune: Autotune = None,
                 determinism: Determinism = None, check_offsets: bool = False,
                 capturing: bool = False) -> Dict[str, Any]: ...
