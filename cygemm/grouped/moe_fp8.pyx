# cython: language_level=3, boundscheck=False, wraparound=False
"""A mixture-of-experts layer's FP8 GEMM: out[a:b] = x[a:b] @ w[g].T dequantized by tensor-wide
scales (scale_x * scale_w[g]) or by DeepSeek-V3's block scales (1x128 for the tokens, 128x128 for
each expert's weight), for expert g's rows a:b (:func:`moe_scaled_gemm`).

Offsets on the GPU run cuBLASLt's grouped matmul in FP8 (route "lt_grouped", chosen as for
:func:`cygemm.moe_gemm`: cygemm.grouped.device_offsets), each group's scales given to cuBLASLt as
device arrays of per-group pointers: scale mode PER_BATCH_SCALAR_32F for tensor-wide scales;
BLK128x128_32F for the weights' blocks (each expert's are a slice of the quantizer's) and
VEC128_32F for the tokens', which cuBLASLt reads per group as a block of their own (K-blocks x
the group's rows rounded up to 4, as TransformerEngine lays them out): cygemm's kernel regroups
the quantizer's (T, K/128) scales into `workspace` on the GPU first. Host offsets, or offsets read
to the host, run :func:`cygemm.fp8.scaled_matmul` per expert.
"""
import functools

from libc.stdint cimport int64_t

from cygemm.engine.streams cimport check_stream_arg
from cygemm.bindings.cudart cimport *
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport LT_MATMUL_MATRIX_SCALE_PER_BATCH_SCALAR_32F
from cygemm.fp8.args cimport SCALE_1X128, SCALE_128X128
from cygemm.kernels.grouped cimport CYGEMM_RAGGED_N
from cygemm.engine.types cimport MatrixView, ArrayDesc
from cygemm.engine.arrays cimport read_fp8, read_array, view_from_desc, is_torch
from cygemm.engine.errors import check_flag
from cygemm.engine.arrays cimport Addresses, layout_operand
from libc.stdint cimport uintptr_t
from cygemm.engine.args cimport (CallArgs, args_init, add_array, add_view, add_scalar, check_overlaps, prepare_call,
                                 ARG_READ, ARG_WRITE, CALL_KERNELS)
from cygemm.engine.dtypes cimport DTYPES_INDEX, DTYPES_GEMM, SCALES_DTYPE, fp8_pair_ok
from cygemm.grouped.lt_grouped cimport LtGroupedCall, LT_NAMES_FORWARD
from cygemm.grouped.device_offsets cimport (on_device, check_route, check_offsets_view, run_on_device,
                                            describe_on_device)
from cygemm.engine.dtypes import name_of
from cygemm.grouped.groups cimport read_offsets

