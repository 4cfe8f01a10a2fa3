"""Benchmark sections for Hopper's fastest paths: FP8 GEMMs against cygemm's own bf16 GEMM and
torch._scaled_mm; grouped GEMMs against the cuBLAS routes timed from C++ and torch._grouped_mm;
cygemm's elementwise passes against a device-to-device copy of the same bytes and torch.

Every case: the same operands for every contender, interleaved rounds (Recorder.measure)."""
import cupy as cp

import cygemm
from cygemm import elementwise, fp8
from cygemm.gemm_ops import forward_into
import contenders as C

FP8_SHAPES = ((8192, 8192, 8192), (4096, 4096, 4096), (16384, 4096, 1024))     # M, N, K


def _torch():
    if C.torch is None:
        raise C.Skip("torch not importable")
    return C.torch


def _on_torch_stream(s, fn):
    torch = _torch()
    ts = torch.cuda.ExternalStream(s.ptr)

    def call():
        with torch.cuda.stream(ts):
            fn()
    return call


def fp8_section(R, s, floor):
    """FP8 E4M3 GEMMs, bf16 out, a (M, K) row-major and w (N, K) (b = w.T): cygemm's FP8 plain and
    with bias + gelu fused, cygemm's bf16 GEMM on the same shapes, torch._scaled_mm and torch's bf16,
    and cuBLASLt's fastest FP8 kernels (plain, bias + gelu) timed from C++ on operands of the
    same shapes."""
    torch = _torch()
    shapes = FP8_SHAPES[1:2] if R.quick else FP8_SHAPES
    for M, N, K in shapes:
        case = f"fp8 {M}x{N}x{K}"
        R.progress(case)
        g = torch.Generator(device="cuda").manual_seed(M + N + K)
        a_bf = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
        w_bf = torch.randn(N, K, device="cuda", generator=g).to(torch.bfloat16)
        a8, w8 = a_bf.to(torch.float8_e4m3fn), w_bf.to(torch.float8_e4m3fn)
        bias = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16)
        one = torch.ones(1, device="cuda")
        out_ours, out_fused, out_bf, out_theirs = (torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                                                   for _ in range(4))
        ptr = s.ptr
        torch.cuda.synchronize()
        contenders = {
            "cygemm fp8": lambda: fp8.scaled_matmul(a8, w8.t(), one, one, out=out_ours, stream=ptr),
            "cygemm fp8 + bias + gelu": lambda: fp8.scaled_matmul(a8, w8.t(), one, one, out=out_fused,
                                                                  bias=bias, act="gelu", stream=ptr),
            "cygemm bf16": lambda: cygemm.gemm(a_bf, w_bf, out_bf, trans_b=True, stream=ptr),
            "torch._scaled_mm": _on_torch_stream(s, lambda: torch._scaled_mm(
                a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, out=out_theirs)),
            "torch bf16 mm": _on_torch_stream(s, lambda: torch.mm(a_bf, w_bf.t(), out=out_theirs)),
        }
        floors = [("C++ cuBLASLt fp8 (fastest of 8)", f"fp8 {M} {N} {K} none gpu"),
                  ("C++ cuBLASLt fp8 + bias + gelu (fastest of 8)", f"fp8 {M} {N} {K} gelu_bias gpu")]
        # 8192^3 in FP8 draws the H200 to its power limit and its clock down (1980 -> 1575 MHz over
        # a run): rounds moved by 15%, so more of them, every contender in each.
        R.measure(case, contenders, s, flop=2.0 * M * N * K, reps=20, floors=floors, rounds=7)
        contenders.clear()
        torch.cuda.empty_cache()


def _copy(s, nbytes):
    """A device-to-device copy moving nbytes in all (nbytes / 2 read, nbytes / 2 written)."""
    half = nbytes // 2
    src, dst = cp.empty(half, cp.uint8), cp.empty(half, cp.uint8)
    D2D = cp.cuda.runtime.memcpyDeviceToDevice
    return lambda: cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, half, D2D, s.ptr)


