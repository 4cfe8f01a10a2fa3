# cython: language_level=3, boundscheck=False, wraparound=False
"""Device arrays of CuPy, torch, __cuda_array_interface__ and DLPack read into views, once and
without touching the GPU (whether two views overlap: cygemm.engine.overlap)."""


# -------------------- described (merged into arrays)
# What every ``describe_*`` shares, so that all of them take the same operands and say the same
# things: operands read by their layout alone, and one cuBLAS call described.
#
# Operands: device arrays (CuPy, torch, ``__cuda_array_interface__``, DLPack) pass through to the
# usual readers unchanged (read, never touched). A NumPy array in host memory is read for its
# shape, strides, dtype and address; a ``(shape, dtype)`` pair is a C-contiguous array at a
# made-up address of its own (the pairs of one call never overlap). Either becomes an
# :class:`ArrayLayout`, which ``_arrays``' readers read as they read a device array. Dtypes by
# name or object: NumPy's, ml_dtypes' (bfloat16, float8_e4m3fn, float8_e5m2), torch's, and the
# names "bfloat16", "float8_e4m3fn"/"e4m3", "float8_e5m2"/"e5m2"; uint8 holds FP8 bytes.
#
# A call: the user's row-major terms first (M, N, K, batch, whether cuBLAS's operands are swapped
# and why), then the column-major arguments cuBLAS gets.
from libc.stdint cimport int64_t, uintptr_t

from cygemm.bindings.cudart cimport (cudaDataType, CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF, CUDA_R_64F,
                                     CUDA_C_32F, CUDA_C_64F, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_8U, CUDA_R_8I, CUDA_R_32I)
from cygemm.bindings.cublas cimport (CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C, cublasComputeType_t, CUBLAS_COMPUTE_32F,
                                     CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_64F, CUBLAS_COMPUTE_32I)
from cygemm.engine.types cimport MatrixView, ColMajorGemm, MAX_NDIM
from cygemm.engine.mapping cimport is_rowmajor
from cygemm.engine.settings import get_options
from cygemm.engine.settings cimport Policy, determinism_name, autotune_name
from cygemm.engine.dtypes import BY_ANY_NAME, ROWS
from cygemm.engine.dtypes cimport dtype_name, INT8_SUMS_DTYPE

import operator as _operator

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


_EXPECTED = "a device array, a host (NumPy) array or tensor, or a (shape, dtype) pair"


cdef object layout_operand(object x, str name, Addresses addresses):
    if isinstance(x, (list, tuple)) and not is_pair(x):
        raise TypeError(f"{name}: expected {_EXPECTED}, got a {type(x).__name__} that is no (shape, dtype) pair "
                        f"(for host data, pass numpy.asarray of it)")
    if isinstance(x, np.ndarray):
        if x.ndim > MAX_NDIM:
            raise ValueError(f"{name}: expected at most {MAX_NDIM} dimensions, got {x.ndim}")
        return _layout(name, tuple(x.shape), x.strides, x.dtype, x.__array_interface__["data"][0], True)
    if is_torch_tensor(x) and x.device.type == "cpu":     # a host tensor: its layout, as NumPy's
        if x.dim() > MAX_NDIM:
            raise ValueError(f"{name}: expected at most {MAX_NDIM} dimensions, got {x.dim()}")
        return _layout(name, tuple(x.shape), tuple([s * x.element_size() for s in x.stride()]), x.dtype,
                       x.data_ptr(), True)
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
# A compute type by the name of the math it runs (math="tf32" / "fp32"; float64's; int8's sums).
_COMPUTE_NAMES = {<int>CUBLAS_COMPUTE_32F_FAST_TF32: "tf32", <int>CUBLAS_COMPUTE_32F: "fp32",
                  <int>CUBLAS_COMPUTE_64F: "fp64", <int>CUBLAS_COMPUTE_32I: dtype_name(INT8_SUMS_DTYPE)}