def moe_scaled_gemm(x, w, scale_x, scale_w, group_offsets, out, *, format_x=None, format_w=None,
                    fast_accum=False, workspace=None, stream=None, route=None, check_offsets=False):
    """FP8 mixture-of-experts GEMM: out[a:b] = x[a:b] @ w[g].T, dequantized by the scales, for expert
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
    scale_x : device float32 array
        The tokens' dequantizing scales: one element (tensor-wide), or DeepSeek-V3's 1x128 blocks,
        (T, ceil(K / 128)) with T contiguous, as ``fp8.quantize_scaled(x, "1x128")`` makes them.
    scale_w : device float32 array
        The weights' dequantizing scales: G elements (one per expert) or one, with a tensor-wide
        ``scale_x``; or 128x128 blocks, (G * N / 128, ceil(K / 128)) with rows ``round_up(ceil(K
        / 128), 4)`` apart, as ``fp8.quantize_scaled(w.reshape(G * N, K), "128x128")`` makes them
        (N a multiple of 128, so that no block spans two experts), with 1x128 ``scale_x``.
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
    workspace : device float32 array, optional
        Block scales with offsets on the GPU: at least ``ceil(K / 128) * (round_up(T, 4) + 4 * G)``
        elements, where the tokens' scales are regrouped per expert on the GPU (allocation-free,
        capturable; one workspace per stream: calls running at once must not share it). Not
        needed otherwise.
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
    check_offsets = check_flag(check_offsets, "check_offsets")
    cdef CallArgs c
    cdef LtGroupedCall lt
    why_layout = _read(&c, x, w, scale_x, scale_w, group_offsets, out, format_x, format_w, fast_accum, workspace, &lt)
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
                  "lt_grouped_fp8")     # (c.views: x, w, scale_x, scale_w, the offsets, out[, workspace])
    return out


def _per_expert(x, w, scale_x, scale_w, out, format_x, format_w, fast_accum, stream, offs, route):
    """The route of host offsets: fp8.scaled_matmul per expert with rows."""
    from cygemm import fp8
    for arg, name in ((x, "x"), (w, "w"), (scale_w, "scale_w"), (out, "out")):
        if not hasattr(type(arg), "__getitem__"):
            raise TypeError(f"{name}: the route of host offsets runs fp8.scaled_matmul per expert, which slices x, w, "
                            f"scale_w and out: pass CuPy arrays or torch tensors, or the offsets as a device array "
                            f"(got {type(arg).__module__}.{type(arg).__name__})")
    blocks = len(scale_w.shape) == 2
    per_expert = scale_w.shape[0] != 1
    nb = w.shape[1] // 128
    if per_expert and not blocks:
        # Expert g's scale at scale_w[g] is 4-byte aligned; cuBLASLt 13.1's FP8 kernels on Hopper
        # refused such a scale pointer (no kernel, or NOT_SUPPORTED where the plan was made for an
        # aligned one). Each expert's scale goes to a 16-byte slot of its own.
        scale_w = _sixteen_byte_slots(scale_w)
    for g in range(len(offs) - 1):
        a, b = offs[g], offs[g + 1]
        if b == a:
            continue
        if blocks:
            _block_expert(x[a:b], w[g], scale_x[a:b], scale_w[g * nb:(g + 1) * nb], out[a:b], format_x, format_w,
                          stream)
            continue
        fp8.scaled_matmul(x[a:b], w[g].T, scale_x, scale_w[g, :1] if per_expert else scale_w, out=out[a:b],
                          format_a=format_x, format_b=format_w, fast_accum=fast_accum, scale_mode="tensor",
                          stream=stream)


def _block_expert(x, w, sx, sw, out, format_x, format_w, stream):
    """One expert's block-scaled GEMM through fp8.scaled_matmul: its 1x128 scales with the rows
    contiguous, the weight's 128x128 scales as w.T's (transposed), and its rows padded with zeros
    to a multiple of 4 where they are not (what the dense 1x128 layout takes)."""
    from cygemm import fp8
    rows = x.shape[0]
    padded = (rows + 3) // 4 * 4
    if padded != rows:
        x = _zero_rows(x, padded)
        sx = _zero_rows(sx, padded)
        target = out
        out = _zero_rows(out, padded)
    fp8.scaled_matmul(x, w.T, _rows_contiguous(sx), sw.T, out=out, format_a=format_x, format_b=format_w,
                      scale_mode=("1x128", "128x128"), stream=stream)
    if padded != rows:
        target[...] = out[:rows]


def _zeros_like_library(a, shape):
    """Zeros of `shape` and a's dtype, in a's library and on its device (CuPy or torch)."""
    if is_torch(a):
        return a.new_zeros(shape)
    import cupy as cp
    return cp.zeros(shape, dtype=a.dtype)


def _sixteen_byte_slots(s):
    """A (G, 4) float32 copy of the G scales `s` whose column 0 holds them: row g starts 16 bytes
    after row g - 1 (CuPy or torch; a new array)."""
    slots = _zeros_like_library(s, (s.shape[0], 4))
    slots[:, 0] = s
    return slots


def _zero_rows(a, rows):
    """a's rows over zeros, `rows` in all (CuPy or torch; a new array)."""
    z = _zeros_like_library(a, (rows,) + tuple(a.shape[1:]))
    z[:a.shape[0]] = a
    return z


def _rows_contiguous(s):
    """A copy of a (rows, blocks) slice of scales with its rows contiguous (CuPy or torch)."""
    if is_torch(s):
        return s.t().contiguous().t()
    import cupy as cp
    return cp.asfortranarray(s)


