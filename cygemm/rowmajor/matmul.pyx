# cython: language_level=3, boundscheck=False, wraparound=False
"""cygemm.matmul: NumPy's matmul on device arrays of any library, read in place.

Each operand's last two axes go to cuBLAS through the one mapping (_mapping: leading dimensions and
op flags, so transposed views and slices are not copied); the batch axes are broadcast with
stride 0, merged where their strides allow, and the innermost run becomes one strided-batched
GEMM (the others, if any, a loop of such calls with no copy). What a call copies, casts or
allocates is decided once, from the layouts, before anything runs (_batch_layout's
decide_copies); then it runs.
"""
cimport cython
from libc.stdint cimport int64_t, uintptr_t

from cygemm.engine.streams cimport check_stream_arg
from cygemm.bindings.cudart cimport (cudaStream_t, cudaDataType, CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF, CUDA_R_64F,
                                     CUDA_C_32F, CUDA_C_64F)
from cygemm.bindings.cublas cimport cublasComputeType_t, CUBLAS_OP_T, CUBLAS_COMPUTE_32F
from cygemm.engine.types cimport (ArrayDesc, MatrixView, ColMajorGemm, Scalars, real_scalars, is_complex_type, Math,
                                  compute_type)
from cygemm.engine.errors cimport refuse_in_capture
from cygemm.engine.context cimport GemmContext
from cygemm.engine.arrays cimport read_array, desc_shape
from cygemm.engine.dtypes cimport dtype_name, promote_rank
from cygemm.engine.args cimport (CallArgs, args_init, add_view, prepare_call, parse_math, CALL_GEMM, ARG_READ,
                                 ARG_WRITE)
from cygemm.engine.settings cimport Policy, call_policy, default_policy
from cygemm.engine.execute cimport run_gemm
from cygemm.engine.small_batched cimport describe_route_of
from cygemm.engine.mapping cimport MapResult, MAP_OK, map_rowmajor_gemm, check_batch_disjoint, is_rowmajor, layout_error
from cygemm.engine.arrays cimport Addresses, layout_operand, has_memory, describe_call
from cygemm.rowmajor.batch_layout cimport (BatchLayout, MatmulPlan, read_layout, result_shape, has_result_shape,
                                         merge_out, check_out, empty_batch, may_overlap_inputs, call_views, span_view,
                                         decide_copies)
from cygemm.engine.alloc cimport is_torch, new_array, torch_dtype, torch_stream
from cygemm.engine import alloc as _alloc
from cygemm.engine.dtypes import numpy_dtype
from cygemm.engine.alloc import as_cupy
from cygemm.rowmajor import matmul_fallback as _matmul_fallback
from cygemm.engine.arrays import DESCRIBE_KEYS


__all__ = ["matmul", "describe_matmul"]


# ------------------------------------------------------------ dtypes and array libraries

cdef cudaDataType _promote(cudaDataType x, cudaDataType y) noexcept:
    """As cp.matmul / torch promote among float16, bfloat16, float32, float64, complex64 and
    complex128 (the table's ranks): complex with either complex, its parts as wide as the wider
    operand's; float16 with bfloat16, float32."""
    if x == y:
        return x
    cdef int rx = promote_rank(x), ry = promote_rank(y)
    if is_complex_type(x) or is_complex_type(y):
        return CUDA_C_64F if max(rx, ry) == promote_rank(CUDA_C_64F) else CUDA_C_32F
    if rx == ry:            # float16 with bfloat16: neither holds the other
        return CUDA_R_32F
    return x if rx > ry else y


cdef object _contiguous(object x, cudaDataType t, cudaStream_t s):
    """x as a new C-ordered array of dtype t and of x's own library, copied on stream s."""
    if is_torch(x):
        import torch
        with torch.cuda.stream(torch_stream(torch, s, x.device)):
            return x.to(torch_dtype(torch, t)).contiguous()
    import cupy
    with _alloc.stream_context(<uintptr_t>s):
        return cupy.ascontiguousarray(as_cupy(x), dtype=numpy_dtype(dtype_name(t)))


