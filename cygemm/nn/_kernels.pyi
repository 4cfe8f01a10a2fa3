from typing import Optional

import cupy

from cygemm.typing import StreamLike

THREADS: int
MAX_BLOCKS: int

def grid_for(n: int, threads: int = ...) -> int: ...
def softmax_xent(logits: cupy.ndarray, labels: cupy.ndarray, grad: cupy.ndarray, grad_scale: float,
                 loss_scale: float, partial: cupy.ndarray, done: cupy.ndarray, loss: cupy.ndarray,
                 bad: cupy.ndarray, blocks: int, stream: StreamLike,
                 col_partial: Optional[cupy.ndarray] = None,
                 bias_grad: Optional[cupy.ndarray] = None) -> cupy.ndarray: ...
def mse(y: cupy.ndarray, target: cupy.ndarray, grad: cupy.ndarray, grad_scale: float, loss_scale: float,
        partial: cupy.ndarray, done: cupy.ndarray, loss: cupy.ndarray, blocks: int,
        stream: StreamLike) -> cupy.ndarray: ...
def sgd(params: cupy.ndarray, grads: cupy.ndarray, momentum_buffer: cupy.ndarray, lr: cupy.ndarray,
        steps: cupy.ndarray, done: cupy.ndarray, momentum: float, dampening: float, weight_decay: float,
        nesterov: bool, schedule: int, warmup: int, total: int, final_factor: float, blocks: int,
        stream: StreamLike, params_bf16: Optional[cupy.ndarray] = None) -> cupy.ndarray: ...
def adam(params: cupy.ndarray, grads: cupy.ndarray, exp_avg: cupy.ndarray, exp_avg_sq: cupy.ndarray,
         lr: cupy.ndarray, steps: cupy.ndarray, done: cupy.ndarray, beta1: float, beta2: float, eps: float,
         weight_decay: float, decoupled: bool, schedule: int, warmup: int, total: int, final_factor: float,
         blocks: int, stream: StreamLike, params_bf16: Optional[cupy.ndarray] = None) -> cupy.ndarray: ...
def f32_to_bf16(x: cupy.ndarray, y: cupy.ndarray, stream: StreamLike) -> cupy.ndarray: ...
def bf16_to_f32(x: cupy.ndarray, y: cupy.ndarray, stream: StreamLike) -> cupy.ndarray: ...
