from typing import Optional

from cygemm.typing import DeviceArray, StreamLike

THREADS: int
MAX_BLOCKS: int

def grid_for(n: int, threads: int = ...) -> int: ...
def softmax_xent(logits: DeviceArray, labels: DeviceArray, grad: DeviceArray, grad_scale: float,
                 loss_scale: float, partial: DeviceArray, done: DeviceArray, loss: DeviceArray,
                 bad: DeviceArray, blocks: int, stream: StreamLike,
                 col_partial: Optional[DeviceArray] = None,
                 bias_grad: Optional[DeviceArray] = None) -> DeviceArray: ...
def mse(y: DeviceArray, target: DeviceArray, grad: DeviceArray, grad_scale: float, loss_scale: float,
        partial: DeviceArray, done: DeviceArray, loss: DeviceArray, blocks: int,
        stream: StreamLike) -> DeviceArray: ...
def sgd(params: DeviceArray, grads: DeviceArray, momentum_buffer: DeviceArray, lr: DeviceArray,
        steps: DeviceArray, done: DeviceArray, momentum: float, dampening: float, weight_decay: float,
        nesterov: bool, schedule: int, warmup: int, total: int, final_factor: float, blocks: int,
        stream: StreamLike, params_bf16: Optional[DeviceArray] = None) -> DeviceArray: ...
def adam(params: DeviceArray, grads: DeviceArray, exp_avg: DeviceArray, exp_avg_sq: DeviceArray,
         lr: DeviceArray, steps: DeviceArray, done: DeviceArray, beta1: float, beta2: float, eps: float,
         weight_decay: float, decoupled: bool, schedule: int, warmup: int, total: int, final_factor: float,
         blocks: int, stream: StreamLike, params_bf16: Optional[DeviceArray] = None) -> DeviceArray: ...
def f32_to_bf16(x: DeviceArray, y: DeviceArray, stream: StreamLike) -> DeviceArray: ...
def bf16_to_f32(x: DeviceArray, y: DeviceArray, stream: StreamLike) -> DeviceArray: ...