cdef int _copy_into(object out, object src, cudaStream_t s) except -1:
    """out[...] = src on stream s, whichever libraries the two come from."""
    if is_torch(out):
        import torch
        with torch.cuda.stream(torch_stream(torch, s, out.device)):
            out.copy_(src if is_torch(src) else torch.as_tensor(src, device=out.device))
        return 0
    with _alloc.stream_context(<uintptr_t>s):
        as_cupy(out)[...] = as_cupy(src)      # casts when the dtypes differ
    return 0


# ------------------------------------------------------------ torch's autograd

# The function that runs a call autograd must record: cygemm.autograd's, set by the package's
# __init__ (this compiled layer names nothing above it; torch is imported only on that path).
cdef object _grad_path = None
cdef object _is_grad_enabled = None


def _set_grad_path(fn):
    global _grad_path
    _grad_path = fn


cdef bint _records_grad(object a, object b, object out) except -1:
    """Whether torch's autograd must record matmul(a, b, out): a torch tensor among them
    requires grad (checked first: False in inference) and grad mode is on."""
    global _is_grad_enabled
    if not (getattr(a, "requires_grad", False) or getattr(b, "requires_grad", False)
            or (out is not None and getattr(out, "requires_grad", False))):
        return False
    if _is_grad_enabled is None:
        import torch
        _is_grad_enabled = torch.is_grad_enabled
    return _is_grad_enabled() and _grad_path is not None


# ------------------------------------------------------------ matmul

cdef int _read_operands(object a, object b, object out, ArrayDesc* da, ArrayDesc* db, ArrayDesc* dc,
                        BatchLayout* L, cudaDataType* t) except -1:
    """matmul's argument path, shared with describe_matmul: read a, b (and out), check shapes
    as NumPy does, promote the dtype into t, and check out's shape and that its matrices do
    not overlap one another. Returns whether out has another dtype than t (a cast follows)."""
    read_array(a, da, "a", True)
    read_array(b, db, "b", True)
    if da.ndim == 0 or db.ndim == 0:
        raise ValueError(f"{'a' if da.ndim == 0 else 'b'}: matmul needs at least 1 dimension, got a 0-D array")
    t[0] = _promote(da.dtype, db.dtype)
    read_layout(da, db, L)
    if out is None:
        return 0
    read_array(out, dc, "out", True)
    if is_complex_type(t[0]) and not is_complex_type(dc.dtype):
        raise TypeError(f"out: the product of {dtype_name(da.dtype)} and {dtype_name(db.dtype)} is "
                        f"{dtype_name(t[0])}, which a {dtype_name(dc.dtype)} out cannot hold (NumPy refuses "
                        f"this cast too): pass a complex out")
    if not has_result_shape(dc, L):
        raise ValueError(f"out: expected shape {result_shape(L)}, got {desc_shape(dc)}")
    check_out(L, dc, da, db)
    return dc.dtype != t[0]


cdef int _check_call(CallArgs* c, const ArrayDesc* da, const ArrayDesc* db, const ArrayDesc* dc,
                     bint has_out, str math, cudaDataType t, object stream) except -1:
    """The common preamble (math, stream, context, devices) through the one argument path. The
    overlaps are matmul's own (an out sharing memory with a or b is written through a
    temporary), so its overlaps are checked on the memory each array spans."""
    cdef MatrixView v
    args_init(c)
    span_view(da, &v)
    add_view(c, &v, "a", ARG_READ, da.torch)
    span_view(db, &v)
    add_view(c, &v, "b", ARG_READ, db.torch)
    if has_out:
        span_view(dc, &v)
        add_view(c, &v, "out", ARG_WRITE, dc.torch)
    return prepare_call(c, CALL_GEMM, stream, math, t, False)


