"""The exact first-use checks of the promises of cuBLASLt's grouped matmul fed by cygemm's table
of device offsets (cygemm.engine.promises): bf16/fp16 and FP8. Registered with the engine when
cygemm.grouped is imported."""
from cygemm.engine import promises as _promises


def _check_lt_grouped():
    """moe_gemm (both weight layouts) and moe_gemm_wgrad (both) through route 'lt_grouped', with
    int32 and int64 offsets on the GPU, ragged experts and empty ones (first, inside, last), every
    operand a view with its own leading dimension, bitwise against the per-group loop of host
    offsets on the same exact inputs (values in {-1, 0, 1}: every float32 sum exact, so both round
    alike); an empty expert's weight gradient must be zeros, and no output may keep its NaN. Then
    a problem of many waves (32 experts, 8192 rows, N 512, K 1024), and the K-tail detector with a
    deep K, fixed and ragged. About 70 MB."""
    import cupy as cp
    import numpy as np
    import cygemm
    counts = [0, 3, 0, 17, 1, 9, 2, 0]
    offs = np.concatenate([[0], np.cumsum(counts)]).tolist()
    T, K, N, G = offs[-1], 40, 24, len(counts)
    ok = True
    for dtype in _promises.half_dtypes(cp):
        x, dy = _promises.padded(cp, (T, K), 8, dtype, 0.1), _promises.padded(cp, (T, N), 16, dtype, 0.7)
        for index in (cp.int32, cp.int64):
            dev = cp.asarray(offs, dtype=index)
            for layout in ("kn", "nk"):
                w = _promises.padded(cp, (G, K, N) if layout == "kn" else (G, N, K), 8, dtype, 0.3)
                out, ref = _promises.nan_view(cp, (T, N), 8, dtype), _promises.nan_view(cp, (T, N), 8, dtype)
                cygemm.moe_gemm(x, w, dev, out, w_layout=layout, route="lt_grouped")
                cygemm.moe_gemm(x, w, offs, ref, w_layout=layout, route="loop")
                ok &= _promises.same_bits(cp, out, ref)
                dw, dw_ref = _promises.nan_view(cp, w.shape, 16, dtype), _promises.nan_view(cp, w.shape, 16, dtype)
                cygemm.moe_gemm_wgrad(x, dy, dev, dw, dw_layout=layout, route="lt_grouped")
                cygemm.moe_gemm_wgrad(x, dy, offs, dw_ref, dw_layout=layout, route="loop")
                ok &= _promises.same_bits(cp, dw, dw_ref)
                ok &= all(bool((dw[g] == 0).all()) for g in range(G) if counts[g] == 0)
    dtype = _promises.half_dtypes(cp)[-1]
    # Many waves: the sizes of a real layer, where cuBLAS's kernels schedule otherwise.
    counts = (np.arange(32) * 17 % 29 + 1) * 8
    counts[-1] += 8192 - counts.sum()
    offs = np.concatenate([[0], np.cumsum(counts)]).tolist()
    T, K, N = 8192, 1024, 512
    x, dy = _promises.ternary(cp, (T, K), 0.2, dtype), _promises.ternary(cp, (T, N), 0.4, dtype)
    w = _promises.ternary(cp, (32, N, K), 0.6, dtype)
    dev = cp.asarray(offs, dtype=cp.int32)
    out, ref = cp.full((T, N), cp.nan, dtype), cp.full((T, N), cp.nan, dtype)
    cygemm.moe_gemm(x, w, dev, out, w_layout="nk", route="lt_grouped")
    cygemm.moe_gemm(x, w, offs, ref, w_layout="nk", route="loop")
    ok &= _promises.same_bits(cp, out, ref)
    dw, dw_ref = cp.full(w.shape, cp.nan, dtype), cp.full(w.shape, cp.nan, dtype)
    cygemm.moe_gemm_wgrad(x, dy, dev, dw, dw_layout="nk", route="lt_grouped")
    cygemm.moe_gemm_wgrad(x, dy, offs, dw_ref, dw_layout="nk", route="loop")
    ok &= _promises.same_bits(cp, dw, dw_ref)
    del x, dy, w, out, ref, dw, dw_ref
    for dtype in _promises.half_dtypes(cp):
        # The K-tail detector through the grouped matmul: a deep K that is no multiple of 256,
        # fixed (the forward's hidden size) and ragged (a weight gradient's rows); C must be 2.
        deep = 32776
        a, b = _promises.detector(cp, dtype, 16, 16, deep)
        w = cp.ascontiguousarray(cp.broadcast_to(b, (2, deep, 16)))
        out = cp.full((16, 16), cp.nan, dtype)
        cygemm.moe_gemm(a, w, cp.asarray([0, 9, 16], dtype=cp.int32), out, route="lt_grouped")
        ok &= bool((out.astype(cp.float32) == 2).all())
        x = cp.zeros((deep + 8, 16), dtype)
        x[0], x[deep - 1] = 1, 1
        dw = cp.full((2, 16, 16), cp.nan, dtype)
        cygemm.moe_gemm_wgrad(x, cp.ones((deep + 8, 16), dtype), cp.asarray([0, deep, deep + 8], dtype=cp.int64), dw,
                              route="lt_grouped")
        ok &= bool((dw[0].astype(cp.float32) == 2).all()) and bool((dw[1] == 0).all())
    from cygemm.grouped import lt_grouped
    lt_grouped.clear_plans()
    return ok


