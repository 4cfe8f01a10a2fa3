"""The tests' references, written from definitions in float64 NumPy and independent of cygemm's
code: activations and their derivatives (``refs.activations``), FP8 codes (``refs.fp8``), a model
of column-major cuBLAS GEMMs on flat memory (``refs.cublas``), row reductions (``refs.rows``)
and mixture-of-experts GEMMs (``refs.moe``). Importable as ``refs`` from any test (tests/ is on sys.path: conftest.py's
folder)."""
