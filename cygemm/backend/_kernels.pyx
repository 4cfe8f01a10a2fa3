# cython: language_level=3, boundscheck=False, wraparound=False
# kernels: backend
"""The launchers of the CUDABackend's kernels (cygemm/kernels/backend.cu, compiled at build time):
row-wise softmax and log-softmax (one warp per row, max subtracted: exact for logits of any
finite size), and a sigmoid that never forms exp of a large positive number. One launch each,
in float32 or float64; in place when the output is the input. Nothing allocated, nothing
synchronised: each launch can be captured into a CUDA graph.
"""
from libc.stdint cimport int64_t, uintptr_t

import cupy as cp
import numpy as np

from cygemm.kernels.backend cimport *
from cygemm.capi cimport (cudaStream_t, cudaDataType, CUDA_R_32F, CUDA_R_64F, check_cuda,
                          stream_from_object)     # the public contract, as any Cython code

cdef object _ndarray = cp.ndarray
cdef object _F32 = np.dtype(np.float32)
cdef object _F64 = np.dtype(np.float64)


cdef cudaDataType _float_array(object x, str name) except *:
    if not isinstance(x, _ndarray):
        raise TypeError(f"{name}: expected a float32 or float64 CuPy array, got {type(x).__name__}")
    if x.dtype == _F32:
        return CUDA_R_32F
    if x.dtype == _F64:
        return CUDA_R_64F
    raise TypeError(f"{name}: expected a float32 or float64 CuPy array, got {x.dtype.name}")


cdef int _same_dtype(object out, object x) except -1:
    if not isinstance(out, _ndarray):
        raise TypeError(f"out: expected a CuPy {x.dtype.name} array, got {type(out).__name__}")
    if out.dtype != x.dtype:
        raise TypeError(f"out: expected x's dtype {x.dtype.name}, got {out.dtype.name}")
    return 0


def row_op(str kind, x, out, stream):
    """softmax or log_softmax of x along its last axis into out.

    Parameters
    ----------
    kind : {"softmax", "log_softmax"}
    x : cupy.ndarray
        float32 or float64, C-contiguous (a 0-d array is one row of one element).
    out : cupy.ndarray
        x's shape and dtype, C-contiguous; may be x itself.
    stream
        Where the kernel runs (a CuPy stream, an int cudaStream_t, ...).

    Returns
    -------
    cupy.ndarray
        `out`, each row its softmax (or log-softmax).
    """
    cdef cygemm_row_op_t op
    if kind == "softmax":
        op = CYGEMM_ROW_SOFTMAX
    elif kind == "log_softmax":
        op = CYGEMM_ROW_LOG_SOFTMAX
    else:
        raise ValueError(f"kind: expected 'softmax' or 'log_softmax', got {kind!r}")
    cdef cudaDataType dtype = _float_array(x, "x")
    _same_dtype(out, x)
    if out.shape != x.shape:
        raise ValueError(f"out: expected x's shape {x.shape}, got {out.shape}")
    if not x.flags.c_contiguous or not out.flags.c_contiguous:
        raise ValueError(f"x, out: expected C-contiguous arrays, got strides {x.strides} and {out.strides}")
    cdef int64_t cols = x.shape[x.ndim - 1] if x.ndim else 1
    cdef int64_t rows = x.size // cols if cols else 0
    if cols > 2147483647:
        raise ValueError(f"x: expected at most 2147483647 elements along the last axis, got {cols}")
    cdef const void* xp = <const void*><uintptr_t>x.data.ptr
    cdef void* yp = <void*><uintptr_t>out.data.ptr
    cdef cudaStream_t s
    stream_from_object(stream, &s)
    with nogil:
        check_cuda(cygemm_row_op(dtype, op, xp, yp, rows, cols, s), "cygemm_row_op")
    return out


cdef int _layout(object x, object out, cygemm_strided_layout* layout) except -1:
    """x broadcast to out's shape, as byte strides of both, size-1 dimensions dropped and
    dimensions that step evenly in both merged."""
    cdef tuple shape = out.shape, xshape = x.shape, ystrides = out.strides, xstrides = x.strides
    cdef int nd = len(shape), xnd = len(xshape), lead = nd - xnd, d, k = 0
    cdef int64_t extent, xs, ys
    if xnd > nd:
        raise ValueError(f"out: expected a shape x {xshape} broadcasts to, got {shape}")
    for d in range(xnd):
        if xshape[d] != 1 and xshape[d] != shape[lead + d]:
            raise ValueError(f"out: expected a shape x {xshape} broadcasts to, got {shape}")
    for d in range(nd):
        extent = shape[d]
        if extent == 1:
            continue
        ys = ystrides[d]
        xs = xstrides[d - lead] if d >= lead and xshape[d - lead] != 1 else 0
        if k and layout.x_strides[k - 1] == xs * extent and layout.y_strides[k - 1] == ys * extent:
            layout.shape[k - 1] *= extent          # one dimension of shape[k-1] * extent steps
            layout.x_strides[k - 1] = xs
            layout.y_strides[k - 1] = ys
            continue
        if k == CYGEMM_SIGMOID_MAX_DIMS:
            raise ValueError(f"x, out: expected at most {CYGEMM_SIGMOID_MAX_DIMS} dimensions that cannot be "
                             f"merged, got shape {shape} with strides {xstrides} and {ystrides}")
        layout.shape[k], layout.x_strides[k], layout.y_strides[k] = extent, xs, ys
        k += 1
    if k == 0:                                      # one element
        layout.shape[0], layout.x_strides[0], layout.y_strides[0] = 1, 0, 0
        k = 1
    layout.ndim = k
    return 0


def sigmoid(x, out, stream):
    """``out = 1 / (1 + exp(-x))``, as ``e / (1 + e)`` with ``e = exp(x)`` where x < 0 (no
    overflow for either sign), elementwise in one launch.

    Parameters
    ----------
    x : cupy.ndarray
        float32 or float64, any strides.
    out : cupy.ndarray
        x's dtype, a shape x broadcasts to, any strides; may be x itself.
    stream
        Where the kernel runs (a CuPy stream, an int cudaStream_t, ...).

    Returns
    -------
    cupy.ndarray
        `out`, holding sigmoid(x) broadcast to its shape.
    """
    cdef cudaDataType dtype = _float_array(x, "x")
    _same_dtype(out, x)
    cdef int64_t n = out.size
    cdef const void* xp = <const void*><uintptr_t>x.data.ptr
    cdef void* yp = <void*><uintptr_t>out.data.ptr
    cdef cygemm_strided_layout layout
    cdef bint dense = out.shape == x.shape and ((x.flags.c_contiguous and out.flags.c_contiguous)
                                                or (x.flags.f_contiguous and out.flags.f_contiguous))
    if not dense:
        _layout(x, out, &layout)
    cdef cudaStream_t s
    stream_from_object(stream, &s)
    if n == 0:
        return out
    with nogil:
        if dense:
            check_cuda(cygemm_sigmoid(dtype, xp, yp, n, s), "cygemm_sigmoid")
        else:
            check_cuda(cygemm_sigmoid_strided(dtype, xp, yp, n, &layout, s), "cygemm_sigmoid_strided")
    return out
