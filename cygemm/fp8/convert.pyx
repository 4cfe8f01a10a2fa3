# cython: language_level=3, boundscheck=False, wraparound=False
# kernels: fp8
"""FP8 conversions (Hopper and later): :func:`quantize`, :func:`dequantize` and :func:`amax`, with
cygemm's kernels (16-byte accesses, grid sized to the GPU, allocation-free, capturable).
Re-exported by :mod:`cygemm.fp8`, their documented home.

CuPy has no FP8 dtype: FP8 data live in ``uint8`` arrays, and the ``format`` arguments say
which format the bytes hold. torch's ``float8_e4m3fn`` and ``float8_e5m2`` tensors carry theirs.
"""
from libc.stdint cimport int64_t, uintptr_t


from cygemm.bindings.cudart cimport *
from cygemm.kernels.fp8 cimport cygemm_fp8_quantize, cygemm_fp8_dequantize, cygemm_amax
from cygemm.engine.types cimport MatrixView, ArrayDesc
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.arrays cimport read_fp8, read_array, desc_shape
from cygemm.engine.args cimport (CallArgs, ArgRole, args_init, add_view, add_scalar, prepare_call, CALL_KERNELS, ARG_READ,
                                 ARG_WRITE)
from cygemm.engine.alloc cimport empty_array, data_pointer, first_torch

from cygemm.engine.dtypes import FP8_FORMATS, FORMATS_EXPECTED
from cygemm.engine.dtypes cimport by_name, expected_names, DTYPES_FLOAT

__all__ = ["quantize", "dequantize", "amax"]

_DEQUANTIZED = by_name(DTYPES_FLOAT)      # the float types every entry takes: (type, itemsize)
_DEQUANTIZED_EXPECTED = expected_names(DTYPES_FLOAT)


cdef int64_t _contiguous(const ArrayDesc* d, str name) except -1:
    """Element count of a C-contiguous array (ValueError otherwise)."""
    cdef int64_t n = 1, expect = 1
    cdef int i
    for i in range(d.ndim):
        n *= d.shape[i]
    if n == 0:
        return 0
    for i in range(d.ndim - 1, -1, -1):
        if d.shape[i] != 1 and d.strides[i] != expect:
            raise ValueError(f"{name}: expected a C-contiguous array, got element strides "
                             f"{tuple([d.strides[j] for j in range(d.ndim)])} for shape {desc_shape(d)}")
        expect *= d.shape[i]
    return n


cdef MatrixView _flat(const ArrayDesc* d, int64_t n):
    cdef MatrixView v
    v.ptr, v.device, v.dtype, v.itemsize = d.ptr, d.device, d.dtype, d.itemsize
    v.batch, v.rows, v.cols, v.batch_stride, v.row_stride, v.col_stride = 1, 1, n, 0, n, 1
    return v


cdef int64_t _add_contiguous(CallArgs* c, object x, ArrayDesc* d, str name, ArgRole role) except -1:
    """Read a C-contiguous array of any shape into `d` and into c as one flat row; its size."""
    read_array(x, d, name, False)
    cdef int64_t n = _contiguous(d, name)
    cdef MatrixView v = _flat(d, n)
    add_view(c, &v, name, role, d.torch)
    return n


def quantize(x, scale, *, out=None, format="e4m3", amax=None, stream=None):
    """``out = saturate(x * scale)`` in FP8, and optionally ``amax = max |x|``.

    Parameters
    ----------
    x : device array
        float32, float16 or bfloat16, C-contiguous, any shape.
    scale : device float32 scalar
        The quantizing scale (read when the kernel runs: capturable with changing scales).
    out : device array, optional
        ``x``'s shape: ``uint8`` (the format from ``format``) or a torch float8 tensor.
        None: a new array: a torch float8 tensor for a torch ``x``, else a CuPy ``uint8`` array.
    format : {'e4m3', 'e5m2'}
        The FP8 format; values beyond its largest finite value (448, 57344) saturate to it.
    amax : device float32 scalar, optional
        Receives ``max |x|`` (NaN ignored), for the next step's scale.
    stream : optional
        The stream (default: the current stream of the arrays' library: torch's when one is
        a torch tensor, else CuPy's).

    Returns
    -------
    device array
        ``out`` (the FP8 codes), or the new array.

    Raises
    ------
    ValueError, TypeError
        Before anything runs: dtypes, shapes, a non-contiguous array, the format.
    """
    cdef CallArgs c
    cdef ArrayDesc dx, dq
    cdef MatrixView v
    args_init(&c)
    cdef int64_t n = _add_contiguous(&c, x, &dx, "x", ARG_READ)
    cdef MatrixView* vs = add_scalar(&c, scale, "scale", ARG_READ)
    if format not in FP8_FORMATS:
        raise ValueError(f"format: expected {FORMATS_EXPECTED}, got {format!r}")
    cdef cudaDataType fmt = FP8_FORMATS[format]
    cdef MatrixView* vq
    if out is not None:
        read_fp8(out, &dq, "out", format, "format")
        if desc_shape(&dq) != desc_shape(&dx):
            raise ValueError(f"out: expected shape {desc_shape(&dx)}, got {desc_shape(&dq)}")
        _contiguous(&dq, "out")
        v = _flat(&dq, n)
    else:
        v = _flat(&dx, n)
        v.ptr, v.dtype, v.itemsize, v.device = NULL, fmt, 1, -1
    vq = add_view(&c, &v, "out", ARG_WRITE, out is not None and dq.torch)
    cdef MatrixView* va = add_scalar(&c, amax, "amax", ARG_WRITE) if amax is not None else NULL
    prepare_call(&c, CALL_KERNELS, stream)
    if out is None:     # in the caller's library: torch float8 for a torch x, else CuPy uint8
        out = empty_array(desc_shape(&dx), fmt, c.stream, "quantize(out=None): allocating the result",
                          first_torch((x,)))
        vq.ptr = <char*>data_pointer(out)
    cdef float* amax_p = <float*>va.ptr if va != NULL else NULL
    with nogil:
        check_cuda(cygemm_fp8_quantize(dx.dtype, fmt, n, dx.ptr, <const float*>vs.ptr, vq.ptr, amax_p,
                                       c.stream), "cygemm_fp8_quantize")
    return out


