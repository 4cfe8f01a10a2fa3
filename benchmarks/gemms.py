"""The GEMM sections: "ceilings" (datasheet figures, measured copy bandwidth), "square",
"shapes", "transposes" and "batched": every GEMM contender and the C++ cublasGemmEx floor on
the same operands."""
import cupy as cp

import contenders as C
from common import L2_BYTES, gpu_ms
from recorder import inner_for


def n_sets(bytes_per_set):
    """Operand sets to rotate: several when one set would sit in L2 between calls."""
    return 1 if bytes_per_set >= L2_BYTES else 4


def ceilings_section(R, s, floor):
    """Datasheet figures and measured ones: copy bandwidth here, matrix rates from the
    best measured GEMM of each precision (filled in by the report)."""
    R.add("datasheet", "H200 SXM TF32 dense", "tflops_peak", 494.7)
    R.add("datasheet", "H200 SXM BF16/FP16 dense", "tflops_peak", 989.4)
    R.add("datasheet", "H200 SXM FP32 (no tensor cores)", "tflops_peak", 66.9)
    R.add("datasheet", "H200 HBM3e bandwidth", "gbps_peak", 4800.0)
    nbytes = (1 << 28) if R.quick else (1 << 30)
    src, dst = cp.ones(nbytes // 4, cp.float32), cp.empty(nbytes // 4, cp.float32)
    R.progress(f"copy bandwidth, {nbytes >> 20} MiB")
    with s:
        med, lo, hi = gpu_ms(cp, lambda: dst.__setitem__(Ellipsis, src), s, reps=20)
    # Read + write: 2 bytes moved per byte copied.
    R.add("measured copy bandwidth", "device-to-device copy (read+write)", "gbps", 2 * nbytes / med / 1e6,
          2 * nbytes / hi / 1e6, 2 * nbytes / lo / 1e6, ms=med)
    del src, dst


def gemm_case(R, s, case, m, n, k, prec, ta=False, tb=False, group=None):
    """Every GEMM contender on one problem, the C++ floor among them, in interleaved rounds."""
    flop = 2.0 * m * n * k
    itemsize = 2 if prec in ("fp16", "bf16") else 4
    sets = n_sets(itemsize * (m * k + k * n + m * n))
    try:
        ops = [(C.operand((k, m) if ta else (m, k), prec, 3 * i), C.operand((n, k) if tb else (k, n), prec, 3 * i + 1),
                C.operand((m, n), prec, 3 * i + 2)) for i in range(sets)]
    except C.Skip as sk:
        for name in C.GEMM_CONTENDERS:
            R.skip(case, name, sk)
        return
    R.progress(case)
    contenders = {}
    for name, make in C.GEMM_CONTENDERS.items():
        try:
            contenders[name] = [make(A, B, Cc, prec, ta, tb, s) for A, B, Cc in ops]
        except Exception as exc:
            contenders[name] = exc if isinstance(exc, C.Skip) else C.Skip(f"{type(exc).__name__}: {str(exc)[:160]}")
    R.measure(case, contenders, s, flop, inner=inner_for(flop), reps=15 if flop > 1e12 else 30,
              floors=[("C++ cublasGemmEx", f"gemm {m} {n} {k} {prec} {int(ta)} {int(tb)} gpu")],
              group=group, size=(m, n, k), prec=prec)
    del contenders, ops


def square_section(R, s, floor):
    sizes = [256, 2048] if R.quick else [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    for prec in ("tf32", "fp32", "fp16", "bf16"):
        for n in sizes:
            gemm_case(R, s, f"square {n}^3 {prec}", n, n, n, prec, group=f"square {prec}")
        cp.get_default_memory_pool().free_all_blocks()


def shapes_section(R, s, floor):
    shapes = [(8192, 8192, 1024)] if R.quick else [(32768, 1024, 1024), (8192, 8192, 1024), (64, 4096, 4096)]
    for prec in ("tf32", "bf16"):
        for m, n, k in shapes:
            gemm_case(R, s, f"MLP layer {m}x{n}x{k} {prec}", m, n, k, prec, group=f"shapes {prec}")
    cp.get_default_memory_pool().free_all_blocks()


def transposes_section(R, s, floor):
    n = 2048 if R.quick else 4096
    for ta, tb in ((False, False), (False, True), (True, False), (True, True)):
        tag = ("T" if ta else "N") + ("T" if tb else "N")
        gemm_case(R, s, f"{n}^3 tf32 op(A)op(B)={tag}", n, n, n, "tf32", ta, tb, group="transposes")


def batched_section(R, s, floor):
    cases = [(32, 16384), (64, 16384), (128, 4096)] if not R.quick else [(64, 4096)]
    for n, batch in cases:
        for bcast in (False, True):
            for prec in ("tf32", "fp32"):
                case = f"batched {batch}x{n}^3 {prec}" + (" (B broadcast)" if bcast else "")
                flop = 2.0 * n ** 3 * batch
                A = C.operand((batch, n, n), prec, 1)
                B = C.operand((1 if bcast else batch, n, n), prec, 2)
                Cc = C.operand((batch, n, n), prec, 3)
                R.progress(case)
                R.measure(case, C.batched_contenders(A, B, Cc, prec, s), s, flop, inner=10,
                          floors=[("C++ cublasGemmStridedBatchedEx", f"batched {n} {n} {n} {batch} {prec} {int(bcast)} gpu")],
                          group="batched")
                del A, B, Cc
    cp.get_default_memory_pool().free_all_blocks()
