# The epilogue table (see epilogues.pyx).
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
