# cython: language_level=3, boundscheck=False, wraparound=False
"""What every ``describe_*`` shares, so that all of them take the same operands and say the same
things: operands read by their layout alone, and one cuBLAS call described.

Operands: device arrays (CuPy, torch, ``__cuda_array_interface__``, DLPack) pass through to the
usual readers unchanged (read, never touched). A NumPy array in host memory is read for its
shape, strides, dtype and address; a ``(shape, dtype)`` pair is a C-contiguous array at a
made-up address of its own (the pairs of one call never overlap). Either becomes an
:class:`ArrayLayout`, which ``_arrays``' readers read as they read a device array. Dtypes by
name or object: NumPy's, ml_dtypes' (bfloat16, float8_e4m3fn, float8_e5m2), torch's, and the
names "bfloat16", "float8_e4m3fn"/"e4m3", "float8_e5m2"/"e5m2"; uint8 holds FP8 bytes.

A call: the user's row-major terms first (M, N, K, batch, whether cuBLAS's operands are swapped
and why), then the column-major arguments cuBLAS gets.
"""
from libc.stdint cimport int64_t, uintptr_t

from cygemm.bindings.cudart cimport (cudaDataType, CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF, CUDA_R_64F,
                                     CUDA_C_32F, CUDA_C_64F, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_8U, CUDA_R_8I, CUDA_R_32I)
from cygemm.bindings.cublas cimport CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C
from cygemm.engine.types cimport MatrixView, ColMajorGemm, MAX_NDIM
from cygemm.engine.mapping cimport is_rowmajor
from cygemm.engine.settings import get_options
from cygemm.engine.dtypes import BY_ANY_NAME, ROWS

import numpy as np

# name or alias -> (type, itemsize, the name a layout reports): the dtype table's typed rows.
_TYPED = {n: (r["cuda"], r["size"], r["name"]) for n, r in BY_ANY_NAME.items() if r["kind"] != "u"}
_BYTES = {r["name"]: (r["cuda"], r["size"], r["name"]) for r in ROWS if r["kind"] == "u"}
_FIRST_ADDRESS = 0x10_0000_0000       # pairs' made-up addresses start here (never NULL)


cdef class ArrayLayout:
    """An operand known by its layout only (see the module's docstring)."""

    def __repr__(self):
        return f"ArrayLayout(shape={self.shape}, dtype={self.dtype!r})"


cdef class Addresses:
    def __cinit__(self):
        self.cursor = _FIRST_ADDRESS

    cdef uintptr_t take(self, object nbytes):
        cdef uintptr_t p = self.cursor
        self.cursor += (int(nbytes) + 511) // 256 * 256       # rounded up, and a gap
        return p


cdef tuple _dtype_of(object dt, str name):
    """(kind, type, itemsize, name) of a dtype given by name or object."""
    key = dt
    if not isinstance(dt, str):
        text = str(dt)
        if text.startswith("torch."):       # torch's dtypes, without importing torch
            key = text[len("torch."):]
    if isinstance(key, str) and key in _TYPED:
        t, size, shown = _TYPED[key]
        return LAYOUT_TYPED, t, size, shown
    try:
        np_dt = np.dtype(key)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a dtype (one of {', '.join(_TYPED)}, or a NumPy, ml_dtypes or "
                        f"torch dtype), got {dt!r}") from None
    if np_dt.name in _TYPED:                # ml_dtypes' bfloat16 and float8 types among them
        t, size, shown = _TYPED[np_dt.name]
        return LAYOUT_TYPED, t, size, shown
    if np_dt.name in _BYTES:
        return (LAYOUT_BYTES,) + _BYTES[np_dt.name]
    return LAYOUT_OTHER, CUDA_R_8U, max(np_dt.itemsize, 1), np_dt.name


cdef tuple _shape_of(object shape, str name):
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(int(n) for n in shape)
        if any(n < 0 or n != m for n, m in zip(dims, shape)):
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a shape of non-negative ints in its (shape, dtype) pair, "
                         f"got {shape!r}") from None
    if len(dims) > MAX_NDIM:
        raise ValueError(f"{name}: expected at most {MAX_NDIM} dimensions, got {len(dims)}")
    return dims


cdef ArrayLayout _layout(str name, tuple shape, object strides, object dt, uintptr_t address, bint memory):
    """strides: bytes (a NumPy array's) or None (C order)."""
    cdef ArrayLayout x = ArrayLayout()
    kind, t, itemsize, shown = _dtype_of(dt, name)
    x.kind, x.dtype, x.shape, x.has_memory = kind, shown, shape, memory
    x.d.ptr, x.d.ndim, x.d.itemsize, x.d.device, x.d.dtype, x.d.torch = <char*>address, len(shape), itemsize, -1, <cudaDataType>t, False
    cdef int i
    cdef int64_t expect = 1
    if strides is None or 0 in shape:       # C order (an empty array's strides mean nothing)
        for i in range(len(shape) - 1, -1, -1):
            x.d.shape[i], x.d.strides[i] = shape[i], expect
            expect *= shape[i]
        return x
    for i in range(len(shape)):
        if strides[i] % itemsize:
            raise ValueError(f"{name}: stride {strides[i]} bytes on axis {i} is not a multiple of the "
                             f"element size ({itemsize} bytes)")
        x.d.shape[i], x.d.strides[i] = shape[i], strides[i] // itemsize
    return x


