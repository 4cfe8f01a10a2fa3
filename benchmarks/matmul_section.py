"""The "matmul" section: cygemm.matmul against cp.matmul on layouts cp.matmul copies and
layouts it does not, the bytes each call allocates, and the host time per call."""
import statistics

import cupy as cp
import numpy as np

import cygemm
from common import host_us
from recorder import inner_for


def alloc_bytes(fn, stream):
    """Device bytes CuPy's allocator hands out during one call of fn (with out= given: the
    copies the call makes)."""
    pool = cp.get_default_memory_pool()
    got = [0]

    def counting(nbytes):
        got[0] += nbytes
        return pool.malloc(nbytes)
    cp.cuda.set_allocator(counting)
    try:
        fn()
        stream.synchronize()
    finally:
        cp.cuda.set_allocator(pool.malloc)
    return got[0]


def matmul_section(R, s, floor):
    """cygemm.matmul against cp.matmul (TF32 for both), out= given, on layouts cp.matmul
    copies and layouts it does not; and the bytes each call allocates (its copies)."""
    from cupy._core import _routines_linalg as cupy_linalg
    sq = [256, 4096] if R.quick else [64, 256, 1024, 4096, 8192]
    n = 2048 if R.quick else 4096
    rng = np.random.default_rng(5)

    def arr(*shape):
        return cp.asarray(rng.standard_normal(shape, dtype=np.float32))
    cases = [(f"matmul square {k}^3 tf32", arr(k, k), arr(k, k), 2.0 * k ** 3) for k in sq]
    cases += [
        (f"matmul {n}^3 a transposed view tf32", arr(n, n).T, arr(n, n), 2.0 * n ** 3),
        (f"matmul {n}^3 a column slice tf32", arr(n, 2 * n)[:, :n], arr(n, n), 2.0 * n ** 3),
        (f"matmul {n}^3 b transposed view, a row slice tf32", arr(2 * n, n)[::2], arr(n, n).T, 2.0 * n ** 3),
        ("matmul batched 16384x64^3 tf32", arr(16384, 64, 64), arr(16384, 64, 64), 2.0 * 64 ** 3 * 16384),
        ("matmul batched 16384x64^3 (b broadcast) tf32", arr(16384, 64, 64), arr(64, 64), 2.0 * 64 ** 3 * 16384),
        ("matmul batched 64x8x128x128 (b broadcast over 8) tf32", arr(64, 8, 128, 128), arr(64, 1, 128, 128),
         2.0 * 128 ** 3 * 512),
        (f"matmul 1-D . 2-D ({n},)@({n},{n}) tf32", arr(n), arr(n, n), 2.0 * n * n),
        (f"matmul 2-D . 1-D ({n},{n})@({n},) tf32", arr(n, n), arr(n), 2.0 * n * n),
        (f"matmul 2-D . strided 1-D ({n},{n})@x[::2] tf32", arr(n, n), arr(2 * n)[::2], 2.0 * n * n),
        (f"matmul 2-D . transposed view: ({n},{n})@x.T tf32", arr(n, n), arr(n, n).T, 2.0 * n ** 3),
    ]
    for case, a, b, flop in cases:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) if max(a.ndim, b.ndim) > 2 else ()
        out = cp.empty(batch + a.shape[-2:-1] + b.shape[-1:] if b.ndim > 1 else batch + a.shape[-2:-1], cp.float32)

        def ours(a=a, b=b, out=out):
            cygemm.matmul(a, b, out, stream=s)

        def theirs(a=a, b=b, out=out):
            cupy_linalg.set_compute_type(cp.float32, cupy_linalg.COMPUTE_TYPE_TF32)
            with s:
                cp.matmul(a, b, out=out)
        R.progress(case)
        rows = R.measure(case, {"cygemm.matmul": ours, "cp.matmul": theirs}, s, flop,
                         inner=inner_for(flop), reps=15 if flop > 1e12 else 30, group="matmul")
        for name, fn in (("cygemm.matmul", ours), ("cp.matmul", theirs)):
            R.add(case + " (bytes allocated per call)", name, "bytes", alloc_bytes(fn, s))
        del out, rows
    A, B, Y = arr(64, 64), arr(64, 64), cp.empty((64, 64), cp.float32)
    s.use()
    fns = {"cygemm.matmul(out=)": lambda: cygemm.matmul(A, B, Y), "cp.matmul(out=)": lambda: cp.matmul(A, B, out=Y)}
    per = {name: [] for name in fns}
    for r in range(3 if R.quick else 5):
        R.progress(f"matmul host-time round {r + 1}")
        for name, fn in fns.items():
            per[name].append(host_us(fn, s.synchronize, calls=1000 if R.quick else 3000))
    cp.cuda.Stream.null.use()
    for name, vals in per.items():
        R.add("64^3 host us/call: matmul", name, "host_us", statistics.median(vals), min(vals), max(vals))
    cp.get_default_memory_pool().free_all_blocks()
