# cython: language_level=3, boundscheck=False, wraparound=False
"""Grouped GEMMs: G independent row-major GEMMs of any sizes in one call (:func:`grouped_gemm`),
and the mixture-of-experts form over one token matrix sorted by expert (:func:`moe_gemm`).

Every group is read, mapped to cuBLAS (rowmajor's one mapping) and checked before anything is
enqueued. The groups then run by one of four routes (``ROUTES``): one
``cublasGemmGroupedBatchedEx``, one strided-batched GEMM when the groups are uniform, a loop of
plain GEMMs, or that loop spread over the caller's stream and its side stream. Large problems
time the routes that apply once and keep the fastest (the tuning table, kind "grouped"); small
ones take a fixed rule. Nothing allocates device memory: the grouped route's pointer arrays are
written by a kernel into the stream's table (see ``_context.stream_table``), so every route can
be captured into a CUDA graph.
"""
import threading

from libc.stdint cimport int64_t

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.kernels.grouped cimport (cygemm_ptr_triples, cygemm_write_pointer_table,
                                     CYGEMM_GROUPED_PTRS_PER_LAUNCH)
from cygemm.engine.types cimport ColMajorGemm, MatrixView, Math, Scalars, real_scalars, compute_type
from cygemm.engine.mapping cimport map_rowmajor_gemm, MAP_OK
from cygemm.engine.operands cimport parse_trans
from cygemm.engine.described cimport Addresses, layout_operand, is_pair, has_memory, describe_call
from cygemm.engine.errors cimport check_cuda, check_cublas
from cygemm.engine.args cimport CallArgs, args_init, prepare_call, check_overlaps, parse_math, CALL_GEMM
from cygemm.engine.context cimport GemmContext, bind_stream, stream_table, run_forked, STREAM_TABLE_BYTES
from cygemm.engine.settings cimport Policy, call_policy, AUTOTUNE_OFF, DETERMINISM_OFF
from cygemm.engine.execute cimport run_gemm
from cygemm.engine.routes cimport RouteTable, route_table, choose_route, describe_route, route_tabled
from cygemm.engine.args cimport add_array, expect_dtype, ARG_READ, ARG_WRITE
from cygemm.engine.dtypes cimport DTYPES_INDEX
from cygemm.engine.streams cimport stream_is_capturing
from cygemm.kernels.grouped cimport CYGEMM_RAGGED_N, CYGEMM_RAGGED_K
from cygemm.grouped.lt_grouped cimport LtGroupedCall, why_not as lt_why_not, run_lt_grouped
from cpython.ref cimport PyObject
from cygemm.engine.groups cimport (read_moe_wgrad, read_offsets)
from cygemm.engine.groups cimport (Groups, read_lists, read_moe, check_group_devices, R_BATCHED, R_GROUPED, R_LOOP,
                                   R_STREAMS)


# ---------------------------------------------------------------- route table

# The routes' numbers are _groups.GroupedRoute's (the fixed rule's order).
ROUTES = {
    "batched": "one strided-batched GEMM (the plan layer's choice): the groups share their sizes, "
               "leading dimensions and transposes, and their A, B and out advance by constant strides",
    "grouped": "cublasGemmGroupedBatchedEx, one group per GEMM; its pointer arrays written on the "
               "stream by cygemm's kernel (2730 GEMMs per cuBLAS call, larger G in several calls)",
    "loop": "each GEMM through the plan layer on the caller's stream, one after another",
    "streams": "the loop with the groups alternating between the caller's stream and its side "
               "stream (forked and joined back with events; a captured graph has two branches)",
}
_NAMES = ("batched", "grouped", "loop", "streams")

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
cdef int64_t PER_CALL = STREAM_TABLE_BYTES // (3 * sizeof(void*))       # 2730
# The fixed rule's threshold for the grouped route over the loop: below it the loop's few
# launches cost no more than the pointer kernels and the grouped call's setup.
cdef int64_t GROUPED_MIN_GROUPS = 8
# Problems of more groups are not timed (fixed rule): their keys, one entry per group, would
# bloat the tuning file, and the grouped route's one-call form is then the sensible choice.
cdef int64_t MAX_TUNED_GROUPS = 1024

