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
cimport cython
from libc.stdint cimport int64_t

from cygemm.engine.streams cimport check_stream_arg
from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.kernels.grouped cimport CYGEMM_RAGGED_N, CYGEMM_RAGGED_K
from cygemm.engine.types cimport MatrixView, ColMajorGemm, compute_type
from cygemm.engine.mapping cimport map_or_raise
from cygemm.engine.args cimport CallArgs, prepare_call, check_overlaps, parse_math, CALL_GEMM
from cygemm.engine.context cimport GemmContext
from cygemm.engine.errors import check_flag
from cygemm.engine.arrays cimport Addresses, layout_operand, compute_name
from cygemm.grouped.groups cimport Groups, read_moe, read_moe_args, check_experts_disjoint
from cygemm.grouped.gemm cimport run_groups, describe_host_routes
from cygemm.grouped.lt_grouped cimport LtGroupedCall, LT_NAMES_FORWARD, LT_NAMES_WGRAD_KN, LT_NAMES_WGRAD_NK
from cygemm.grouped.device_offsets cimport (on_device, check_route, check_offsets_view, run_on_device,
                                            describe_on_device)
from cygemm.engine.settings cimport Policy, call_policy, determinism_name, autotune_name
from cygemm.grouped.gemm import ROUTES
# The routes of the calls whose group offsets are a device array.
from cygemm.grouped.device_offsets import DEVICE_OFFSET_ROUTES  # noqa: F401 (re-exported)

import functools

_NAMES = tuple(ROUTES)


@cython.binding(False)             # a builtin function: torch.compile takes its stand-in (cygemm.autograd.traced)
@cython.embedsignature(True)
@cython.embedsignature.format("clinic")   # (inspect.signature reads it)
def moe_gemm(x, w, group_offsets, out, *, str w_layout="kn", str math="tf32", stream=None, route=None,
             autotune=None, determinism=None, check_offsets=False):
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
    _moe(x, w, group_offsets, out, w_layout, False, math, stream, route, autotune, determinism,
         check_flag(check_offsets, "check_offsets"))
    return out


@cython.binding(False)             # a builtin function: torch.compile takes its stand-in (cygemm.autograd.traced)
@cython.embedsignature(True)
@cython.embedsignature.format("clinic")   # (inspect.signature reads it)
def moe_gemm_wgrad(x, dy, group_offsets, dw, *, str dw_layout="kn", str math="tf32", stream=None, route=None,
                   autotune=None, determinism=None, check_offsets=False):
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
    _moe(x, dy, group_offsets, dw, dw_layout, True, math, stream, route, autotune, determinism,
         check_flag(check_offsets, "check_offsets"))
    return dw


cdef int _moe(object x, object b, object offsets, object out, str layout, bint wgrad, object math, object stream,
              object route, object autotune, object determinism, bint check_offsets) except -1:
    """moe_gemm (b: w) and moe_gemm_wgrad (b: dy, out: dw): offsets on the GPU by their engine,
    host offsets by the grouped engine's routes."""
    if on_device(offsets):
        return _moe_on_device(x, b, offsets, out, layout, wgrad, math, stream, route, autotune, determinism,
                              check_offsets)
    # (offsets on the host already: route "host_offsets" is the host routes' chooser)
    return _host_route(x, b, offsets, out, layout, wgrad, math, stream, None if route == "host_offsets" else route,
                       autotune, determinism)


# ---------------------------------------------------------------- offsets on the device

