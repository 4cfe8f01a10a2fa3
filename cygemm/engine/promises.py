"""Promises that rest on observed cuBLAS behaviour, checked on the cuBLAS the user has.

These of cygemm's promises are not documented by cuBLAS, only measured, or not yet run at all:

- ``ktail_guard``: the rule by which cygemm.engine.ktail finds the split-K kernels that drop the end of
  K, and that the split it moves them to adds every product;
- ``batch_invariant``: every split-free kernel of one cuBLASLt algorithm adds in one order, so a
  row's bits do not depend on how many rows the call has (cygemm.engine.families);
- ``lt_grouped``: cuBLASLt's grouped matmul, fed by cygemm's table of device offsets
  (cygemm.grouped.lt_grouped), gives each group exactly what the per-group path gives;
  ``lt_grouped_fp8`` the same in FP8 with each group's scales;
- ``ktail_fixed``: on a cuBLASLt whose notes name the K-tail fix (13.8.0.4), no GEMM drops the end
  of K without the guard, so the guard stands down.

Each promise lists in VERIFIED the cuBLASLt versions it was measured on (none for the last two:
this release has not run them on a cuBLASLt that has them). On any other, the first call that
relies on a promise runs a small exact check of it once (a few GEMMs of at most 80 MB, then a
sync), and the verdict is kept per cuBLASLt version in the tuning table (cygemm.engine.tuning, which
keys its file by that version). A promise whose check failed makes its mode refuse with
CygemmError (or, for ``ktail_fixed``, keeps the guard acting); it is never broken silently.
"""
import threading

from cygemm.engine.errors import CygemmError
from cygemm.engine.dtypes import ROWS

# cuBLASLt versions (cublasLtGetVersion) whose behaviour the promises were measured on.
VERIFIED_CUBLASLT = (130100,)
VERIFIED = {"ktail_guard": VERIFIED_CUBLASLT, "batch_invariant": VERIFIED_CUBLASLT, "lt_grouped": (),
            "lt_grouped_fp8": (), "ktail_fixed": ()}
PROMISES = tuple(VERIFIED)

_lock = threading.RLock()
_verdicts = {}          # promise -> True (holds) / False (failed) for this process's cuBLASLt
_checking = set()       # promises whose check runs now (its own GEMMs rely on it: let them)
checks_run = {p: 0 for p in PROMISES}   # how many checks ran in this process (tests read it)
_fail = set()           # test hook: promises whose next check is made to fail


def _cublaslt_version():
    from cygemm.engine import context as _context
    return _context.versions()["cublasLt"]


def verified(version=None, promise="ktail_guard"):
    """Whether `promise` was measured on cuBLASLt `version` (default: the loaded one)."""
    return (_cublaslt_version() if version is None else version) in VERIFIED[promise]


def holds(promise):
    """Whether `promise` holds on the loaded cuBLAS, checking it once where unverified (True
    while its own check runs: the check's GEMMs rely on it)."""
    if promise in _checking:
        return True
    way = _way(promise)
    verdict = _verdicts.get((promise, way))
    if verdict is None:
        with _lock:
            verdict = _verdicts.get((promise, way))
            if verdict is None:
                verdict = _decide(promise, way)
                _verdicts[(promise, way)] = verdict
    return verdict


def known(promise):
    """The verdict of `promise` in this process for the way it is kept now: True, False, or None
    (not decided yet: nothing is checked by asking)."""
    if verified(promise=promise) and _way(promise) is None:
        return True
    return _verdicts.get((promise, _way(promise)))


def _way(promise):
    """How the promise is kept now, where there are several ways: batch_invariant by cuBLASLt's
    own flag ("cublas", measured on no version yet) or by kernel families (None)."""
    if promise == "batch_invariant":
        from cygemm.engine import settings
        if settings.get_options()["batch_invariance"] == "cublas":
            from cygemm.engine import lt_features
            if lt_features.feature_gate("batch_invariance") is None:
                return "cublas"
    return None


