# cython: language_level=3, boundscheck=False, wraparound=False
"""A mixture-of-experts layer's GEMMs over one token matrix sorted by expert: the forward and the
data gradient (:func:`moe_gemm`, ragged M) and the weight gradient (:func:`moe_gemm_wgrad`,
ragged K), with the experts' row offsets on the host or on the GPU.

Host offsets: the experts are groups of the grouped engine (cygemm.grouped.gemm), views of the
operands, by its routes. Offsets on the GPU: the one chooser decides between cuBLASLt's grouped
matmul fed on the device ("lt_grouped", cygemm.grouped.lt_grouped: no host sync, capturable, the
offsets read at replay) and reading the offsets to the host once ("host_offsets": one sync, then
the host routes; not inside a capture). Every argument is read and checked before anything is
enqueued, the offsets' values aside (they stay on the GPU: ``check_offsets=True`` reads them).
"""
from libc.stdint cimport int64_t
from cpython.ref cimport PyObject

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.kernels.grouped cimport CYGEMM_RAGGED_N, CYGEMM_RAGGED_K
from cygemm.engine.types cimport MatrixView, compute_type
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.args cimport (CallArgs, args_init, add_array, expect_dtype, prepare_call, check_overlaps,
                                 parse_math, ARG_READ, ARG_WRITE, CALL_GEMM)
from cygemm.engine.dtypes cimport DTYPES_INDEX
from cygemm.engine.context cimport GemmContext
from cygemm.engine.streams cimport stream_is_capturing
from cygemm.engine.settings cimport Policy, call_policy, DETERMINISM_OFF
from cygemm.engine.routes cimport RouteTable, route_table, choose_route, describe_route
from cygemm.engine.groups cimport Groups, read_moe, read_moe_wgrad, read_offsets
from cygemm.grouped.gemm cimport run_groups, describe_host_routes, note_route
from cygemm.grouped.lt_grouped cimport LtGroupedCall, why_not as lt_why_not, run_lt_grouped
from cygemm.grouped.gemm import ROUTES, LT_NEEDS_DEVICE_OFFSETS

_NAMES = tuple(ROUTES)

# The routes of the mixture-of-experts calls whose group offsets are a device array.
DEVICE_OFFSET_ROUTES = {
    "lt_grouped": "cuBLASLt's grouped matmul: the group sizes read on the GPU by cygemm's kernel, one "
                  "cublasLtMatmul for every group, no host sync (cuBLASLt 13.8.1 or newer, compute capability "
                  "9.0 or newer, bfloat16 or float16, every group 16-byte aligned)",
    "host_offsets": "the offsets read to the host (one sync of the stream), then the routes of host offsets "
                    "(ROUTES); refused inside a CUDA graph capture",
}
_DEVICE_NAMES = ("lt_grouped", "host_offsets")
cdef enum:
    D_LT_GROUPED = 0
    D_HOST_OFFSETS = 1

# cublasGemmGroupedBatchedEx reads A, B and C pointers from device memory: the stream's table
# holds, per cuBLAS call, `count` A pointers, then `count` B pointers, then `count` C pointers.

