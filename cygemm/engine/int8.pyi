# The int8 GEMM has no Python API of its own: cygemm.int_mm and cygemm.gemm reach it (see int8.pxd).
