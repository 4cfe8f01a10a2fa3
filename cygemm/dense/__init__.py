"""The dense layer, ``act(A @ B + bias)``, forward and backward, with its epilogues fused through
cuBLASLt or run by cygemm's kernels (``layer.pyx``, its routes chosen by cygemm's engine), and
its elementwise passes alone (``elementwise.pyx``, also :mod:`cygemm.elementwise`)."""
from cygemm.dense.layer import (ACTIVATIONS, BACKWARD_ROUTES, FORWARD_ROUTES, activation_table, backward_into,
                                clear_plan_cache, forward_into, layer_shape, parse_activation, plan_cache_size)

__all__ = ["ACTIVATIONS", "BACKWARD_ROUTES", "FORWARD_ROUTES", "activation_table", "backward_into", "clear_plan_cache",
           "forward_into", "layer_shape", "parse_activation", "plan_cache_size"]