def _check_lt_grouped_fp8():
    """moe_scaled_gemm through route 'lt_grouped' (E4M3 with E4M3 and with E5M2; bfloat16 and
    float32 out; a scale per expert and one shared; int32 offsets with empty experts first, inside
    and last; padded leading dimensions; on Hopper, DeepSeek-V3's block scales too), bitwise
    against fp8.scaled_matmul per expert on the same exact inputs: values in {-1, 0, 1} and
    power-of-two scales, so every result is exact."""
    import cupy as cp
    import numpy as np
    import cygemm
    counts = [0, 5, 0, 19, 1, 7, 0]
    offs = np.concatenate([[0], np.cumsum(counts)]).tolist()
    T, K, N, G = offs[-1], 64, 48, len(counts)
    dev = cp.asarray(offs, dtype=cp.int32)
    ok = True
    one = cp.ones(1, cp.float32)

    def fp8_ternary(shape, fmt, phase):         # (exact in either format; rows 16 elements longer)
        t = _promises.ternary(cp, shape[:-1] + (shape[-1] + 16,), phase, cp.float32)
        return cygemm.fp8.quantize(t, one, format=fmt)[..., :shape[-1]]

    from cygemm.engine.dtypes import FP8_FORMATS
    e4m3 = next(iter(FP8_FORMATS))                  # (the table's first FP8 format; both are taken for w)
    for fmt_w in FP8_FORMATS:
        x, w = fp8_ternary((T, K), e4m3, 0.1), fp8_ternary((G, N, K), fmt_w, 0.3)
        scale_x = cp.asarray([0.5], cp.float32)
        for scale_w in (cp.asarray([2.0 ** (g % 3) for g in range(G)], cp.float32), cp.asarray([4.0], cp.float32)):
            for out_dtype in (_promises.half_dtypes(cp)[-1], cp.float32):
                out = _promises.nan_view(cp, (T, N), 16, out_dtype)
                ref = cp.full(out.shape, cp.nan, out.dtype)
                cygemm.moe_scaled_gemm(x, w, scale_x, scale_w, dev, out, format_x=e4m3, format_w=fmt_w,
                                       route="lt_grouped")
                cygemm.moe_scaled_gemm(x, w, scale_x, scale_w, offs, ref, format_x=e4m3, format_w=fmt_w)
                bits = cp.uint16 if out.dtype.itemsize == 2 else cp.uint32
                ok &= bool((out.view(bits) == ref.view(bits)).all()) and not bool(cp.isnan(out).any())
    # DeepSeek-V3's block scales where the GPU takes them (Hopper): 1x128 tokens, 128x128 weights,
    # powers of two varying over every block; experts of any rows (the reference pads them).
    from cygemm.engine import lt_features
    if lt_features.major() == 9:
        counts = [5, 0, 7, 19, 1, 12, 0]           # (rows not in fours: the padded blocks)
        offs = np.concatenate([[0], np.cumsum(counts)]).tolist()
        T, K, N, G = offs[-1], 256, 256, len(counts)
        kb, nb = K // 128, N // 128
        x, w = fp8_ternary((T, K), e4m3, 0.5), cp.ascontiguousarray(fp8_ternary((G, N, K), e4m3, 0.8))
        scale_x = cp.asfortranarray((2.0 ** (cp.arange(T * kb) % 3 - 1)).astype(cp.float32).reshape(T, kb))
        scale_w = cp.zeros((G * nb, 4), cp.float32)[:, :kb]        # (rows round_up(kb, 4) apart)
        scale_w[...] = (2.0 ** (cp.arange(G * nb * kb) % 5 - 2)).astype(cp.float32).reshape(G * nb, kb)
        workspace = cp.full(kb * (-(-T // 4) * 4 + 4 * G), cp.nan, cp.float32)
        dev = cp.asarray(offs, dtype=cp.int64)
        for out_dtype in (_promises.half_dtypes(cp)[-1], cp.float32):
            out, ref = cp.full((T, N), cp.nan, out_dtype), cp.full((T, N), cp.nan, out_dtype)
            cygemm.moe_scaled_gemm(x, w, scale_x, scale_w, dev, out, format_x=e4m3, format_w=e4m3,
                                   workspace=workspace, route="lt_grouped")
            cygemm.moe_scaled_gemm(x, w, scale_x, scale_w, offs, ref, format_x=e4m3, format_w=e4m3)
            bits = cp.uint16 if out.dtype.itemsize == 2 else cp.uint32
            ok &= bool((out.view(bits) == ref.view(bits)).all()) and not bool(cp.isnan(out).any())
    from cygemm.grouped import lt_grouped
    lt_grouped.clear_plans()
    return ok


_promises.register_check("lt_grouped", _check_lt_grouped)
_promises.register_check("lt_grouped_fp8", _check_lt_grouped_fp8)
