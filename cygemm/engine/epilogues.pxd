# The epilogue table (see epilogues.pyx).
from cygemm.bindings.cudart cimport cudaDataType, CUDA_R_16F, CUDA_R_16BF
from cygemm.bindings.cublaslt cimport cublasLtEpilogue_t
from cygemm.kernels.elementwise cimport cygemm_act_t

# One row per activation: its kernel code, the cuBLASLt epilogues that apply it in the GEMM
# (NO_EPILOGUE: none), the AUX form that also writes Z with its rules, and whether its
# derivative is fixed by its output (then the backward may take y instead of Z).
ctypedef struct Activation:
    const char* name
    cygemm_act_t code
    int epilogue            # bias and activation in one cuBLASLt call, Z not saved
    int epilogue_bias
    int aux_epilogue        # ... writing Z as its aux output too
    int aux_epilogue_bias
    int aux_ld_multiple     # cuBLASLt's rule for the aux's leading dimension (elements)
    int aux_alignment       # ... and for its pointer (bytes)
    bint grad_from_output

cdef enum:
    N_ACTIVATIONS = 8
    NO_EPILOGUE = -1

# The row of an activation name (ValueError listing the valid names).
cdef const Activation* activation_row(object act) except NULL
# leaky_relu's slope, checked (ValueError unless finite and >= 0).
cdef float leaky_slope_of(object leaky_slope) except? -1
# The row of a kernel code (CYGEMM_ACT_*): NULL where none (the C API's int act), or
# ValueError naming `arg`.
cdef const Activation* activation_of_code(int code) noexcept nogil
cdef const Activation* activation_by_code(int code, str arg) except NULL
# The cuBLASLt epilogue of an activation (NO_EPILOGUE: none), without the GIL.
cdef int lt_epilogue_of(const Activation* act, bint has_bias, bint writes_z) noexcept nogil
# The one cuBLASLt epilogue of an activation, with or without bias, writing Z (aux) or not;
# ValueError naming `act` (or `z_out`) when none does, listing what does. `who`: whose rule
# it is, for the message ("cuBLASLt's epilogues", "FP8 GEMMs").
cdef cublasLtEpilogue_t lt_epilogue(const Activation* act, bint has_bias, bint writes_z, str who) except *
cdef bint has_lt_epilogue(const Activation* act, bint writes_z) noexcept nogil
# The message of an activation (code) no cuBLASLt epilogue applies, for `who`.
cdef str no_lt_epilogue(int code, str who)
# The row of `act` for a call that is one cuBLASLt call (GemmPlan, FP8): an unknown name gets
# the message listing what cuBLASLt's epilogues apply (not every activation), for `who`.
cdef const Activation* epilogue_activation(object act, str who) except NULL


