# Kernel families for the determinism policies (see families.pyx).
from cygemm.engine.types cimport ColMajorGemm, GemmTypes
from cygemm.engine.context cimport GemmContext
from cygemm.engine.launch cimport PlanData
from cygemm.bindings.cudart cimport cudaDataType
from cygemm.bindings.cublas cimport cublasComputeType_t
from cygemm.bindings.cublaslt cimport cublasLtEpilogue_t, cublasLtMatmulAlgo_t

# Fill d.candidates (at most PLAN_CANDIDATES) with the kernels of d's problem that the mode
# allows: split-free kernels of one cuBLASLt algorithm, its family (d.family).
# DETERMINISM_RUN_TO_RUN: the family of the heuristic's first candidate (that kernel alone, family
# -1, where it splits K).
# DETERMINISM_BATCH_INVARIANT: the family chosen for the same problem at FAMILY_ROWS x FAMILY_ROWS,
# so it does not depend on M or N: the family kernels the heuristic offers at this size (else
# at the nearest larger ones), then that reference kernel and its retilings, each where
# cublasLtMatmulAlgoCheck accepts it. d's descriptors must
# exist (make_descriptors); the other arguments are what made them. bucket_choice: the tuned
# record of the problem's size bucket (bucket_key), or None; where it holds a member of this
# problem's family that cublasLtMatmulAlgoCheck accepts, that member alone (nothing to time).
# d.cublas_invariance (batch_invariant only): instead, cuBLASLt's own batch-invariance flag set on
# d's descriptor with the operands' alignment class, and the heuristic's candidates under it.
cdef int family_candidates(GemmContext* ctx, PlanData* d, const ColMajorGemm* g, int determinism,
                           cudaDataType dtype, cublasComputeType_t compute, cublasLtEpilogue_t epi,
                           const void* bias, void* aux, size_t ws_bytes, unsigned al_a, unsigned al_b,
                           unsigned al_c, const GemmTypes* types, object bucket_choice=*) except -1

# The tuning key that batch-invariant problems of one size bucket share: a plan's key (see
# plans._key_tuple) with M and N rounded up to powers of two and no leading dimensions.
cdef tuple bucket_key(tuple key)

# Whether algo is a split-free kernel of cuBLASLt algorithm `family` (FAMILY_CUBLAS: any
# algorithm, checked against a descriptor that carries cuBLASLt's batch-invariance flag).
cdef bint in_family(const cublasLtMatmulAlgo_t* algo, int family) noexcept nogil

# The family of a plan kept batch-invariant by cuBLASLt's own flag (batch_invariance="cublas").
cdef enum:
    FAMILY_CUBLAS = -2
