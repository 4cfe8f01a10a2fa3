from typing import Any, Dict, Literal, Optional, Sequence, TypeVar, Union

from cygemm.typing import DeviceArray, GroupOffsets, StreamLike

_Out = TypeVar("_Out", bound=DeviceArray)
_Fmt = Optional[Literal["e4m3", "e5m2"]]

def moe_scaled_gemm(x: DeviceArray, w: DeviceArray, scale_x: DeviceArray, scale_w: DeviceArray,
                    group_offsets: GroupOffsets, out: _Out, *, format_x: _Fmt = None,
                    format_w: _Fmt = None, fast_accum: bool = False, workspace: Optional[DeviceArray] = None,
                    stream: StreamLike = None,
                    route: Optional[Literal["loop", "lt_grouped", "host_offsets"]] = None,
                    check_offsets: bool = False) -> _Out: ...
def describe_moe_scaled(x: Any, w: Any, scale_x: Any, scale_w: Any, group_offsets: Any, out: Any, *,
                        format_x: _Fmt = None, format_w: _Fmt = None, fast_accum: bool = False,
                        workspace: Optional[DeviceArray] = None, stream: StreamLike = None,
                        route: Optional[Literal["loop", "lt_grouped", "host_offsets"]] = None,
                        check_offsets: bool = False, capturing: bool = False) -> Dict[str, Any]: ...
