# cython: language_level=3, boundscheck=False, wraparound=False
"""A mixture-of-experts layer's FP8 GEMM with tensor-wide scales: out[a:b] = scale_x * scale_w[g] *
(x[a:b] @ w[g].T) for expert g's rows a:b (:func:`moe_scaled_gemm`).

Offsets on the GPU run cuBLASLt's grouped matmul in FP8 (route "lt_grouped", chosen as for
:func:`cygemm.moe_gemm`: cygemm.grouped.device_offsets), each group's scales given to cuBLASLt as
device arrays of per-group pointers (scale mode PER_BATCH_SCALAR_32F). Host offsets, or offsets
read to the host, run :func:`cygemm.fp8.scaled_matmul` per expert. DeepSeek-V3's finer scales
(1x128 tokens, 128x128 weights) are not taken here yet: cuBLASLt wants each group's block scales
in a layout of their own, which cygemm's quantizers do not make yet.
"""
import functools

from libc.stdint cimport int64_t

from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.kernels.grouped cimport CYGEMM_RAGGED_N
from cygemm.engine.types cimport MatrixView, ArrayDesc
from cygemm.engine.arrays cimport read_fp8, view_from_desc
from cygemm.engine.args cimport (CallArgs, args_init, add_array, add_view, add_scalar, check_overlaps, prepare_call,
                                 ARG_READ, ARG_WRITE, CALL_KERNELS)
from cygemm.engine.dtypes cimport DTYPES_INDEX, DTYPES_GEMM
from cygemm.grouped.lt_grouped cimport LtGroupedCall, LT_NAMES_FORWARD
from cygemm.grouped.device_offsets cimport (on_device, check_route, check_offsets_view, run_on_device,
                                            describe_on_device)
from cygemm.engine.dtypes import name_of
from cygemm.engine.groups cimport read_offsets

def moe_scaled_gemm(x, w, scale_x, scale_w, group_offsets, out, *, format_x=None, format_w=None,
                    bint fast_accum=False, stream=None, route=None, bint check_offsets=False):
    """FP8 mixture-of-experts GEMM: out[a:b] = scale_x * scale_w[g] * (x[a:b] @ w[g].T) for expert
    g's rows a:b of sorted tokens.

    Parameters
    ----------
    x : device array (T, K), FP8
        Every token, sorted by expert; torch ``float8_e4m3fn`` / ``float8_e5m2``, or uint8 bytes
        with ``format_x``. K contiguous (Hopper's FP8 kernels read both operands along K).
    w : device array (G, N, K), FP8
        Each expert's weight as a linear layer holds it (N, K), K contiguous; any batch stride.
        The data gradient of ``out`` is this call on ``dout`` and the weights' transposes
        (G, K, N), quantized as their own arrays.
    scale_x : device float32 array of one element
        The tokens' dequantizing scale.
    scale_w : device float32 array of G elements (one per expert) or of one
        The weights' dequantizing scales.
    group_offsets : sequence of int, or device array
        As :func:`cygemm.moe_gemm`: G + 1 offsets from 0 to T. On the GPU (int32 or int64), the
        call runs without a host sync where cuBLASLt's grouped matmul applies; host offsets (and
        offsets read to the host) run :func:`cygemm.fp8.scaled_matmul` per expert, which needs
        CuPy or torch arrays (it slices them).
    out : device array (T, N)
        bfloat16, float16 or float32; shares memory with no input.
    format_x, format_w : {"e4m3", "e5m2"}, optional
        The FP8 format of uint8 operands (torch float8 tensors carry theirs). E4M3 with E4M3 or
        E5M2; not two E5M2.
    fast_accum : bool
        cuBLASLt's fast FP8 accumulation (fewer promotions to float32; as torch's).
    stream, route, check_offsets
        As :func:`cygemm.moe_gemm` (routes of host offsets: per expert, "loop").

    Returns
    -------
    device array
        ``out``.

    Raises
    ------
    ValueError
        Shapes that do not fit, scales of another shape, offsets as :func:`cygemm.moe_gemm`
        refuses them, an ``out`` sharing memory with an input, an unknown ``route``.
    TypeError
        Operands that are not FP8 (or both E5M2), an ``out`` of another dtype, scales that are not
        float32; host offsets with arrays that cannot be sliced (not CuPy or torch).
    CaptureError, CygemmError, CublasError, CudaError
        As :func:`cygemm.moe_gemm` (the first-use check is "lt_grouped_fp8").
    """
    cdef CallArgs c
    cdef LtGroupedCall lt
    why_layout = _read(&c, x, w, scale_x, scale_w, group_offsets, out, format_x, format_w, fast_accum, &lt)
    if lt.groups == 0 or lt.p.rows == 0 or lt.p.m == 0:
        return out                  # no expert, no token or no column: nothing to write
    host_run = functools.partial(_per_expert, x, w, scale_x, scale_w, out, format_x, format_w, fast_accum, stream)
    check_route(route, ("loop",))
    if not on_device(group_offsets):
        if route is not None and route != "loop":
            raise ValueError(f"route: {route!r} does not apply: it reads the group offsets from a device array "
                             "(these are host ints: the route is 'loop')")
        host_run(read_offsets(group_offsets, lt.groups, lt.p.rows), None)
        return out
    prepare_call(&c, CALL_KERNELS, stream, "tf32", CUDA_R_32F, False)     # (overlaps checked by _read)
    run_on_device(&c, 4, &lt, why_layout, host_run, route, None, None, check_offsets, ("loop",), "group_offsets",
                  "lt_grouped_fp8")     # (c.views: x, w, scale_x, scale_w, the offsets, out)
    return out


