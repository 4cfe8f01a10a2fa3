"""Benchmark section: a mixture-of-experts layer's three GEMMs with the expert offsets on the GPU.

DeepSeek-V3's experts (256 experts, top-8 routing, hidden 7168, expert width 2048: the fused gate
and up projection, N = 4096) and Mixtral's (8 experts, top-2, 4096 -> 14336), 512 to 16384 tokens
routed at random (seeded; every token to `top` distinct experts, so some experts get few rows or
none at small batches). For each: the forward (ragged M, w stored (G, N, K)), the data gradient
(ragged M, w read transposed in place) and the weight gradient (ragged K).

Contenders, on the same operands, interleaved (Recorder.measure), GPU time from CUDA graphs of
one call where the call can be captured:

- "cygemm lt_grouped": cygemm.moe_gemm / moe_gemm_wgrad with int32 offsets on the GPU, route
  "lt_grouped" (cuBLASLt's grouped matmul; no host sync), in a graph;
- "torch._grouped_mm": torch's sync-free bf16 grouped GEMM (CUTLASS on sm_90), in a graph;
- "cygemm host offsets + sync": route "host_offsets": the offsets read to the host (a stream
  sync) and cygemm's routes of host offsets, as a model whose routing is computed on the GPU
  must do without lt_grouped (not capturable: timed between events, the sync's gap included);
- "cygemm loop of per-expert GEMMs": route "loop" on host offsets, in a graph;
- FP8 (forward only, DeepSeek-V3): cygemm.moe_scaled_gemm (E4M3, route "lt_grouped") with
  tensor-wide scales and with DeepSeek-V3's 1x128 / 128x128 block scales, loops of
  cygemm.fp8.scaled_matmul per expert with each, against bf16 lt_grouped, each in a graph.

Targets: bf16 lt_grouped >= 1.0x torch._grouped_mm; FP8 block-scaled grouped >= 1.5x bf16 grouped
from 4096 tokens; no host sync on the device-offset path (the graph replays).
"""
import numpy as np

import cygemm
from cygemm import grouped, fp8
import contenders as C
from hopper import _on_torch_stream

# name, experts, top-k, hidden (K of the up projection), expert width (N, gate and up fused)
MODELS = (("DeepSeek-V3", 256, 8, 7168, 4096), ("Mixtral-8x7B", 8, 2, 4096, 14336))
TOKENS = (512, 2048, 4096, 16384)
QUICK_TOKENS = (2048,)


def routed_offsets(tokens, experts, top, seed):
    """The experts' row offsets (G + 1) after routing `tokens` tokens each to `top` distinct
    experts chosen at random (seeded)."""
    rng = np.random.default_rng(seed)
    picks = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top]
    counts = np.bincount(picks.ravel(), minlength=experts)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def _torch():
    if C.torch is None:
        raise C.Skip("torch not importable")
    return C.torch


def _graphed(s, fn):
    """A callable replaying a CUDA graph of one call of fn (warmed up first), or fn's Skip."""
    fn()
    s.synchronize()
    with cygemm.graph.capture(s) as g:
        fn()
    return lambda: g.launch(s)


def _torch_graphed(torch, s, fn):
    """A callable replaying a torch CUDA graph of fn on s. CUDAGraph.replay launches on torch's
    current stream: replayed bare, the events recorded on s would time nothing."""
    ts = torch.cuda.ExternalStream(s.ptr)
    with torch.cuda.stream(ts):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=ts):
        fn()
    return _on_torch_stream(s, g.replay)


def _try(make):
    try:
        return make()
    except C.Skip as e:
        return e
    except Exception as e:           # a contender that cannot run is recorded, the section goes on
        return C.Skip(f"{type(e).__name__}: {str(e)[:160]}")


def moe_section(R, s, floor):
    torch = _torch()
    ptr = s.ptr
    for model, G, top, K, N in MODELS:
        for tokens in (QUICK_TOKENS if R.quick else TOKENS):
            offs = routed_offsets(tokens, G, top, seed=tokens + G)
            T = int(offs[-1])
            host = offs.tolist()
            g = torch.Generator(device="cuda").manual_seed(tokens)
            x = (torch.randn(T, K, device="cuda", generator=g) / 4).to(torch.bfloat16)
            w = (torch.randn(G, N, K, device="cuda", generator=g) / 64).to(torch.bfloat16)
            dy = (torch.randn(T, N, device="cuda", generator=g) / 4).to(torch.bfloat16)
            out = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)
            dx = torch.empty(T, K, device="cuda", dtype=torch.bfloat16)
            dw = torch.empty(G, N, K, device="cuda", dtype=torch.bfloat16)
            dev = torch.tensor(offs, device="cuda", dtype=torch.int32)
            ends = dev[1:]
            gemms = {
                "forward": (2.0 * T * N * K,
                            lambda: grouped.moe_gemm(x, w, dev, out, w_layout="nk", route="lt_grouped", stream=ptr),
                            lambda: grouped.moe_gemm(x, w, dev, out, w_layout="nk", route="host_offsets", stream=ptr),
                            lambda: grouped.moe_gemm(x, w, host, out, w_layout="nk", route="loop", stream=ptr),
                            lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=ends, out_dtype=torch.bfloat16)),
                "dgrad": (2.0 * T * N * K,
                          lambda: grouped.moe_gemm(dy, w, dev, dx, w_layout="kn", route="lt_grouped", stream=ptr),
                          lambda: grouped.moe_gemm(dy, w, dev, dx, w_layout="kn", route="host_offsets", stream=ptr),
                          lambda: grouped.moe_gemm(dy, w, host, dx, w_layout="kn", route="loop", stream=ptr),
                          lambda: torch._grouped_mm(dy, w, offs=ends, out_dtype=torch.bfloat16)),
                "wgrad": (2.0 * T * N * K,
                          lambda: grouped.moe_gemm_wgrad(x, dy, dev, dw, dw_layout="nk", route="lt_grouped",
                                                         stream=ptr),
                          lambda: grouped.moe_gemm_wgrad(x, dy, dev, dw, dw_layout="nk", route="host_offsets",
                                                         stream=ptr),
                          lambda: grouped.moe_gemm_wgrad(x, dy, host, dw, dw_layout="nk", route="loop", stream=ptr),
                          lambda: torch._grouped_mm(dy.t(), x, offs=ends, out_dtype=torch.bfloat16)),
            }
            for kind, (flop, ours, synced, loop, theirs) in gemms.items():
                case = f"moe {model} {kind} bf16, {tokens} tokens ({T} rows)"
                R.progress(case)
                contenders = {
                    "cygemm lt_grouped": _try(lambda: _graphed(s, ours)),
                    "torch._grouped_mm": (_try(lambda: _torch_graphed(torch, s, theirs))
                                          if hasattr(torch, "_grouped_mm") else C.Skip("this torch has no _grouped_mm")),
                    "cygemm host offsets + sync": synced,
                    "cygemm loop of per-expert GEMMs": _try(lambda: _graphed(s, loop)),
                }
                R.measure(case, contenders, s, flop=flop, reps=10, rounds=3, tokens=tokens, model=model)
                contenders.clear()
            if model == "DeepSeek-V3":
                _fp8_forward(R, s, torch, x, w, offs, tokens, T, N, K)
            gemms.clear()
            torch.cuda.empty_cache()