# The keys every description starts with, in this order (describe_call's; describe_matmul's
# entries for CuPy's path give them too).
DESCRIBE_KEYS = ("M", "N", "K", "batch", "swapped", "cublas_a", "cublas_b", "why", "determinism", "kernels",
                 "opa", "opb", "m", "n", "k", "lda", "ldb", "ldc", "stride_a", "stride_b", "stride_c", "a", "b", "c",
                 "compute", "autotune")


cdef dict describe_call(const MatrixView* va, const MatrixView* vb, const MatrixView* vc,
                        const ColMajorGemm* g, bint trans_a, bint trans_b, tuple names, tuple memory,
                        Policy policy, cublasComputeType_t compute):
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
    mode = determinism_name(policy)             # (the call's: its determinism= or the option)
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
    else:
        first_memory, second_memory = (memory[1], memory[0]) if swapped else (memory[0], memory[1])
        d.update(opa=_OP_NAMES[<int>g.opa], opb=_OP_NAMES[<int>g.opb],
                 m=g.m, n=g.n, k=g.k, lda=g.lda, ldb=g.ldb, ldc=g.ldc,
                 stride_a=g.stride_a, stride_b=g.stride_b, stride_c=g.stride_c,
                 a=_ptr(g.a, first_memory), b=_ptr(g.b, second_memory), c=_ptr(g.c, memory[2]))
    d.update(compute=compute_name(compute), autotune=autotune_name(policy))
    return d


cdef str compute_name(cublasComputeType_t compute): return _COMPUTE_NAMES.get(<int>compute)

# -------------------- arrays
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t, uintptr_t

from cygemm.bindings.cudart cimport cudaDataType, CUDA_R_32F, CUDA_R_16F
from cygemm.engine.dtypes cimport (DTYPES_FLOAT, DTYPES_WIDE, DTYPES_GEMM, DTYPES_FP8, DTYPES_BYTES, DTYPES_INDEX, by_name,
                                   by_typestr, by_dlpack, dtype_name, expected_names, type_size, is_fp8_type)
from cygemm.engine.dtypes import ROWS, names, row_of_name, FP8_FORMATS, FORMATS_EXPECTED as _FORMATS_EXPECTED
from cygemm.engine.types cimport MatrixView, ArrayDesc, MAX_NDIM, view_is_empty

import sys as _sys

import numpy as _np

_sys_modules = _sys.modules

try:
    import cupy as _cupy
    _cupy_ndarray = _cupy.ndarray
except ImportError:
    _cupy = None
    _cupy_ndarray = None
#: CuPy and its ndarray type, or None where CuPy is not installed (the one optional import).
CUPY, CUPY_NDARRAY = _cupy, _cupy_ndarray


cdef extern from *:
    """
    /* DLPack v0.x ABI, enough to read a tensor's description. */
    typedef struct { int32_t device_type; int32_t device_id; } cg_DLDevice;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } cg_DLDataType;
    typedef struct {
        void* data; cg_DLDevice device; int32_t ndim; cg_DLDataType dtype;
        int64_t* shape; int64_t* strides; uint64_t byte_offset;
    } cg_DLTensor;
    """
    ctypedef struct cg_DLDevice:
        int32_t device_type, device_id
    ctypedef struct cg_DLDataType:
        uint8_t code, bits
        uint16_t lanes
    ctypedef struct cg_DLTensor:
        void* data
        cg_DLDevice device
        int32_t ndim
        cg_DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset

cdef enum:
    DL_INT = 0
    DL_FLOAT = 2
    DL_BFLOAT = 4
    DL_COMPLEX = 5
    DL_CUDA = 2
    DL_CPU = 1

# (cudaDataType, itemsize) by NumPy name, CAI typestr and DLPack (code, bits), indexed by a DTYPES_*
# level: the dtype table's (cygemm.engine.dtypes). bfloat16: torch's, or CuPy's through ml_dtypes
# (CuPy 14), whose typestr is '<V2'.
_BY_NAME = tuple([by_name(level) for level in range(DTYPES_INDEX + 1)])
_BY_TYPESTR = tuple([by_typestr(level) for level in range(DTYPES_INDEX + 1)])
_BY_DLPACK = tuple([by_dlpack(level) for level in range(DTYPES_INDEX + 1)])
_F32, _F16 = (CUDA_R_32F, type_size(CUDA_R_32F)), (CUDA_R_16F, type_size(CUDA_R_16F))
_NP_F32, _NP_F16 = _np.dtype(_np.float32), _np.dtype(_np.float16)