_tls = threading.local()


def last_route():
    """The route the calling thread's last grouped call ran.

    Returns
    -------
    str or None
        A name of ``ROUTES``; None before any call, or when the last call launched nothing (no
        group, or only empty ones). A call whose only non-empty groups have K == 0 (out scaled
        by beta, each through the plan layer) reports "loop".

    Raises
    ------
    Nothing.
    """
    return getattr(_tls, "route", None)


# ---------------------------------------------------------------- running the routes

ctypedef struct GroupedCall:
    void* grp                       # the Groups run (borrowed: alive for the call)
    GemmContext* ctx
    cudaStream_t s
    cudaDataType dtype
    cublasComputeType_t compute
    float alpha
    float beta
    Scalars sc                      # the same, as the plan layer takes them
    Policy policy
    const ColMajorGemm* gs          # the active groups
    int64_t n
    const ColMajorGemm* batched     # where that route applies
    # cublasGemmGroupedBatchedEx's host arrays (Groups.host_arrays; NULL until that route runs)
    const int* dims
    const cublasOperation_t* ops
    const float* scalars
    const int* ones


cdef int _run_grouped(const GroupedCall* f) except -1 nogil:
    """cublasGemmGroupedBatchedEx over the groups, PER_CALL at a time. Each chunk's pointers go
    into the stream's table by kernel (by value: no host memory is read later, so a graph
    replays them), then cuBLAS reads them there; work on one stream is serial, so the next
    chunk's table rewrite waits for the previous GEMMs."""
    cdef cygemm_ptr_triples t
    cdef const void** table = <const void**>stream_table(f.ctx, f.s)
    cdef const void** ta
    cdef const void** tb
    cdef void** tc
    cdef int64_t start = 0, count, base, j, step, n = f.n
    cdef const ColMajorGemm* g
    cdef const int* d = f.dims
    while start < n:
        count = min(PER_CALL, n - start)
        ta, tb, tc = table, table + count, <void**>(table + 2 * count)
        base = 0
        while base < count:
            step = min(<int64_t>CYGEMM_GROUPED_PTRS_PER_LAUNCH, count - base)
            for j in range(step):
                g = &f.gs[start + base + j]
                t.a[j], t.b[j], t.c[j] = g.a, g.b, g.c
            check_cuda(cygemm_write_pointer_table(&t, <int>step, ta + base, tb + base, tc + base, f.s),
                       "cygemm_write_pointer_table")
            base += step
        bind_stream(f.ctx, f.s)
        check_cublas(cublasGemmGroupedBatchedEx(
            f.ctx.blas, f.ops + start, f.ops + n + start, d + start, d + n + start, d + 2 * n + start,
            f.scalars + start, <const void* const*>ta, f.dtype, d + 3 * n + start,
            <const void* const*>tb, f.dtype, d + 4 * n + start, f.scalars + n + start,
            <void* const*>tc, f.dtype, d + 5 * n + start, <int>count, f.ones, f.compute),
            "cublasGemmGroupedBatchedEx")
        start += count
    return 0


cdef int _bind_host_arrays(GroupedCall* f) except -1:
    cdef Groups grp = <Groups>f.grp
    grp.host_arrays(f.alpha, f.beta, f.s)
    f.dims, f.ops, f.scalars, f.ones = grp.dims, grp.ops, grp.scalars, grp.ones
    return 0


cdef int _run_streams(void* call, cudaStream_t main, cudaStream_t side) except -1:
    """Every other group on the side stream (its own workspace)."""
    cdef const GroupedCall* f = <const GroupedCall*>call
    cdef int64_t i
    with nogil:
        for i in range(f.n):
            run_gemm(f.ctx, side if i & 1 else main, &f.gs[i], f.dtype, f.compute, &f.sc,
                     f.policy)
    return 0


