"""Deprecated: the dense layer's old name. Import :mod:`cygemm.dense` (or use
:mod:`cygemm.gemm_ops`); this alias re-exports its names and will be removed."""
import warnings

from cygemm.dense import (ACTIVATIONS, BACKWARD_ROUTES, FORWARD_ROUTES, activation_table, backward_into,
                          clear_plan_cache, forward_into, layer_shape, parse_activation, plan_cache_size)

__all__ = ["ACTIVATIONS", "BACKWARD_ROUTES", "FORWARD_ROUTES", "activation_table", "backward_into",
           "clear_plan_cache", "forward_into", "layer_shape", "parse_activation", "plan_cache_size"]

warnings.warn("cygemm.fused is deprecated: import cygemm.dense", DeprecationWarning, stacklevel=2)