cdef object _bad_dtype(str name, str got, int wide):
    """TypeError for an array whose dtype (named `got`) the entry cannot take, with what to do
    instead: gemm or matmul for float64 and complex (wide False), a cast or CuPy for the rest."""
    msg = f"{name}: expected {expected_names(wide)}, got {got}"
    if wide == DTYPES_INDEX:            # (offsets: nothing to cast to a float)
        return TypeError(msg + " (offsets and indices are int32 or int64: x.astype(cupy.int32))")
    row = row_of_name(got)
    if got in by_name(DTYPES_WIDE) and not wide:
        msg += f" (cygemm.gemm and cygemm.matmul take {got}; or cast it with x.astype(cupy.float32))"
    elif row is not None and row["kind"] == "i" and row["listed"] and wide != DTYPES_GEMM:
        msg += f" (cygemm.gemm, gemm_strided_batched and int_mm multiply {got} into int32)"
    elif got.startswith(("int", "uint", "bool")):
        msg += (f" (cygemm has no {got} GEMM: use cupy.matmul or torch.matmul for {got}, or cast it "
                "to a float dtype with x.astype(cupy.float32))")
    return TypeError(msg)


cdef str _dlpack_dtype_name(int code, int bits, int lanes):
    """A DLPack dtype as NumPy names it (int32, complex64...), or its codes where it has no name."""
    kind = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}.get(code)
    if kind is None or lanes != 1:
        return f"DLPack dtype (code={code}, bits={bits}, lanes={lanes})"
    return "bool" if kind == "bool" else f"{kind}{bits}"


cdef str _typestr_name(str typestr):
    try:
        return _np.dtype(typestr).name
    except TypeError:
        return f"typestr {typestr!r}"


cdef int _fill_desc(ArrayDesc* d, str name, uintptr_t ptr, tuple shape, object strides, int itemsize,
                    int device) except -1:
    cdef int ndim = len(shape), i
    if ndim > MAX_NDIM:
        raise ValueError(f"{name}: expected at most {MAX_NDIM} dimensions, got {ndim}")
    cdef int64_t expect = 1
    d.ptr, d.ndim, d.itemsize, d.device, d.torch = <char*>ptr, ndim, itemsize, device, False
    # C-contiguous; also for an empty array, whose strides are meaningless (CuPy gives 0s).
    if strides is None or 0 in shape:
        for i in range(ndim - 1, -1, -1):
            d.shape[i] = shape[i]
            d.strides[i] = expect
            expect *= d.shape[i]
        return 0
    cdef int64_t st
    for i in range(ndim):
        d.shape[i] = shape[i]
        st = strides[i]
        if st % itemsize:
            raise ValueError(f"{name}: stride {st} bytes on axis {i} is not a multiple "
                             f"of the element size ({itemsize} bytes)")
        d.strides[i] = st // itemsize
    return 0


cdef tuple _ints(object seq):
    """seq as a tuple of ints: exact non-negative ints as they are (the common case, checked in
    C), anything else through operator.index (TypeError where it is no integer)."""
    cdef Py_ssize_t i, n
    if type(seq) is tuple:
        n = len(<tuple>seq)
        for i in range(n):
            item = (<tuple>seq)[i]
            if type(item) is not int or item < 0:
                break
        else:
            return <tuple>seq
    return tuple([_operator.index(v) for v in seq])


