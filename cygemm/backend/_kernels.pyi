from typing import Literal

import cupy

from cygemm.typing import StreamLike

def row_op(kind: Literal["softmax", "log_softmax"], x: cupy.ndarray, out: cupy.ndarray,
           stream: StreamLike) -> cupy.ndarray: ...
def sigmoid(x: cupy.ndarray, out: cupy.ndarray, stream: StreamLike) -> cupy.ndarray: ...
