from typing import Optional, Tuple

from cygemm.typing import DeviceArray, StreamLike

def bias_act(x: DeviceArray, bias: Optional[DeviceArray] = None, *, out: DeviceArray,
             z_out: Optional[DeviceArray] = None, act: str = "none", leaky_slope: float = 0.01,
             stream: StreamLike = None) -> DeviceArray: ...
def act_backward(gy: DeviceArray, z: Optional[DeviceArray], *, dz_out: Optional[DeviceArray] = None,
                 dbias_out: Optional[DeviceArray] = None, act: str = "none", leaky_slope: float = 0.01,
                 z_is_output: bool = False, accumulate: bool = False,
                 stream: StreamLike = None) -> Tuple[Optional[DeviceArray], Optional[DeviceArray]]: ...
