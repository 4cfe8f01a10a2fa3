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
# run_gemm's cuBLAS part (cublasGemmEx or the plan), also the small-matrix table's "cublas" route.
cdef int run_cublas(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                    cublasComputeType_t compute, const Scalars* sc, Policy policy) except -1 nogil


# -------------------- int8 (merged into execute)
# int8 x int8 GEMMs through cuBLASLt's integer tensor cores (see execute.pyx, its int8 part): the layout rules
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