cdef int _host_route(object x, object b, object offs, object out, str layout, bint wgrad, object math,
                     object stream, object route, object autotune, object determinism) except -1:
    cdef CallArgs c
    cdef Groups grp = read_moe(&c, x, b, offs, out, layout, wgrad)
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
    lt.dtype = lt.a_type = lt.b_type = xv.dtype
    lt.scaled = lt.fast_accum = False
    lt.scale_rows_src, lt.scale_rows_dst, lt.scale_kblocks, lt.p.scale_b_kblocks = NULL, NULL, 0, 0
    lt.p.scale_a.base = lt.p.scale_b.base = NULL
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
        lt.p.m, lt.p.n, lt.p.k = ov.cols, -1, xv.cols       # (the ragged size: from the offsets)
        lt.p.lda, lt.p.ldb, lt.p.ldd = bv.row_stride, xv.row_stride, ov.row_stride
        lt.p.ragged = CYGEMM_RAGGED_N
        lt.names = LT_NAMES_FORWARD
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
    lt.p.m, lt.p.n, lt.p.k = av.cols, cv.cols, -1
    lt.p.lda, lt.p.ldb, lt.p.ldd = av.row_stride, cv.row_stride, ov.row_stride
    lt.p.ragged = CYGEMM_RAGGED_K
    lt.names = LT_NAMES_WGRAD_NK if nk else LT_NAMES_WGRAD_KN
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
    cdef int64_t G = read_moe_args(c, x, b, offsets, out, layout, wgrad)
    cdef bint nk = layout == "nk"
    cdef MatrixView* xv = &c.views[0]
    cdef MatrixView* bv = &c.views[1]
    cdef MatrixView* offv = &c.views[2]
    cdef MatrixView* ov = &c.views[3]
    if offv.cols != G + 1:
        raise ValueError(f"group_offsets: expected G + 1 = {G + 1} offsets ({'dw' if wgrad else 'w'} holds {G} "
                         f"experts), got {offv.cols}")
    check_offsets_view(offv)
    check_overlaps(c)
    _check_one_group(xv, bv, ov, nk, wgrad)
    return _fill_lt_call(lt, xv, bv, ov, offv, nk, wgrad)


cdef int _check_one_group(const MatrixView* xv, const MatrixView* bv, const MatrixView* ov, bint nk,
                          bint wgrad) except -1:
    """What the routes of host offsets would refuse, checked on one expert holding every row (the
    offsets' values change no view's strides), in O(1): a call they cannot run is refused before
    any route is chosen, not after its offsets were read (a sync). The messages name the views
    as those routes do."""
    cdef MatrixView v[3]
    cdef ColMajorGemm g
    cdef int64_t T = xv.rows
    if not wgrad:
        v[0], v[1], v[2] = xv[0], bv[0], ov[0]
        v[1].batch, v[1].batch_stride = 1, 0
        map_or_raise(&v[0], &v[1], &v[2], False, nk, &g, (f"x[0:{T}]", "w[0]", f"out[0:{T}]"))
        return 0
    # kn: dw[g] = x[a:b].T @ dy[a:b]; nk: dw[g] = dy[a:b].T @ x[a:b]
    v[0], v[1], v[2] = (bv[0] if nk else xv[0]), (xv[0] if nk else bv[0]), ov[0]
    v[2].batch, v[2].batch_stride = 1, 0
    map_or_raise(&v[0], &v[1], &v[2], True, False, &g,
                 (f"{'dy' if nk else 'x'}[0:{T}]", f"{'x' if nk else 'dy'}[0:{T}]", "dw[0]"))
    check_experts_disjoint(ov, "dw")
    return 0


cdef int _moe_on_device(object x, object b, object offsets, object out, str layout, bint wgrad, object math,
                        object stream, object route, object autotune, object determinism,
                        bint check_offsets) except -1:
    cdef CallArgs c
    cdef LtGroupedCall lt
    why_layout = _read_device_call(&c, x, b, offsets, out, layout, wgrad, &lt)
    check_route(route, _NAMES)
    cdef Policy policy
    call_policy(autotune, determinism, &policy)         # (bad values refused before the GPU is asked)
    if lt.groups == 0 or c.views[3].rows * c.views[3].cols * c.views[3].batch == 0 or (
            not wgrad and lt.p.rows == 0):
        return 0                # no expert, or an empty result: nothing to write
    prepare_call(&c, CALL_GEMM, stream, math, lt.dtype, False)       # (overlaps checked by the reader)
    host_run = functools.partial(_host_run, x, b, out, layout, wgrad, math, stream, autotune, determinism)
    run_on_device(&c, 2, &lt, why_layout, host_run, route, autotune, determinism, check_offsets, _NAMES,
                  "group_offsets")       # (c.views: x, w or dy, the offsets, out)
    return 0