@cython.binding(False)             # a builtin function: torch.compile takes its stand-in (cygemm.autograd.traced)
@cython.embedsignature(True)
@cython.embedsignature.format("clinic")   # (inspect.signature reads it)
def matmul(a, b, out=None, *, str math="tf32", stream=None, autotune=None, determinism=None):
    """Matrix product with NumPy's ``matmul`` semantics, on CUDA arrays, through cuBLAS.

    Parameters
    ----------
    a, b : device arrays
        CuPy arrays, torch CUDA tensors, or any object with ``__cuda_array_interface__`` or
        ``__dlpack__`` on a CUDA device. float16, bfloat16, float32, float64, complex64 and
        complex128 (and mixes of them, cast to the promoted dtype) run through cuBLAS as
        described here; any other pair of dtypes ``cp.matmul`` takes (integers, booleans, and
        their mixes with floats) runs through CuPy's own matmul on ``stream``, with NumPy's
        type promotion (``math``, ``autotune`` and ``determinism`` do not apply;
        :func:`describe_matmul` says which path a call takes; for int8 x int8 with exact int32
        sums, see :func:`cygemm.int_mm`).
        1-D operands are promoted as NumPy does (a row for ``a``, a column for ``b``, the
        axis removed from the result); batch axes (all but the last two) broadcast.
    out : device array, optional
        Where to write the result: its shape must be the result's; any strides, as long as its
        matrices do not overlap one another. It may share memory with ``a`` or ``b``: then the
        product is computed into a temporary first, as NumPy does. An ``out`` of another float
        dtype gets the result cast into it (NumPy's ``same_kind`` casting): the product is
        computed in the promoted dtype of ``a`` and ``b``, into a temporary.
    math : {"tf32", "fp32", "cupy"}
        float32 and complex64 products: "tf32" (``CUBLAS_COMPUTE_32F_FAST_TF32``, the
        default), "fp32" (strict), "cupy" (as ``cp.matmul``: TF32 only when the environment
        sets ``CUPY_TF32=1``). float16/bfloat16 accumulate in fp32, float64 and complex128 in
        fp64.
    stream : optional
        A ``cupy.cuda.Stream``, ``torch.cuda.Stream``, an object with ``__cuda_stream__`` or
        an int ``cudaStream_t``. None: the current stream of the inputs' library (torch's for
        torch tensors, else CuPy's).
    autotune : {None, "off", "auto", "exhaustive"}
        As :func:`cygemm.gemm`.
    determinism : {None, "off", "run_to_run", "batch_invariant"}
        The same bits in every process, or also for every number of rows (None: the option's;
        see :doc:`/reproducibility`). Other than "off", it replaces ``autotune``.

    Returns
    -------
    array
        ``out`` when given; else a new C-ordered array of the inputs' library (a torch tensor
        from torch's allocator when either input is one, else a CuPy array from CuPy's pool),
        allocated on ``stream``. When a torch input requires grad and grad mode is on, the
        call goes through :class:`cygemm.autograd.MatmulFunction` and the tensor has a ``grad_fn``
        (``loss.backward()`` runs cygemm's GEMMs); under ``torch.no_grad()`` it has none.

    Raises
    ------
    ValueError
        Shapes that do not multiply or broadcast, an ``out`` of the wrong shape, an ``out``
        whose matrices overlap.
    TypeError
        A non-device array or an unsupported dtype.
    CaptureError
        A call that must allocate (``out=None``, a dtype cast, an unreadable layout, an
        overlapping ``out``) while ``stream`` is being captured.
    RuntimeError
        ``out`` given while autograd records the call (as torch's ``out=`` functions refuse).

    Notes
    -----
    No operand is copied when its last two axes have unit stride along one of them
    (C- or F-ordered matrices, transposed views, row/column slices, stride-0 broadcasts).
    Copies are made, on ``stream``, only for: operands of different dtypes (cast to the
    promoted dtype), a matrix with no unit-stride axis (e.g. ``x[::2, ::2]``), an ``out`` of
    another dtype, and an ``out`` that overlaps an input or cannot be written in place. Without them, and with ``out``
    given, the call allocates nothing and can be captured into a CUDA graph.
    """
    if _matmul_fallback.takes(a, b):    # a dtype cygemm's GEMMs do not take: CuPy's matmul runs it
        return _matmul_fallback.run(a, b, out, stream)
    cdef bint torch_lib = is_torch(a) or is_torch(b)
    if torch_lib and _records_grad(a, b, out):     # torch's autograd records the call (cygemm.autograd)
        return _grad_path(a, b, out, math, stream, autotune, determinism)
    cdef ArrayDesc da, db, dc
    cdef BatchLayout L0, L
    cdef cudaDataType t
    _read_operands(a, b, out, &da, &db, &dc, &L0, &t)
    cdef Policy policy
    call_policy(autotune, determinism, &policy)
    cdef CallArgs c
    _check_call(&c, &da, &db, &dc, out is not None, math, t, stream)
    cdef cudaStream_t s = c.stream
    cdef MatmulPlan p
    reason = decide_copies(&da, &db, &dc, out is not None, t, &L0, &L, &p)
    if p.empty:
        return out if out is not None else new_array(torch_lib, a if is_torch(a) else b, result_shape(&L0), t, s)
    # From here on the arguments are valid: the plan's copies, then the GEMMs.
    target = out
    if reason is not None:
        refuse_in_capture(s, reason)
        like = a if is_torch(a) else b     # the library and device of new arrays
        if p.copy_a:
            a = _contiguous(a, t, s)
            read_array(a, &da, "a", True)
        if p.copy_b:
            b = _contiguous(b, t, s)
            read_array(b, &db, "b", True)
        if p.new_result or p.via_temp:
            target = new_array(torch_lib, out if p.temp_like_out and is_torch(out) else like,
                                result_shape(&L0), t, s)
            read_array(target, &dc, "out", True)
        read_layout(&da, &db, &L)
        merge_out(&L, &dc, &da, &db, &L)
    _run_plan(c.ctx, s, &L, &da, &db, &dc, t, c.compute, policy)
    if p.via_temp:          # computed into a temporary: now into out (cast as NumPy does)
        _copy_into(out, target, s)
        return out
    return target