cdef int _run_route(GroupedCall* f, int route) except -1:
    cdef int64_t i
    if route == R_GROUPED:
        if f.dims == NULL:
            _bind_host_arrays(f)
        with nogil:
            _run_grouped(f)
        return 0
    if route == R_BATCHED:
        with nogil:
            run_gemm(f.ctx, f.s, f.batched, f.dtype, f.compute, &f.sc, f.policy)
        return 0
    if route == R_LOOP:
        with nogil:
            for i in range(f.n):
                run_gemm(f.ctx, f.s, &f.gs[i], f.dtype, f.compute, &f.sc, f.policy)
        return 0
    return run_forked(f.ctx, f.s, _run_streams, f)      # R_STREAMS


# The grouped table for cygemm.engine.routes.
cdef int _applies(void* call, int route) except -1:
    cdef const GroupedCall* f = <const GroupedCall*>call
    return (<Groups>f.grp).why_not(route, f.compute) is None


cdef int _fixed_rule(void* call) except -1:
    """Small problems, capture before any eager call, beta != 0 untimed: one strided-batched
    GEMM where the groups allow; else one grouped call for many groups; else the loop."""
    cdef const GroupedCall* f = <const GroupedCall*>call
    cdef Groups grp = <Groups>f.grp
    if f.policy.determinism != DETERMINISM_OFF:    # each group by its own plan: its rows, whatever the others'
        return R_LOOP
    if grp.why_not(R_BATCHED, f.compute) is None:
        return R_BATCHED
    if grp.n_act >= GROUPED_MIN_GROUPS and grp.why_not(R_GROUPED, f.compute) is None:
        return R_GROUPED
    return R_LOOP


cdef object _key(void* call):
    cdef const GroupedCall* f = <const GroupedCall*>call
    return (<Groups>f.grp).key(f.compute)


cdef int _enqueue(void* call, int route) except -1:
    return _run_route(<GroupedCall*>call, route)


cdef RouteTable _GROUPED = route_table("grouped", _NAMES, _applies, _fixed_rule, _key, _enqueue)


cdef double _macs(Groups grp) noexcept:
    """The problem's size for the chooser's rule; -1 (never timed) past MAX_TUNED_GROUPS groups."""
    return grp.macs if grp.n_act <= MAX_TUNED_GROUPS else -1


cdef int _route_index(object route) except -1:
    if route in _NAMES:
        return _NAMES.index(route)
    if route == "lt_grouped":
        raise ValueError("route: 'lt_grouped' does not apply: it reads the group offsets from a device array "
                         "(moe_gemm and moe_gemm_wgrad with group_offsets on the GPU)")
    raise ValueError(f"route: expected None or one of {', '.join(repr(n) for n in _NAMES)}, got {route!r}")


cdef int _asked_route(Groups grp, object route, cublasComputeType_t compute) except -2:
    """route=: its index (ValueError when unknown or when it cannot run these groups), -1: none."""
    if route is None:
        return -1
    cdef int r = _route_index(route)
    why = grp.why_not(r, compute)
    if why is not None:
        raise ValueError(f"route: {route!r} does not apply: {why}")
    return r


cdef int _run(Groups grp, CallArgs* c, object alpha, object beta, object math, object stream,
              object route, object autotune, object determinism) except -1:
    """The engine of grouped_gemm and moe_gemm: grp read and checked, c holding the buffers
    whose devices prepare_call checks (moe_gemm's x, w, out, their overlaps checked by moe_gemm; none for
    grouped_gemm)."""
    cdef GroupedCall f
    f.grp = <void*>grp
    f.alpha, f.beta = alpha, beta
    f.sc = real_scalars(f.alpha, f.beta)
    cdef Math m = parse_math(math)
    f.dtype = grp.dtype
    f.compute = compute_type(grp.dtype, m)
    call_policy(autotune, determinism, &f.policy)
    cdef int asked = _asked_route(grp, route, f.compute)
    if grp.n == 0:
        _tls.route = None
        return 0
    prepare_call(c, CALL_GEMM, stream, math, grp.dtype, False)    # overlaps checked before: the groups' sweep, moe's x/w/out
    check_group_devices(c, grp)
    f.ctx, f.s = c.ctx, c.stream
    f.gs, f.n = grp.act, grp.n_act
    f.batched = &grp.batched
    cdef int64_t i
    if grp.n_zero_k:
        # K == 0: out = beta out, which cublasGemmEx does (the plan layer sends k == 0 there).
        with nogil:
            for i in range(grp.n_zero_k):
                run_gemm(f.ctx, f.s, &grp.zero_k[i], f.dtype, f.compute, &f.sc, f.policy)
    if grp.n_act == 0:
        _tls.route = "loop" if grp.n_zero_k else None
        return 0
    f.dims, f.ops, f.scalars, f.ones = NULL, NULL, NULL, NULL
    # Timing runs write the outputs: only a beta 0 call may time.
    cdef int r = choose_route(_GROUPED, &f, f.ctx, f.s, f.policy, _macs(grp), f.beta == 0, asked, NULL)
    _run_route(&f, r)
    _tls.route = _NAMES[r]
    return 0