cpdef bint is_pair(object x):
    # (a dtype is a name or a dtype object: never a number, a sequence or an array)
    # (the shape is checked by the pair's reader, naming what is wrong with it)
    return (isinstance(x, (tuple, list)) and len(x) == 2
            and not isinstance(x[1], (tuple, list, np.ndarray, int, float, complex, np.number))
            and not hasattr(x[1], "__cuda_array_interface__") and not hasattr(x[1], "__dlpack__"))


_EXPECTED = "a device array, a host (NumPy) array or a (shape, dtype) pair"


cdef object layout_operand(object x, str name, Addresses addresses):
    if isinstance(x, (list, tuple)) and not is_pair(x):
        raise TypeError(f"{name}: expected {_EXPECTED}, got a {type(x).__name__} that is no (shape, dtype) pair "
                        f"(for host data, pass numpy.asarray of it)")
    if isinstance(x, np.ndarray):
        if x.ndim > MAX_NDIM:
            raise ValueError(f"{name}: expected at most {MAX_NDIM} dimensions, got {x.ndim}")
        return _layout(name, tuple(x.shape), x.strides, x.dtype, x.__array_interface__["data"][0], True)
    if not isinstance(x, (tuple, list)):
        if not (hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack__")):
            raise TypeError(f"{name}: expected {_EXPECTED}, got {type(x).__module__}.{type(x).__qualname__}")
        return x            # a device array (its reader checks it, naming it)
    shape = _shape_of(x[0], name)
    cdef ArrayLayout probe = _layout(name, shape, None, x[1], 0, False)
    cdef int64_t n = probe.d.itemsize
    for extent in shape:
        n *= extent
    probe.d.ptr = <char*>addresses.take(n)
    return probe


cdef bint has_memory(object x):
    return type(x) is not ArrayLayout or (<ArrayLayout>x).has_memory


# What each determinism mode lets a call run (see cygemm.engine.families).
_KERNELS = {
    "off": "the fastest of cuBLASLt's candidates and cublasGemmEx (timed once when large)",
    "run_to_run": "split-free kernels of one cuBLASLt algorithm, the problem's own (cublasGemmEx below "
                  "the tuning size): the same bits in every process",
    "batch_invariant": "split-free kernels of the cuBLASLt algorithm chosen for the problem at "
                       "4096 x 4096 x K, whatever M: each row's bits independent of the others",
    "batch_invariant/cublas": "cuBLASLt's own batch invariance (CUBLASLT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS, "
                              "the operands' alignment class): each row's bits independent of the others",
}


cdef object _ptr(const void* p, bint memory):
    return <uintptr_t>p if memory and p != NULL else None


_OP_NAMES = {<int>CUBLAS_OP_N: "N", <int>CUBLAS_OP_T: "T", <int>CUBLAS_OP_C: "C"}


# The keys every description starts with, in this order (describe_call's; describe_matmul's
# entries for CuPy's path give them too).
DESCRIBE_KEYS = ("M", "N", "K", "batch", "swapped", "cublas_a", "cublas_b", "why", "determinism", "kernels",
                 "opa", "opb", "m", "n", "k", "lda", "ldb", "ldc", "stride_a", "stride_b", "stride_c", "a", "b", "c")


cdef dict describe_call(const MatrixView* va, const MatrixView* vb, const MatrixView* vc,
                        const ColMajorGemm* g, bint trans_a, bint trans_b, tuple names, tuple memory):
    a, b, out = names
    op_a = f"op({a})" if trans_a or trans_b else a
    op_b = f"op({b})" if trans_a or trans_b else b
    # The mapping's own rule (_mapping): a row-major out is computed transposed, operands swapped.
    cdef bint swapped = is_rowmajor(vc)
    if swapped:
        why = (f"{out} is row-major, which column-major cuBLAS reads as {out}^T: it computes "
               f"{out}^T = {op_b}^T @ {op_a}^T, so its first operand is {b} and its m, n are {out}'s "
               f"columns, rows")
    else:
        why = f"{out} is column-major as cuBLAS is: it computes {out} = {op_a} @ {op_b} as written"
    options = get_options()
    mode = options["determinism"]
    kernels = _KERNELS[mode]
    if mode == "batch_invariant" and options["batch_invariance"] == "cublas":
        from cygemm.engine import lt_features
        if lt_features.feature_gate("batch_invariance") is None:
            kernels = _KERNELS["batch_invariant/cublas"]
    d = dict(M=vc.rows, N=vc.cols, K=va.rows if trans_a else va.cols, batch=vc.batch if g == NULL else g.batch,
             swapped=swapped, cublas_a=b if swapped else a, cublas_b=a if swapped else b, why=why,
             determinism=mode, kernels=kernels)
    if g == NULL:
        d.update(dict.fromkeys(("opa", "opb", "m", "n", "k", "lda", "ldb", "ldc", "stride_a", "stride_b",
                                "stride_c", "a", "b", "c")))
        return d
    first_memory, second_memory = (memory[1], memory[0]) if swapped else (memory[0], memory[1])
    d.update(opa=_OP_NAMES[<int>g.opa], opb=_OP_NAMES[<int>g.opb],
             m=g.m, n=g.n, k=g.k, lda=g.lda, ldb=g.ldb, ldc=g.ldc,
             stride_a=g.stride_a, stride_b=g.stride_b, stride_c=g.stride_c,
             a=_ptr(g.a, first_memory), b=_ptr(g.b, second_memory), c=_ptr(g.c, memory[2]))
    return d