cdef tuple _cai_layout(str name, object cai):
    """A __cuda_array_interface__'s (shape, strides): integers, extents >= 0, else TypeError or
    ValueError naming the array (CuPy and torch give theirs; another producer's is checked here)."""
    shape, strides = cai.get("shape"), cai.get("strides")
    try:
        shape = _ints(shape)
        strides = None if strides is None else _ints(strides)
    except TypeError:
        raise TypeError(f"{name}: its __cuda_array_interface__ shape and strides must be tuples of integers "
                        f"(strides may be None), got {cai.get('shape')!r} and {cai.get('strides')!r}") from None
    for n in shape:
        if n < 0:
            raise ValueError(f"{name}: its __cuda_array_interface__ shape has a negative extent: {shape}")
    data = cai.get("data")
    if not (type(data) is tuple and len(<tuple>data) == 2 and type(data[0]) is int and data[0] >= 0):
        raise TypeError(f"{name}: its __cuda_array_interface__ data must be (pointer: int >= 0, read_only), got {data!r}")
    return shape, strides


cdef tuple desc_shape(const ArrayDesc* d):
    return tuple([d.shape[i] for i in range(d.ndim)])


cdef int read_array(object x, ArrayDesc* d, str name, int wide) except -1:
    """Read pointer, shape, strides, dtype and device of a device array, once, without touching
    the GPU. wide: DTYPES_FLOAT, DTYPES_WIDE or DTYPES_GEMM (which dtypes it takes; no other)."""
    cdef object dt
    if _cupy_ndarray is not None and type(x) is _cupy_ndarray:    # fast path: no dict built
        dt_obj = x.dtype
        # NumPy's builtin dtypes are singletons: identity beats building dtype.str.
        dt = _F32 if dt_obj is _NP_F32 else (_F16 if dt_obj is _NP_F16 else (
            _BY_NAME[wide]).get(dt_obj.name))
        if dt is None:
            raise _bad_dtype(name, str(x.dtype), wide)
        d.dtype = <cudaDataType>(<int>dt[0])
        mem = x.data        # its device_id spares check_devices a cudaPointerGetAttributes
        return _fill_desc(d, name, mem.ptr, x.shape, x.strides, dt[1], mem.device_id)
    if type(x) is ArrayLayout:      # a describe_* operand: a host array or a (shape, dtype) pair
        return _read_layout(<ArrayLayout>x, d, name, wide)
    if _torch_tensor is not None and isinstance(x, _torch_tensor):
        return _read_torch(x, d, name, wide)
    if _torch_tensor is None and _torch_imported() and _find_torch() and isinstance(x, _torch_tensor):
        return _read_torch(x, d, name, wide)            # (a subclass too)
    cdef object cai
    try:
        cai = x.__cuda_array_interface__
    except AttributeError:
        cai = None
    except (TypeError, BufferError, RuntimeError):  # e.g. torch bfloat16: use DLPack
        cai = None
    if cai is not None:
        dt = (<dict>_BY_TYPESTR[wide]).get(cai["typestr"])
        if dt is None and hasattr(x, "__dlpack__"):
            # CAI has no bfloat16 typestr (torch says '<V2'); DLPack names it.
            return _read_dlpack(x, d, name, wide)
        if dt is None:
            raise _bad_dtype(name, _typestr_name(cai["typestr"]), wide)
        d.dtype = <cudaDataType>(<int>dt[0])
        shape, strides = _cai_layout(name, cai)
        return _fill_desc(d, name, cai["data"][0], shape, strides, dt[1], -1)
    if isinstance(x, _np.ndarray):
        raise TypeError(f"{name}: expected a CUDA device array, got a NumPy array in host memory "
                        f"(move it to the GPU with cupy.asarray)")
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return _read_dlpack(x, d, name, wide)
    raise TypeError(f"{name}: expected a CUDA device array (__cuda_array_interface__ or DLPack "
                    f"on a CUDA device), got {type(x).__module__}.{type(x).__name__}")


cdef int _read_layout(ArrayLayout x, ArrayDesc* d, str name, int wide) except -1:
    cdef cudaDataType t = x.d.dtype
    if x.kind != LAYOUT_TYPED or dtype_name(t) not in <dict>_BY_NAME[wide]:
        raise TypeError(f"{name}: expected {expected_names(wide)}, got {x.dtype}")
    d[0] = x.d
    return 0