def moe_gemm(x, w, group_offsets, out, *, str w_layout="kn", str math="tf32", stream=None, route=None,
             autotune=None, determinism=None, bint check_offsets=False):
    """Mixture-of-experts GEMM: out[a:b] = x[a:b] @ w[g] for expert g's rows a:b of sorted tokens.

    Parameters
    ----------
    x : device array (T, K)
        Every token, sorted by expert: expert g's are rows ``group_offsets[g]:group_offsets[g+1]``.
    w : device array (G, K, N) or (G, N, K)
        The experts' weights, as ``w_layout`` says; any batch stride.
    group_offsets : sequence of int, or device array
        G + 1 non-decreasing offsets from 0 to T; an expert may have no rows. Host ints (a
        list, tuple or NumPy array), or a 1-D int32 or int64 device array (CuPy, torch, any
        ``__cuda_array_interface__``) on x's device: then nothing synchronizes where cuBLASLt's
        grouped matmul applies (route "lt_grouped"), and a captured graph replays with the
        offsets the array holds at replay.
    out : device array (T, N)
        The result, the dtype of x; shares memory with neither x, w nor the offsets.
    w_layout : {"kn", "nk"}
        "kn": ``w[g]`` is (K, N); "nk": ``w[g]`` is (N, K), the layout of a linear layer's
        weight, and ``out[a:b] = x[a:b] @ w[g].T``. The data gradient of ``out = x @ w[g]`` is
        ``moe_gemm(dout, w, offsets, dx, w_layout="nk")``, w read in place.
    math, stream, autotune, determinism
        As :func:`grouped_gemm`.
    route : optional
        One of ``ROUTES`` (host offsets, or device offsets read to the host first), or
        "lt_grouped" (device offsets); None: the chooser's (``describe_moe`` says which).
    check_offsets : bool
        Device offsets only: read them to the host (one sync) and refuse wrong ones with the
        ValueError host offsets get. Off (the default), offsets are not read back: wrong ones
        never make cuBLAS touch memory outside x, w and out (each is clamped to [0, T], a
        decreasing one makes its expert empty) but give wrong rows.

    Returns
    -------
    device array
        ``out``, each expert's rows written.

    Raises
    ------
    ValueError
        Shapes that do not fit, host offsets that do not start at 0, decrease, or do not end at
        T, device offsets of another length or not contiguous, an unknown ``w_layout``, an
        ``out`` sharing memory with x, w or the offsets, a ``route`` that is unknown or does
        not apply.
    TypeError
        Offsets that are not ints (host) or not int32/int64 (device), dtypes that differ, not
        device arrays.
    CaptureError
        Device offsets inside a CUDA graph capture where "lt_grouped" does not apply (reading
        them would need a sync); the message says why it does not.
    CygemmError
        "lt_grouped" on a cuBLASLt whose first-use check of it failed.
    CublasError, CudaError
        As :func:`grouped_gemm`.

    Notes
    -----
    The G groups are views of x, w and out (no copy), run by the engine of
    :func:`grouped_gemm`. Equal group sizes make one strided-batched GEMM ("batched").
    """
    cdef CallArgs c
    if _on_device(group_offsets):
        _moe_on_device(x, w, group_offsets, out, w_layout, False, math, stream, route, autotune, determinism,
                       check_offsets)
        return out
    cdef Groups grp = read_moe(&c, x, w, group_offsets, out, w_layout)
    check_overlaps(&c)
    run_groups(grp, &c, 1.0, 0.0, math, stream, route, autotune, determinism)
    return out


def moe_gemm_wgrad(x, dy, group_offsets, dw, *, str dw_layout="kn", str math="tf32", stream=None, route=None,
                   autotune=None, determinism=None, bint check_offsets=False):
    """The weight gradient of a mixture-of-experts GEMM: dw[g] = x[a:b].T @ dy[a:b] for expert g's
    rows a:b (ragged K), every expert's matrix in one preallocated dw.

    Parameters
    ----------
    x : device array (T, K)
        The layer's input, tokens sorted by expert (as :func:`moe_gemm` took it).
    dy : device array (T, N)
        The gradient of its output, the dtype of x.
    group_offsets : sequence of int, or device array
        As :func:`moe_gemm` (G + 1 offsets, G the experts of dw).
    dw : device array (G, K, N) or (G, N, K)
        The result, as ``dw_layout`` says; an expert with no rows gets zeros. Shares memory
        with none of x, dy and the offsets.
    dw_layout : {"kn", "nk"}
        "kn": ``dw[g] = x[a:b].T @ dy[a:b]`` (K, N), the gradient of ``moe_gemm``'s "kn"
        weight; "nk": ``dw[g] = dy[a:b].T @ x[a:b]`` (N, K), a linear layer's weight.
    math, stream, route, autotune, determinism, check_offsets
        As :func:`moe_gemm`.

    Returns
    -------
    device array
        ``dw``.

    Raises
    ------
    ValueError, TypeError, CaptureError, CygemmError, CublasError, CudaError
        As :func:`moe_gemm`, naming x, dy, dw or group_offsets.
    """
    cdef CallArgs c
    if _on_device(group_offsets):
        _moe_on_device(x, dy, group_offsets, dw, dw_layout, True, math, stream, route, autotune, determinism,
                       check_offsets)
        return dw
    cdef Groups grp = read_moe_wgrad(&c, x, dy, group_offsets, dw, dw_layout)
    check_overlaps(&c)
    run_groups(grp, &c, 1.0, 0.0, math, stream, route, autotune, determinism)
    return dw


