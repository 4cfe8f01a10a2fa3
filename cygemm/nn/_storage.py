"""Where a model's parameters live: flat buffers shared by all its layers, so that an optimizer
updates a whole model in one launch, and the precision they are trained in.

``"fp32"``: float32 parameters and gradients, the GEMMs read the parameters. ``"bf16-mixed"``
(as torch's bfloat16 autocast): float32 master parameters, which the optimizer updates, and a
bfloat16 copy of them, which the GEMMs read and the optimizer rewrites in the same launch;
activations and gradients are bfloat16, the GEMMs accumulate in float32. bfloat16 keeps
float32's exponent range, so gradients do not underflow as float16's do: no loss scaling is
needed (torch's bfloat16 autocast uses none either; its GradScaler is for float16).
``"fp8-tensor"``, ``"fp8-rowwise"``, ``"fp8-block"``: stored as bf16-mixed, the GEMMs in FP8
with those scales (cygemm/nn/_fp8.py).
"""
from typing import Literal

import cupy as cp
import ml_dtypes
import numpy as np

from cygemm.nn import _kernels

BF16 = np.dtype(ml_dtypes.bfloat16)
PRECISIONS = ("fp32", "bf16-mixed", "fp8-tensor", "fp8-rowwise", "fp8-block")
# The precisions as type checkers read them (they cannot read PRECISIONS; a test holds the two
# equal), with the aliases parse_precision takes.
Precision = Literal["fp32", "bf16-mixed", "fp8-tensor", "fp8-rowwise", "fp8-block", "bf16", "float32"]


def parse_precision(precision):
    """The canonical name of `precision` ("bf16" is accepted for "bf16-mixed")."""
    name = {"bf16": "bf16-mixed", "float32": "fp32"}.get(precision, precision)
    if name not in PRECISIONS:
        raise ValueError(f"precision: expected one of {', '.join(repr(p) for p in PRECISIONS)}, got {precision!r}")
    return name


def compute_dtype(precision):
    """The dtype the GEMMs, activations and gradients use under `precision`."""
    return np.dtype(np.float32) if precision == "fp32" else BF16


class FlatStorage:
    """The parameters and gradients of one or more layers.

    Attributes
    ----------
    params : cupy.ndarray
        float32 (the master parameters under bf16-mixed).
    grads : cupy.ndarray
        The gradients, in the compute dtype (what the GEMMs write).
    params_bf16 : cupy.ndarray or None
        Under bf16-mixed, the bfloat16 copy of ``params`` the GEMMs read.
    """

    def __init__(self, size, precision="fp32"):
        self.precision = precision
        self.params = cp.empty(size, np.float32)
        self.grads = cp.empty(size, compute_dtype(precision))
        self.grads.data.memset_async(0, self.grads.nbytes)     # zero in either dtype (no kernel)
        self.params_bf16 = None if precision == "fp32" else cp.empty(size, BF16)

    @property
    def compute_params(self):
        """What the GEMMs read: ``params_bf16`` under bf16-mixed, else ``params``."""
        return self.params if self.params_bf16 is None else self.params_bf16

    def refresh(self, stream):
        """Rewrite the bfloat16 copy from the master parameters (one launch on `stream`;
        nothing under fp32). Needed after any write to ``params`` but the optimizer's."""
        if self.params_bf16 is not None:
            _kernels.f32_to_bf16(self.params, self.params_bf16, stream)