def _fp8_forward(R, s, torch, x, w, offs, tokens, T, N, K):
    """DeepSeek-V3's forward in FP8 (E4M3): cygemm.moe_scaled_gemm (route "lt_grouped") with
    tensor-wide scales (one for the tokens, one per expert) and with DeepSeek-V3's block scales
    (1x128 tokens, 128x128 weights), and as loops of fp8.scaled_matmul per expert with each,
    against bf16 lt_grouped."""
    case = f"moe DeepSeek-V3 forward fp8, {tokens} tokens ({T} rows)"
    R.progress(case)
    ptr = s.ptr
    G = len(offs) - 1
    xq, sx = fp8.quantize_scaled(x, "tensor")
    wq_sw = [fp8.quantize_scaled(w[g], "tensor") for g in range(G)]
    wq = torch.stack([q for q, _ in wq_sw])
    sw = torch.cat([sc.reshape(1) for _, sc in wq_sw])
    out8 = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)
    dev = torch.tensor(offs, device="cuda", dtype=torch.int32)
    tensor_parts, block_parts = [], []
    for g in range(G):
        a, b = int(offs[g]), int(offs[g + 1])
        if b == a:
            continue
        tensor_parts.append((xq[a:b], wq[g], sw[g:g + 1], out8[a:b]))
        if (b - a) % 4 == 0:          # (1x128 scales need rows in fours: padded experts in practice)
            bxq, bxs = fp8.quantize_scaled(x[a:b], "1x128")
            bwq, bws = fp8.quantize_scaled(w[g], "128x128")
            bxs = bxs.t().contiguous().t()      # (the dense 1x128 layout takes its rows contiguous)
            block_parts.append((bxq, bwq, bxs, bws, torch.empty(b - a, N, device="cuda", dtype=torch.bfloat16)))

    # The whole layer's block scales, as one grouped call takes them.
    bxq_all, bxs_all = fp8.quantize_scaled(x, "1x128")
    bwq_all, bws_all = fp8.quantize_scaled(w.reshape(G * N, K), "128x128")
    bwq_all = bwq_all.reshape(G, N, K)
    scale_ws = torch.empty(((K + 127) // 128) * (-(-T // 4) * 4 + 4 * G), device="cuda", dtype=torch.float32)

    def tensor_loop():
        for xs, ws, sc, o in tensor_parts:
            fp8.scaled_matmul(xs, ws.t(), sx, sc, out=o, stream=ptr)

    def block_loop():
        for bxq, bwq, bxs, bws, o in block_parts:
            fp8.scaled_matmul(bxq, bwq.t(), bxs, bws.t(), out=o, stream=ptr)    # (w.T's scales: bws.T)

    out = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)
    contenders = {
        "cygemm bf16 lt_grouped": _try(lambda: _graphed(s, lambda: grouped.moe_gemm(
            x, w, dev, out, w_layout="nk", route="lt_grouped", stream=ptr))),
        "cygemm fp8 lt_grouped (tensor scales)": _try(lambda: _graphed(s, lambda: grouped.moe_scaled_gemm(
            xq, wq, sx, sw, dev, out8, route="lt_grouped", stream=ptr))),
        "cygemm fp8 loop of scaled_matmul (tensor scales)": _try(lambda: _graphed(s, tensor_loop)),
        "cygemm fp8 loop of scaled_matmul (1x128, 128x128; experts of rows in fours)": _try(
            lambda: _graphed(s, block_loop)),
        "cygemm fp8 lt_grouped (1x128, 128x128)": _try(lambda: _graphed(s, lambda: grouped.moe_scaled_gemm(
            bxq_all, bwq_all, bxs_all, bws_all, dev, out8, workspace=scale_ws, route="lt_grouped", stream=ptr))),
    }
    R.measure(case, contenders, s, flop=2.0 * T * N * K, reps=10, rounds=3, tokens=tokens, model="DeepSeek-V3")
    contenders.clear()
