from typing import Any, Dict, List, Optional, Tuple, TypeVar

from cygemm.typing import Activation, Autotune, Determinism, DeviceArray, Math, StreamLike

_Out = TypeVar("_Out", bound=DeviceArray)

ACTIVATIONS: Dict[str, int]
FORWARD_ROUTES: Dict[str, str]
BACKWARD_ROUTES: Dict[str, str]

def parse_activation(act: str) -> int: ...
def activation_table() -> List[Dict[str, Any]]: ...
def clear_plan_cache() -> None: ...
def layer_shape(A: DeviceArray, B: DeviceArray) -> Tuple[int, int, int, str]: ...
def plan_cache_size() -> int: ...
def forward_into(A: DeviceArray, B: DeviceArray, out: _Out, bias: Optional[DeviceArray] = None, *,
                 with_bias: bool = True, act: Activation = "none", leaky_slope: float = 0.01, save_z: bool = False,
                 z_out: Optional[DeviceArray] = None, lt_workspace: Optional[DeviceArray] = None,
                 math: Math = "tf32", stream: StreamLike = None, autotune: Autotune = None,
                 determinism: Determinism = None) -> _Out: ...
def backward_into(A: DeviceArray, B: DeviceArray, gY: DeviceArray, Z: Optional[DeviceArray], *,
                  with_bias: bool = True, act: Activation = "none", leaky_slope: float = 0.01,
                  gA_out: Optional[DeviceArray] = None, gB_out: Optional[DeviceArray] = None,
                  gBias_out: Optional[DeviceArray] = None, work_dZ: Optional[DeviceArray] = None,
                  lt_workspace: Optional[DeviceArray] = None, math: Math = "tf32", stream: StreamLike = None,
                  accumulate: bool = False, y: Optional[DeviceArray] = None, autotune: Autotune = None,
                  determinism: Determinism = None) -> Tuple[Optional[DeviceArray], Optional[DeviceArray], Optional[DeviceArray]]: ...