cdef int _run_plan(GemmContext* ctx, cudaStream_t s, const BatchLayout* L, const ArrayDesc* da,
                   const ArrayDesc* db, const ArrayDesc* dc, cudaDataType t, cublasComputeType_t compute,
                   Policy policy) except -1:
    """The GEMMs of a decided call: every operand now reads and writes in place."""
    cdef ColMajorGemm g
    cdef MatrixView va, vb, vc
    call_views(L, da, db, dc, 0, 0, 0, &va, &vb, &vc)
    if map_rowmajor_gemm(&va, &vb, &vc, False, False, &g) != MAP_OK:
        raise RuntimeError("cygemm.matmul: the arrays it made do not have the layout it decided (internal error)")
    if g.batch > 1:
        check_batch_disjoint(&g, "out")       # a temporary's: always passes; out's was checked first
    return _run_all(ctx, s, L, da, db, dc, t, compute, policy)


cdef int _run_all(GemmContext* ctx, cudaStream_t s, const BatchLayout* L, const ArrayDesc* a,
                  const ArrayDesc* b, const ArrayDesc* c, cudaDataType t,
                  cublasComputeType_t compute, Policy policy, list calls=None, tuple memory=None) except -1:
    """One strided-batched GEMM per index of the outer batch axes (none: one call).
    calls: a list to describe the calls into instead of launching them (memory: whether a, b
    and out have memory, for describe_call)."""
    cdef int outer = L.nb - 1 if L.nb > 0 else 0, i
    cdef int64_t idx[64]
    cdef int64_t off_a, off_b, off_c
    cdef MatrixView va, vb, vc
    cdef ColMajorGemm g
    cdef Scalars sc = real_scalars(1.0, 0.0)
    for i in range(outer):
        idx[i] = 0
    while True:
        off_a = off_b = off_c = 0
        for i in range(outer):
            off_a += idx[i] * L.sa[i]
            off_b += idx[i] * L.sb[i]
            off_c += idx[i] * L.sc[i]
        call_views(L, a, b, c, off_a, off_b, off_c, &va, &vb, &vc)
        map_rowmajor_gemm(&va, &vb, &vc, False, False, &g)   # same strides as the checked call
        g.strided_batched = g.batch > 1
        if calls is not None:
            described = describe_call(&va, &vb, &vc, &g, False, False, ("a", "b", "out"), memory, policy,
                                      compute)
            described.update(describe_route_of(&g, t, compute, policy))
            calls.append(described)
        else:
            with nogil:
                run_gemm(ctx, s, &g, t, compute, &sc, policy)
        i = outer - 1                   # next index, last axis fastest
        while i >= 0:
            idx[i] += 1
            if idx[i] < L.size[i]:
                break
            idx[i] = 0
            i -= 1
        if i < 0:
            return 0