def _per_expert(x, w, scale_x, scale_w, out, format_x, format_w, fast_accum, stream, offs, route):
    """The route of host offsets: fp8.scaled_matmul per expert with rows."""
    from cygemm import fp8
    for arg, name in ((x, "x"), (w, "w"), (scale_w, "scale_w"), (out, "out")):
        if not hasattr(type(arg), "__getitem__"):
            raise TypeError(f"{name}: the route of host offsets runs fp8.scaled_matmul per expert, which slices x, w, "
                            f"scale_w and out: pass CuPy arrays or torch tensors, or the offsets as a device array "
                            f"(got {type(arg).__module__}.{type(arg).__name__})")
    per_expert = getattr(scale_w, "shape", (1,))[0] != 1
    for g in range(len(offs) - 1):
        a, b = offs[g], offs[g + 1]
        if b > a:
            fp8.scaled_matmul(x[a:b], w[g].T, scale_x, scale_w[g:g + 1] if per_expert else scale_w, out=out[a:b],
                              format_a=format_x, format_b=format_w, fast_accum=fast_accum, stream=stream)


cdef MatrixView* _fp8(CallArgs* c, object x, str name, object fmt, str fmt_arg, int ndim) except NULL:
    cdef ArrayDesc d
    cdef MatrixView v
    read_fp8(x, &d, name, fmt, fmt_arg)
    view_from_desc(&d, &v, name, ndim, ndim)
    return add_view(c, &v, name, ARG_READ)


