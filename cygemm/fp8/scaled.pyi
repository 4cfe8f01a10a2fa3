from typing import Any, Dict, Literal, Optional, Tuple, TypeVar, Union, overload

from cygemm.typing import Autotune, Determinism, DeviceArray, StreamLike
from cygemm.rowmajor.plan import GemmPlan

Format = Literal["e4m3", "e5m2"]
ScaleMode = Literal["tensor", "rowwise", "1x128", "128x128"]
ScaleModeArg = Union[None, ScaleMode, Tuple[ScaleMode, ScaleMode]]
_In = TypeVar("_In", bound=DeviceArray)     # a result made by the call: a's library
_Out = TypeVar("_Out", bound=DeviceArray)
FP8_MAX: Dict[str, float]
SCALE_MODES: Dict[str, int]
FP8_FORMATS: Dict[str, int]

@overload
def scaled_matmul(a: _In, b: DeviceArray, scale_a: DeviceArray, scale_b: DeviceArray, *,
                  out: None = None,
                  out_dtype: Optional[Literal["bfloat16", "float16", "float32", "e4m3", "e5m2"]] = None,
                  bias: Optional[DeviceArray] = None, act: Literal["none", "relu", "gelu"] = "none",
                  scale_out: Optional[DeviceArray] = None, amax_out: Optional[DeviceArray] = None,
                  format_a: Optional[Format] = None, format_b: Optional[Format] = None,
                  format_out: Optional[Format] = None, fast_accum: bool = False,
                  scale_mode: ScaleModeArg = None,
                  determinism: Determinism = None, stream: StreamLike = None,
                  autotune: Autotune = None) -> _In: ...
@overload
def scaled_matmul(a: DeviceArray, b: DeviceArray, scale_a: DeviceArray, scale_b: DeviceArray, *,
                  out: _Out,
                  out_dtype: Optional[Literal["bfloat16", "float16", "float32", "e4m3", "e5m2"]] = None,
                  bias: Optional[DeviceArray] = None, act: Literal["none", "relu", "gelu"] = "none",
                  scale_out: Optional[DeviceArray] = None, amax_out: Optional[DeviceArray] = None,
                  format_a: Optional[Format] = None, format_b: Optional[Format] = None,
                  format_out: Optional[Format] = None, fast_accum: bool = False,
                  scale_mode: ScaleModeArg = None,
                  determinism: Determinism = None, stream: StreamLike = None,
                  autotune: Autotune = None) -> _Out: ...
def describe_scaled_matmul(a: Any, b: Any, scale_a: Any, scale_b: Any, *, out: Any = None,
                           out_dtype: Optional[str] = None, bias: Any = None, act: str = "none",
                           scale_out: Any = None, amax_out: Any = None, format_a: Optional[Format] = None,
                           format_b: Optional[Format] = None, format_out: Optional[Format] = None,
                           fast_accum: bool = False, scale_mode: ScaleModeArg = None,
                           determinism: Determinism = None, stream: StreamLike = None,
                           autotune: Autotune = None) -> Dict[str, Any]: ...

class ScaledMatmulPlan(GemmPlan):
    def __init__(self, a: DeviceArray, b: DeviceArray, scale_a: DeviceArray, scale_b: DeviceArray, *,
                 out: DeviceArray,
                 out_dtype: Optional[Literal["bfloat16", "float16", "float32", "e4m3", "e5m2"]] = None,
                 bias: Optional[DeviceArray] = None, act: Literal["none", "relu", "gelu"] = "none",
                 scale_out: Optional[DeviceArray] = None, amax_out: Optional[DeviceArray] = None,
                 format_a: Optional[Format] = None, format_b: Optional[Format] = None,
                 format_out: Optional[Format] = None, fast_accum: bool = False,
                 scale_mode: ScaleModeArg = None, determinism: Determinism = None) -> None: ...
    def execute(self, a: Optional[DeviceArray] = None, b: Optional[DeviceArray] = None,
                out: Optional[DeviceArray] = None, *, stream: StreamLike = None) -> DeviceArray: ...

