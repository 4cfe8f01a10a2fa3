"""Grouped GEMMs: many GEMMs of different sizes in one call (:func:`grouped_gemm`), and a
mixture-of-experts layer's per-expert GEMMs on one token matrix (:func:`moe_gemm`, its weight
gradient :func:`moe_gemm_wgrad`), with the experts' offsets on the host or on the GPU, by the
route that is fastest for them (``gemm.pyx``: the grouped engine; ``moe.pyx``: the
mixture-of-experts calls, ``moe_fp8.pyx`` in FP8; ``device_offsets.pyx``: the route of offsets on the
GPU; ``lt_grouped.pyx``: cuBLASLt's grouped matmul)."""
from cygemm.grouped.gemm import ROUTES, describe_grouped, grouped_gemm, last_route
from cygemm.grouped.moe import DEVICE_OFFSET_ROUTES, describe_moe, moe_gemm, moe_gemm_wgrad
from cygemm.grouped.moe_fp8 import describe_moe_scaled, moe_scaled_gemm
from cygemm.grouped import promise_checks as _promise_checks  # noqa: F401 (registers them)

__all__ = ["ROUTES", "describe_grouped", "grouped_gemm", "last_route", "DEVICE_OFFSET_ROUTES", "describe_moe", "moe_gemm",
           "moe_gemm_wgrad", "describe_moe_scaled", "moe_scaled_gemm"]
