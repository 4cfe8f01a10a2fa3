# What the dense layer's forward and backward share (see _layer.pyx).
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasComputeType_t
from cygemm._types cimport MatrixView, ColMajorGemm
from cygemm._context cimport GemmContext
from cygemm._args cimport CallArgs, ArgRole
from cygemm.tuning cimport enqueue_fn

# A (rows, cols) matrix of `dtype` read into c (row_major: unit stride along its last axis).
cdef MatrixView* layer_matrix(CallArgs* c, object x, str name, ArgRole role, int64_t rows, int64_t cols,
                              cudaDataType dtype, bint row_major) except NULL
# An (n,) or (1, n) contiguous vector of `dtype` read into c.
cdef MatrixView* layer_vector(CallArgs* c, object x, str name, ArgRole role, int64_t n,
                              cudaDataType dtype) except NULL
# A layer's A (M, K) and B (K, N) into c's first two slots: 2-D, one dtype, inner dimensions agree.
cdef int layer_operands(CallArgs* c, object A, object B) except -1
# The caller's lt_workspace (wv: its view, checked with the call's other buffers) or the stream's own.
cdef int layer_workspace(CallArgs* c, object ws, MatrixView* wv, void** ptr, size_t* nbytes) except -1
# A plain GEMM through the plans (alpha 1).
cdef int layer_gemm(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                    cublasComputeType_t compute, float beta, int autotune) except -1
# Time a layer's routes: auto, the plans inside each route take the heuristic's choice and the
# rounds stay within the tuning budget; exhaustive, the plans are timed too and every round runs.
cdef int time_routes(GemmContext* ctx, cudaStream_t s, enqueue_fn enqueue, void* arg, const int* choices,
                     int n, float* ms, int autotune) except -1
