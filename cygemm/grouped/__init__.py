"""Grouped GEMMs: many GEMMs of different sizes in one call (:func:`grouped_gemm`), and a
mixture-of-experts layer's per-expert GEMMs on one token matrix (:func:`moe_gemm`), by the route
that is fastest for them (``gemm.pyx``; the groups are read and checked by cygemm's engine)."""
from cygemm.grouped.gemm import ROUTES, describe_grouped, grouped_gemm, last_route, moe_gemm