# ---------------------------------------------------------------- Python surface

cdef bint _flag(object value, str name) except -1:
    """A transpose flag as gemm takes it (False/True, "N", "T", "H": the groups are real, so "H"
    is "T"); anything else is refused rather than read as truthy."""
    cdef bint trans, conj
    parse_trans(value, name, &trans, &conj)
    return trans


def grouped_gemm(As, Bs, outs, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
                 str math="tf32", stream=None, route=None, autotune=None, determinism=None):
    """outs[g] = alpha * op(As[g]) @ op(Bs[g]) + beta * outs[g] for every group g, in one call.

    Parameters
    ----------
    As, Bs, outs : sequences of device arrays, 2-D
        One matrix each per group (G >= 0 groups), all of one dtype (float32, float16 or
        bfloat16); sizes may differ from group to group. Each is read in place as
        :func:`cygemm.gemm` reads its operands (C or F order, slices, ``.T``). A group whose
        out is empty is skipped; one with K == 0 gets ``outs[g] = beta * outs[g]``.
    trans_a, trans_b : bool or {"N", "T"}
        Use As[g].T / Bs[g].T (no copy), alike for every group.
    alpha, beta : float
        Scalars shared by every group.
    math : {"tf32", "fp32", "cupy"}
        As :func:`cygemm.gemm`.
    stream : optional
        As :func:`cygemm.gemm`; everything is enqueued there (the "streams" route also on the
        stream's side stream, joined back before the call returns).
    route : {None, "batched", "grouped", "loop", "streams"}
        Run this route (see ``ROUTES``); None: the forced route of ``cygemm.engine.tuning``, the
        tuned one, or the fixed rule.
    autotune : {None, "off", "auto", "exhaustive"}
        Whether a large call times the routes that apply (None: the option's), as
        :func:`cygemm.gemm`.
    determinism : {None, "off", "run_to_run", "batch_invariant"}
        As :func:`cygemm.gemm` (None: the option's). Other than "off", it replaces ``autotune``:
        the fixed rule picks the route, and each route's GEMMs run under the mode.

    Returns
    -------
    sequence
        ``outs``.

    Raises
    ------
    ValueError
        Lists of different lengths, shapes that do not multiply, a layout cuBLAS cannot read in
        place, an output sharing memory with an input or another output (each named, e.g.
        ``outs[3]``), a ``route`` that is unknown or does not apply to these groups, arrays or
        stream of another device.
    TypeError
        Not a sequence of device arrays, an unsupported dtype, or dtypes that differ between
        groups.
    CublasError, CudaError
        A failed cuBLAS/CUDA call, naming the status and the call.

    Notes
    -----
    Every group is read and checked before anything is enqueued. Allocates no device memory
    and can be captured into a CUDA graph. Large problems (``autotune_min_macs`` multiply-adds
    in all, at most 1024 groups, beta 0) time the routes that apply once and keep the fastest;
    others take the fixed rule: "batched" where it applies, else "grouped" for 8 or more
    groups, else "loop". :func:`~cygemm.grouped.last_route` names what ran.
    """
    cdef CallArgs c
    args_init(&c)
    cdef Groups grp = read_lists(As, Bs, outs, _flag(trans_a, "trans_a"), _flag(trans_b, "trans_b"))
    _run(grp, &c, alpha, beta, math, stream, route, autotune, determinism)
    return outs


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
    _run(grp, &c, 1.0, 0.0, math, stream, route, autotune, determinism)
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
    _run(grp, &c, 1.0, 0.0, math, stream, route, autotune, determinism)
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
    _run(grp, &c, 1.0, 0.0, math, stream, route, autotune, determinism)
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
        _tls.route = "lt_grouped"
    return 0