def dequantize(q, scale_inv, *, out=None, dtype="float32", format=None, stream=None):
    """``out = q * scale_inv`` from FP8.

    Parameters
    ----------
    q : device array
        FP8: torch float8, or ``uint8`` with ``format``; C-contiguous, any shape.
    scale_inv : device float32 scalar
        The dequantizing scale (1 / the scale ``q`` was quantized with).
    out : device array, optional
        ``q``'s shape, float32, float16 or bfloat16. None: a new array of ``dtype`` (a torch
        tensor for a torch ``q``, else CuPy).
    dtype : {'float32', 'float16', 'bfloat16'}
        The new result's dtype (ignored when ``out`` is given).
    format : {'e4m3', 'e5m2'}, optional
        The format of ``uint8`` bytes.
    stream : optional
        The stream (default: the current stream of the arrays' library: torch's when one is
        a torch tensor, else CuPy's).

    Returns
    -------
    device array
        ``out`` (the values ``q * scale_inv``), or the new array of ``dtype``.

    Raises
    ------
    ValueError, TypeError
        Before anything runs: dtypes, shapes, a non-contiguous array, the format.
    """
    cdef CallArgs c
    cdef ArrayDesc dq, dy
    cdef MatrixView v
    args_init(&c)
    read_fp8(q, &dq, "q", format, "format")
    cdef int64_t n = _contiguous(&dq, "q")
    v = _flat(&dq, n)
    add_view(&c, &v, "q", ARG_READ, dq.torch)
    cdef MatrixView* vs = add_scalar(&c, scale_inv, "scale_inv", ARG_READ)
    cdef MatrixView* vy
    if out is not None:
        read_array(out, &dy, "out", False)
        if desc_shape(&dy) != desc_shape(&dq):
            raise ValueError(f"out: expected shape {desc_shape(&dq)}, got {desc_shape(&dy)}")
        _contiguous(&dy, "out")
        v = _flat(&dy, n)
    else:
        if dtype not in _DEQUANTIZED:
            raise ValueError(f"dtype: expected {_DEQUANTIZED_EXPECTED}, got {dtype!r}")
        v = _flat(&dq, n)
        v.ptr, v.device = NULL, -1
        v.dtype, v.itemsize = _DEQUANTIZED[dtype]
    vy = add_view(&c, &v, "out", ARG_WRITE, out is not None and dy.torch)
    prepare_call(&c, CALL_KERNELS, stream)
    if out is None:     # in the caller's library: a torch tensor for a torch q
        out = empty_array(desc_shape(&dq), vy.dtype, c.stream, "dequantize(out=None): allocating the result",
                          first_torch((q,)))
        vy.ptr = <char*>data_pointer(out)
    with nogil:
        check_cuda(cygemm_fp8_dequantize(dq.dtype, vy.dtype, n, dq.ptr, <const float*>vs.ptr, vy.ptr, c.stream),
                   "cygemm_fp8_dequantize")
    return out


def amax(x, out, *, stream=None):
    """``out = max |x|`` (NaN ignored) into a device float32 scalar, nothing else written.

    Parameters
    ----------
    x : device array
        float32, float16 or bfloat16, C-contiguous, any shape.
    out : device float32 scalar
        Receives the maximum (0 for an empty x).
    stream : optional
        The stream (default: the current stream of the arrays' library: torch's when one is
        a torch tensor, else CuPy's).

    Returns
    -------
    device array
        ``out``, holding ``max |x|``.

    Raises
    ------
    ValueError, TypeError
        Before anything runs: dtypes, a non-contiguous array.
    """
    cdef CallArgs c
    cdef ArrayDesc dx
    cdef MatrixView v
    args_init(&c)
    cdef int64_t n = _add_contiguous(&c, x, &dx, "x", ARG_READ)
    cdef MatrixView* vo = add_scalar(&c, out, "out", ARG_WRITE)
    prepare_call(&c, CALL_KERNELS, stream)
    with nogil:
        check_cuda(cygemm_amax(dx.dtype, n, dx.ptr, <float*>vo.ptr, c.stream), "cygemm_amax")
    return out
