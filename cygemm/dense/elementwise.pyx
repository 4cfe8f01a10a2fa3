# cython: language_level=3, boundscheck=False, wraparound=False
# kernels: elementwise
"""The dense layer's elementwise passes on their own: ``out = act(x + bias)`` (optionally saving
``z = x + bias``) and the backward's ``dz = gy * act'(z)`` with the bias gradient's column sum.

They are the kernels :func:`cygemm.gemm_ops.forward_into` and ``backward_into`` run where no
cuBLASLt epilogue applies (kernels/elementwise.cu): memory-bound, 16-byte loads and stores where the rows
are aligned (4 floats or 8 halves per access), a scalar path otherwise, float math for every
storage type, the bias gradient reduced in a fixed order (deterministic). Allocation-free and
capturable: the bias gradient's partial sums go to the stream's workspace.
"""
from libc.stdint cimport int64_t

from cygemm.bindings.cudart cimport *
from cygemm.kernels.elementwise cimport *
from cygemm.engine.epilogues cimport Activation, activation_row, leaky_slope_of
from cygemm.engine.types cimport MatrixView
from cygemm.engine.dtypes cimport dtype_level, expected_names, DTYPES_FLOAT
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.args cimport (CallArgs, args_init, add_array, add_matrix, add_vector, allow_in_place, prepare_call, CALL_KERNELS,
                                 expect_dtype,
                                 ARG_READ, ARG_WRITE)
from cygemm.engine.context cimport call_workspace
from cygemm.engine.mapping cimport rowmajor_ld, is_rowmajor


cdef int _row_major(const MatrixView* v, str name) except -1:
    if not is_rowmajor(v):
        raise ValueError(f"{name}: expected a row-major array (unit stride along the last axis), got "
                         f"element strides ({v.row_stride}, {v.col_stride})")
    if dtype_level(v.dtype) != DTYPES_FLOAT:
        raise TypeError(f"{name}: expected {expected_names(DTYPES_FLOAT)}")
    return 0


def bias_act(x, bias=None, *, out, z_out=None, act="none", leaky_slope=0.01, stream=None):
    """``out = act(x + bias)``, and ``z_out = x + bias`` when given, in one pass.

    Parameters
    ----------
    x : device array, (M, N), row-major
        float32, float16 or bfloat16. May be ``out`` or ``z_out`` itself (in place).
    bias : device array, (N,), optional
        x's dtype, added along the last axis.
    out : device array, (M, N), row-major
        x's dtype.
    z_out : device array, (M, N), row-major, optional
        Receives the pre-activation (what the backward of most activations needs).
    act : str
        One of cygemm's activations (``none``, ``relu``, ``leaky_relu``, ``gelu``, ``gelu_erf``,
        ``sigmoid``, ``tanh``, ``silu``).
    leaky_slope : float
        leaky_relu's slope.
    stream : optional
        The stream (default: the current stream of the arrays' library: torch's when one is
        a torch tensor, else CuPy's).

    Returns
    -------
    device array
        ``out``, holding ``act(x + bias)``.

    Raises
    ------
    ValueError, TypeError
        Before anything runs: shapes, dtypes, layouts, the activation.
    """
    cdef CallArgs c
    args_init(&c)
    cdef MatrixView* vx = add_array(&c, x, "x", ARG_READ, 2, 2)
    cdef int64_t M = vx.rows, N = vx.cols
    _row_major(vx, "x")
    cdef MatrixView* vb = add_vector(&c, bias, "bias", ARG_READ, N, vx.dtype) if bias is not None else NULL
    cdef MatrixView* vo = add_matrix(&c, out, "out", ARG_WRITE, M, N, vx.dtype, True)
    cdef MatrixView* vz = add_matrix(&c, z_out, "z_out", ARG_WRITE, M, N, vx.dtype, True) if z_out is not None else NULL
    cdef const Activation* row = activation_row(act)
    cdef float slope = leaky_slope_of(leaky_slope)
    # An output may be exactly an input (each element is read before the thread that writes it
    # writes it) or share no memory with it: a shifted view would race.
    allow_in_place(&c, vo, vx)
    allow_in_place(&c, vz, vx)
    allow_in_place(&c, vo, vb)
    allow_in_place(&c, vz, vb)
    prepare_call(&c, CALL_KERNELS, stream)
    with nogil:
        check_cuda(cygemm_bias_act_forward(vx.dtype, M, N, vx.ptr, rowmajor_ld(vx),
                                           vb.ptr if vb != NULL else NULL, vo.ptr, rowmajor_ld(vo),
                                           vz.ptr if vz != NULL else NULL, rowmajor_ld(vz) if vz != NULL else 0,
                                           row.code, slope, c.stream), "cygemm_bias_act_forward")
    return out