# ---------------------------------------------------------------- offsets on the device

cdef bint _on_device(object offsets) except -1:
    """Whether group offsets are a device array (else host ints, read as before)."""
    if isinstance(offsets, (list, tuple, range)):
        return False
    if type(offsets).__module__.startswith("torch"):
        return bool(getattr(offsets, "is_cuda", False))
    if hasattr(offsets, "__cuda_array_interface__"):
        return True
    dev = getattr(offsets, "__dlpack_device__", None)
    return dev is not None and int(dev()[0]) == 2         # kDLCUDA


# One device-offset call, the state of its route table's hooks.
ctypedef struct _DeviceCall:
    LtGroupedCall lt
    GemmContext* ctx
    cudaStream_t s
    bint capturing
    Policy policy
    PyObject* py            # [args of the host route, why lt_grouped does not apply]: a borrowed list


cdef int _dev_applies(void* call, int route) except -1:
    cdef _DeviceCall* f = <_DeviceCall*>call
    if route == D_LT_GROUPED:
        return (<list>f.py)[1] is None
    return not f.capturing


cdef int _dev_rule(void* call) except -1:
    return D_LT_GROUPED if _dev_applies(call, D_LT_GROUPED) else D_HOST_OFFSETS


cdef object _dev_key(void* call):
    return ("moe_offsets",)             # never timed: the problem's sizes are on the device


cdef int _dev_enqueue(void* call, int route) except -1:
    cdef _DeviceCall* f = <_DeviceCall*>call
    if route == D_LT_GROUPED:
        from cygemm.engine import promises as _promises
        _promises.require("lt_grouped")
        run_lt_grouped(f.ctx, f.s, &f.lt)
        return 0
    a = (<list>f.py)[0]
    _host_route(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10])
    return 0


cdef RouteTable _DEVICE = route_table("moe_offsets", _DEVICE_NAMES, _dev_applies, _dev_rule, _dev_key, _dev_enqueue)


cdef list _offsets_to_host(cudaStream_t s, const MatrixView* ov):
    """The offsets as host ints, once the stream's work before them is done (one sync)."""
    import numpy as np
    cdef int64_t n = ov.cols
    buf = np.empty(n, np.int64 if ov.itemsize == 8 else np.int32)
    cdef size_t addr = buf.ctypes.data
    with nogil:
        check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize")
        check_cuda(cudaMemcpy(<void*>addr, ov.ptr, n * ov.itemsize, cudaMemcpyDeviceToHost), "cudaMemcpy")
    return buf.tolist()


cdef int _host_route(object x, object b, list offs, object out, str layout, bint wgrad, object math, object stream,
                     object route, object autotune, object determinism) except -1:
    cdef CallArgs c
    cdef Groups grp = (read_moe_wgrad(&c, x, b, offs, out, layout) if wgrad else read_moe(&c, x, b, offs, out, layout))
    check_overlaps(&c)
    run_groups(grp, &c, 1.0, 0.0, math, stream, route, autotune, determinism)
    return 0


cdef int _unit_rows(const MatrixView* v) noexcept nogil:
    return v.col_stride == 1 or v.cols <= 1