def describe_matmul(a, b, out=None, *, str math="tf32", stream=None, autotune=None, determinism=None):
    """The cuBLAS calls ``matmul(a, b, out, ...)`` makes, without launching anything (no GPU needed).

    Parameters
    ----------
    a, b : device array, NumPy array, or (shape, dtype) pair
        What :func:`matmul` takes, or a stand-in read for its layout only (describing never
        touches memory): a NumPy array in host memory (its shape, strides, dtype and address),
        or a ``(shape, dtype)`` pair, a C-contiguous array with no memory. Device arrays
        (CuPy, torch CUDA tensors, objects with ``__cuda_array_interface__``) are read, never
        touched. Dtypes: float16, bfloat16 (torch's, ml_dtypes', or the name ``"bfloat16"``),
        float32, float64, a and b of one dtype (matmul would cast); or any dtypes that go to
        CuPy's matmul (described as such).
    out : the same, optional
        None: a new C-ordered result of the promoted dtype, as ``matmul(a, b)`` makes.
    math, autotune, determinism
        As :func:`matmul`, checked as it checks them; the calls described are the ones it makes
        with them (their compute type, policy and route).
    stream
        Taken as :func:`matmul` takes it; describing enqueues nothing.

    Returns
    -------
    list of dict
        One dict per cuBLAS call (none for an empty result), with the keys every ``describe_*``
        gives (:func:`cygemm.describe_gemm`, :func:`cygemm.fp8.describe_scaled_matmul`, each
        group of :func:`cygemm.describe_grouped`), in this order, then ``path``: "cublas". For
        dtypes that go to CuPy's matmul instead (see :func:`matmul`), one dict with the same
        keys, ``M``, ``N``, ``K``, ``batch`` and ``why`` filled and the cuBLAS arguments None,
        and ``path`` "cupy.matmul". In the user's row-major terms:

        - ``M``, ``N``, ``K``: the call's out is M x N, the sum runs over K;
        - ``batch``: the matrices of the call (a strided-batched GEMM when > 1);
        - ``swapped``: True when out is row-major, which column-major cuBLAS reads as its
          transpose: it then computes ``out^T = b^T @ a^T``, so its first operand is b;
        - ``cublas_a``, ``cublas_b``: which argument ("a" or "b") is cuBLAS's first and second
          operand;
        - ``why``: that in words.

        Then cuBLAS's (column-major) arguments: ``opa``, ``opb`` ("N" or "T"), ``m``, ``n``,
        ``k``, the leading dimensions ``lda``, ``ldb``, ``ldc`` and the batch strides
        ``stride_a``, ``stride_b``, ``stride_c`` (elements), and the pointers ``a``, ``b``,
        ``c`` (ints: device addresses, or a NumPy array's host address; None for a
        ``(shape, dtype)`` pair and for out=None's new result, which have no memory).
        Then ``compute`` ("tf32", "fp32" or "fp64": the compute type ``math`` gives this
        dtype), ``autotune`` (the level the call runs at: a determinism mode runs at "auto") and ``route``: "kernel" where cygemm's kernel
        for batches of small matrices runs the call, "cublas", or "timed" (both are timed on
        the first call and the faster kept).

    Raises
    ------
    ValueError
        Where matmul would copy instead (dtypes differ, a layout cuBLAS cannot read or write in
        place, an ``out`` sharing memory with ``a`` or ``b``), and for the errors matmul raises.
    TypeError
        As matmul, naming the argument; also a sequence that is no (shape, dtype) pair.
    """
    cdef Math m = parse_math(math)
    cdef Policy policy
    call_policy(autotune, determinism, &policy)
    check_stream_arg(stream)
    if _matmul_fallback.takes(a, b, describing=True):
        return [_matmul_fallback.describe(a, b, DESCRIBE_KEYS)]
    cdef Addresses addresses = Addresses()
    a, b = layout_operand(a, "a", addresses), layout_operand(b, "b", addresses)
    cdef tuple memory = (has_memory(a), has_memory(b), out is not None)
    if out is None:         # the result's shape by NumPy's rules (read_layout checks them again)
        out = layout_operand(_result_of(a, b), "out", addresses)
    else:
        out = layout_operand(out, "out", addresses)
        memory = memory[:2] + (has_memory(out),)
    cdef ArrayDesc da, db, dc
    cdef BatchLayout L
    cdef cudaDataType t
    if _read_operands(a, b, out, &da, &db, &dc, &L, &t) or da.dtype != db.dtype:
        raise _cast_error(&da, &db, &dc, t)
    if may_overlap_inputs(&L, &dc, &da, &db):
        raise ValueError("out: shares memory with a or b: matmul would use a temporary")
    merge_out(&L, &dc, &da, &db, &L)
    cdef MatrixView va, vb, vc
    cdef ColMajorGemm g
    call_views(&L, &da, &db, &dc, 0, 0, 0, &va, &vb, &vc)
    cdef MapResult r = map_rowmajor_gemm(&va, &vb, &vc, False, False, &g)
    if r != MAP_OK:
        raise layout_error(r, &va, &vb, &vc, ("a", "b", "out"), ": matmul would copy it, and "
                           "describe_matmul describes only calls that read and write in place")
    calls = []
    if L.M and L.N and not empty_batch(&L):
        _run_all(NULL, NULL, &L, &da, &db, &dc, da.dtype, compute_type(da.dtype, m), policy, calls, memory)
    for d in calls:
        d["path"] = "cublas"
    return calls


