"""Benchmark section: FP8 GEMMs with finer scales, fast accumulation, and the kernels that
quantize for them.

- GEMMs (E4M3 in, bfloat16 out, a (M, K) row-major, w (N, K), b = w.T): cygemm's scaled_matmul
  with per-tensor, rowwise, 1x128 x 128x128 and 1x128 x 1x128 scales, per tensor with
  fast_accum, torch._scaled_mm with the scales it takes (per tensor, rowwise, and the block
  pair where this torch accepts it), and both libraries' bfloat16 GEMMs; the same operands for
  every contender, interleaved rounds. Each row's ``vs_bf16`` is cygemm's bf16 GEMM's time over
  its own.
- Accuracy (metric ``rel_err``): each cygemm mode's result against float64 of the bfloat16
  inputs (what quantizing costs), and fast_accum's against float64 of the FP8 values themselves
  (what skipping the promotion of partial sums costs), as K grows.
- The C++ floor for each pair: cuBLASLt's fastest candidate of all its heuristic offers, under
  several workspace limits, timed from C++ (benchmarks/cublas_floor.cu).
- A cygemm.nn Dense layer's training step with 8192^3 GEMMs, bf16-mixed against each FP8 recipe.
- Quantizing (8192 x 8192 bfloat16 -> E4M3 with scales): quantize_scaled in each mode, plain and
  transposed, in GB/s and as a fraction of a device-to-device copy of the same bytes."""
import cupy as cp

import cygemm
from cygemm import fp8
import contenders as C
from hopper import _measure_bandwidth, _on_torch_stream, _torch

SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 1024), (4096, 14336, 4096))    # M, N, K
PAIRS = (("tensor", "tensor"), ("rowwise", "rowwise"), ("1x128", "128x128"), ("1x128", "1x128"))


def _quantized(torch, x, mode):
    """x's FP8 codes (torch float8) and scales as scaled_matmul's a (for w: pass scale.T)."""
    if mode == "tensor":
        amax = x.abs().max().float().reshape(1)
        scale = (448.0 / amax).clamp(max=2.0 ** 126)
        return (x.float() * scale).to(torch.float8_e4m3fn), (1.0 / scale).reshape(1)
    return fp8.quantize_scaled(x, mode)


def _rel_err(torch, got, ref):
    return float((got.double() - ref).norm() / ref.norm())