def require(promise):
    """Return if `promise` holds on the loaded cuBLAS (checking it once where unverified), else
    raise CygemmError naming the version and what to do."""
    if holds(promise):
        return
    measured = VERIFIED[promise]
    on = (f"measured on cuBLASLt {', '.join(map(str, measured))}" if measured else
          "has not yet run on any cuBLASLt that offers it")
    raise CygemmError(
        f"{_WHAT[promise]} rests on cuBLAS behaviour that this release {on}; on the loaded cuBLASLt "
        f"{_cublaslt_version()} its first-use check failed, so cygemm refuses rather than give a wrong answer. "
        f"{_INSTEAD[promise]}")


_WHAT = {"ktail_guard": "The guard against GEMMs that drop the end of K",
         "batch_invariant": "determinism='batch_invariant'",
         "lt_grouped": "cuBLASLt's grouped matmul with the group offsets on the GPU (route 'lt_grouped')",
         "lt_grouped_fp8": "cuBLASLt's FP8 grouped matmul with the group offsets on the GPU (moe_scaled_gemm, "
                           "route 'lt_grouped')",
         "ktail_fixed": "The K-tail fix of cuBLAS 13.8.0.4"}
_INSTEAD = {"ktail_guard": "Install a verified cuBLAS (pip install 'nvidia-cublas==13.1.*'), or avoid deep-K "
                           "bf16/fp16 GEMMs whose K is not a multiple of 256.",
            "batch_invariant": "Install a verified cuBLAS (pip install 'nvidia-cublas==13.1.*'), or use "
                               "determinism='run_to_run'.",
            "lt_grouped": "Pass the group offsets as host ints, or route='host_offsets' (one sync a call, "
                          "outside captures), and report the cuBLAS version.",
            "lt_grouped_fp8": "Pass the group offsets as host ints, or route='host_offsets', and report the "
                              "cuBLAS version.",
            "ktail_fixed": "The guard keeps acting."}


def _decide(promise, way=None):
    if verified(promise=promise) and promise not in _fail and way is None:
        return True
    from cygemm.engine import tuning
    from cygemm.engine import context as _context
    device = _context.current_device()
    key = (promise,) if way is None else (promise, way)
    if promise not in _fail:
        record = tuning._lookup_promise(device, key)
        if record is not None:
            return bool(record.get("holds"))
    _checking.add(promise)
    remember = True
    try:
        checks_run[promise] += 1
        try:
            holds = _on_a_side_stream(_CHECKS[promise]) and promise not in _fail
        except CygemmError as exc:
            # cuBLAS or CUDA refused the check's own calls (the grouped matmul on a GPU it does
            # not support, say): the promise is not trusted in this process. Not remembered in
            # the tuning file: a passing failure (out of memory) must not shut it for good. Any
            # other exception is the caller's, and decides nothing.
            import warnings
            warnings.warn(f"cygemm: the first-use check of {_WHAT[promise]} failed with {exc!r}", RuntimeWarning,
                          stacklevel=3)
            holds, remember = False, False
    finally:
        _checking.discard(promise)
        _fail.discard(promise)
    if remember:
        tuning._remember_promise(device, key, {"holds": holds})
    return holds


def _on_a_side_stream(check):
    """Run a check on a new stream of its own, in relaxed capture mode: the first call that needs
    it may come inside a capture (of another stream), which the check's allocations, GEMMs and
    syncs must neither join nor invalidate."""
    import cupy as cp
    from cygemm.engine.streams import exchange_capture_mode
    old = exchange_capture_mode(2)
    try:
        side = cp.cuda.Stream(non_blocking=True)
        with side:
            holds = check()
        side.synchronize()
        return holds
    finally:
        exchange_capture_mode(old)


def _half_dtypes(cp):
    """float16, and bfloat16 where ml_dtypes lets CuPy hold it."""
    from cygemm.engine.dtypes import numpy_dtype
    try:
        return [numpy_dtype(r["name"]) for r in ROWS if r["kind"] == "f" and r["size"] == 2]    # the half types
    except TypeError:
        return [cp.float16]


def _detector(cp, dtype, m, n, k):
    """A (m x k) zero but its first and last columns (1), B (k x n) ones: C must be exactly 2."""
    a = cp.zeros((m, k), dtype)
    a[:, 0] = 1
    a[:, -1] = 1
    return a, cp.ones((k, n), dtype)


