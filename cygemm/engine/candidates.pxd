# Timing a plan's candidates (see candidates.pyx).
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaStream_t
from cygemm.engine.types cimport ColMajorGemm
from cygemm.engine.context cimport GemmContext
from cygemm.engine.launch cimport PlanData

# Time d's candidates (and cublasGemmEx when d.gemmex_ok) on g's operands; on success d takes
# the fastest (route, algorithm, tuned, tuned_ms). c_is_input: C is read (beta != 0), so the
# timed runs write a scratch output. autotune: AUTOTUNE_AUTO or AUTOTUNE_EXHAUSTIVE.
cdef int tune_candidates(GemmContext* ctx, cudaStream_t stream, PlanData* d, const ColMajorGemm* g,
                         const void* bias, void* aux, void* ws, size_t ws_bytes, int autotune,
                         bint c_is_input) except -1

# Use a tuning table record (route, algorithm) if it still fits d's problem (cublasLtMatmulAlgoCheck;
# under a determinism policy, a kernel of d's family only): True when d took it.
cdef bint apply_record(GemmContext* ctx, PlanData* d, dict record, size_t ws_bytes, int64_t k)
# d's choice as a tuning table record.
cdef dict record_of(PlanData* d)

# A batch-invariant plan's record for its size bucket: record_of's, and the fastest members'
# algorithms ("members", in the order of their first timed round).
cdef dict bucket_record_of(PlanData* d)
