"""Run the consumer's GEMMs on CuPy arrays on a stream of their own; compare with float64.

    python check.py        (after: pip install --no-build-isolation .)
"""
import sys

import cupy as cp
import numpy as np

import consumer


def e4m3_values(codes):
    """float64 values of E4M3 codes (sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinity)."""
    e, m = (codes >> 3) & 15, (codes & 7).astype(np.float64)
    v = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e.astype(np.float64) - 7))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return np.where(codes >> 7, -v, v)


def fp8_blocks(rng, stream):
    """A (1 x 128 scales) and W (128 x 128 scales) quantized by cygemm, multiplied through the
    C API; the relative error against float64 of the codes times their scales."""
    from cygemm import fp8
    m, n, k = 256, 384, 640
    with stream:
        a = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
        w = cp.asarray(rng.standard_normal((n, k)).astype(np.float32) * 100)
        qa, sa = fp8.quantize_scaled(a, "1x128")
        qw, sw = fp8.quantize_scaled(w, "128x128")
        d = cp.full((m, n), cp.nan, cp.float32)
    consumer.fp8_gemm_blocks(qa.data.ptr, qw.data.ptr, d.data.ptr, m, n, k, sa.data.ptr, sw.data.ptr, stream.ptr)
    stream.synchronize()
    a64 = e4m3_values(qa.get()) * np.repeat(sa.get(), 128, axis=1)[:, :k]
    w64 = e4m3_values(qw.get()) * np.repeat(np.repeat(sw.get(), 128, axis=0), 128, axis=1)[:n, :k]
    ref = a64 @ w64.T
    return np.linalg.norm(d.get() - ref) / np.linalg.norm(ref)


def main():
    import cygemm
    reason = cygemm.gpu_unavailable_reason()
    if reason:
        print(f"consumer built and imported; needs a GPU to run ({reason})")
        return 0
    rng = np.random.default_rng()
    stream = cp.cuda.Stream(non_blocking=True)
    m, n, k, batch = 33, 17, 40, 5
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    with stream:
        A, B, C = cp.asarray(a), cp.asarray(b), cp.asarray(c0)
    consumer.sgemm(A.data.ptr, B.data.ptr, C.data.ptr, m, n, k, 0.5, 2.0, stream.ptr)
    stream.synchronize()
    ref = 0.5 * a.astype(np.float64) @ b.T.astype(np.float64) + 2.0 * c0
    err = np.linalg.norm(C.get() - ref) / np.linalg.norm(ref)

    a3 = rng.standard_normal((batch, m, k)).astype(np.float32)
    b2 = rng.standard_normal((k, n)).astype(np.float32)
    with stream:
        A3, B2 = cp.asarray(a3), cp.asarray(b2)
        C3 = cp.full((batch, m, n), cp.nan, cp.float32)    # poisoned: every element must be written
    consumer.sgemm_batched(A3.data.ptr, B2.data.ptr, C3.data.ptr, m, n, k, batch, stream.ptr)
    stream.synchronize()
    ref3 = a3.astype(np.float64) @ b2.astype(np.float64)
    err3 = np.linalg.norm(C3.get() - ref3) / np.linalg.norm(ref3)

    # FP8 E4M3 operands of small integers (exact in E4M3: codes of -2, -1, 0, 1, 2), so the
    # float64 reference is exact; the GEMM accumulates integers, exact in float32 too.
    codes = np.array([0xC0, 0xB8, 0x00, 0x38, 0x40], np.uint8)
    values = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    m8, n8, k8 = 32, 16, 64
    ia, iw = rng.integers(0, 5, (m8, k8)), rng.integers(0, 5, (n8, k8))
    with stream:
        A8, W8 = cp.asarray(codes[ia]), cp.asarray(codes[iw])
        D8 = cp.full((m8, n8), cp.nan, cp.float32)
        sa, sw = cp.asarray(np.array([0.5], np.float32)), cp.asarray(np.array([3.0], np.float32))
    consumer.fp8_gemm(A8.data.ptr, W8.data.ptr, D8.data.ptr, m8, n8, k8, sa.data.ptr, sw.data.ptr, stream.ptr)
    stream.synchronize()
    ref8 = 1.5 * values[ia] @ values[iw].T
    err8 = np.abs(D8.get() - ref8).max()
    errb = fp8_blocks(rng, stream)
    ok = err < 1e-5 and err3 < 1e-5 and err8 == 0 and errb < 1e-3   # NaN fails the comparisons
    print(f"sgemm rel. error {err:.1e}, sgemm_batched rel. error {err3:.1e}, fp8 max error {err8:.1e}, "
          f"fp8 block-scaled rel. error {errb:.1e}: {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
