# cython: language_level=3, boundscheck=False, wraparound=False
"""The one argument path of every entry point (see args.pxd).

An entry point reads each buffer it touches into a CallArgs (inputs first, then outputs, then
workspaces), checks what is its own (shapes, the mapping to cuBLAS), then calls one prepare_*
for what every call shares. Nothing is enqueued before it returns.
"""
import os

import numpy as np

from cpython.object cimport PyObject
from libc.stdint cimport int64_t, uintptr_t

from cygemm.bindings.cudart cimport *
from cygemm.engine.types cimport (MatrixView, ArrayDesc, Math, GemmTypes, MATH_TF32, MATH_FP32, compute_type,
                                  typed_compute_type, view_is_empty, WORKSPACE_ALIGNMENT)
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.streams cimport stream_from_object, stream_device
from cygemm.engine.mapping cimport is_rowmajor
from cygemm.engine.context cimport current_context, known_device_count, call_workspace
from cygemm.engine.arrays cimport read_array, desc_shape
from cygemm.engine.dtypes cimport dtype_name, SCALES_DTYPE
from cygemm.engine.overlap cimport views_overlap, check_no_overlap


cdef Math parse_math(object math) except *:
    if math == "tf32":
        return MATH_TF32
    if math == "fp32":
        return MATH_FP32
    if math == "cupy":          # as cp.matmul: TF32 only when CUPY_TF32=1
        return MATH_TF32 if os.environ.get("CUPY_TF32", "0") == "1" else MATH_FP32
    raise ValueError(f"math: expected 'tf32', 'fp32' or 'cupy', got {math!r}")


cdef int _check_scratch(const MatrixView* v, str name) except -1:
    # cuBLASLt requires a workspace pointer aligned to 256 bytes.
    cdef uintptr_t p = <uintptr_t>v.ptr
    if v.cols > 0 and p % WORKSPACE_ALIGNMENT:
        raise ValueError(f"{name}: expected a workspace aligned to {WORKSPACE_ALIGNMENT} bytes, "
                         f"got address {p:#x} ({p % WORKSPACE_ALIGNMENT} bytes past a boundary)")
    return 0


cdef inline bint _same_view(const MatrixView* x, const MatrixView* y) noexcept nogil:
    return (x.ptr == y.ptr and x.rows == y.rows and x.cols == y.cols and x.row_stride == y.row_stride
            and x.col_stride == y.col_stride and x.batch == y.batch
            and (x.batch <= 1 or x.batch_stride == y.batch_stride))


cdef int check_overlaps(CallArgs* c) except -1:
    cdef int i, j
    # Inputs come first: each output and workspace against everything before it.
    for i in range(c.n):
        if c.roles[i] == ARG_READ:
            continue
        if c.roles[i] == ARG_SCRATCH:
            _check_scratch(&c.views[i], <str>c.names[i])
        for j in range(i):
            if c.views[i].ptr != NULL and c.views[j].ptr != NULL and views_overlap(&c.views[i], &c.views[j]):
                if (c.in_place_of[i] >> j) & 1 and _same_view(&c.views[i], &c.views[j]):
                    continue            # exactly its input, as the entry point allows
                check_no_overlap(&c.views[i], <str>c.names[i], &c.views[j], <str>c.names[j])
    return 0


cdef inline int _bind(CallArgs* c, object stream) except -1:
    """The stream, this thread's context, the devices of the stream and of every buffer."""
    stream_from_object(stream, &c.stream, c.torch_arrays)
    c.ctx = current_context()
    return check_devices(c)


cdef int prepare_call(CallArgs* c, CallKind kind, object stream, object math="tf32",
                      cudaDataType dtype=CUDA_R_32F, bint overlaps=True) except -1:
    if overlaps:
        check_overlaps(c)
    if kind == CALL_GEMM:
        c.math = parse_math(math)
        c.compute = compute_type(dtype, c.math)
    elif kind == CALL_TYPED_GEMM:
        c.math = MATH_FP32
        c.compute = typed_compute_type(c.types)
    return _bind(c, stream)