cdef int _check_block_scales(const MatrixView* sx, const MatrixView* sw, int64_t T, int64_t K, int64_t N, int64_t G,
                             int64_t KB) except -1:
    """DeepSeek-V3's scales as fp8.quantize_scaled makes them: the tokens' 1x128, (T, KB) with T
    contiguous; the weights' 128x128, (G * N / 128, KB) with rows round_up(KB, 4) apart."""
    cdef int64_t ld = (KB + 3) // 4 * 4
    if N % 128:
        raise ValueError(f"w: 128x128 weight scales need N to be a multiple of 128 (each expert's blocks its own), "
                         f"got N = {N}")
    if sx.rows != T or sx.cols != KB or (T > 1 and sx.row_stride != 1) or (KB > 1 and sx.col_stride != T):
        raise ValueError(f"scale_x: expected 1x128 token scales of shape ({T}, {KB}) with the tokens contiguous (as "
                         f"fp8.quantize_scaled(x, '1x128') makes them), got ({sx.rows}, {sx.cols}) with element "
                         f"strides ({sx.row_stride}, {sx.col_stride})")
    if (<uintptr_t>sx.ptr) % 16 or (<uintptr_t>sw.ptr) % 16:
        raise ValueError(f"{'scale_x' if (<uintptr_t>sx.ptr) % 16 else 'scale_w'}: expected a start on 16 bytes "
                         "(cuBLASLt's rule for block scales)")
    if sw.rows != G * (N // 128) or sw.cols != KB or (sw.rows > 1 and sw.row_stride != ld) or (
            KB > 1 and sw.col_stride != 1):
        raise ValueError(f"scale_w: expected 128x128 weight scales of shape ({G * (N // 128)}, {KB}) with rows {ld} "
                         f"apart (as fp8.quantize_scaled(w.reshape(G * N, K), '128x128') makes them), got "
                         f"({sw.rows}, {sw.cols}) with element strides ({sw.row_stride}, {sw.col_stride})")
    return 0


cdef MatrixView* _fp8(CallArgs* c, object x, str name, object fmt, str fmt_arg, int ndim) except NULL:
    cdef ArrayDesc d
    cdef MatrixView v
    read_fp8(x, &d, name, fmt, fmt_arg)
    view_from_desc(&d, &v, name, ndim, ndim)
    return add_view(c, &v, name, ARG_READ, d.torch)