def _host_run(x, b, out, layout, wgrad, math, stream, autotune, determinism, offs, host_route):
    _host_route(x, b, offs, out, layout, wgrad, math, stream, host_route, autotune, determinism)


def describe_moe(a, b, group_offsets, out, *, str kind="forward", str w_layout="kn", str dw_layout="kn",
                 str math="tf32", stream=None, route=None, autotune=None, determinism=None, check_offsets=False,
                 capturing=False):
    """Which route :func:`moe_gemm` (or :func:`moe_gemm_wgrad`) would take for these arguments,
    which routes could, why the others cannot, and whether the call synchronizes, without
    launching anything (no GPU needed; without one, "lt_grouped" says it needs a GPU).

    Parameters
    ----------
    a, b, group_offsets, out
        moe_gemm's ``x, w, group_offsets, out`` (kind "forward") or moe_gemm_wgrad's ``x, dy,
        group_offsets, dw`` (kind "wgrad"): device arrays, or stand-ins read for their layout only
        (describing never touches memory): NumPy arrays in host memory or ``(shape, dtype)``
        pairs, as :func:`cygemm.describe_gemm` takes them. Host offsets (a sequence or a NumPy
        array) are checked as the call checks them; device offsets are not read.
    kind : {"forward", "wgrad"}
        Which call.
    w_layout, dw_layout : {"kn", "nk"}
        As the call takes them (``w_layout`` for kind "forward", ``dw_layout`` for "wgrad").
    math, route, autotune, determinism, check_offsets
        As the call, checked as it checks them; a ``route`` that applies is the one described.
    stream
        Taken as the call takes it; describing enqueues nothing.
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
    check_flag(check_offsets, "check_offsets")
    capturing = check_flag(capturing, "capturing")
    check_route(route, _NAMES)
    check_stream_arg(stream)
    cdef Addresses addresses = Addresses()
    a, b, out = [layout_operand(x, n, addresses) for x, n in zip((a, b, out), ("a", "b", "out"))]
    cdef bint wgrad = kind == "wgrad"
    cdef str layout = dw_layout if wgrad else w_layout
    cdef CallArgs c
    cdef Groups grp
    if not on_device(group_offsets):
        grp = read_moe(&c, a, b, group_offsets, out, layout, wgrad)
        check_overlaps(&c)
        info = dict(offsets="host", groups=grp.n, syncs=False)
        info.update(describe_host_routes(grp, math, autotune, determinism,
                                         None if route == "host_offsets" else route))
        return _with_policy(info, grp.dtype, math, autotune, determinism)
    parse_math(math)
    cdef LtGroupedCall lt
    why_layout = _read_device_call(&c, a, b, group_offsets, out, layout, wgrad, &lt)
    info = describe_on_device(&lt, why_layout, autotune, determinism, capturing)
    if route is not None and route in info["routes"]:
        info.update(chosen=route, decided_by="asked", syncs=route == "host_offsets",
                    why_chosen="the call's route= asks for it, and it applies")
    return _with_policy(info, lt.dtype, math, autotune, determinism)


cdef dict _with_policy(dict info, cudaDataType dtype, object math, object autotune, object determinism):
    """describe_moe's policy keys: the call's determinism mode, compute type and autotune level."""
    cdef Policy policy
    call_policy(autotune, determinism, &policy)
    info.update(determinism=determinism_name(policy),
                compute=compute_name(compute_type(dtype, parse_math(math))),
                autotune=autotune_name(policy))
    return info


