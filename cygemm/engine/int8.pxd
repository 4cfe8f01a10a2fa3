# int8 x int8 GEMMs through cuBLASLt's integer tensor cores (see int8.pyx): the layout rules
# checked before anything runs, and the one way such a GEMM runs.
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.engine.types cimport MatrixView, ColMajorGemm, Scalars
from cygemm.engine.context cimport GemmContext
from cygemm.engine.settings cimport Policy

# Raise (naming the argument, the rule and the fix) where cuBLASLt has no int8 kernel for this
# call: a, b the user's operands as read (before trans), out the result's view, trans_a/trans_b
# as given, g the mapped call (a single row or column is turned to be read along K). Also checks
# the scalars against the output type.
cdef int check_int8(const MatrixView* a, const MatrixView* b, const MatrixView* out, bint trans_a,
                    bint trans_b, ColMajorGemm* g, const Scalars* sc) except -1
# Run one checked int8 GEMM (out: the result's view, for messages; out_type: CUDA_R_32I, or
# CUDA_R_8I with a float alpha and beta) under the call's policy.
cdef int run_int8(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, const MatrixView* out,
                  cudaDataType out_type, const Scalars* sc, Policy policy) except -1
