# GemmPlan (see gemm_plan.pyx): the engine's Plan with its operands and lifecycle. Declared
# here so that a feature's plan (cygemm.fp8.ScaledMatmulPlan) extends it.
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaDataType
from cygemm.bindings.cublaslt cimport cublasLtEpilogue_t
from cygemm.engine.types cimport ColMajorGemm, GemmTypes, Scalars
from cygemm.engine.args cimport CallArgs
from cygemm.engine.epilogues cimport Activation
from cygemm.engine.plans cimport Plan


# What a plan's one call hands cuBLAS(Lt), read from its operands.
ctypedef struct PlannedCall:
    ColMajorGemm g
    cudaDataType dtype          # D's type (the plan's)
    bint typed                  # types counts (FP8)
    GemmTypes types             # storage types and device scales of a mixed-type GEMM
    cublasLtEpilogue_t epi
    const void* bias            # NULL: none
    void* aux                   # GELU_AUX's Z (NULL: none), aux_ld its leading dimension
    int64_t aux_ld


cdef enum PlanKind:
    KIND_GEMM = 0               # plain: cuBLASLt or cublasGemmEx (the latter where cuBLASLt refuses)
    KIND_EPILOGUE = 1           # one cuBLASLt call with bias / activation / Z in its epilogue
    KIND_SCALED = 2             # one cuBLASLt FP8 call (cygemm.fp8.ScaledMatmulPlan)


cdef class GemmPlan(Plan):
    cdef CallArgs args          # the planned operands (their overlaps checked once, when made)
    cdef PlannedCall call
    cdef PlanKind plan_kind
    cdef object alpha, beta     # as given; read into scalars with the operands
    cdef Scalars scalars
    cdef bint trans_a, trans_b, conj_a, conj_b, batched
    cdef const Activation* act
    cdef str math
    cdef int device             # -1 until first resolved
    cdef int determinism        # its Determinism mode (-1: the option's when planned), see plans
    cdef bint planned
    cdef tuple operands         # every buffer, in the order _read takes them (A, B, out first)
    cdef readonly bint closed

    # Read `operands` into c and call, with every check of the kind: the one reader of its
    # construction and of execute's new operands. A subclass reads its own kind.
    cdef int _read(self, CallArgs* c, PlannedCall* call, tuple operands) except -1
    # Everything an argument can cause, once, at construction: _read, then the overlaps.
    cdef int _setup(self, tuple operands) except -1
    # Why plan() found no algorithm (a ValueError's message).
    cdef str _no_algorithm(self)