cdef object _capture_error(str why):
    from cygemm.engine.errors import CaptureError
    return CaptureError(why)


cdef object _layouts(object xs, str name, Addresses addresses):
    """A list of operands as describe_* reads them (not a sequence: as given, for read_lists to refuse)."""
    if is_pair(xs):
        raise TypeError(f"{name}: expected a list of operands, one a group, got one (shape, dtype) pair; "
                        f"for one group pass [{xs!r}]")
    try:
        return [layout_operand(x, f"{name}[{i}]", addresses) for i, x in enumerate(xs)]
    except TypeError:
        if not hasattr(xs, "__len__"):
            return xs
        raise


_WHY_CHOSEN = {
    "forced": "cygemm.engine.tuning forces this route",
    "tuned": "the fastest route when this problem was timed on this GPU (the tuning table)",
    "rule": "the fixed rule (a problem too small to time, or autotune off): 'batched' where it applies, "
            "else 'grouped' for 8 or more groups, else 'loop'",
    None: "not decided yet: the first call times the routes that apply and keeps the fastest",
}


def describe_grouped(As, Bs, outs, *, trans_a=False, trans_b=False, str math="tf32", autotune=None,
                     determinism=None):
    """Which routes :func:`grouped_gemm` could take for these groups, the one it would, and each
    group's cuBLAS arguments, without launching anything (no GPU needed).

    Parameters
    ----------
    As, Bs, outs : sequences of device arrays, NumPy arrays, or (shape, dtype) pairs
        What :func:`grouped_gemm` takes, or stand-ins read for their layout only (describing
        never touches memory): NumPy arrays in host memory (shape, strides, dtype, address) or
        ``(shape, dtype)`` pairs (C-contiguous, no memory; the pairs of one call are laid out
        one after another, As, then Bs, then outs, as slices of one buffer would be, so
        "batched" applies to pairs of equal shapes). Dtypes: float16, bfloat16 (torch's,
        ml_dtypes', or ``"bfloat16"``) or float32, one for all.
    trans_a, trans_b, math, autotune, determinism
        As :func:`grouped_gemm` (what would decide the route).

    Returns
    -------
    dict
        ``groups`` (G), ``active`` (groups with M, N, K > 0), ``zero_k`` (groups with M, N > 0
        and K == 0), ``macs``, ``routes`` (the names of ``ROUTES`` that apply, in the fixed
        rule's order), ``not_applicable`` ({name: why not}), ``chosen`` (the route a call would
        run when that is decided already: forced, tuned on this GPU, or the fixed rule for a
        problem too small to time; else None), ``decided_by`` ("forced", "tuned", "rule" or
        None), ``why_chosen`` (that in words), and ``per_group``: one dict per group with the
        keys of :func:`cygemm.describe_matmul`'s calls, in its order and with its meanings
        (``M``, ``N``, ``K``, ``batch`` (1), ``swapped``, ``cublas_a``, ``cublas_b`` (e.g.
        "Bs[2]"), ``why``, ``opa``, ``opb``, ``m``, ``n``, ``k``, ``lda``, ``ldb``, ``ldc``,
        ``stride_a``, ``stride_b``, ``stride_c``, ``a``, ``b``, ``c``; cuBLAS's arguments None
        for an empty group whose layout maps to none), then ``route``: what runs the group
        (``chosen`` for an active group, "loop" for K == 0, None for an empty out).

    Raises
    ------
    ValueError, TypeError
        As :func:`grouped_gemm` raises them for these arguments, naming the group's argument
        (e.g. ``outs[3]``); also a sequence that is no (shape, dtype) pair.
    """
    cdef Addresses addresses = Addresses()
    As, Bs, outs = _layouts(As, "As", addresses), _layouts(Bs, "Bs", addresses), _layouts(outs, "outs", addresses)
    cdef Groups grp = read_lists(As, Bs, outs, _flag(trans_a, "trans_a"), _flag(trans_b, "trans_b"))
    cdef GroupedCall f
    f.grp, f.compute = <void*>grp, compute_type(grp.dtype, parse_math(math))
    call_policy(autotune, determinism, &f.policy)     # (the fixed rule reads the determinism mode)
    why = {n: grp.why_not(i, f.compute) for i, n in enumerate(_NAMES)}
    info = dict(groups=grp.n, active=grp.n_act, zero_k=grp.n_zero_k, macs=grp.macs,
                routes=[n for n in _NAMES if why[n] is None],
                not_applicable={n: w for n, w in why.items() if w is not None}, chosen=None, decided_by=None)
    cdef int device = -1
    if grp.n_act:
        if route_tabled(_GROUPED, f.policy, _macs(grp)):
            from cygemm.engine import context as _context
            if _context.gpu_unavailable_reason() is None:       # the table is per GPU model
                device = _context.current_device()
        chosen, decided_by = describe_route(_GROUPED, &f, device, f.policy, _macs(grp))
        info.update(chosen=chosen, decided_by=decided_by)
    info["why_chosen"] = _WHY_CHOSEN[info["decided_by"]] if grp.n_act else "no group has anything to compute"
    info["not_applicable"]["lt_grouped"] = _LT_NEEDS_DEVICE_OFFSETS
    info["per_group"] = [_describe_group(grp, i, As[i], Bs[i], outs[i], info["chosen"]) for i in range(grp.n)]
    return info