cdef int view_from_object(object x, MatrixView* view, str name, int min_ndim, int max_ndim,
                          int wide=DTYPES_FLOAT, bint* torch=NULL) except -1:
    """A (batch, rows, cols) view of a device array of min_ndim..max_ndim (<= 3) dimensions;
    a 1-D array is one row. wide: a DTYPES_* level. torch: set True when x is a torch tensor."""
    cdef ArrayDesc d
    read_array(x, &d, name, wide)
    if torch != NULL and d.torch:
        torch[0] = True
    return view_from_desc(&d, view, name, min_ndim, max_ndim)


cdef int view_from_desc(const ArrayDesc* dp, MatrixView* view, str name, int min_ndim, int max_ndim) except -1:
    cdef int ndim = dp.ndim
    if ndim < min_ndim or ndim > max_ndim:
        want = f"{min_ndim}-D" if min_ndim == max_ndim else f"{min_ndim}-D or {max_ndim}-D"
        raise ValueError(f"{name}: expected a {want} array, got {ndim}-D with shape {desc_shape(dp)}")
    view.ptr, view.itemsize, view.device, view.dtype = dp.ptr, dp.itemsize, dp.device, dp.dtype
    if ndim == 1:                             # a vector is one row
        view.rows, view.cols = 1, dp.shape[0]
        view.row_stride, view.col_stride = dp.shape[0], dp.strides[0]
        view.batch, view.batch_stride = 1, 0
        return 0
    view.rows, view.cols = dp.shape[ndim - 2], dp.shape[ndim - 1]
    view.row_stride, view.col_stride = dp.strides[ndim - 2], dp.strides[ndim - 1]
    if ndim == 3:
        view.batch, view.batch_stride = dp.shape[0], dp.strides[0]
    else:
        view.batch, view.batch_stride = 1, 0
    return 0


# torch tensors are read through their attributes: torch's __cuda_array_interface__ and
# __dlpack__ cost microseconds a call, and CAI refuses tensors that require grad or bfloat16.
cdef object _torch_tensor = None
cdef tuple _torch_by_level = None
cdef object _torch_grad_enabled = None


cdef bint is_torch(object x) except -1:
    """Whether x is a torch tensor (a subclass too; torch is not imported for the question)."""
    if type(x) is _cupy_ndarray:        # the common case
        return False
    if _torch_tensor is None and not (_torch_imported() and _find_torch()):
        return False
    return isinstance(x, _torch_tensor)


def is_torch_tensor(x):
    """Whether x is a torch tensor (a subclass too; torch is not imported for the question): the
    one test of it for cygemm's Python code."""
    return is_torch(x)


cdef inline bint _torch_imported():
    # (a dict lookup: a call on arrays of another library, torch not imported, pays only this)
    return "torch" in _sys_modules


cdef bint _find_torch() except -1:
    global _torch_tensor, _torch_by_level, _torch_grad_enabled
    import sys
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor"):
        return False
    # torch's dtype objects by level (its attributes of the table's names)
    _torch_by_level = tuple([{getattr(torch, n): v for n, v in (<dict>_BY_NAME[level]).items() if hasattr(torch, n)}
                             for level in range(DTYPES_INDEX + 1)])
    _torch_grad_enabled = torch.is_grad_enabled
    _torch_tensor = torch.Tensor
    return True


cdef int _refuse_recorded(object x, str name) except -1:
    # Only cygemm.matmul and cygemm.autograd are recorded: elsewhere a gradient would be lost.
    if x.requires_grad and _torch_grad_enabled():
        raise TypeError(f"{name}: a torch tensor that requires grad, and this cygemm call is not recorded by "
                        "torch's autograd (its gradient would be lost): use cygemm.matmul or "
                        "cygemm.autograd.linear, which are, or pass .detach() or call it under "
                        "torch.no_grad()")
    return 0


