"""FP8 GEMMs (Hopper and later) and the conversions they need.

:func:`scaled_matmul` computes ``out = act(scale_a * scale_b * (a @ b) + bias)`` with ``a`` and
``b`` in FP8 (E4M3 or E5M2) through cuBLASLt, in the plan layer like every other GEMM (one plan
per problem, timed once when large). Scales are device float32 scalars, read when the GEMM runs,
so a captured graph replays with whatever scales the buffers hold then (delayed scaling). An
FP8 output has its own quantizing scale, and the output's amax can be written on the way.

Hopper's FP8 kernels read both operands K-contiguous: ``a`` row-major (M, K) and ``b`` (K, N)
column-major, i.e. ``b = w.T`` for a C-contiguous weight ``w`` of shape (N, K), the layout of a
linear layer's weight and of ``torch._scaled_mm``. Any other layout is refused (nothing runs).

:func:`quantize` and :func:`dequantize` convert between FP8 and float32/float16/bfloat16 with
cygemm's kernels (16-byte accesses, grid sized to the GPU, allocation-free, capturable), as
:func:`amax` does; :func:`quantize_scaled` quantizes with per-row, 1 x 128 or 128 x 128 scales in
the layout scaled_matmul reads (:func:`empty_scale` allocates their buffers). The GEMMs are in ``cygemm/fp8/scaled.pyx``, the conversions in
``convert.pyx`` and the finer scales in ``scales.pyx``.

CuPy has no FP8 dtype: FP8 data live in ``uint8`` arrays, and the ``format_*`` arguments say
which format the bytes hold. torch's ``float8_e4m3fn`` and ``float8_e5m2`` tensors carry theirs.
"""
from cygemm.fp8.scaled import (FP8_FORMATS, FP8_MAX, SCALE_MODES, ScaledMatmulPlan, describe_scaled_matmul,
                               scaled_matmul)
from cygemm.fp8.convert import amax, dequantize, quantize
from cygemm.fp8.scales import empty_scale, quantize_scaled

__all__ = ["FP8_FORMATS", "FP8_MAX", "SCALE_MODES", "ScaledMatmulPlan", "describe_scaled_matmul", "scaled_matmul",
           "amax", "dequantize", "quantize", "empty_scale", "quantize_scaled"]
