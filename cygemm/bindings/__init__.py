"""The C headers of the CUDA runtime, cuBLAS and cuBLASLt as Cython sees them (``.pxd`` only,
nogil): ``cimport cygemm.bindings.cudart``, ``cygemm.bindings.cublas``, ``cygemm.bindings.cublaslt``."""