def act_backward(gy, z, *, dz_out=None, dbias_out=None, act="none", leaky_slope=0.01,
                 bint z_is_output=False, bint accumulate=False, stream=None):
    """``dz_out = gy * act'(z)`` and ``dbias_out = dz.sum(axis=0)``, in one pass over gy and z.

    Parameters
    ----------
    gy : device array, (M, N), row-major
        The gradient of the activation's output; float32, float16 or bfloat16.
    z : device array, (M, N), row-major, or None
        The pre-activation (or, with ``z_is_output``, the activation's output y, which fixes
        act' for none, relu, leaky_relu with a positive slope, sigmoid and tanh). None only for
        ``act='none'``.
    dz_out : device array, (M, N), row-major, optional
        Receives dz (may be ``gy`` itself). None: only the bias gradient.
    dbias_out : device array, (N,), optional
        Receives the column sums of dz (added to it with ``accumulate``).
    act, leaky_slope
        As :func:`bias_act`.
    z_is_output : bool
        ``z`` holds the forward's output instead of the pre-activation.
    accumulate : bool
        Add the bias gradient to ``dbias_out`` instead of overwriting it.
    stream : optional
        The stream (default: the current stream of the arrays' library: torch's when one is
        a torch tensor, else CuPy's).

    Returns
    -------
    tuple
        ``(dz_out, dbias_out)``.

    Raises
    ------
    ValueError, TypeError
        Before anything runs: shapes, dtypes, layouts, the activation, neither output given.
    """
    cdef CallArgs c
    args_init(&c)
    cdef MatrixView* vg = add_array(&c, gy, "gy", ARG_READ, 2, 2)
    cdef int64_t M = vg.rows, N = vg.cols
    _row_major(vg, "gy")
    cdef const Activation* row = activation_row(act)
    cdef float slope = leaky_slope_of(leaky_slope)
    if z is None and row.code != CYGEMM_ACT_NONE:
        raise ValueError(f"z: act={act!r} needs z (the pre-activation, or the output with z_is_output)")
    if z_is_output and not row.grad_from_output:
        raise ValueError(f"z_is_output: act={act!r}'s derivative is not fixed by its output; pass the "
                         f"pre-activation")
    cdef MatrixView* vz = add_matrix(&c, z, "z", ARG_READ, M, N, vg.dtype, True) if z is not None else NULL
    if dz_out is None and dbias_out is None:
        raise ValueError("dz_out/dbias_out: give at least one output")
    cdef MatrixView* vd = add_matrix(&c, dz_out, "dz_out", ARG_WRITE, M, N, vg.dtype, True) if dz_out is not None else NULL
    cdef MatrixView* vb = add_vector(&c, dbias_out, "dbias_out", ARG_WRITE, N, vg.dtype) if dbias_out is not None else NULL
    allow_in_place(&c, vd, vg)          # dz may overwrite gy (read first, element by element)
    prepare_call(&c, CALL_KERNELS, stream)
    cdef int64_t scratch_floats = cygemm_act_backward_scratch_floats(M, N) if vb != NULL else 0
    if <size_t>scratch_floats * 4 > c.ctx.workspace_bytes:
        raise ValueError(f"dbias_out: N={N} needs {scratch_floats * 4} bytes of scratch, more than the "
                         f"stream's workspace ({c.ctx.workspace_bytes} bytes)")
    cdef float* scratch = <float*>call_workspace(c.ctx, c.stream) if vb != NULL else NULL
    with nogil:
        check_cuda(cygemm_act_backward(vg.dtype, M, N, vg.ptr, rowmajor_ld(vg),
                                       vz.ptr if vz != NULL else NULL, rowmajor_ld(vz) if vz != NULL else 0,
                                       vd.ptr if vd != NULL else NULL, rowmajor_ld(vd) if vd != NULL else 0,
                                       vb.ptr if vb != NULL else NULL, 1.0 if accumulate else 0.0, scratch,
                                       row.code, slope, z_is_output, c.stream), "cygemm_act_backward")
    return dz_out, dbias_out
