from typing import Literal, Optional

from cygemm.typing import DeviceArray, StreamLike

Format = Literal["e4m3", "e5m2"]

def quantize(x: DeviceArray, scale: DeviceArray, *, out: Optional[DeviceArray] = None, format: Format = "e4m3",
             amax: Optional[DeviceArray] = None, stream: StreamLike = None) -> DeviceArray: ...
def dequantize(q: DeviceArray, scale_inv: DeviceArray, *, out: Optional[DeviceArray] = None,
               dtype: Literal["float32", "float16", "bfloat16"] = "float32", format: Optional[Format] = None,
               stream: StreamLike = None) -> DeviceArray: ...
def amax(x: DeviceArray, out: DeviceArray, *, stream: StreamLike = None) -> DeviceArray: ...
