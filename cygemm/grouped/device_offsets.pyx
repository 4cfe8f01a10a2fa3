# cython: language_level=3, boundscheck=False, wraparound=False
"""The mixture-of-experts calls whose group offsets are a device array: the one chooser decides
between cuBLASLt's grouped matmul fed on the device ("lt_grouped", cygemm.grouped.lt_grouped: no
host sync, capturable, the offsets read at replay) and reading the offsets to the host once
("host_offsets": one sync, then the routes of host offsets; not inside a capture, where the call
raises CaptureError saying why lt_grouped does not apply). The callers (cygemm.grouped.moe,
cygemm.grouped.moe_fp8) read and check their arguments and fill the grouped problem; the
offsets' values stay on the GPU unless check_offsets reads them.
"""
from libc.stdint cimport int64_t, uintptr_t
from cpython.ref cimport PyObject

from cygemm.bindings.cudart cimport *
from cygemm.engine.types cimport MatrixView
from cygemm.engine.dtypes cimport dtype_name, expected_names, DTYPES_INDEX
from cygemm.engine.dtypes import names
from cygemm.engine.arrays cimport ArrayLayout, is_torch
from cygemm.engine.errors cimport check_cuda
from cygemm.engine.args cimport CallArgs
from cygemm.engine.context cimport GemmContext
from cygemm.engine.streams cimport stream_is_capturing
from cygemm.engine.settings cimport Policy, call_policy, DETERMINISM_OFF
from cygemm.engine.chooser cimport RouteTable, route_table, choose_route, describe_route
from cygemm.grouped.groups cimport read_offsets
from cygemm.grouped.gemm cimport note_route
from cygemm.grouped.lt_grouped cimport LtGroupedCall, why_not as lt_why_not, run_lt_grouped

DEVICE_OFFSET_ROUTES = {
    "lt_grouped": "cuBLASLt's grouped matmul: the group sizes read on the GPU by cygemm's kernel, one "
                  "cublasLtMatmul for every group, no host sync (cuBLASLt 13.8.1 or newer, compute capability "
                  "9.0, 10.x or 11.0, bfloat16 or float16 (or FP8), every group 16-byte aligned)",
    "host_offsets": "the offsets read to the host (one sync of the stream), then the routes of host offsets "
                    "(ROUTES); refused inside a CUDA graph capture",
}
_DEVICE_NAMES = ("lt_grouped", "host_offsets")
cdef enum:
    D_LT_GROUPED = 0
    D_HOST_OFFSETS = 1

# cublasGemmGroupedBatchedEx reads A, B and C pointers from device memory: the stream's table
# holds, per cuBLAS call, `count` A pointers, then `count` B pointers, then `count` C pointers.


cdef bint on_device(object offsets) except -1:
    if isinstance(offsets, (list, tuple, range)):
        return False
    if type(offsets) is ArrayLayout:        # a view of an XLA buffer (cygemm.jax), or a describe_* layout
        return (<ArrayLayout>offsets).on_gpu
    if is_torch(offsets):
        return bool(getattr(offsets, "is_cuda", False))
    if hasattr(offsets, "__cuda_array_interface__"):
        return True
    dev = getattr(offsets, "__dlpack_device__", None)
    return dev is not None and int(dev()[0]) == 2         # kDLCUDA


# One device-offset call, the state of its route table's hooks.
ctypedef struct _DeviceCall:
    LtGroupedCall* lt
    GemmContext* ctx
    cudaStream_t s
    bint capturing
    Policy policy
    PyObject* py            # [host_run, its offsets, its route, why lt_grouped does not apply, its promise]: a borrowed list


cdef int _applies(void* call, int route) except -1:
    cdef _DeviceCall* f = <_DeviceCall*>call
    if route == D_LT_GROUPED:
        return (<list>f.py)[3] is None
    return not f.capturing


cdef int _rule(void* call) except -1:
    return D_LT_GROUPED if _applies(call, D_LT_GROUPED) else D_HOST_OFFSETS


cdef object _key(void* call):
    return ("moe_offsets",)             # never timed: the problem's sizes are on the device


cdef int _enqueue(void* call, int route) except -1:
    cdef _DeviceCall* f = <_DeviceCall*>call
    if route == D_LT_GROUPED:
        from cygemm.engine import promises as _promises
        _promises.require((<list>f.py)[4])
        run_lt_grouped(f.ctx, f.s, f.lt)
        note_route("lt_grouped")
        return 0
    state = <list>f.py
    state[0](state[1], state[2])
    return 0


cdef RouteTable _DEVICE = route_table("moe_offsets", _DEVICE_NAMES, _applies, _rule, _key, _enqueue)


cdef list offsets_to_host(object stream_ptr, const MatrixView* ov):
    import numpy as np
    cdef cudaStream_t s = <cudaStream_t><uintptr_t>stream_ptr
    cdef int64_t n = ov.cols
    buf = np.empty(n, np.int64 if ov.itemsize == 8 else np.int32)
    cdef size_t addr = buf.ctypes.data
    with nogil:
        check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize")
        check_cuda(cudaMemcpy(<void*>addr, ov.ptr, n * ov.itemsize, cudaMemcpyDeviceToHost), "cudaMemcpy")
    return buf.tolist()


