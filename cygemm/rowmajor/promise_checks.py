"""The exact first-use checks of the promises row-major GEMMs make (cygemm.engine.promises):
the K-tail guard's rule, batch invariance by kernel families, and the K-tail fix of a newer
cuBLASLt. Registered with the engine when cygemm.rowmajor is imported."""
from cygemm.engine import promises as _promises


def _check_ktail_guard():
    """Shapes whose first kernel dropped K's last element on cuBLAS 13.1 (H200), and their
    neighbours in K: every element exact through the guarded paths."""
    import cupy as cp
    import cygemm
    from cygemm.engine import plans
    ok = True
    for dtype in _promises.half_dtypes(cp):
        for m, n, k in ((64, 256, 32776), (16, 512, 24584), (8, 128, 40968), (1, 1024, 32776)):
            a, b = _promises.detector(cp, dtype, m, n, k)
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
    for dtype in _promises.half_dtypes(cp)[1:] + [cp.float32]:
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


_promises.register_check("ktail_guard", _check_ktail_guard)
_promises.register_check("batch_invariant", _check_batch_invariant)
_promises.register_check("ktail_fixed", _check_ktail_fixed)
