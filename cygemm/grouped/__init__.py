"""Grouped GEMMs: many GEMMs of different sizes in one call (:func:`grouped_gemm`), and a
mixture-of-experts layer's per-expert GEMMs on one token matrix (:func:`moe_gemm`, its weight
gradient :func:`moe_gemm_wgrad`), with the experts' offsets on the host or on the GPU, by the
route that is fastest for them (``gemm.pyx``; the groups are read and checked by cygemm's engine;
``lt_grouped.pyx``: cuBLASLt's grouped matmul for offsets on the GPU)."""
from cygemm.grouped.gemm import (DEVICE_OFFSET_ROUTES, ROUTES, describe_grouped, describe_moe, grouped_gemm,
                                 last_route, moe_gemm, moe_gemm_wgrad)
