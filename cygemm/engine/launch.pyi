# Enqueueing one GEMM has no Python API: the plans cimport it (see launch.pxd).
