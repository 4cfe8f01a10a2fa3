"""Promises that rest on observed cuBLAS behaviour, checked on the cuBLAS the user has.

Two of cygemm's promises are not documented by cuBLAS, only measured:

- ``ktail_guard``: the rule by which cygemm.engine.ktail finds the split-K kernels that drop the end of
  K, and that the split it moves them to adds every product;
- ``batch_invariant``: every split-free kernel of one cuBLASLt algorithm adds in one order, so a
  row's bits do not depend on how many rows the call has (cygemm.engine.families).

Each was measured on the cuBLASLt versions in VERIFIED_CUBLASLT. On any other, the first call that
relies on a promise runs a small exact check of it once (a few GEMMs of at most 80 MB, then a
sync), and the verdict is kept per cuBLASLt version in the tuning table (cygemm.engine.tuning, which
keys its file by that version). A promise whose check failed makes the mode refuse with
CygemmError; it is never broken silently.
"""
import threading

from cygemm.engine.errors import CygemmError
from cygemm.engine.dtypes import ROWS

# cuBLASLt versions (cublasLtGetVersion) whose behaviour the promises were measured on.
VERIFIED_CUBLASLT = (130100,)
PROMISES = ("ktail_guard", "batch_invariant")

_lock = threading.RLock()
_verdicts = {}          # promise -> True (holds) / False (failed) for this process's cuBLASLt
_checking = set()       # promises whose check runs now (its own GEMMs rely on it: let them)
checks_run = {p: 0 for p in PROMISES}   # how many checks ran in this process (tests read it)
_fail = set()           # test hook: promises whose next check is made to fail


def _cublaslt_version():
    from cygemm.engine import context as _context
    return _context.versions()["cublasLt"]


def verified(version=None):
    """Whether this release's promises were measured on cuBLASLt `version` (default: loaded)."""
    return (_cublaslt_version() if version is None else version) in VERIFIED_CUBLASLT


def require(promise):
    """Return if `promise` holds on the loaded cuBLAS (checking it once where unverified), else
    raise CygemmError naming the version and what to do."""
    if promise in _checking:
        return
    holds = _verdicts.get(promise)
    if holds is None:
        with _lock:
            holds = _verdicts.get(promise)
            if holds is None:
                holds = _decide(promise)
                _verdicts[promise] = holds
    if not holds:
        raise CygemmError(
            f"{_WHAT[promise]} rests on cuBLAS behaviour that this release measured on cuBLASLt "
            f"{', '.join(map(str, VERIFIED_CUBLASLT))}; on the loaded cuBLASLt {_cublaslt_version()} its check "
            f"failed, so cygemm refuses rather than break it. Install a verified cuBLAS "
            f"(pip install 'nvidia-cublas==13.1.*'), or {_INSTEAD[promise]}")


_WHAT = {"ktail_guard": "The guard against GEMMs that drop the end of K",
         "batch_invariant": "determinism='batch_invariant'"}
_INSTEAD = {"ktail_guard": "avoid deep-K bf16/fp16 GEMMs whose K is not a multiple of 256.",
            "batch_invariant": "use determinism='run_to_run'."}


def _decide(promise):
    if verified() and promise not in _fail:
        return True
    from cygemm.engine import tuning
    from cygemm.engine import context as _context
    device = _context.current_device()
    key = (promise,)
    if promise not in _fail:
        record = tuning._lookup_promise(device, key)
        if record is not None:
            return bool(record.get("holds"))
    _checking.add(promise)
    try:
        checks_run[promise] += 1
        holds = _on_a_side_stream(_CHECKS[promise]) and promise not in _fail
    finally:
        _checking.discard(promise)
        _fail.discard(promise)
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


_CHECKS = {"ktail_guard": _check_ktail_guard, "batch_invariant": _check_batch_invariant}


def _reset_for_tests():
    with _lock:
        _verdicts.clear()
        _fail.clear()
