# The one execute: running a plan and what happens when cuBLASLt refuses it (see execute.pyx).
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasComputeType_t
from cygemm.engine.types cimport ColMajorGemm, Scalars
from cygemm.engine.context cimport GemmContext
from cygemm.engine.plans cimport Plan
from cygemm.engine.settings cimport Policy

# What a call does when cuBLASLt refuses its plan (nothing was enqueued).
cdef enum Refusal:
    REFUSAL_GEMMEX = 0      # a plain GEMM: cublasGemmEx runs it (batch_invariant: CygemmError)
    REFUSAL_REPORT = 1      # return 1: the caller has another route
    REFUSAL_RAISE = 2       # the call is this one cuBLASLt call: CublasError, ValueError or CaptureError

# The plan executor: run `plan` (epilogue pointers bias/aux, NULL where none). Returns 0 when it
# ran; 1 when it was refused with nothing enqueued: unusable, an algorithm that failed a
# capture before (while capturing), or cuBLASLt refusing it now (then, inside a capture, the
# plan is marked capture_ok = False once the capture is found alive, else usable = False;
# refused_status receives cuBLASLt's status). A failed cublasGemmEx route raises.
cdef int execute_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                      const void* bias, void* aux, void* ws, size_t ws_bytes, const Scalars* sc,
                      int* refused_status=*) except -1

# Run `plan` with the call's refusal policy. Returns 0 when it ran, 1 (REFUSAL_REPORT only) when
# it was refused. REFUSAL_RAISE names `what` ("FP8", "int8", "GemmPlan") in what it raises.
cdef int run_plan(Plan plan, GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g,
                  const void* bias, void* aux, void* ws, size_t ws_bytes, const Scalars* sc,
                  Refusal refusal, str what=*) except -1

# Before a one-call plan runs (REFUSAL_RAISE): 1 when cuBLASLt has no kernel for it (the caller
# raises ValueError saying why, in its own terms), ValueError naming `label` ("FP8 GEMM") when its
# algorithm refused a capture before and the stream is capturing, else 0.
cdef int check_runnable(Plan plan, cudaStream_t stream, str label) except -1

# A plain GEMM through the plans: small problems (and 64-bit sizes) go straight to
# cublasGemmEx, except under the batch-invariant mode; large ones run their plan, decided
# once. policy: the call's (settings.call_policy; default_policy for the C entry points).
# Raises on failure.
cdef int run_gemm(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                  cublasComputeType_t compute, const Scalars* sc,
                  Policy policy) except -1 nogil
