# cython: language_level=3, boundscheck=False, wraparound=False
# kernels: fp8_scales
"""Quantizing to FP8 with the scales of Hopper's FP8 recipes: :func:`quantize_scaled`, one scale
for the tensor (current scaling), per row, per 1 x 128 tile along a row, or per 128 x 128 block,
each from the amax of what it scales, written in the layout :func:`cygemm.fp8.scaled_matmul`
reads. Re-exported by :mod:`cygemm.fp8`, its documented home.
"""
import operator

from libc.stdint cimport int64_t, uintptr_t

from cygemm.bindings.cudart cimport *
from cygemm.kernels.fp8_scales cimport cygemm_fp8_quantize_scaled
from cygemm.engine.types cimport MatrixView, ArrayDesc
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.errors import check_flag
from cygemm.engine.streams cimport stream_from_object
from cygemm.engine.arrays cimport read_fp8, read_array, desc_shape
from cygemm.engine.dtypes cimport dtype_name, dtype_level, expected_names, DTYPES_FLOAT, SCALES_DTYPE
from cygemm.engine.args cimport CallArgs, args_init, add_view, prepare_call, CALL_KERNELS, ARG_READ, ARG_WRITE
from cygemm.engine.alloc cimport empty_array, data_pointer, first_torch
from cygemm.fp8.args cimport SCALE_TENSOR, SCALE_OUTER, SCALE_1X128, SCALE_128X128, expect_scale

from cygemm.engine.dtypes import FP8_FORMATS, FORMATS_EXPECTED

__all__ = ["quantize_scaled"]

_MODES = {"tensor": SCALE_TENSOR, "rowwise": SCALE_OUTER, "1x128": SCALE_1X128, "128x128": SCALE_128X128}


cdef int _expect_c_contiguous(const ArrayDesc* d, str name, tuple shape) except -1:
    if desc_shape(d) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {desc_shape(d)}")
    if d.ndim == 2 and shape[0] * shape[1] > 0 and (d.strides[1] != 1 and shape[1] > 1 or
                                                    d.strides[0] != shape[1] and shape[0] > 1):
        raise ValueError(f"{name}: expected a C-contiguous array, got element strides "
                         f"({d.strides[0]}, {d.strides[1]}) for shape {shape}")
    return 0


cdef MatrixView _view(const ArrayDesc* d, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride):
    cdef MatrixView v
    v.ptr, v.device, v.dtype, v.itemsize = d.ptr, d.device, d.dtype, d.itemsize
    v.batch, v.batch_stride, v.rows, v.cols, v.row_stride, v.col_stride = 1, 0, rows, cols, row_stride, col_stride
    return v


cdef tuple _scale_shape(int mode, int64_t rows, int64_t cols):
    """The scale array of q (rows x cols) as scaled_matmul's a: its shape, and the shape and
    slice-or-transpose of the C-contiguous array that holds it."""
    cdef int64_t kb = (cols + 127) // 128, rb = (rows + 127) // 128, ld = (kb + 3) // 4 * 4
    if mode == SCALE_TENSOR:
        return (1,), (1, 1)
    if mode == SCALE_OUTER:
        return (rows, 1), (rows, 1)
    if mode == SCALE_1X128:
        return (rows, kb), (kb, rows)           # held (kb, rows), returned transposed
    return (rb, kb), (rb, ld)                   # held (rb, ld), returned [:, :kb]


cdef object _new_scale(int mode, int64_t rows, int64_t cols, cudaStream_t stream, object like):
    """A new scale array for FP8 codes of shape (rows, cols), in scaled_matmul's layout for them
    as its a: a view of the C-contiguous array that holds it (torch's for a torch `like`)."""
    shape, held = _scale_shape(mode, rows, cols)
    holder = empty_array(held, CUDA_R_32F, stream, "quantize_scaled(scale=None): allocating the scales", like)
    return (holder.T if mode == SCALE_1X128 else holder[:, :shape[1]] if mode == SCALE_128X128
            else holder.reshape(1) if mode == SCALE_TENSOR else holder)


cdef int _mode_of(object mode) except -1:
    if mode not in _MODES:
        raise ValueError(f"mode: expected 'tensor', 'rowwise', '1x128' or '128x128', got {mode!r}")
    return _MODES[mode]