def _check_ktail_guard():
    """Shapes whose first kernel dropped K's last element on cuBLAS 13.1 (H200), and their
    neighbours in K: every element exact through the guarded paths."""
    import cupy as cp
    import cygemm
    from cygemm.engine import plans
    ok = True
    for dtype in _half_dtypes(cp):
        for m, n, k in ((64, 256, 32776), (16, 512, 24584), (8, 128, 40968), (1, 1024, 32776)):
            a, b = _detector(cp, dtype, m, n, k)
            c = cp.full((m, n), cp.nan, dtype)
            cygemm.gemm(a, b, out=c)
            ok &= bool((c.astype(cp.float32) == 2).all())
    plans.clear_plan_cache()
    return ok


def _check_batch_invariant():
    """The rows of a bf16 and a TF32 product under batch_invariant, for 1, 7 and 300 rows of the
    same operands: bitwise the same."""
    import cupy as cp
    import cygemm
    from cygemm.engine import plans
    ok = True
    for dtype in _half_dtypes(cp)[1:] + [cp.float32]:
        # Operands without cuRAND (its first use would not run beside a capture): sin of a ramp.
        x = cp.sin(cp.arange(300 * 1024, dtype=cp.float32) * 0.731).reshape(300, 1024).astype(dtype)
        w = cp.sin(cp.arange(1024 * 768, dtype=cp.float32) * 1.37 + 0.5).reshape(1024, 768).astype(dtype)
        full = cygemm.matmul(x, w, determinism="batch_invariant")
        for rows in (1, 7):
            part = cygemm.matmul(x[:rows], w, determinism="batch_invariant")
            bits = cp.uint32 if dtype == cp.float32 else cp.uint16
            ok &= bool((part.view(bits) == full[:rows].view(bits)).all())
    plans.clear_plan_cache()
    return ok


def _check_ktail_fixed():
    """The K-tail guard's detector with the guard standing down (cygemm.engine.ktail treats
    cuBLAS as fixed while this runs): every element exact through cuBLAS's own choices."""
    return _check_ktail_guard()


def _ternary(cp, shape, phase, dtype):
    """Values in {-1, 0, 1} without cuRAND: every product and every sum of up to 256 of them is
    exact in float32 accumulation and in a bfloat16 or float16 result."""
    n = 1
    for d in shape:
        n *= d
    return cp.rint(cp.sin(cp.arange(n, dtype=cp.float32) * 0.917 + phase) * 1.4).reshape(shape).astype(dtype)


def _padded(cp, shape, pad, dtype, phase):
    """Ternary values in a view of a wider buffer: rows `pad` elements longer than they hold, so
    every leading dimension differs from its matrix's columns."""
    buf = _ternary(cp, shape[:-1] + (shape[-1] + pad,), phase, dtype)
    return buf[..., :shape[-1]]


def _nan_view(cp, shape, pad, dtype):
    return cp.full(shape[:-1] + (shape[-1] + pad,), cp.nan, dtype)[..., :shape[-1]]