cdef object _cast_error(const ArrayDesc* da, const ArrayDesc* db, const ArrayDesc* dc, cudaDataType t):
    """describe_matmul's ValueError where matmul would cast: names the arguments and their dtypes."""
    if da.dtype != db.dtype:
        return ValueError(f"a/b: dtypes differ (a is {dtype_name(da.dtype)}, b is {dtype_name(db.dtype)}): "
                          f"matmul would cast both to {dtype_name(t)} first; describe_matmul describes only "
                          f"calls without casts: pass a and b of one dtype (e.g. x.astype('{dtype_name(t)}'))")
    return ValueError(f"out: its dtype is {dtype_name(dc.dtype)} but a and b are {dtype_name(t)}: matmul would "
                      f"compute in {dtype_name(t)} and cast into out; describe_matmul describes only calls "
                      f"without casts: pass an out of dtype {dtype_name(t)}")


cdef tuple _result_of(object a, object b):
    """(shape, dtype) of matmul(a, b)'s new result, checked as matmul checks them."""
    cdef ArrayDesc da, db
    cdef BatchLayout L
    read_array(a, &da, "a", True)
    read_array(b, &db, "b", True)
    if da.ndim == 0 or db.ndim == 0:
        raise ValueError(f"{'a' if da.ndim == 0 else 'b'}: matmul needs at least 1 dimension, got a 0-D array")
    read_layout(&da, &db, &L)
    return result_shape(&L), dtype_name(_promote(da.dtype, db.dtype))
