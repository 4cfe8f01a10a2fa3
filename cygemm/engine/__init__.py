"""cygemm's engine: everything between the public entry points and cuBLAS, private.

Lowest first (setup.py's MODULES is the build order; each module cimports only those before
it): errors, settings, streams, the release queue, the context (handles and workspaces), the
row-major mapping, array reading, view overlaps, allocation, the one argument path, timing, the
K-tail guard, launching, cuBLASLt descriptors, kernel families, candidates, int8, matmul's batch
layout, the dense layer's routes, FP8's arguments and the groups of a grouped call; promises
checked on the loaded cuBLAS. Nothing here is a public import path: the features above import it.
"""