cdef object _fill_lt_call(LtGroupedCall* lt, const MatrixView* xv, const MatrixView* bv, const MatrixView* ov,
                          const MatrixView* offv, bint nk, bint wgrad):
    """The grouped matmul's problem in cuBLAS's terms (the row-major swap: a row-major (r, c)
    matrix is a column-major (c, r) one); None, or why its layout rules it out."""
    cdef int64_t isz = xv.itemsize, T = xv.rows, G = offv.cols - 1
    lt.dtype = xv.dtype
    lt.groups = <int>G
    lt.offsets = offv.ptr
    lt.offsets_64bit = offv.itemsize == 8
    lt.zero_out = NULL
    lt.elem_bytes = <int>isz
    lt.p.rows = T
    if not (_unit_rows(xv) and _unit_rows(bv) and _unit_rows(ov)):
        return "x, the weights and the output need rows of unit stride (C-order rows; any row stride)"
    if not wgrad:
        # out (T, N) = cuBLAS D (N x rows): A = w[g], B = x rows; m = N, n = the rows, k = K
        lt.p.a.base, lt.p.a.group_stride, lt.p.a.row_stride = bv.ptr, bv.batch_stride * isz, 0
        lt.p.b.base, lt.p.b.group_stride, lt.p.b.row_stride = xv.ptr, 0, xv.row_stride * isz
        lt.p.d.base, lt.p.d.group_stride, lt.p.d.row_stride = ov.ptr, 0, ov.row_stride * isz
        lt.p.m, lt.p.n, lt.p.k = <int>ov.cols, 0, <int>xv.cols
        lt.p.lda, lt.p.ldb, lt.p.ldd = <int>bv.row_stride, <int>xv.row_stride, <int>ov.row_stride
        lt.p.ragged = CYGEMM_RAGGED_N
        lt.opa = CUBLAS_OP_T if nk else CUBLAS_OP_N
        lt.opb = CUBLAS_OP_N
        lt.avg_m, lt.avg_n, lt.avg_k = ov.cols, T // G if G else 0, xv.cols
        return None
    # dw[g]: kn (K, N) = cuBLAS D (N x K) = dy rows (N x r) @ (x rows)^T; nk (N, K) = D (K x N) =
    # x rows (K x r) @ (dy rows)^T. k = the rows.
    cdef const MatrixView* av = xv if nk else bv
    cdef const MatrixView* cv = bv if nk else xv
    lt.p.a.base, lt.p.a.group_stride, lt.p.a.row_stride = av.ptr, 0, av.row_stride * isz
    lt.p.b.base, lt.p.b.group_stride, lt.p.b.row_stride = cv.ptr, 0, cv.row_stride * isz
    lt.p.d.base, lt.p.d.group_stride, lt.p.d.row_stride = ov.ptr, ov.batch_stride * isz, 0
    lt.p.m, lt.p.n, lt.p.k = <int>av.cols, <int>cv.cols, 0
    lt.p.lda, lt.p.ldb, lt.p.ldd = <int>av.row_stride, <int>cv.row_stride, <int>ov.row_stride
    lt.p.ragged = CYGEMM_RAGGED_K
    lt.opa, lt.opb = CUBLAS_OP_N, CUBLAS_OP_T
    lt.avg_m, lt.avg_n, lt.avg_k = av.cols, cv.cols, T // G if G else 0
    lt.zero_out = ov.ptr
    lt.zero_group_stride, lt.zero_rows, lt.zero_cols = ov.batch_stride * isz, ov.rows, ov.cols
    lt.zero_row_stride = ov.row_stride * isz
    return None


cdef object _read_device_call(CallArgs* c, object x, object b, object offsets, object out, str layout, bint wgrad,
                              LtGroupedCall* lt):
    """Read and check every argument of a device-offset call into c (no GPU needed): the same
    checks as host offsets, but for the offsets' values, which stay on the device."""
    cdef bint nk
    args_init(c)
    cdef MatrixView* xv
    cdef MatrixView* bv
    cdef MatrixView* ov
    cdef MatrixView* offv
    cdef int64_t T, K, N, G
    if wgrad:
        if layout != "kn" and layout != "nk":
            raise ValueError(f"dw_layout: expected 'kn' (dw is (G, K, N)) or 'nk' (dw is (G, N, K)), got {layout!r}")
        nk = layout == "nk"
        xv = add_array(c, x, "x", ARG_READ, 2, 2)
        bv = add_array(c, b, "dy", ARG_READ, 2, 2)
        offv = add_array(c, offsets, "group_offsets", ARG_READ, 1, 1, DTYPES_INDEX)
        ov = add_array(c, out, "dw", ARG_WRITE, 3, 3)
        expect_dtype(bv, "dy", xv.dtype, "x")
        expect_dtype(ov, "dw", xv.dtype, "x")
        T, K, N, G = xv.rows, xv.cols, bv.cols, ov.batch
        if bv.rows != T:
            raise ValueError(f"dy: expected {T} rows (the rows of x), got shape ({bv.rows}, {bv.cols})")
        if (ov.rows, ov.cols) != ((N, K) if nk else (K, N)):
            want = f"(G, {N}, {K})" if nk else f"(G, {K}, {N})"
            raise ValueError(f"dw: expected shape {want} for dw_layout={layout!r}, got ({G}, {ov.rows}, {ov.cols})")
    else:
        if layout != "kn" and layout != "nk":
            raise ValueError(f"w_layout: expected 'kn' (w is (G, K, N)) or 'nk' (w is (G, N, K)), got {layout!r}")
        nk = layout == "nk"
        xv = add_array(c, x, "x", ARG_READ, 2, 2)
        bv = add_array(c, b, "w", ARG_READ, 3, 3)
        offv = add_array(c, offsets, "group_offsets", ARG_READ, 1, 1, DTYPES_INDEX)
        ov = add_array(c, out, "out", ARG_WRITE, 2, 2)
        expect_dtype(bv, "w", xv.dtype, "x")
        expect_dtype(ov, "out", xv.dtype, "x")
        T, K, G = xv.rows, xv.cols, bv.batch
        N = bv.rows if nk else bv.cols
        if (bv.cols if nk else bv.rows) != K:
            want = f"(G, N, {K})" if nk else f"(G, {K}, N)"
            raise ValueError(f"w: x is ({T}, {K}) so w must be {want} for w_layout={layout!r}, got "
                             f"({G}, {bv.rows}, {bv.cols})")
        if ov.rows != T or ov.cols != N:
            raise ValueError(f"out: expected shape ({T}, {N}), got ({ov.rows}, {ov.cols})")
    if offv.cols != G + 1:
        raise ValueError(f"group_offsets: expected G + 1 = {G + 1} offsets ({'dw' if wgrad else 'w'} holds {G} "
                         f"experts), got {offv.cols}")
    if offv.col_stride != 1 and offv.cols > 1:
        raise ValueError(f"group_offsets: expected a contiguous 1-D array, got a stride of {offv.col_stride} elements")
    check_overlaps(c)
    return _fill_lt_call(lt, xv, bv, ov, offv, nk, wgrad)