cdef int check_devices(CallArgs* c) except -1:
    if known_device_count() < 2:      # set when the first context was made, before any check
        return 0
    cdef int device = c.ctx.device, i
    cdef int stream_dev = device
    stream_device(c.stream, &stream_dev)
    if stream_dev != device:
        raise ValueError(f"stream: the stream belongs to device {stream_dev} but the call runs on "
                         f"device {device} (make that device current)")
    cdef cudaPointerAttributes attr
    cdef const MatrixView* v
    for i in range(c.n):
        v = &c.views[i]
        if v.ptr == NULL or view_is_empty(v):    # not allocated yet, or empty
            continue
        if v.device == device:          # the array object named its device (CuPy, torch, DLPack)
            continue
        check_cuda(cudaPointerGetAttributes(&attr, v.ptr), "cudaPointerGetAttributes")
        if attr.type != cudaMemoryTypeDevice and attr.type != cudaMemoryTypeManaged:
            raise ValueError(f"{<str>c.names[i]}: expected device memory, got a pointer of memory "
                             f"type {<int>attr.type} (host memory)")
        if attr.type == cudaMemoryTypeDevice and attr.device != device:
            raise ValueError(f"{<str>c.names[i]}: the array is on device {attr.device} but the call "
                             f"runs on device {device} (make that device current)")
    return 0


cdef MatrixView* add_scalar(CallArgs* c, object x, str name, ArgRole role) except NULL:
    cdef ArrayDesc d
    cdef MatrixView v
    if isinstance(x, (int, float, np.generic)) and not isinstance(x, bool):
        raise TypeError(f"{name}: expected a device float32 scalar (one element, read on the GPU when "
                        f"the call runs), got a host number {x!r}: pass cupy.asarray({float(x)!r}, cupy.float32)")
    read_array(x, &d, name, False)
    cdef int64_t size = 1
    cdef int i
    for i in range(d.ndim):
        size *= d.shape[i]
    if d.dtype != SCALES_DTYPE or size != 1:
        raise ValueError(f"{name}: expected a device float32 scalar (one element), got "
                         f"{dtype_name(d.dtype)} of shape {desc_shape(&d)}")
    v.ptr, v.device, v.dtype, v.itemsize = d.ptr, d.device, d.dtype, 4
    v.batch, v.rows, v.cols, v.batch_stride, v.row_stride, v.col_stride = 1, 1, 1, 0, 1, 1
    return add_view(c, &v, name, role, d.torch)


cdef int raise_dtype(const MatrixView* v, str name, cudaDataType dtype, str whose) except -1:
    what = f"the dtype of {whose} ({dtype_name(dtype)})" if whose else f"dtype {dtype_name(dtype)}"
    raise TypeError(f"{name}: expected {what}, got {dtype_name(v.dtype)}")


cdef int expect_matrix(const MatrixView* v, str name, int64_t rows, int64_t cols,
                       cudaDataType dtype) except -1:
    if v.rows != rows or v.cols != cols:
        raise ValueError(f"{name}: expected shape ({rows}, {cols}), got ({v.rows}, {v.cols})")
    return expect_dtype(v, name, dtype, None)


cdef int expect_vector(const MatrixView* v, object x, str name, int64_t n,
                       cudaDataType dtype) except -1:
    if v.rows != 1 or v.cols != n:
        shape = getattr(x, "shape", None)
        if shape is None:
            shape = x.__cuda_array_interface__["shape"]
        raise ValueError(f"{name}: expected shape ({n},) or (1, {n}), got {tuple(shape)}")
    expect_dtype(v, name, dtype, None)
    if v.col_stride != 1 and n > 1:
        raise ValueError(f"{name}: expected a contiguous vector, got element stride {v.col_stride}")
    return 0


cdef MatrixView* add_matrix(CallArgs* c, object x, str name, ArgRole role, int64_t rows, int64_t cols,
                            cudaDataType dtype, bint row_major) except NULL:
    cdef MatrixView* v = add_array(c, x, name, role, 2, 2)
    expect_matrix(v, name, rows, cols, dtype)
    if row_major and not is_rowmajor(v):
        raise ValueError(f"{name}: expected a row-major array (unit stride along the last axis, "
                         f"rows not overlapping), got element strides ({v.row_stride}, {v.col_stride})")
    return v


cdef MatrixView* add_vector(CallArgs* c, object x, str name, ArgRole role, int64_t n,
                            cudaDataType dtype) except NULL:
    cdef MatrixView* v = add_array(c, x, name, role, 1, 2)
    expect_vector(v, x, name, n, dtype)
    return v


cdef int call_workspace_of(CallArgs* c, const MatrixView* wv, void** ptr, size_t* nbytes) except -1:
    if wv == NULL:
        ptr[0] = call_workspace(c.ctx, c.stream)
        nbytes[0] = c.ctx.workspace_bytes
        return 0
    ptr[0] = wv.ptr
    nbytes[0] = <size_t>wv.cols
    return 0