def _same(cp, got, ref):
    """Bitwise the same, and no NaN left (every element written)."""
    return bool((got.view(cp.uint16) == ref.view(cp.uint16)).all()) and not bool(cp.isnan(got).any())


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
    for dtype in _half_dtypes(cp):
        x, dy = _padded(cp, (T, K), 8, dtype, 0.1), _padded(cp, (T, N), 16, dtype, 0.7)
        for index in (cp.int32, cp.int64):
            dev = cp.asarray(offs, dtype=index)
            for layout in ("kn", "nk"):
                w = _padded(cp, (G, K, N) if layout == "kn" else (G, N, K), 8, dtype, 0.3)
                out, ref = _nan_view(cp, (T, N), 8, dtype), _nan_view(cp, (T, N), 8, dtype)
                cygemm.moe_gemm(x, w, dev, out, w_layout=layout, route="lt_grouped")
                cygemm.moe_gemm(x, w, offs, ref, w_layout=layout, route="loop")
                ok &= _same(cp, out, ref)
                dw, dw_ref = _nan_view(cp, w.shape, 16, dtype), _nan_view(cp, w.shape, 16, dtype)
                cygemm.moe_gemm_wgrad(x, dy, dev, dw, dw_layout=layout, route="lt_grouped")
                cygemm.moe_gemm_wgrad(x, dy, offs, dw_ref, dw_layout=layout, route="loop")
                ok &= _same(cp, dw, dw_ref)
                ok &= all(bool((dw[g] == 0).all()) for g in range(G) if counts[g] == 0)
    dtype = _half_dtypes(cp)[-1]
    # Many waves: the sizes of a real layer, where cuBLAS's kernels schedule otherwise.
    counts = (np.arange(32) * 17 % 29 + 1) * 8
    counts[-1] += 8192 - counts.sum()
    offs = np.concatenate([[0], np.cumsum(counts)]).tolist()
    T, K, N = 8192, 1024, 512
    x, dy = _ternary(cp, (T, K), 0.2, dtype), _ternary(cp, (T, N), 0.4, dtype)
    w = _ternary(cp, (32, N, K), 0.6, dtype)
    dev = cp.asarray(offs, dtype=cp.int32)
    out, ref = cp.full((T, N), cp.nan, dtype), cp.full((T, N), cp.nan, dtype)
    cygemm.moe_gemm(x, w, dev, out, w_layout="nk", route="lt_grouped")
    cygemm.moe_gemm(x, w, offs, ref, w_layout="nk", route="loop")
    ok &= _same(cp, out, ref)
    dw, dw_ref = cp.full(w.shape, cp.nan, dtype), cp.full(w.shape, cp.nan, dtype)
    cygemm.moe_gemm_wgrad(x, dy, dev, dw, dw_layout="nk", route="lt_grouped")
    cygemm.moe_gemm_wgrad(x, dy, offs, dw_ref, dw_layout="nk", route="loop")
    ok &= _same(cp, dw, dw_ref)
    del x, dy, w, out, ref, dw, dw_ref
    for dtype in _half_dtypes(cp):
        # The K-tail detector through the grouped matmul: a deep K that is no multiple of 256,
        # fixed (the forward's hidden size) and ragged (a weight gradient's rows); C must be 2.
        deep = 32776
        a, b = _detector(cp, dtype, 16, 16, deep)
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
        t = _ternary(cp, shape[:-1] + (shape[-1] + 16,), phase, cp.float32)
        return cygemm.fp8.quantize(t, one, format=fmt)[..., :shape[-1]]

    from cygemm.engine.dtypes import FP8_FORMATS
    e4m3 = next(iter(FP8_FORMATS))                  # (the table's first FP8 format; both are taken for w)
    for fmt_w in FP8_FORMATS:
        x, w = fp8_ternary((T, K), e4m3, 0.1), fp8_ternary((G, N, K), fmt_w, 0.3)
        scale_x = cp.asarray([0.5], cp.float32)
        for scale_w in (cp.asarray([2.0 ** (g % 3) for g in range(G)], cp.float32), cp.asarray([4.0], cp.float32)):
            for out_dtype in (_half_dtypes(cp)[-1], cp.float32):
                out = _nan_view(cp, (T, N), 16, out_dtype)
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
        for out_dtype in (_half_dtypes(cp)[-1], cp.float32):
            out, ref = cp.full((T, N), cp.nan, out_dtype), cp.full((T, N), cp.nan, out_dtype)
            cygemm.moe_scaled_gemm(x, w, scale_x, scale_w, dev, out, format_x=e4m3, format_w=e4m3,
                                   workspace=workspace, route="lt_grouped")
            cygemm.moe_scaled_gemm(x, w, scale_x, scale_w, offs, ref, format_x=e4m3, format_w=e4m3)
            bits = cp.uint16 if out.dtype.itemsize == 2 else cp.uint32
            ok &= bool((out.view(bits) == ref.view(bits)).all()) and not bool(cp.isnan(out).any())
    from cygemm.grouped import lt_grouped
    lt_grouped.clear_plans()
    return ok


_CHECKS = {"ktail_guard": _check_ktail_guard, "batch_invariant": _check_batch_invariant,
           "lt_grouped": _check_lt_grouped, "lt_grouped_fp8": _check_lt_grouped_fp8,
           "ktail_fixed": _check_ktail_fixed}


def _reset_for_tests():
    with _lock:
        _verdicts.clear()
        _fail.clear()
