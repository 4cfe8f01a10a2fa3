"""cygemm's engine: everything between the public entry points and cuBLAS, private.

Only what several features share, lowest first (setup.py's MODULES is the build order; each
module cimports only those before it): dtypes (the dtype table), errors, the cuBLASLt features
of the loaded library, settings, the row-major mapping, arrays (the one reader, describe's
layouts too), streams, the release queue, the context (handles and workspaces), view overlaps,
allocation, args (the one argument path), tuning (timing and the table of what won), the
chooser (every route table and the one chooser), the K-tail guard, launching, cuBLASLt
descriptors, kernel families, candidates, plans, the small-matrix kernel's route, execute (one
plan executor, the int8 GEMM), operands, epilogues; promises checked on the loaded cuBLAS;
graph (public as cygemm.graph). Each feature (rowmajor, dense, fp8, grouped) keeps its private
half in its own package. Nothing here is a public import path: the features above import it.
"""
