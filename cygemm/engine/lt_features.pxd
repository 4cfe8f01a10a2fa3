# What the loaded cuBLASLt offers beyond cuBLAS 13.1 (cygemm/bindings/cublaslt.pxd, its last
# section): the functions it exports, resolved once from the library itself, and whether it
# takes the batch-invariance attribute. See lt_features.pyx.
from cygemm.bindings.cublaslt cimport (cublasLtGroupedMatrixLayoutCreate_fn, cublasLtMatmulAlgoGetHeuristicForStream_fn,
                                       cublasLtMatmulAlgoCheckForStream_fn)

ctypedef struct LtExtras:
    size_t version                                          # cublasLtGetVersion()
    cublasLtGroupedMatrixLayoutCreate_fn grouped_layout_create      # NULL: not exported
    cublasLtMatmulAlgoGetHeuristicForStream_fn heuristic_for_stream
    cublasLtMatmulAlgoCheckForStream_fn check_for_stream
    bint batch_invariance_flags     # CUBLASLT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS accepted

# The loaded library's extras (resolved on first use; the test hook's stand-in while it is on).
cdef const LtExtras* lt_extras() except NULL
# Whether cuBLASLt's grouped matmul may run on `device` (the version, the GPU, the symbol:
# feature_gate("grouped_gemm") says why not).
cdef bint grouped_gemm_usable(int device) except -1