def empty_scale(mode, rows, cols, *, stream=None):
    """A new, uninitialized scale array for FP8 codes of shape (rows, cols), for
    :func:`quantize_scaled`'s ``scale=`` (allocated once, refilled every step).

    Parameters
    ----------
    mode : {"tensor", "rowwise", "1x128", "128x128"}
        As :func:`quantize_scaled`'s.
    rows, cols : int
        The shape of the codes the scales are for (``q``'s, not ``x.T``'s with ``transpose``).
    stream : stream, optional
        Where the memory is allocated from CuPy's pool (None: CuPy's current stream).

    Returns
    -------
    cupy.ndarray
        float32, in the layout quantize_scaled writes and scaled_matmul reads: (1,),
        (rows, 1), (rows, ceil(cols / 128)) rows-contiguous, or (ceil(rows / 128),
        ceil(cols / 128)) with 16-byte aligned rows.

    Raises
    ------
    ValueError
        An unknown mode, or a negative size (before anything is allocated).
    TypeError
        A size that is not an integer.
    """
    cdef int m = _mode_of(mode)
    cdef int64_t n_rows = _size(rows, "rows"), n_cols = _size(cols, "cols")
    cdef cudaStream_t s
    stream_from_object(stream, &s)
    return _new_scale(m, n_rows, n_cols, s, None)


cdef int64_t _size(object n, str name) except -1:
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(n).__name__}") from None
    if n < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {n}")
    return n