def fp8_scales_section(R, s, floor):
    torch = _torch()
    shapes = SHAPES[:1] if R.quick else SHAPES
    ptr = s.ptr
    for M, N, K in shapes:
        case = f"fp8 scales {M}x{N}x{K}"
        R.progress(case)
        g = torch.Generator(device="cuda").manual_seed(M + 3 * N + 7 * K)
        a = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
        w = torch.randn(N, K, device="cuda", generator=g).to(torch.bfloat16)
        quant = {mode: (_quantized(torch, a, mode), _quantized(torch, w, mode))
                 for mode in ("tensor", "rowwise", "1x128", "128x128")}
        outs = {name: torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                for name in [f"{p}" for p in PAIRS] + ["fast", "bf16", "torch"]}
        torch.cuda.synchronize()

        def ours(mode_a, mode_b, out, fast=False):
            (qa, sa), (qw, sw) = quant[mode_a][0], quant[mode_b][1]
            return lambda: fp8.scaled_matmul(qa, qw.t(), sa, sw.t(), out=out, fast_accum=fast, stream=ptr)

        contenders = {f"cygemm fp8 {ma} x {mb}": ours(ma, mb, outs[f"{(ma, mb)}"]) for ma, mb in PAIRS}
        contenders["cygemm fp8 tensor x tensor fast_accum"] = ours("tensor", "tensor", outs["fast"], fast=True)
        contenders["cygemm bf16"] = lambda: cygemm.gemm(a, w, outs["bf16"], trans_b=True, stream=ptr)
        for ma, mb in (("tensor", "tensor"), ("rowwise", "rowwise"), ("1x128", "128x128")):
            (qa, sa), (qw, sw) = quant[ma][0], quant[mb][1]
            name = f"torch._scaled_mm {ma} x {mb}"
            try:        # (the block pair: torch 2.11 refused the layouts tried; recorded as skipped)
                torch._scaled_mm(qa, qw.t(), scale_a=sa, scale_b=sw.t(), out_dtype=torch.bfloat16)
                contenders[name] = _on_torch_stream(s, lambda qa=qa, qw=qw, sa=sa, sw=sw: torch._scaled_mm(
                    qa, qw.t(), scale_a=sa, scale_b=sw.t(), out_dtype=torch.bfloat16, out=outs["torch"]))
            except Exception as exc:
                contenders[name] = C.Skip(f"torch {torch.__version__} refused it: {type(exc).__name__}: {str(exc)[:120]}")
        contenders["torch bf16 mm"] = _on_torch_stream(s, lambda: torch.mm(a, w.t(), out=outs["torch"]))
        # cuBLASLt's best from C++ for each pair: every candidate its heuristic offers under
        # workspace limits of 0, 4 MiB and 32 MiB, the fastest kept (scales of 1, random codes).
        floors = [(f"C++ cuBLASLt fp8 {ma} x {mb} (fastest candidate)", f"fp8 {M} {N} {K} none {ma} {mb} gpu")
                  for ma, mb in PAIRS]
        rows = R.measure(case, contenders, s, flop=2.0 * M * N * K, reps=20, rounds=5, floors=floors)
        bf16 = next((r["value"] for r in rows if r["contender"] == "cygemm bf16"), None)
        for r in rows:
            if bf16:
                r["vs_bf16"] = bf16 / r["value"]
        # Accuracy: against float64 of the bfloat16 inputs, and fast_accum against the FP8 values.
        torch.cuda.synchronize()
        ref = a.double() @ w.double().t()
        for ma, mb in PAIRS:
            ours(ma, mb, outs[f"{(ma, mb)}"])()
            s.synchronize()
            R.add(case, f"cygemm fp8 {ma} x {mb}", "rel_err", _rel_err(torch, outs[f"{(ma, mb)}"], ref),
                  against="float64 of the bfloat16 inputs")
        (qa, sa), (qw, sw) = quant["tensor"][0], quant["tensor"][1]
        exact = (qa.double() * sa.double()) @ (qw.double() * sw.double()).t()
        for fast in (False, True):
            out = outs["fast"]
            ours("tensor", "tensor", out, fast=fast)()
            s.synchronize()
            R.add(case, f"cygemm fp8 tensor x tensor{' fast_accum' if fast else ''}", "rel_err",
                  _rel_err(torch, out, exact), against="float64 of the FP8 values")
        del quant, contenders, outs, ref, exact
        torch.cuda.empty_cache()
    _dense_step(R, s)
    _quantize_bandwidth(R, s, torch)


def _dense_step(R, s):
    """One cygemm.nn Dense layer's training step (forward and backward, every quantization and
    cast included; relu) with 8192 x 8192 x 8192 GEMMs, in bf16-mixed and each FP8 recipe,
    interleaved on the same input. Each row's ``vs_bf16_mixed`` is its time over bf16-mixed's."""
    from cygemm import nn
    n = 4096 if R.quick else 8192
    case = f"dense layer step {n}x{n}x{n} relu"
    R.progress(case)
    with s:
        x = cp.random.default_rng(5).standard_normal((n, n), dtype=cp.float32)
        gy = cp.random.default_rng(6).standard_normal((n, n), dtype=cp.float32)
    contenders = {}
    for precision in ("bf16-mixed", "fp8-tensor", "fp8-rowwise", "fp8-block"):
        layer = nn.Dense(n, n, act="relu", seed=1, precision=precision).bind(n, stream=s)
        contenders[f"cygemm.nn Dense {precision}"] = lambda layer=layer: (layer.forward(x), layer.backward(gy))
    rows = R.measure(case, contenders, s, flop=6.0 * n ** 3, reps=10, rounds=5)
    base = next((r["value"] for r in rows if r["contender"] == "cygemm.nn Dense bf16-mixed"), None)
    for r in rows:
        if base:
            r["vs_bf16_mixed"] = r["value"] / base
    del contenders
    cp.get_default_memory_pool().free_all_blocks()


def _quantize_bandwidth(R, s, torch):
    n = 4096 if R.quick else 8192
    x = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    ptr = s.ptr
    for mode in ("tensor", "rowwise", "1x128", "128x128"):
        for transpose in (False, True):
            q, scale = fp8.quantize_scaled(x, mode, transpose=transpose)
            torch.cuda.synchronize()
            case = f"quantize_scaled {mode}{' transposed' if transpose else ''} {n}x{n} bfloat16 -> e4m3"
            R.progress(case)
            nbytes = n * n * 2 + n * n + scale.numel() * 4
            _measure_bandwidth(R, case, {
                "cygemm quantize_scaled": lambda q=q, scale=scale, transpose=transpose: fp8.quantize_scaled(
                    x, mode, transpose=transpose, out=q, scale=scale, stream=ptr),
            }, s, nbytes)