cdef int _moe_on_device(object x, object b, object offsets, object out, str layout, bint wgrad, object math,
                        object stream, object route, object autotune, object determinism,
                        bint check_offsets) except -1:
    cdef CallArgs c
    cdef _DeviceCall f
    why_layout = _read_device_call(&c, x, b, offsets, out, layout, wgrad, &f.lt)
    host_route = route if route in _NAMES else None
    if route is not None and route not in _NAMES and route not in _DEVICE_NAMES:
        raise ValueError(f"route: expected None or one of "
                         f"{', '.join(repr(n) for n in _NAMES + _DEVICE_NAMES)}, got {route!r}")
    call_policy(autotune, determinism, &f.policy)
    prepare_call(&c, CALL_GEMM, stream, math, f.lt.dtype, False)       # (overlaps checked by the reader)
    f.ctx, f.s = c.ctx, c.stream
    f.capturing = stream_is_capturing(f.s)
    cdef const MatrixView* offv = &c.views[2]        # (x, w or dy, the offsets, out)
    if check_offsets:
        if f.capturing:
            raise _capture_error("check_offsets=True reads the offsets to the host, a sync a capture forbids")
        read_offsets(_offsets_to_host(f.s, offv), f.lt.groups, f.lt.p.rows)
    why_lt = why_layout if why_layout is not None else lt_why_not(&f.lt, f.ctx.device, f.capturing)
    if why_lt is None and f.policy.determinism != DETERMINISM_OFF:
        why_lt = ("a determinism mode: cuBLASLt's grouped matmul makes no promise of order, so the groups "
                  "run by the routes of host offsets")
    if why_lt is None and host_route is not None:
        why_lt = f"route={host_route!r} asks for the routes of host offsets"
    host_args = (x, b, None, out, layout, wgrad, math, stream, host_route, autotune, determinism)
    state = [host_args, why_lt]
    f.py = <PyObject*>state
    cdef int asked = -1
    if route == "lt_grouped":
        if why_lt is not None:
            raise ValueError(f"route: 'lt_grouped' does not apply: {why_lt}")
        asked = D_LT_GROUPED
    elif host_route is not None:
        asked = D_HOST_OFFSETS
    if f.capturing and why_lt is not None:
        raise _capture_error(f"group_offsets on the GPU inside a capture need cuBLASLt's grouped matmul "
                             f"(reading them would sync), which does not apply: {why_lt}")
    cdef int r = choose_route(_DEVICE, &f, f.ctx, f.s, f.policy, -1, False, asked, NULL)
    if r == D_HOST_OFFSETS:
        state[0] = (x, b, _offsets_to_host(f.s, offv), out, layout, wgrad, math, stream, host_route, autotune,
                    determinism)
    _dev_enqueue(&f, r)
    if r == D_LT_GROUPED:
        note_route("lt_grouped")
    return 0


