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
from cygemm.engine.errors import CygemmError
from cygemm.engine.dtypes import ROWS

# cuBLASLt versions (cublasLtGetVersion) whose behaviour the promises were measured on: the
# loaded library's facts are cygemm.engine.lt_features's.
from cygemm.engine.lt_features import VERIFIED_CUBLASLT  # noqa: E402
VERIFIED = {"ktail_guard": VERIFIED_CUBLASLT, "batch_invariant": VERIFIED_CUBLASLT, "lt_grouped": (),
            "lt_grouped_fp8": (), "ktail_fixed": ()}
PROMISES = tuple(VERIFIED)

_verdicts = {}          # (promise, way) -> True (holds) / False (failed) for this process's cuBLASLt
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
    if verdict is not None:
        return verdict
    if verified(promise=promise) and promise not in _fail and way is None:
        return True                     # (measured on this cuBLASLt: nothing to check)
    # Decided once per process under the chooser's single flight (cygemm.engine.tuning): other
    # threads asking meanwhile wait for the verdict, in the tuning table as any tuned choice.
    from cygemm.engine import context as _context
    from cygemm.engine import tuning
    device = _context.current_device()
    key = (promise,) if way is None else (promise, way)
    if tuning.claim_flight(device, "promise", key, lambda: (promise, way) in _verdicts):
        try:
            _verdicts[(promise, way)] = _decide(promise, way)
        finally:
            tuning.release_flight(device, "promise", key)
    return _verdicts[(promise, way)]


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


def half_dtypes(cp):
    """(The checks' helpers, shared by the features' checks.) float16, and bfloat16 where ml_dtypes lets CuPy hold it."""
    from cygemm.engine.dtypes import numpy_dtype
    try:
        return [numpy_dtype(r["name"]) for r in ROWS if r["kind"] == "f" and r["size"] == 2]    # the half types
    except TypeError:
        return [cp.float16]


def detector(cp, dtype, m, n, k):
    """A (m x k) zero but its first and last columns (1), B (k x n) ones: C must be exactly 2."""
    a = cp.zeros((m, k), dtype)
    a[:, 0] = 1
    a[:, -1] = 1
    return a, cp.ones((k, n), dtype)


def ternary(cp, shape, phase, dtype):
    """Values in {-1, 0, 1} without cuRAND: every product and every sum of up to 256 of them is
    exact in float32 accumulation and in a bfloat16 or float16 result."""
    n = 1
    for d in shape:
        n *= d
    return cp.rint(cp.sin(cp.arange(n, dtype=cp.float32) * 0.917 + phase) * 1.4).reshape(shape).astype(dtype)


def padded(cp, shape, pad, dtype, phase):
    """Ternary values in a view of a wider buffer: rows `pad` elements longer than they hold, so
    every leading dimension differs from its matrix's columns."""
    buf = ternary(cp, shape[:-1] + (shape[-1] + pad,), phase, dtype)
    return buf[..., :shape[-1]]


def nan_view(cp, shape, pad, dtype):
    return cp.full(shape[:-1] + (shape[-1] + pad,), cp.nan, dtype)[..., :shape[-1]]


def same_bits(cp, got, ref):
    """Bitwise the same, and no NaN left (every element written)."""
    return bool((got.view(cp.uint16) == ref.view(cp.uint16)).all()) and not bool(cp.isnan(got).any())


_CHECKS = {}         # promise -> its exact check, registered by the feature that makes the promise


def register_check(promise, check):
    """Give `promise` (one of PROMISES) its exact check: a function of no arguments, run once on
    a side stream of its own, True where the promise holds. Each feature registers the checks of
    its promises when it is imported (cygemm.rowmajor, cygemm.grouped), so the engine never calls
    the public API itself."""
    if promise not in VERIFIED:
        raise ValueError(f"promise: expected one of {', '.join(PROMISES)}, got {promise!r}")
    _CHECKS[promise] = check


def _reset_for_tests():
    _verdicts.clear()
    _fail.clear()