cdef object _why_not_lt(LtGroupedCall* lt, object why_layout, int device, bint capturing, Policy policy,
                       bint check, str promise):
    """Why lt_grouped cannot run the call (None: it can). check: run its first-use check now if
    it has not run on this cuBLASLt (describe only reads a verdict already known)."""
    why = why_layout if why_layout is not None else lt_why_not(lt, device, capturing)
    if why is None and policy.determinism != DETERMINISM_OFF:
        why = ("a determinism mode: cuBLASLt's grouped matmul makes no promise of order, so the groups run by "
               "the routes of host offsets")
    if why is None:
        from cygemm.engine import promises as _promises
        holds = _promises.holds(promise) if check else _promises.known(promise)
        if holds is False:
            why = (f"its first-use check failed on the loaded cuBLASLt {_promises._cublaslt_version()} "
                   f"(cygemm.engine.promises, {promise!r}): it is not trusted there")
    return why


cdef object _capture_error(str why):
    from cygemm.engine.errors import CaptureError
    return CaptureError(why)


cdef int check_offsets_view(const MatrixView* ov) except -1:
    name = dtype_name(ov.dtype)
    if name not in names(DTYPES_INDEX):
        raise TypeError(f"group_offsets: expected {expected_names(DTYPES_INDEX)} offsets, got {name}")
    if ov.col_stride != 1 and ov.cols > 1:
        raise ValueError(f"group_offsets: expected a contiguous 1-D array, got a stride of {ov.col_stride} elements")
    if (<uintptr_t>ov.ptr) % ov.itemsize:
        raise ValueError(f"group_offsets: expected its start aligned to its {ov.itemsize}-byte elements, got address "
                         f"{<uintptr_t>ov.ptr:#x}")
    return 0


cdef int check_route(object route, tuple host_names) except -1:
    if route is not None and route not in host_names and route not in _DEVICE_NAMES:
        raise ValueError(f"route: expected None or one of "
                         f"{', '.join(repr(n) for n in host_names + _DEVICE_NAMES)}, got {route!r}")
    return 0


cdef int run_on_device(CallArgs* c, int offsets_at, LtGroupedCall* lt, object why_layout, object host_run,
                       object route, object autotune, object determinism, bint check_offsets,
                       tuple host_names, str what, str promise="lt_grouped") except -1:
    cdef _DeviceCall f
    check_route(route, host_names)
    host_route = route if route in host_names else None
    call_policy(autotune, determinism, &f.policy)
    f.lt, f.ctx, f.s = lt, c.ctx, c.stream
    f.capturing = stream_is_capturing(f.s)
    cdef const MatrixView* offv = &c.views[offsets_at]
    stream_ptr = <uintptr_t>f.s
    if check_offsets:
        if f.capturing:
            raise _capture_error("check_offsets=True reads the offsets to the host, a sync a capture forbids")
        read_offsets(offsets_to_host(stream_ptr, offv), lt.groups, lt.p.rows)
    why_lt = _why_not_lt(lt, why_layout, f.ctx.device, f.capturing, f.policy, True, promise)
    if why_lt is None and host_route is not None:
        why_lt = f"route={host_route!r} asks for the routes of host offsets"
    state = [host_run, None, host_route, why_lt, promise]
    f.py = <PyObject*>state
    cdef int asked = -1
    if route == "lt_grouped":
        if why_lt is not None:
            raise ValueError(f"route: 'lt_grouped' does not apply: {why_lt}")
        asked = D_LT_GROUPED
    elif host_route is not None or route == "host_offsets":
        asked = D_HOST_OFFSETS
    if f.capturing and why_lt is not None:
        raise _capture_error(f"{what} on the GPU inside a capture need cuBLASLt's grouped matmul (reading them "
                             f"would sync), which does not apply: {why_lt}")
    cdef int r = choose_route(_DEVICE, &f, f.ctx, f.s, f.policy, -1, False, asked, NULL)
    if r == D_HOST_OFFSETS:
        state[1] = offsets_to_host(stream_ptr, offv)
    _enqueue(&f, r)
    return 0


cdef dict describe_on_device(LtGroupedCall* lt, object why_layout, object autotune, object determinism,
                             bint capturing, str promise="lt_grouped"):
    cdef _DeviceCall f
    call_policy(autotune, determinism, &f.policy)
    f.lt, f.capturing = lt, capturing
    from cygemm.engine import context as _context
    device = _context.current_device() if _context.gpu_unavailable_reason() is None else 0
    why_lt = _why_not_lt(lt, why_layout, device, capturing, f.policy, False, promise)
    state = [None, None, None, why_lt, promise]
    f.py = <PyObject*>state
    why = {"lt_grouped": why_lt,
           "host_offsets": "reading the offsets to the host is a sync, which a capture forbids" if capturing else None}
    info = dict(offsets="device", groups=lt.groups, routes=[n for n in _DEVICE_NAMES if why[n] is None],
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
