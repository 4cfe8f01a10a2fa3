# cython: language_level=3
"""The epilogue table: for each activation, the cuBLASLt epilogues that apply it inside the
GEMM, the rules of the AUX form that also writes Z, and whether its derivative is fixed by its
output. The dense layer (cygemm.dense) chooses its routes from these rows; cygemm's kernels
(kernels/elementwise.cu) apply what no epilogue does.
"""
from cygemm.bindings.cublaslt cimport *
from cygemm.kernels.elementwise cimport *


# One row per activation: its kernel code, the cuBLASLt epilogues that apply it in the GEMM
# (-1: none), the AUX form that also writes Z with its rules (cuBLASLt: GELU_AUX's aux is Z
# itself when its leading dimension is a multiple of 8 and it is 16-byte aligned), and
# whether its derivative is fixed by its output (then the backward may take y instead of Z).
# A new activation is one row here plus its device function in kernels/elementwise.cu.

cdef Activation _ACTS[8]
_ACTS[0] = Activation(b"none", CYGEMM_ACT_NONE, CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,
                      NO_EPILOGUE, NO_EPILOGUE, 0, 0, True)
_ACTS[1] = Activation(b"relu", CYGEMM_ACT_RELU, CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_RELU_BIAS,
                      NO_EPILOGUE, NO_EPILOGUE, 0, 0, True)
_ACTS[2] = Activation(b"leaky_relu", CYGEMM_ACT_LEAKY_RELU, NO_EPILOGUE, NO_EPILOGUE,
                      NO_EPILOGUE, NO_EPILOGUE, 0, 0, True)       # from its output when slope > 0
_ACTS[3] = Activation(b"gelu", CYGEMM_ACT_GELU, CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_BIAS,
                      CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 8, 16, False)
_ACTS[4] = Activation(b"gelu_erf", CYGEMM_ACT_GELU_ERF, NO_EPILOGUE, NO_EPILOGUE,
                      NO_EPILOGUE, NO_EPILOGUE, 0, 0, False)
_ACTS[5] = Activation(b"sigmoid", CYGEMM_ACT_SIGMOID, NO_EPILOGUE, NO_EPILOGUE,
                      NO_EPILOGUE, NO_EPILOGUE, 0, 0, True)
_ACTS[6] = Activation(b"tanh", CYGEMM_ACT_TANH, NO_EPILOGUE, NO_EPILOGUE,
                      NO_EPILOGUE, NO_EPILOGUE, 0, 0, True)
_ACTS[7] = Activation(b"silu", CYGEMM_ACT_SILU, NO_EPILOGUE, NO_EPILOGUE,
                      NO_EPILOGUE, NO_EPILOGUE, 0, 0, False)

_ALIASES = {"identity": "none"}
ACTIVATIONS = {_ACTS[i].name.decode(): <int>_ACTS[i].code for i in range(N_ACTIVATIONS)}
ACTIVATIONS.update({alias: ACTIVATIONS[name] for alias, name in _ALIASES.items()})


cdef const Activation* activation_row(object act) except NULL:
    cdef int code = parse_activation(act)
    cdef int i
    for i in range(N_ACTIVATIONS):
        if <int>_ACTS[i].code == code:
            return &_ACTS[i]
    raise AssertionError(f"act {act!r}: no row in the epilogue table")


def parse_activation(act):
    """Activation name (case-insensitive) -> kernel code; ValueError lists the valid names."""
    try:
        return ACTIVATIONS[act.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"act: expected one of {sorted(ACTIVATIONS)}, got {act!r}") from None


def activation_table():
    """The epilogue table, one dict per activation (for tests and docs)."""
    return [dict(name=_ACTS[i].name.decode(), code=<int>_ACTS[i].code,
                 epilogue=_ACTS[i].epilogue != NO_EPILOGUE, aux_epilogue=_ACTS[i].aux_epilogue != NO_EPILOGUE,
                 grad_from_output=bool(_ACTS[i].grad_from_output)) for i in range(N_ACTIVATIONS)]


cdef float leaky_slope_of(object leaky_slope) except? -1:
    cdef double s = leaky_slope
    if not (s == s) or s in (float("inf"), float("-inf")) or s < 0:
        raise ValueError(f"leaky_slope: expected a finite number >= 0, got {leaky_slope!r}")
    return <float>s