cdef object _read(CallArgs* c, object x, object w, object scale_x, object scale_w, object offsets, object out,
                  object format_x, object format_w, bint fast_accum, LtGroupedCall* lt):
    """Every argument read and checked (no GPU needed), the grouped problem filled; why its layout
    rules the grouped matmul out, or None."""
    args_init(c)
    cdef MatrixView* xv = _fp8(c, x, "x", format_x, "format_x", 2)
    cdef MatrixView* wv = _fp8(c, w, "w", format_w, "format_w", 3)
    cdef MatrixView* sx = add_scalar(c, scale_x, "scale_x", ARG_READ)
    # (read at the widest level, so that a scale of another type is named by the check below)
    cdef MatrixView* sw = add_array(c, scale_w, "scale_w", ARG_READ, 1, 1, DTYPES_GEMM)
    cdef int64_t T = xv.rows, K = xv.cols, G = wv.batch, N = wv.rows
    if wv.cols != K:
        raise ValueError(f"w: x is ({T}, {K}) so w must be (G, N, {K}) (each expert's (N, K) weight), got "
                         f"({G}, {wv.rows}, {wv.cols})")
    if sw.dtype != CUDA_R_32F:
        raise TypeError(f"scale_w: expected float32 scales, got {name_of(sw.dtype)}")
    if sw.cols != G and sw.cols != 1:
        raise ValueError(f"scale_w: expected G = {G} scales (one per expert) or one, got {sw.cols}")
    if sw.cols > 1 and sw.col_stride != 1:
        raise ValueError(f"scale_w: expected a contiguous array, got a stride of {sw.col_stride} elements")
    # What every FP8 GEMM of cuBLASLt needs, whichever route runs it (as fp8.scaled_matmul says).
    if xv.dtype == CUDA_R_8F_E5M2 and wv.dtype == CUDA_R_8F_E5M2:
        raise TypeError("x/w: cuBLASLt has no E5M2 x E5M2 GEMM; hold one operand in E4M3")
    if K % 16:
        raise ValueError(f"x: FP8 GEMMs need K to be a multiple of 16, got K = {K}; pad K to {(K + 15) // 16 * 16}")
    if not ((xv.col_stride == 1 or K <= 1) and (wv.col_stride == 1 or K <= 1)):
        raise ValueError("x, w: FP8 GEMMs read both operands along K (Hopper's FP8 kernels are 'TN'): K must be "
                         "their contiguous axis")
    cdef bint offsets_on_device = on_device(offsets)
    cdef MatrixView* offv = NULL
    if offsets_on_device:
        offv = add_array(c, offsets, "group_offsets", ARG_READ, 1, 1, DTYPES_INDEX)
        if offv.cols != G + 1:
            raise ValueError(f"group_offsets: expected G + 1 = {G + 1} offsets (w holds {G} experts), got {offv.cols}")
        check_offsets_view(offv)
    cdef MatrixView* ov = add_array(c, out, "out", ARG_WRITE, 2, 2)     # (the float types: FP8's outputs here)
    if ov.rows != T or ov.cols != N:
        raise ValueError(f"out: expected shape ({T}, {N}), got ({ov.rows}, {ov.cols})")
    check_overlaps(c)
    lt.groups = <int>G
    lt.p.rows, lt.p.m = T, N
    if not offsets_on_device:
        return None
    # out (T, N) = cuBLAS D (N x rows) = op(A) (N x K) @ B (K x rows): A = w[g] stored (K x N)
    # column-major, transposed ("TN", as Hopper's FP8 kernels read); B = x's rows.
    cdef int64_t isz = ov.itemsize
    lt.dtype, lt.a_type, lt.b_type = ov.dtype, wv.dtype, xv.dtype
    lt.scaled, lt.fast_accum = True, fast_accum
    lt.offsets, lt.offsets_64bit = offv.ptr, offv.itemsize == 8
    lt.zero_out, lt.elem_bytes = NULL, <int>isz
    lt.p.a.base, lt.p.a.group_stride, lt.p.a.row_stride = wv.ptr, wv.batch_stride, 0       # (FP8: 1 byte)
    lt.p.b.base, lt.p.b.group_stride, lt.p.b.row_stride = xv.ptr, 0, xv.row_stride
    lt.p.d.base, lt.p.d.group_stride, lt.p.d.row_stride = ov.ptr, 0, ov.row_stride * isz
    lt.p.scale_a.base, lt.p.scale_a.group_stride, lt.p.scale_a.row_stride = sw.ptr, 4 if sw.cols > 1 else 0, 0
    lt.p.scale_b.base, lt.p.scale_b.group_stride, lt.p.scale_b.row_stride = sx.ptr, 0, 0
    lt.p.m, lt.p.n, lt.p.k = N, -1, K
    lt.p.lda, lt.p.ldb, lt.p.ldd = wv.row_stride, xv.row_stride, ov.row_stride
    lt.p.ragged = CYGEMM_RAGGED_N
    lt.names = LT_NAMES_FORWARD
    lt.opa, lt.opb = CUBLAS_OP_T, CUBLAS_OP_N
    lt.avg_m, lt.avg_n, lt.avg_k = N, T // G if G else 0, K
    if not (ov.col_stride == 1 or N <= 1):
        return "out needs rows of unit stride (C-order rows)"
    return None


def describe_moe_scaled(x, w, scale_x, scale_w, group_offsets, out, *, format_x=None, format_w=None,
                        bint fast_accum=False, bint capturing=False):
    """Which route :func:`moe_scaled_gemm` would take, and why the other does not apply, without
    launching anything (no GPU needed): the keys of :func:`cygemm.describe_moe`.

    Parameters
    ----------
    x, w, scale_x, scale_w, group_offsets, out, format_x, format_w, fast_accum
        As :func:`moe_scaled_gemm`, or stand-ins described but never read.
    capturing : bool
        Describe the call as made inside a CUDA graph capture.

    Returns
    -------
    dict
        As :func:`cygemm.describe_moe`; host offsets: ``offsets`` "host", ``chosen`` "loop".

    Raises
    ------
    ValueError, TypeError
        As :func:`moe_scaled_gemm` raises them for these arguments.
    """
    cdef CallArgs c
    cdef LtGroupedCall lt
    why_layout = _read(&c, x, w, scale_x, scale_w, group_offsets, out, format_x, format_w, fast_accum, &lt)
    if not on_device(group_offsets):
        read_offsets(group_offsets, lt.groups, lt.p.rows)
        return dict(offsets="host", groups=lt.groups, routes=["loop"],
                    not_applicable={"lt_grouped": "it reads the group offsets from a device array"},
                    chosen="loop", decided_by="rule", syncs=False,
                    why_chosen="host offsets: fp8.scaled_matmul per expert")
    return describe_on_device(&lt, why_layout, None, None, capturing, "lt_grouped_fp8")
