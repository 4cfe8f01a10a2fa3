# cuBLASLt descriptors of one plan: the matmul descriptor, the matrix layouts and the
# heuristic's preference, made from a column-major problem and freed with the plan.
from libc.stdint cimport int64_t, uint32_t
from cygemm.bindings.cudart cimport cudaDataType
from cygemm.bindings.cublas cimport cublasComputeType_t
from cygemm.bindings.cublaslt cimport cublasLtEpilogue_t, cublasLtMatmulAlgo_t
from cygemm.engine.types cimport ColMajorGemm, GemmTypes
from cygemm.engine.launch cimport PlanData


# Fill d's desc, la/lb/lc (ld where D's type differs from C's: FP8 outputs) and pref for
# problem g over `batch` matrices (1: not batched): op flags, epilogue with its bias/aux
# pointers, FP8 storage types, scales and fast accumulation (types; NULL for one dtype), the
# workspace limit and the pointers' alignments (al_a, al_b, al_c). Raises on failure (what was
# made is freed by free_descriptors, which the plan's close calls).
cdef int make_descriptors(PlanData* d, const ColMajorGemm* g, int64_t batch, cudaDataType dtype,
                          cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                          int64_t aux_ld, size_t ws_bytes, uint32_t al_a, uint32_t al_b, uint32_t al_c,
                          const GemmTypes* types) except -1

# Destroy what make_descriptors made (NULL handles are skipped) and clear the handles.
cdef void free_descriptors(PlanData* d) noexcept nogil

# A cuBLASLt algorithm as the tuning table keeps it (hex of its bytes), and back: False where the
# text is not one (not a string, not hex, another length).
cdef str algo_hex(const cublasLtMatmulAlgo_t* algo)
cdef bint algo_from_hex(object text, cublasLtMatmulAlgo_t* algo) except -1