cdef int _read_torch(object x, ArrayDesc* d, str name, int wide) except -1:
    if not x.is_cuda:
        raise TypeError(f"{name}: expected a CUDA tensor, got a torch tensor on {x.device} (a CPU tensor "
                        "is not a CUDA array: move it with .cuda())")
    _refuse_recorded(x, name)
    dt = (<dict>_torch_by_level[wide]).get(x.dtype)
    if dt is None:
        raise _bad_dtype(name, str(x.dtype).replace("torch.", ""), wide)
    if x.is_conj() or x.is_neg():   # lazy x.conj(), x.mH, negation: the memory does not hold the values
        raise ValueError(f"{name}: a torch tensor with the conjugate or negative bit set (a lazy view such as "
                         "x.conj() or x.mH), wrong read raw: pass x.resolve_conj().resolve_neg(), or x with trans 'H'")
    d.dtype = <cudaDataType>(<int>dt[0])
    itemsize = dt[1]
    strides = tuple([st * itemsize for st in x.stride()])
    _fill_desc(d, name, x.data_ptr(), tuple(x.shape), strides, itemsize, x.get_device())
    d.torch = True
    return 0


cdef int _read_dlpack(object x, ArrayDesc* d, str name, int wide) except -1:
    dev = x.__dlpack_device__()
    if int(dev[0]) != DL_CUDA:
        where = "host memory" if int(dev[0]) == DL_CPU else f"DLPack device type {dev[0]}"
        raise TypeError(f"{name}: expected an array on a CUDA device, got "
                        f"{type(x).__module__}.{type(x).__name__} in {where} (move it to the GPU, "
                        "e.g. with cupy.asarray)")
    # The capsule keeps its own reference; x outlives this call, so the memory does too.
    capsule = x.__dlpack__(stream=-1)
    if not PyCapsule_IsValid(capsule, b"dltensor"):
        raise TypeError(f"{name}: __dlpack__ returned no 'dltensor' capsule")
    cdef cg_DLTensor* t = <cg_DLTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
    cdef int itemsize
    dt = (<dict>_BY_DLPACK[wide]).get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if dt is None:
        raise _bad_dtype(name, _dlpack_dtype_name(t.dtype.code, t.dtype.bits, t.dtype.lanes), wide)
    d.dtype = <cudaDataType>(<int>dt[0])
    itemsize = dt[1]
    shape = tuple([t.shape[i] for i in range(t.ndim)])
    strides = None if t.strides == NULL else tuple([t.strides[i] * itemsize for i in range(t.ndim)])
    return _fill_desc(d, name, <uintptr_t>t.data + t.byte_offset, shape, strides, itemsize,
                      t.device.device_id)

cdef int read_buffer(object x, MatrixView* view, str name) except -1:
    """A workspace of any dtype as a view of its bytes (one row of nbytes): C-contiguous, or
    TypeError/ValueError naming it."""
    cdef object cai
    try:
        cai = x.__cuda_array_interface__
    except AttributeError:
        raise TypeError(f"{name}: expected a CUDA device array, got {type(x).__module__}.{type(x).__name__}") from None
    shape = _cai_layout(name, cai)[0]
    itemsize = _np.dtype(cai["typestr"]).itemsize
    cdef int64_t n = 1
    for extent in shape:
        n *= extent
    strides = cai.get("strides")
    if strides is not None and n > 1:
        expect = itemsize
        for extent, st in reversed(list(zip(shape, strides))):
            if extent > 1 and st != expect:
                raise ValueError(f"{name}: expected a contiguous buffer, got strides {tuple(strides)} "
                                 f"bytes for shape {shape}")
            expect *= extent
    view.ptr = <char*><uintptr_t>cai["data"][0]
    view.batch, view.rows, view.cols = 1, 1, n * itemsize
    view.batch_stride, view.row_stride, view.col_stride = 0, n * itemsize, 1
    view.dtype, view.itemsize = CUDA_R_32F, 1          # dtype unused: only bytes matter
    view.device = x.data.device_id if _cupy_ndarray is not None and type(x) is _cupy_ndarray else -1
    return 0


def describe_array(x, str name="x"):
    """How cygemm reads `x`: dict of ptr, batch, rows, cols, strides (elements), dtype."""
    cdef MatrixView v
    view_from_object(x, &v, name, 2, 3)
    return dict(ptr=<uintptr_t>v.ptr, batch=v.batch, rows=v.rows, cols=v.cols,
                batch_stride=v.batch_stride, row_stride=v.row_stride, col_stride=v.col_stride,
                dtype=dtype_name(v.dtype))

