from typing import Literal

from cygemm.typing import DeviceArray, StreamLike

def row_op(kind: Literal["softmax", "log_softmax"], x: DeviceArray, out: DeviceArray,
           stream: StreamLike) -> DeviceArray: ...
def sigmoid(x: DeviceArray, out: DeviceArray, stream: StreamLike) -> DeviceArray: ...
