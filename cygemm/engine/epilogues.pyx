# cython: language_level=3
"""The epilogue table: for each activation, the cuBLASLt epilogues that apply it inside the
GEMM, the rules of the AUX form that also writes Z, and whether its derivative is fixed by its
output. The dense layer (cygemm.dense) chooses its routes from these rows; cygemm's kernels
(kernels/elementwise.cu) apply what no epilogue does.
"""
from libc.math cimport isfinite
from cygemm.engine.errors cimport check_real
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


cdef const Activation* activation_of_code(int code) noexcept nogil:
    cdef int i
    for i in range(N_ACTIVATIONS):
        if <int>_ACTS[i].code == code:
            return &_ACTS[i]
    return NULL


cdef const Activation* activation_by_code(int code, str arg) except NULL:
    cdef const Activation* row = activation_of_code(code)
    if row == NULL:
        raise ValueError(f"{arg}: expected an activation code ({_CODES}), got {code}")
    return row


cdef int lt_epilogue_of(const Activation* act, bint has_bias, bint writes_z) noexcept nogil:
    if writes_z:
        return act.aux_epilogue_bias if has_bias else act.aux_epilogue
    return act.epilogue_bias if has_bias else act.epilogue


cdef str no_lt_epilogue(int code, str who):
    cdef const Activation* row = activation_of_code(code)
    got = repr(row.name.decode()) if row != NULL else f"code {code}"
    return f"act: {who} apply {_EPILOGUE_ACTS} ({_EPILOGUE_CODES}), got {got}"


cdef const Activation* epilogue_activation(object act, str who) except NULL:
    try:
        return activation_row(act)
    except ValueError:
        pass
    raise ValueError(f"act: {who} apply {_EPILOGUE_ACTS} ({_EPILOGUE_CODES}), got {act!r}")


cdef bint has_lt_epilogue(const Activation* act, bint writes_z) noexcept nogil:
    return (act.aux_epilogue if writes_z else act.epilogue) != NO_EPILOGUE


cdef cublasLtEpilogue_t lt_epilogue(const Activation* act, bint has_bias, bint writes_z, str who) except *:
    cdef str name = act.name.decode()
    if not has_lt_epilogue(act, False):
        raise ValueError(f"act: {who} apply {_EPILOGUE_ACTS}, got {name!r}")
    if writes_z and not has_lt_epilogue(act, True):
        raise ValueError(f"z_out: cuBLASLt writes Z beside out only for {_AUX_ACTS}, got act={name!r}")
    return <cublasLtEpilogue_t>lt_epilogue_of(act, has_bias, writes_z)


cdef str _listed(names):
    names = [repr(n) for n in names]
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


cdef list _epilogue_rows():
    """Each cuBLASLt epilogue of the table as data: its name, activation, inputs and outputs,
    the operand dtypes it takes and Z's rules (the nvmath-python epilog-protocol idea)."""
    rows = []
    cdef int i
    for i in range(N_ACTIVATIONS):
        act = _ACTS[i].name.decode()
        base = "" if act == _NO_ACT else act
        for epi, bias, aux in ((_ACTS[i].epilogue, False, False), (_ACTS[i].epilogue_bias, True, False),
                               (_ACTS[i].aux_epilogue, False, True), (_ACTS[i].aux_epilogue_bias, True, True)):
            if epi == NO_EPILOGUE:
                continue
            name = "_".join([p for p in (base, "aux" if aux else "", "bias" if bias else "") if p]) or "default"
            rows.append(dict(name=name, epilogue=epi, act=act, inputs=("bias",) if bias else (),
                             outputs=("out", "z") if aux else ("out",),
                             dtypes="float" if aux else "float or fp8",
                             z_ld_multiple=_ACTS[i].aux_ld_multiple if aux else None,
                             z_alignment=_ACTS[i].aux_alignment if aux else None))
    return rows


_NO_ACT = _ACTS[0].name.decode()
_CODES = ", ".join([f"{<int>_ACTS[i].code} {_ACTS[i].name.decode()}" for i in range(N_ACTIVATIONS)])
_EPILOGUE_ACTS = _listed([_ACTS[i].name.decode() for i in range(N_ACTIVATIONS) if _ACTS[i].epilogue != NO_EPILOGUE])
_EPILOGUE_CODES = ", ".join([f"{_ACTS[i].name.decode()} {<int>_ACTS[i].code}" for i in range(N_ACTIVATIONS)
                             if _ACTS[i].epilogue != NO_EPILOGUE])

#: Every cuBLASLt epilogue cygemm applies, one dict each (name, epilogue, act, inputs, outputs,
#: dtypes, Z's rules).
EPILOGUES = tuple(_epilogue_rows())
_AUX_ACTS = " or ".join([f"{r['act']!r} ({r['name'].upper()})" for r in EPILOGUES
                          if "z" in r["outputs"] and not r["inputs"]])
#: cuBLASLt epilogue value -> its name ("default", "bias", "relu", "gelu_bias", "gelu_aux", ...).
EPILOGUE_NAMES = {row["epilogue"]: row["name"] for row in EPILOGUES}
#: The activations that have a cuBLASLt epilogue, listed for messages ("'none', 'relu' or 'gelu'").
EPILOGUE_ACTS = _EPILOGUE_ACTS


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
                 grad_from_output=bool(_ACTS[i].grad_from_output),
                 takes_slope=_ACTS[i].code == CYGEMM_ACT_LEAKY_RELU) for i in range(N_ACTIVATIONS)]


cdef float leaky_slope_of(object leaky_slope) except? -1:
    cdef double s = check_real(leaky_slope, "leaky_slope")
    if not isfinite(s) or s < 0:
        raise ValueError(f"leaky_slope: expected a finite number >= 0, got {leaky_slope!r}")
    return <float>s
