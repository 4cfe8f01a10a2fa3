# The GEMM reader (see operands.pyx).
from cygemm.bindings.cudart cimport cudaDataType
from cygemm.engine.types cimport ColMajorGemm, Scalars
from cygemm.engine.args cimport CallArgs

# The argument path of gemm, gemm_strided_batched and GemmPlan: operands read into c (A, B,
# out), alpha and beta into sc (complex values for complex operands only), mapped to cuBLAS;
# out=None gives a row-major result whose pointer is NULL. ints: int8 operands too (into an
# int32 or int8 out, checked against cuBLASLt's int8 rules).
cdef int read_gemm(CallArgs* c, object A, object B, object out, bint trans_a, bint trans_b,
                   bint batched, object alpha, object beta, Scalars* sc, ColMajorGemm* g,
                   bint conj_a=*, bint conj_b=*, bint ints=*) except -1
# trans_a / trans_b as the entry points take them (False/True, "N", "T", "H"): transposed, conjugated.
cdef int parse_trans(object value, str name, bint* trans, bint* conj) except -1
# alpha and beta into sc; complex values only for complex operands.
cdef int read_scalars(object alpha, object beta, cudaDataType dtype, Scalars* sc) except -1