cdef object _capture_error(str why):
    from cygemm.engine.errors import CaptureError
    return CaptureError(why)



def describe_moe(a, b, group_offsets, out, *, str kind="forward", str layout="kn", str math="tf32", autotune=None,
                 determinism=None, bint capturing=False):
    """Which route :func:`moe_gemm` (or :func:`moe_gemm_wgrad`) would take for these arguments,
    which routes could, why the others cannot, and whether the call synchronizes, without
    launching anything (no GPU needed; without one, "lt_grouped" says it needs a GPU).

    Parameters
    ----------
    a, b, group_offsets, out
        moe_gemm's ``x, w, group_offsets, out`` (kind "forward") or moe_gemm_wgrad's ``x, dy,
        group_offsets, dw`` (kind "wgrad"): device arrays, or stand-ins described but never read
        (objects with ``__cuda_array_interface__``). Host offsets are checked as the call checks
        them; device offsets are not read.
    kind : {"forward", "wgrad"}
        Which call.
    layout : {"kn", "nk"}
        ``w_layout`` (forward) or ``dw_layout`` (wgrad).
    math, autotune, determinism
        As the call.
    capturing : bool
        Describe the call as made inside a CUDA graph capture.

    Returns
    -------
    dict
        ``offsets`` ("device" or "host"), ``routes`` (the names that apply: of
        ``DEVICE_OFFSET_ROUTES`` for device offsets, of ``ROUTES`` for host ones),
        ``not_applicable`` ({name: why not}, "lt_grouped" always named where it does not
        apply, with the cuBLAS and GPU it needs), ``chosen`` (None where the call would time
        the routes first), ``decided_by``, ``why_chosen``, ``syncs`` (whether the chosen route
        synchronizes the host with the stream: reading device offsets does), ``groups``.

    Raises
    ------
    ValueError, TypeError
        As the call raises them for these arguments.
    """
    if kind not in ("forward", "wgrad"):
        raise ValueError(f"kind: expected 'forward' or 'wgrad', got {kind!r}")
    cdef bint wgrad = kind == "wgrad"
    cdef CallArgs c
    cdef _DeviceCall f
    cdef Groups grp
    call_policy(autotune, determinism, &f.policy)
    if not _on_device(group_offsets):
        grp = (read_moe_wgrad(&c, a, b, group_offsets, out, layout) if wgrad
               else read_moe(&c, a, b, group_offsets, out, layout))
        check_overlaps(&c)
        info = dict(offsets="host", groups=grp.n, syncs=False)
        info.update(describe_host_routes(grp, math, autotune, determinism))
        return info
    parse_math(math)
    why_layout = _read_device_call(&c, a, b, group_offsets, out, layout, wgrad, &f.lt)
    f.capturing = capturing
    from cygemm.engine import context as _context
    device = _context.current_device() if _context.gpu_unavailable_reason() is None else 0
    why_lt = why_layout if why_layout is not None else lt_why_not(&f.lt, device, capturing)
    if why_lt is None and f.policy.determinism != DETERMINISM_OFF:
        why_lt = ("a determinism mode: cuBLASLt's grouped matmul makes no promise of order, so the groups "
                  "run by the routes of host offsets")
    state = [None, why_lt]
    f.py = <PyObject*>state
    why = {"lt_grouped": why_lt,
           "host_offsets": "reading the offsets to the host is a sync, which a capture forbids" if capturing else None}
    info = dict(offsets="device", groups=f.lt.groups, routes=[n for n in _DEVICE_NAMES if why[n] is None],
                not_applicable={n: w for n, w in why.items() if w is not None})
    if not info["routes"]:
        info.update(chosen=None, decided_by=None, syncs=False,
                    why_chosen=f"none: the call raises CaptureError (lt_grouped: {why_lt})")
        return info
    chosen, decided_by = describe_route(_DEVICE, &f, -1, f.policy, -1)
    info.update(chosen=chosen, decided_by=decided_by, syncs=chosen == "host_offsets")
    info["why_chosen"] = ("cygemm.engine.tuning forces this route" if decided_by == "forced" else
                          "the fixed rule: 'lt_grouped' where it applies (no sync), else 'host_offsets'")
    return info


