from typing import Literal, Optional, Tuple

from cygemm.typing import DeviceArray, StreamLike

def quantize_scaled(x: DeviceArray, mode: Literal["tensor", "rowwise", "1x128", "128x128"], *,
                    format: Literal["e4m3", "e5m2"] = "e4m3", transpose: bool = False, pow2: bool = False,
                    out: Optional[DeviceArray] = None, scale: Optional[DeviceArray] = None,
                    stream: StreamLike = None) -> Tuple[DeviceArray, DeviceArray]: ...
def empty_scale(mode: Literal["tensor", "rowwise", "1x128", "128x128"], rows: int, cols: int, *,
                stream: StreamLike = None) -> DeviceArray: ...