def _measure_bandwidth(R, case, contenders, s, nbytes):
    """Time contenders that each move nbytes, beside a copy of the same bytes; rows get GB/s
    and their fraction of the copy's."""
    contenders = dict(contenders, **{"device-to-device copy": _copy(s, nbytes)})
    rows = R.measure(case, contenders, s, reps=30, bytes=nbytes)
    copy = next((r for r in rows if r["contender"] == "device-to-device copy"), None)
    for r in rows:
        r["gbps"] = nbytes / r["value"] / 1e6
        if copy:
            r["of_copy"] = copy["value"] / r["value"]
    return rows


def elementwise_section(R, s, floor):
    """cygemm's elementwise passes (the dense layer's, and FP8 quantize) at 8192 x 8192, in GB/s
    against a copy of the same bytes; torch's activations beside them; then the dense forward
    with Z saved (8192 x 8192 x 1024, TF32, weight stored (N, K)) against torch's F.linear +
    activation."""
    torch = _torch()
    F = torch.nn.functional
    M = N = 4096 if R.quick else 8192
    ptr = s.ptr
    for dtype in ("float32", "bfloat16"):
        tdt = getattr(torch, dtype)
        size = 4 if dtype == "float32" else 2
        g = torch.Generator(device="cuda").manual_seed(7)
        x = torch.randn(M, N, device="cuda", generator=g).to(tdt)
        gy = torch.randn(M, N, device="cuda", generator=g).to(tdt)
        b = torch.randn(N, device="cuda", generator=g).to(tdt)
        y, z, dz = (torch.empty_like(x) for _ in range(3))
        db = torch.empty(N, device="cuda", dtype=tdt)
        one = torch.ones(1, device="cuda")
        q = torch.empty(M, N, device="cuda", dtype=torch.uint8)
        amax = torch.empty(1, device="cuda")
        n = M * N
        torch.cuda.synchronize()
        for act, tact in (("gelu", lambda t: F.gelu(t, approximate="tanh")), ("silu", F.silu)):
            case = f"{act} forward pass {M}x{N} {dtype}"
            R.progress(case)
            _measure_bandwidth(R, case, {
                "cygemm bias_act": lambda: elementwise.bias_act(x, b, out=y, act=act, stream=ptr),
                f"torch {act}": _on_torch_stream(s, lambda: tact(x)),
            }, s, 2 * n * size)
            _measure_bandwidth(R, f"{act} forward pass saving Z {M}x{N} {dtype}", {
                "cygemm bias_act (z_out)": lambda: elementwise.bias_act(x, b, out=y, z_out=z, act=act, stream=ptr),
            }, s, 3 * n * size)
            _measure_bandwidth(R, f"{act} backward dZ + bias gradient {M}x{N} {dtype}", {
                "cygemm act_backward": lambda: elementwise.act_backward(gy, z, dz_out=dz, dbias_out=db, act=act,
                                                                        stream=ptr),
            }, s, 3 * n * size)
        _measure_bandwidth(R, f"fp8 quantize {M}x{N} {dtype} -> e4m3 with amax", {
            "cygemm quantize": lambda: fp8.quantize(x, one, out=q, format="e4m3", amax=amax, stream=ptr),
            "torch cast (no scale, no amax)": _on_torch_stream(s, lambda: x.to(torch.float8_e4m3fn)),
        }, s, n * size + n)
    # The dense forward, Z saved: cygemm's fused routes against torch's GEMM + activation.
    Md, Nd, Kd = (4096, 4096, 1024) if R.quick else (8192, 8192, 1024)
    g = torch.Generator(device="cuda").manual_seed(8)
    A = torch.randn(Md, Kd, device="cuda", generator=g)
    W = torch.randn(Nd, Kd, device="cuda", generator=g)
    b = torch.randn(Nd, device="cuda", generator=g)
    out, z = torch.empty(Md, Nd, device="cuda"), torch.empty(Md, Nd, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    for act, tact in (("gelu", lambda t: F.gelu(t, approximate="tanh")), ("silu", F.silu)):
        case = f"dense {act} forward saving Z {Md}x{Nd}x{Kd} tf32"
        R.progress(case)
        forward_into(A, W.T, out, b, act=act, save_z=True, z_out=z, stream=ptr)     # tuned before timing
        s.synchronize()
        R.measure(case, {
            "cygemm forward_into (save_z)": lambda: forward_into(A, W.T, out, b, act=act, save_z=True, z_out=z,
                                                                 stream=ptr),
            "torch F.linear + activation": _on_torch_stream(s, lambda: tact(F.linear(A, W, b))),
        }, s, flop=2.0 * Md * Nd * Kd, reps=20)


# The mixture-of-experts shapes: (name, rows per expert, K, N). The ragged one: 16 experts of
# 128..1664 rows, 13056 in all.
_RAGGED = [128 * i for i in range(1, 14)] + [128, 640, 640]
GROUPED_SHAPES = (("16 ragged", _RAGGED, 4096, 1024), ("64 x 256", [256] * 64, 4096, 1024),
                  ("8 x 2048", [2048] * 8, 4096, 4096))


def grouped_section(R, s, floor):
    """Grouped bf16 GEMMs out_g = x_g @ W_g^T (W stored (G, N, K)) in the mixture-of-experts
    form: cygemm.moe_gemm (its measured route), torch._grouped_mm and, for uniform groups,
    torch.bmm; the cuBLAS routes timed from C++ on operands of the same shapes."""
    import numpy as np
    from cygemm import grouped
    torch = _torch()
    ptr = s.ptr
    for name, rows, K, N in (GROUPED_SHAPES[1:2] if R.quick else GROUPED_SHAPES):
        G, T = len(rows), sum(rows)
        case = f"grouped bf16 {name}, K={K}, N={N}"
        R.progress(case)
        g = torch.Generator(device="cuda").manual_seed(G)
        x = torch.randn(T, K, device="cuda", generator=g).to(torch.bfloat16)
        w = torch.randn(G, N, K, device="cuda", generator=g).to(torch.bfloat16)
        out = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)
        out_t = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)
        offsets = [0] + list(np.cumsum(rows))
        ends = torch.tensor(offsets[1:], device="cuda", dtype=torch.int32)
        grouped.moe_gemm(x, w, offsets, out, w_layout="nk", stream=ptr)       # routes timed here, once
        s.synchronize()
        chosen = grouped.last_route()
        contenders = {f"cygemm moe_gemm ({chosen})": lambda: grouped.moe_gemm(x, w, offsets, out, w_layout="nk",
                                                                             stream=ptr)}
        if hasattr(torch, "_grouped_mm"):
            contenders["torch._grouped_mm"] = _on_torch_stream(s, lambda: torch._grouped_mm(
                x, w.transpose(-2, -1), offs=ends, out_dtype=torch.bfloat16))
        else:
            contenders["torch._grouped_mm"] = C.Skip("this torch has no _grouped_mm")
        if len(set(rows)) == 1:
            xb, ob = x.view(G, rows[0], K), out_t.view(G, rows[0], N)
            contenders["torch.bmm"] = _on_torch_stream(s, lambda: torch.bmm(xb, w.transpose(-2, -1), out=ob))
        listed = ",".join(map(str, rows))
        floors = [(f"C++ cuBLAS {route}", f"grouped {route} bf16 {K} {N} {listed} gpu")
                  for route in ("loop", "grouped") + (("batched",) if len(set(rows)) == 1 else ())]
        R.measure(case, contenders, s, flop=2.0 * T * N * K, reps=20, floors=floors, route=chosen, rounds=5)
        contenders.clear()
        torch.cuda.empty_cache()
