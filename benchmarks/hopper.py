"""Benchmark sections for Hopper's fastest paths: FP8 GEMMs against cygemm's own bf16 GEMM and
torch._scaled_mm; grouped GEMMs against the cuBLAS routes timed from C++ and torch._grouped_mm;
cygemm's elementwise passes against a device-to-device copy of the same bytes and torch.

Every case: the same operands for every contender, interleaved rounds (Recorder.measure)."""
import cupy as cp
import numpy as np

import cygemm
from cygemm import fp8
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
    with bias + gelu fused, cygemm's bf16 GEMM on the same shapes, torch._scaled_mm and torch's bf16."""
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
        R.measure(case, contenders, s, flop=2.0 * M * N * K, reps=20)
        del a_bf, w_bf, a8, w8, out_ours, out_fused, out_bf, out_theirs
        torch.cuda.empty_cache()