cdef object _read(CallArgs* c, object x, object w, object scale_x, object scale_w, object offsets, object out,
                  object format_x, object format_w, object fast_accum, object workspace, LtGroupedCall* lt):
    """Every argument read and checked (no GPU needed), the grouped problem filled; why its layout
    rules the grouped matmul out, or None."""
    fast_accum = check_flag(fast_accum, "fast_accum")
    args_init(c)
    cdef MatrixView* xv = _fp8(c, x, "x", format_x, "format_x", 2)
    cdef MatrixView* wv = _fp8(c, w, "w", format_w, "format_w", 3)
    cdef ArrayDesc dsw
    read_array(scale_w, &dsw, "scale_w", DTYPES_GEMM)
    cdef bint blocks = dsw.ndim == 2
    cdef MatrixView* sx = (add_array(c, scale_x, "scale_x", ARG_READ, 2, 2, DTYPES_GEMM) if blocks
                           else add_scalar(c, scale_x, "scale_x", ARG_READ))
    # (read at the widest level, so that a scale of another type is named by the checks below)
    cdef MatrixView* sw = add_array(c, scale_w, "scale_w", ARG_READ, 1, 2, DTYPES_GEMM)
    cdef int64_t T = xv.rows, K = xv.cols, G = wv.batch, N = wv.rows, KB = (xv.cols + 127) // 128
    if wv.cols != K:
        raise ValueError(f"w: x is ({T}, {K}) so w must be (G, N, {K}) (each expert's (N, K) weight), got "
                         f"({G}, {wv.rows}, {wv.cols})")
    if sw.dtype != SCALES_DTYPE or sx.dtype != SCALES_DTYPE:
        raise TypeError(f"{'scale_w' if sw.dtype != SCALES_DTYPE else 'scale_x'}: expected float32 scales, got "
                        f"{name_of(sw.dtype if sw.dtype != SCALES_DTYPE else sx.dtype)}")
    if blocks:
        _check_block_scales(sx, sw, T, K, N, G, KB)
        if fast_accum:
            raise ValueError("fast_accum: block scales take no fast accumulation (cuBLASLt's block-scaled FP8 "
                             "kernels promote every block; torch refuses the pair too)")
    else:
        if sw.cols != G and sw.cols != 1:
            raise ValueError(f"scale_w: expected G = {G} scales (one per expert) or one, got {sw.cols}")
        if sw.cols > 1 and sw.col_stride != 1:
            raise ValueError(f"scale_w: expected a contiguous array, got a stride of {sw.col_stride} elements")
    # What every FP8 GEMM of cuBLASLt needs, whichever route runs it (as fp8.scaled_matmul says).
    if not fp8_pair_ok(xv.dtype, wv.dtype):
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
    cdef MatrixView* wsv = NULL
    if blocks and offsets_on_device:
        if workspace is None:
            raise ValueError(f"workspace: block scales with offsets on the GPU need a device float32 array of at "
                             f"least ceil(K / 128) * (round_up(T, 4) + 4 * G) = {KB * ((T + 3) // 4 * 4 + 4 * G)} "
                             f"elements (the tokens' scales, regrouped per expert on the GPU), got None")
        wsv = add_array(c, workspace, "workspace", ARG_WRITE, 1, 1)
        if wsv.dtype != SCALES_DTYPE or wsv.cols < KB * ((T + 3) // 4 * 4 + 4 * G) or (wsv.cols > 1 and wsv.col_stride != 1):
            raise ValueError(f"workspace: expected a contiguous device float32 array of at least {KB * ((T + 3) // 4 * 4 + 4 * G)} "
                             f"elements, got {name_of(wsv.dtype)} of {wsv.cols}")
        if (<uintptr_t>wsv.ptr) % 16:
            raise ValueError("workspace: expected a start on 16 bytes (cuBLASLt's rule for scale arrays)")
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
    lt.scale_rows_src, lt.scale_rows_dst, lt.scale_kblocks, lt.p.scale_b_kblocks = NULL, NULL, 0, 0
    if blocks:
        # Each expert's weight blocks: N / 128 rows of the quantizer's array, rows round_up(KB, 4) apart.
        lt.scale_mode_a, lt.scale_mode_b = SCALE_128X128, SCALE_1X128     # (cuBLASLt's BLK128x128_32F, VEC128_32F)
        lt.p.scale_a.base, lt.p.scale_a.group_stride = sw.ptr, (N // 128) * sw.row_stride * 4
        lt.scale_rows_src, lt.scale_rows_dst, lt.scale_kblocks = <const float*>sx.ptr, <float*>wsv.ptr, <int>KB
        lt.p.scale_b.base, lt.p.scale_b.group_stride, lt.p.scale_b_kblocks = wsv.ptr, 0, KB
    else:
        lt.scale_mode_a = lt.scale_mode_b = LT_MATMUL_MATRIX_SCALE_PER_BATCH_SCALAR_32F
        lt.p.scale_a.base, lt.p.scale_a.group_stride = sw.ptr, 4 if sw.cols > 1 else 0
        lt.p.scale_b.base, lt.p.scale_b.group_stride = sx.ptr, 0
    lt.p.scale_a.row_stride = lt.p.scale_b.row_stride = 0
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
                        fast_accum=False, workspace=None, stream=None, route=None, check_offsets=False,
                        capturing=False):
    """Which route :func:`moe_scaled_gemm` would take, and why the other does not apply, without
    launching anything (no GPU needed): the keys of :func:`cygemm.describe_moe`.

    Parameters
    ----------
    x, w, scale_x, scale_w, group_offsets, out, format_x, format_w, fast_accum, workspace
        As :func:`moe_scaled_gemm`, or stand-ins read for their layout only: NumPy arrays, torch
        CPU tensors or ``(shape, dtype)`` pairs, as :func:`cygemm.describe_gemm` takes them.
    route, check_offsets
        As :func:`moe_scaled_gemm`, checked as it checks them; a ``route`` that applies is the
        one described.
    stream
        Taken as the call takes it; describing enqueues nothing.
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
    check_flag(check_offsets, "check_offsets")
    capturing = check_flag(capturing, "capturing")
    check_route(route, ("loop",))
    check_stream_arg(stream)
    cdef Addresses addresses = Addresses()
    x, w, scale_x, scale_w, out = [None if v is None else layout_operand(v, n, addresses) for v, n in
                                   zip((x, w, scale_x, scale_w, out), ("x", "w", "scale_x", "scale_w", "out"))]
    if workspace is not None:
        workspace = layout_operand(workspace, "workspace", addresses)
    cdef CallArgs c
    cdef LtGroupedCall lt
    why_layout = _read(&c, x, w, scale_x, scale_w, group_offsets, out, format_x, format_w, fast_accum, workspace, &lt)
    if not on_device(group_offsets):
        read_offsets(group_offsets, lt.groups, lt.p.rows)
        return dict(offsets="host", groups=lt.groups, routes=["loop"],
                    not_applicable={"lt_grouped": "it reads the group offsets from a device array"},
                    chosen="loop", decided_by="rule", syncs=False,
                    why_chosen="host offsets: fp8.scaled_matmul per expert")
    info = describe_on_device(&lt, why_layout, None, None, capturing, "lt_grouped_fp8")
    if route is not None and route in info["routes"]:
        info.update(chosen=route, decided_by="asked", syncs=route == "host_offsets",
                    why_chosen="the call's route= asks for it, and it applies")
    return info
