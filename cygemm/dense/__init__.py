"""The dense layer, ``act(A @ B + bias)``, forward and backward, with its epilogues fused through
cuBLASLt or run by cygemm's kernels (``layer.pyx``, its routes chosen by cygemm's engine), and
its elementwise passes alone (``elementwise.pyx``, also :mod:`cygemm.elementwise`)."""
from cygemm.dense.layer import (ACTIVATIONS, BACKWARD_ROUTES, FORWARD_ROUTES, activation_table, backward_into,
                                clear_plan_cache, forward_into, layer_shape, parse_activation, plan_cache_size)

__all__ = ["ACTIVATIONS", "BACKWARD_ROUTES", "FORWARD_ROUTES", "activation_table", "backward_into", "backward_reads",
           "clear_plan_cache", "forward_into", "layer_shape", "parse_activation", "plan_cache_size"]

# Activations whose derivative the output fixes (the backward can read y instead of Z), and
# those that take leaky_slope (from y only where the slope is > 0): the epilogue table's.
_FROM_OUTPUT = {row["code"] for row in activation_table() if row["grad_from_output"]}
_SLOPED = {row["code"] for row in activation_table() if row["takes_slope"]}


def backward_reads(act, leaky_slope=0.01):
    """What :func:`cygemm.gemm_ops.backward_into` reads of the forward besides A and B, for an activation.

    Parameters
    ----------
    act : str
        An activation, as :func:`cygemm.gemm_ops.forward_into` takes it.
    leaky_slope : float
        leaky_relu's slope.

    Returns
    -------
    {"z", "y", None}
        "z": the pre-activation (``forward_into``'s ``z_out``, with ``save_z``); "y": the output
        (passed as ``y=``), for activations whose derivative the output fixes; None for "none".

    Raises
    ------
    ValueError
        An unknown activation.
    """
    code = parse_activation(act)
    if code == 0:
        return None
    if code in _FROM_OUTPUT and (code not in _SLOPED or leaky_slope > 0):
        return "y"
    return "z"
