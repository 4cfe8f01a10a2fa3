# cython: language_level=3, boundscheck=False, wraparound=False
# kernels: grouped
"""Grouped GEMMs: G independent row-major GEMMs of any sizes in one call (:func:`grouped_gemm`),
and the engine that runs the groups of the mixture-of-experts calls too (cygemm.grouped.moe).

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

from cygemm.engine.streams cimport check_stream_arg
from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.kernels.grouped cimport (cygemm_ptr_triples, cygemm_write_pointer_table,
                                     CYGEMM_GROUPED_PTRS_PER_LAUNCH)
from cygemm.engine.types cimport ColMajorGemm, MatrixView, Math, Scalars, real_scalars, compute_type
from cygemm.engine.mapping cimport map_rowmajor_gemm, MAP_OK
from cygemm.engine.operands cimport parse_trans
from cygemm.engine.arrays cimport Addresses, layout_operand, is_pair, has_memory, describe_call
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.errors import check_real
from cygemm.engine.args cimport CallArgs, args_init, prepare_call, check_overlaps, parse_math, CALL_GEMM
from cygemm.engine.context cimport GemmContext, stream_table, run_forked, STREAM_TABLE_BYTES
from cygemm.engine.settings cimport Policy, call_policy, AUTOTUNE_OFF, DETERMINISM_OFF
from cygemm.engine.execute cimport run_gemm
from cygemm.engine.launch cimport grouped_batched_run
from cygemm.engine.chooser cimport RouteTable, route_table, choose_route, describe_route, route_tabled
from cygemm.grouped.groups cimport (Groups, read_lists, check_group_devices, R_BATCHED, R_GROUPED, R_LOOP,
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
        grouped_batched_run(f.ctx, f.s, f.ops + start, d + start, f.scalars + start, n, <const void* const*>ta,
                            <const void* const*>tb, <void* const*>tc, f.dtype, <int>count, f.ones, f.compute)
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


# The grouped table for cygemm.engine.chooser.
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
    f.alpha, f.beta = check_real(alpha, "alpha"), check_real(beta, "beta")
    f.sc = real_scalars(f.alpha, f.beta)
    cdef Math m = parse_math(math)
    f.dtype = grp.dtype
    f.compute = compute_type(grp.dtype, m)
    call_policy(autotune, determinism, &f.policy)
    cdef int asked = _asked_route(grp, route, f.compute)
    if grp.n == 0:
        _tls.route = None
        return 0
    c.torch_arrays |= grp.torch
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
    "asked": "the call's route= asks for it, and it applies",
    None: "not decided yet: the first call times the routes that apply and keeps the fastest",
}


def describe_grouped(As, Bs, outs, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, str math="tf32",
                     stream=None, route=None, autotune=None, determinism=None):
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
    trans_a, trans_b, alpha, beta, math, route, autotune, determinism
        As :func:`grouped_gemm`, checked as it checks them (what would decide the route; a
        ``route`` that does not apply raises ValueError, as the call does).
    stream
        Taken as :func:`grouped_gemm` takes it; describing enqueues nothing.

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
    check_real(alpha, "alpha"), check_real(beta, "beta")
    check_stream_arg(stream)
    info = dict(groups=grp.n, active=grp.n_act, zero_k=grp.n_zero_k, macs=grp.macs)
    info.update(describe_host_routes(grp, math, autotune, determinism, route))
    cdef Policy policy
    call_policy(autotune, determinism, &policy)
    cdef cublasComputeType_t compute = compute_type(grp.dtype, parse_math(math))
    info["per_group"] = [_describe_group(grp, i, As[i], Bs[i], outs[i], info["chosen"], policy, compute)
                         for i in range(grp.n)]
    return info


cdef dict describe_host_routes(Groups grp, object math, object autotune, object determinism, object route=None):
    cdef GroupedCall f
    f.grp, f.compute = <void*>grp, compute_type(grp.dtype, parse_math(math))
    call_policy(autotune, determinism, &f.policy)     # (the fixed rule reads the determinism mode)
    cdef int asked = _asked_route(grp, route, f.compute)     # (ValueError where it does not apply)
    why = {n: grp.why_not(i, f.compute) for i, n in enumerate(_NAMES)}
    info = dict(routes=[n for n in _NAMES if why[n] is None],
                not_applicable={n: w for n, w in why.items() if w is not None}, chosen=None, decided_by=None)
    info["not_applicable"]["lt_grouped"] = LT_NEEDS_DEVICE_OFFSETS
    cdef int device = -1
    if grp.n_act:
        if route_tabled(_GROUPED, f.policy, _macs(grp)):
            from cygemm.engine import context as _context
            if _context.gpu_unavailable_reason() is None:       # the table is per GPU model
                device = _context.current_device()
        chosen, decided_by = describe_route(_GROUPED, &f, device, f.policy, _macs(grp))
        if asked >= 0:
            chosen, decided_by = _NAMES[asked], "asked"
        info.update(chosen=chosen, decided_by=decided_by)
    info["why_chosen"] = _WHY_CHOSEN[info["decided_by"]] if grp.n_act else "no group has anything to compute"
    return info


cdef int run_groups(Groups grp, CallArgs* c, object alpha, object beta, object math, object stream, object route,
                    object autotune, object determinism) except -1:
    return _run(grp, c, alpha, beta, math, stream, route, autotune, determinism)


cdef int note_route(object name) except -1:
    _tls.route = name
    return 0


LT_NEEDS_DEVICE_OFFSETS = ("it reads the group offsets from a device array (moe_gemm and moe_gemm_wgrad with "
                           "group_offsets on the GPU; cuBLASLt 13.8.1 or newer on compute capability 9.0, 10.x or 11.0): "
                           "these groups' sizes are on the host")


cdef dict _describe_group(Groups grp, int64_t i, object A, object B, object out, object chosen, Policy policy,
                          cublasComputeType_t compute):
    cdef MatrixView* v = &grp.views[3 * i]
    cdef ColMajorGemm g
    cdef bint mapped = map_rowmajor_gemm(v, v + 1, v + 2, grp.trans_a, grp.trans_b, &g) == MAP_OK
    g.batch, g.stride_a, g.stride_b, g.stride_c = 1, 0, 0, 0
    d = describe_call(v, v + 1, v + 2, &g if mapped else NULL, grp.trans_a, grp.trans_b,
                      (f"As[{i}]", f"Bs[{i}]", f"outs[{i}]"), (has_memory(A), has_memory(B), has_memory(out)),
                      policy, compute)
    d["route"] = None if d["M"] == 0 or d["N"] == 0 else ("loop" if d["K"] == 0 else chosen)
    return d