def quantize_scaled(x, mode, *, format="e4m3", transpose=False, pow2=False, out=None, scale=None,
                    stream=None):
    """Quantize ``x`` to FP8 with one scale for all of it, per row, per 1 x 128 tile, or per 128 x 128 block.

    For each group of elements a scale covers: ``amax = max |x|`` over it (NaN ignored),
    ``m = fmax / amax`` in float32 (``fmax``: 448 for E4M3, 57344 for E5M2; at most 2**126;
    1 where ``amax`` is 0 or infinite), rounded down to a power of two with ``pow2`` (as
    DeepSeek-V3's recipe does); ``q = saturate(x * m)`` rounded to nearest even; and the
    dequantizing ``scale = 1 / m``, so that ``q * scale`` approximates ``x``.

    Parameters
    ----------
    x : device array, (R, C)
        float32, float16 or bfloat16, C-contiguous (``x.reshape(-1, C)`` for more dimensions).
    mode : {'tensor', 'rowwise', '1x128', '128x128'}
        What one scale covers: all of ``q`` (current scaling: its amax is this call's, not a
        history's); a row of ``q``; 128 consecutive elements of a row of ``q``
        (activations and gradients in DeepSeek-V3's recipe); a 128 x 128 block (weights).
    format : {'e4m3', 'e5m2'}
        The FP8 format.
    transpose : bool
        Quantize ``x.T`` instead: ``q`` is (C, R), C-contiguous, with its groups along ``x``'s
        columns (what a backward pass's GEMMs read: the weight gradient reads activations and
        gradients along the batch). Written from ``x`` in one pass.
    pow2 : bool
        Scales that are powers of two (so ``q * scale`` is exact scaling).
    out : device array, optional
        ``q``: (R, C), or (C, R) with ``transpose``, C-contiguous ``uint8`` (the format from
        ``format``) or a torch float8 tensor. None: a new one (torch for a torch ``x``).
    scale : device float32 array, optional
        Receives the scales, in the layout :func:`cygemm.fp8.scaled_matmul` reads for ``q`` as
        its ``a`` (for ``q.T`` as its ``b``, pass ``scale.T``): ``tensor`` (1,); ``rowwise`` (Q_rows, 1);
        ``1x128`` (Q_rows, ceil(Q_cols / 128)), Q_rows-contiguous; ``128x128``
        (ceil(Q_rows / 128), ceil(Q_cols / 128)), rows ``round_up(ceil(Q_cols / 128), 4)``
        apart (a view such as ``buf[:, :kb]``; the padding is not written), where (Q_rows,
        Q_cols) is ``q``'s shape. None: a new one.
    stream : optional
        The stream (default: the current stream of the arrays' library: torch's when one is
        a torch tensor, else CuPy's).

    Returns
    -------
    (q, scale)
        ``out`` and ``scale``, or the new arrays.

    Raises
    ------
    ValueError, TypeError
        Before anything runs: dtypes, shapes, layouts, the mode and the format.
    """
    cdef bint transposed = check_flag(transpose, "transpose"), to_pow2 = check_flag(pow2, "pow2")
    cdef CallArgs c
    cdef ArrayDesc dx, dq, ds
    cdef MatrixView v
    args_init(&c)
    cdef int m = _mode_of(mode)
    if format not in FP8_FORMATS:
        raise ValueError(f"format: expected {FORMATS_EXPECTED}, got {format!r}")
    cdef cudaDataType fmt = FP8_FORMATS[format]
    read_array(x, &dx, "x", False)
    if dx.ndim != 2:
        raise ValueError(f"x: expected a matrix (R, C), got shape {desc_shape(&dx)}; for more dimensions "
                         f"quantize x.reshape(-1, C)")
    if dtype_level(dx.dtype) != DTYPES_FLOAT:
        raise TypeError(f"x: expected {expected_names(DTYPES_FLOAT)}, got {dtype_name(dx.dtype)}")
    cdef int64_t rows = dx.shape[0], cols = dx.shape[1]
    _expect_c_contiguous(&dx, "x", (rows, cols))
    v = _view(&dx, rows, cols, cols, 1)
    add_view(&c, &v, "x", ARG_READ, dx.torch)
    cdef int64_t q_rows = cols if transposed else rows, q_cols = rows if transposed else cols
    if out is not None:
        read_fp8(out, &dq, "out", format, "format")
        _expect_c_contiguous(&dq, "out", (q_rows, q_cols))
        v = _view(&dq, q_rows, q_cols, q_cols, 1)
    else:
        v = _view(&dx, q_rows, q_cols, q_cols, 1)
        v.ptr, v.dtype, v.itemsize, v.device = NULL, fmt, 1, -1
    cdef MatrixView* vq = add_view(&c, &v, "out", ARG_WRITE, out is not None and dq.torch)
    if scale is not None:
        read_array(scale, &ds, "scale", False)
        if ds.dtype != SCALES_DTYPE:
            raise TypeError(f"scale: expected float32, got {dtype_name(ds.dtype)}")
        expect_scale(&ds, m, True, q_rows, 0, q_cols, "scale")
        if m != SCALE_TENSOR and (<uintptr_t>ds.ptr) % 16:
            raise ValueError(f"scale: scaled_matmul reads {mode} scales from 16-byte aligned memory, got address "
                             f"{<uintptr_t>ds.ptr:#x}")
        if ds.ndim == 2:
            v = _view(&ds, ds.shape[0], ds.shape[1], ds.strides[0], ds.strides[1])
        elif ds.ndim == 1:                  # a rowwise scale as a vector, or (1,)
            v = _view(&ds, 1, ds.shape[0], ds.shape[0], 1)
        else:
            v = _view(&ds, 1, 1, 1, 1)
    else:
        held = _scale_shape(m, q_rows, q_cols)[1]
        v = _view(&dx, held[0], held[1], held[1], 1)
        v.ptr, v.dtype, v.itemsize, v.device = NULL, CUDA_R_32F, 4, -1
    cdef MatrixView* vs = add_view(&c, &v, "scale", ARG_WRITE, scale is not None and ds.torch)
    prepare_call(&c, CALL_KERNELS, stream)
    cdef int major = 0, minor = 0
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c.ctx.device)
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c.ctx.device)
    if major * 10 + minor < 89:     # (its kernels are built for 8.9 and 9.0 on: FP8 GEMMs need them)
        raise RuntimeError(f"quantize_scaled: FP8 with finer scales needs compute capability 8.9 or newer "
                           f"(the FP8 GEMMs that read it do too); this GPU is {major}.{minor}")
    like = first_torch((x,))
    if out is None:
        out = empty_array((q_rows, q_cols), fmt, c.stream, "quantize_scaled(out=None): allocating q", like)
        vq.ptr = <char*>data_pointer(out)
    if scale is None:
        scale = _new_scale(m, q_rows, q_cols, c.stream, like)
        vs.ptr = <char*>data_pointer(scale)
    with nogil:
        check_cuda(cygemm_fp8_quantize_scaled(dx.dtype, fmt, m, transposed, to_pow2, rows, cols, dx.ptr, vq.ptr,
                                              <float*>vs.ptr, c.stream), "cygemm_fp8_quantize_scaled")
    return out, scale