# ---------------------------------------------------------------- FP8 arrays

_FP8_EXPECTED = ", ".join(names(DTYPES_FP8)) + " or " + names(DTYPES_BYTES)[0]     # (FP8 bytes)
_BYTES_TYPESTRS = by_typestr(DTYPES_BYTES)
cdef dict _torch_fp8 = None


cdef dict _torch_fp8_dtypes():
    global _torch_fp8
    if _torch_fp8 is None:
        import torch
        _torch_fp8 = {getattr(torch, n, None): (<dict>by_name(DTYPES_FP8))[n][0] for n in names(DTYPES_FP8)}
        _torch_fp8[torch.uint8] = None
        _torch_fp8.pop(None, None)
    return _torch_fp8


cdef int read_fp8(object x, ArrayDesc* d, str name, object fmt, str fmt_arg) except -1:
    """Read an FP8 array: a torch float8_e4m3fn / float8_e5m2 tensor (its format from its
    dtype), or uint8 bytes (CuPy, torch, __cuda_array_interface__) whose format `fmt` names."""
    cdef object found = False         # None: bytes of either format; else the tensor's format
    cdef ArrayLayout layout
    if fmt is not None and fmt not in FP8_FORMATS:
        raise ValueError(f"{fmt_arg}: expected {_FORMATS_EXPECTED}, got {fmt!r}")
    if type(x) is ArrayLayout:      # a describe_* operand: float8 dtypes carry their format
        layout = <ArrayLayout>x
        if layout.kind == LAYOUT_BYTES:
            found = None
        elif layout.kind == LAYOUT_TYPED and is_fp8_type(layout.d.dtype):
            found = layout.d.dtype
        else:
            raise TypeError(f"{name}: expected {_FP8_EXPECTED}, got {layout.dtype}")
        d[0] = layout.d
    elif _cupy_ndarray is not None and type(x) is _cupy_ndarray:
        if x.dtype != _np.uint8:
            raise TypeError(f"{name}: expected FP8 bytes (a uint8 array, with {fmt_arg}=), got {x.dtype}")
        mem = x.data
        _fill_desc(d, name, mem.ptr, x.shape, x.strides, 1, mem.device_id)
        found = None
    elif (_torch_tensor is not None or (_torch_imported() and _find_torch())) and isinstance(x, _torch_tensor):    # (subclasses too)
        if not x.is_cuda:
            raise TypeError(f"{name}: expected a CUDA tensor, got a torch tensor on {x.device}")
        _refuse_recorded(x, name)
        table = _torch_fp8_dtypes()
        if x.dtype not in table:
            raise TypeError(f"{name}: expected {_FP8_EXPECTED}, got {str(x.dtype).replace('torch.', '')}")
        found = table[x.dtype]
        _fill_desc(d, name, x.data_ptr(), tuple(x.shape), tuple(x.stride()), 1, x.get_device())
    else:
        try:
            cai = x.__cuda_array_interface__
        except AttributeError:
            raise TypeError(f"{name}: expected a CUDA device array of FP8 bytes, got "
                            f"{type(x).__module__}.{type(x).__name__}") from None
        if cai["typestr"] not in _BYTES_TYPESTRS:
            raise TypeError(f"{name}: expected FP8 bytes (a uint8 array, with {fmt_arg}=), got "
                            f"{_typestr_name(cai['typestr'])}")
        shape, strides = _cai_layout(name, cai)
        _fill_desc(d, name, cai["data"][0], shape, strides, 1, -1)
        found = None
    if found is None:
        if fmt is None:
            raise TypeError(f"{name}: a uint8 array can hold either FP8 format; say which with "
                            f"{fmt_arg}= ({_FORMATS_EXPECTED})")
        d.dtype = FP8_FORMATS[fmt]
    else:
        if fmt is not None and FP8_FORMATS[fmt] != found:
            raise TypeError(f"{name}: its dtype is {dtype_name(found)} but {fmt_arg}={fmt!r}")
        d.dtype = found
    d.itemsize = 1
    return 0