_LT_NEEDS_DEVICE_OFFSETS = ("it reads the group offsets from a device array: moe_gemm and moe_gemm_wgrad with "
                            "group_offsets on the GPU")


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
    cdef GroupedCall hf
    call_policy(autotune, determinism, &f.policy)
    if not _on_device(group_offsets):
        grp = (read_moe_wgrad(&c, a, b, group_offsets, out, layout) if wgrad
               else read_moe(&c, a, b, group_offsets, out, layout))
        check_overlaps(&c)
        hf.grp, hf.compute = <void*>grp, compute_type(grp.dtype, parse_math(math))
        hf.policy = f.policy
        why = {n: grp.why_not(i, hf.compute) for i, n in enumerate(_NAMES)}
        why["lt_grouped"] = _LT_NEEDS_DEVICE_OFFSETS
        info = dict(offsets="host", groups=grp.n, routes=[n for n in _NAMES if why[n] is None],
                    not_applicable={n: w for n, w in why.items() if w is not None}, chosen=None, decided_by=None,
                    syncs=False)
        if grp.n_act:
            chosen, decided_by = describe_route(_GROUPED, &hf, -1, hf.policy, _macs(grp))
            info.update(chosen=chosen, decided_by=decided_by)
        info["why_chosen"] = _WHY_CHOSEN[info["decided_by"]] if grp.n_act else "no group has anything to compute"
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


cdef dict _describe_group(Groups grp, int64_t i, object A, object B, object out, object chosen):
    cdef MatrixView* v = &grp.views[3 * i]
    cdef ColMajorGemm g
    cdef bint mapped = map_rowmajor_gemm(v, v + 1, v + 2, grp.trans_a, grp.trans_b, &g) == MAP_OK
    g.batch, g.stride_a, g.stride_b, g.stride_c = 1, 0, 0, 0
    d = describe_call(v, v + 1, v + 2, &g if mapped else NULL, grp.trans_a, grp.trans_b,
                      (f"As[{i}]", f"Bs[{i}]", f"outs[{i}]"), (has_memory(A), has_memory(B), has_memory(out)))
    d["route"] = None if d["M"] == 0 or d["N"] == 0 else ("loop" if d["K"] == 0 else chosen)
    return d
