"""The dense-layer sections: "fused" (one layer's forward and backward with bias and
activation: cygemm's fused routes against CuPy unfused, torch and nvmath epilogues, and the
cuBLASLt epilogue floor) and "mlp" (a two-layer MLP's forward and backward against the same
six GEMMs run plain and torch autograd)."""
import cupy as cp

import cygemm
from cygemm import gemm_ops
from cygemm.gemm_ops import backward_into, forward_into
import contenders as C
from recorder import inner_for


def fused_section(R, s, floor):
    M, N, K = (2048, 2048, 512) if R.quick else (8192, 8192, 1024)
    A, B, bias, gY = (C.operand(sh, "tf32", 20 + i) for i, sh in enumerate(((M, K), (K, N), (N,), (M, N))))
    Y, Z, gA, gB, gb = (cp.empty(sh, cp.float32) for sh in ((M, N), (M, N), (M, K), (K, N), (N,)))
    ws = gemm_ops.ensure_workspaces(M, N, stream=s)
    Wnk = cp.ascontiguousarray(B.T)
    flop = 2.0 * M * N * K
    inner = inner_for(flop)
    fwd, bwd = f"fwd {M}x{N}x{K} tf32", f"bwd {M}x{N}x{K} tf32"
    torch = C.torch
    if torch is not None:
        F = torch.nn.functional
        ts = torch.cuda.ExternalStream(s.ptr)
        tA, tB, tb = (C.as_torch(x) for x in (A, B, bias))
        tW = tB.T.contiguous()
        torch_act = {"relu": F.relu, "gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}

        def on_ts(fn):
            def call():
                torch.backends.cuda.matmul.allow_tf32 = True
                with torch.cuda.stream(ts):
                    fn()
            return call

    def on_s(fn):
        def call():
            with s:
                fn()
        return call

    R.progress(fwd)
    R.measure(fwd, {"plain GEMM (cygemm.gemm)": lambda: cygemm.gemm(A, B, Y, stream=s)}, s, flop, inner)
    for act in ("relu", "gelu", "silu"):
        case = f"{fwd} {act}"
        R.progress(case)
        cs = {"cygemm forward_into": lambda: forward_into(A, B, Y, bias, act=act, lt_workspace=ws.lt_ws, stream=s),
              # torch's F.linear takes its weight as (N, K); the same layout through cygemm (W.T):
              "cygemm forward_into, weight (N, K) as torch's": lambda: forward_into(
                  A, Wnk.T, Y, bias, act=act, lt_workspace=ws.lt_ws, stream=s),
              "CuPy unfused": on_s(cupy_forward(A, B, bias, Y, Z, act))}
        if torch is not None:
            if act in ("relu", "gelu"):
                cs["torch._addmm_activation"] = on_ts(lambda: torch._addmm_activation(tb, tA, tB, use_gelu=act == "gelu"))
            cs["torch F.linear + activation"] = on_ts(lambda: torch_act[act](F.linear(tA, tW, tb)))
        else:
            cs["torch"] = C.Skip(C.IMPORT_ERRORS.get("torch"))
        if act in ("relu", "gelu"):
            try:
                # nvmath's bias runs along the result's rows (cuBLASLt's M): compute Y^T = B^T A^T.
                cs["nvmath Matmul epilog"] = C.nvmath_matmul(B.T, A.T, None, "tf32", False, False, s,
                                                            epilog=f"{act.upper()}_BIAS", bias=bias.reshape(N, 1))
            except Exception as exc:
                cs["nvmath Matmul epilog"] = C.Skip(f"{type(exc).__name__}: {str(exc)[:160]}")
            floors = [("C++ cublasLtMatmul epilogue", f"lt {M} {N} {K} {act}_bias gpu")]
        else:
            floors = []     # cuBLASLt has no SiLU epilogue: no floor does the same work
        R.measure(case, cs, s, flop, inner, floors=floors)
        R.measure(f"{case} (save Z)", {"cygemm forward_into save_z": lambda: forward_into(
            A, B, Y, bias, act=act, save_z=True, z_out=Z, lt_workspace=ws.lt_ws, stream=s)}, s, flop, inner)

    R.progress(bwd)
    R.measure(bwd, {"two plain GEMMs (cygemm.gemm)": lambda: (
        cygemm.gemm(gY, B, gA, trans_b=True, stream=s), cygemm.gemm(A, gY, gB, trans_a=True, stream=s))},
        s, 2 * flop, inner)
    for act in ("relu", "gelu", "silu"):
        case = f"{bwd} {act}"
        R.progress(case)
        forward_into(A, B, Y, bias, act=act, save_z=True, z_out=Z, stream=s)
        kw = dict(y=Y) if act == "relu" else {}
        cs = {"cygemm backward_into": lambda: backward_into(
                  A, B, gY, None if act == "relu" else Z, act=act, gA_out=gA, gB_out=gB, gBias_out=gb,
                  work_dZ=ws.dZ, lt_workspace=ws.lt_ws, stream=s, **kw),
              "CuPy unfused": on_s(cupy_backward(A, B, gY, Z, ws.dZ, gA, gB, gb, act))}
        if torch is not None:
            cs["torch autograd backward"] = torch_backward(A, B, bias, gY, act, s)
        R.measure(case, cs, s, 2 * flop, inner)
    del A, B, bias, gY, Y, Z, gA, gB, gb, ws, Wnk
    gemm_ops.clear_ws_cache()
    cp.get_default_memory_pool().free_all_blocks()


def mlp_section(R, s, floor):
    """A two-layer MLP's forward and backward (six GEMMs) against the same six GEMMs run plain
    and against torch autograd, in one interleaved run."""
    M, D = (2048, 512) if R.quick else (8192, 1024)
    X, W1, W2, gY2 = (C.operand(sh, "tf32", 40 + i) for i, sh in enumerate(((M, D), (D, D), (D, D), (M, D))))
    b1, b2 = C.operand((D,), "tf32", 44), C.operand((D,), "tf32", 45)
    Y1, Z1, Y2, Z2, gY1, gX, dZ1, dZ2, T = (cp.empty((M, D), cp.float32) for _ in range(9))
    gW1, gW2 = cp.empty((D, D), cp.float32), cp.empty((D, D), cp.float32)
    gb1, gb2 = cp.empty(D, cp.float32), cp.empty(D, cp.float32)
    flop = 6 * 2.0 * M * D * D
    for act in ("relu", "gelu"):
        case = f"2-layer MLP fwd+bwd {M}x{D}-{D}-{D} tf32 {act}"
        R.progress(case)
        save = act != "relu"        # relu's derivative is read from the output

        def ours():
            forward_into(X, W1, Y1, b1, act=act, save_z=save, z_out=Z1 if save else None, stream=s)
            forward_into(Y1, W2, Y2, b2, act=act, save_z=save, z_out=Z2 if save else None, stream=s)
            backward_into(Y1, W2, gY2, Z2 if save else None, y=None if save else Y2, act=act, gA_out=gY1,
                          gB_out=gW2, gBias_out=gb2, work_dZ=dZ2, stream=s)
            backward_into(X, W1, gY1, Z1 if save else None, y=None if save else Y1, act=act, gA_out=gX,
                          gB_out=gW1, gBias_out=gb1, work_dZ=dZ1, stream=s)

        def plain():
            cygemm.gemm(X, W1, Y1, stream=s)
            cygemm.gemm(Y1, W2, Y2, stream=s)
            cygemm.gemm(gY2, W2, gY1, trans_b=True, stream=s)
            cygemm.gemm(Y1, gY2, gW2, trans_a=True, stream=s)
            cygemm.gemm(gY1, W1, gX, trans_b=True, stream=s)
            cygemm.gemm(X, gY1, gW1, trans_a=True, stream=s)
        cs = {"cygemm forward_into + backward_into": ours, "six plain GEMMs (cygemm.gemm)": plain}
        if C.torch is not None:
            cs["torch autograd"] = torch_mlp2(X, W1, b1, W2, b2, gY2, act, s)
        else:
            cs["torch autograd"] = C.Skip(C.IMPORT_ERRORS.get("torch"))
        R.measure(case, cs, s, flop, 1)
    del X, W1, W2, gY2, Y1, Z1, Y2, Z2, gY1, gX, dZ1, dZ2, T


def torch_mlp2(X, W1, b1, W2, b2, gY2, act, s):
    """F.linear + activation twice and its backward by autograd (input gradient included)."""
    torch = C.torch
    F = torch.nn.functional
    f = {"relu": F.relu, "gelu": lambda x: F.gelu(x, approximate="tanh")}[act]
    tX = C.as_torch(X).clone().requires_grad_(True)
    params = [C.as_torch(w).T.contiguous().requires_grad_(True) for w in (W1, W2)]
    biases = [C.as_torch(b).clone().requires_grad_(True) for b in (b1, b2)]
    tg = C.as_torch(gY2)
    ts = torch.cuda.ExternalStream(s.ptr)

    def fn():
        torch.backends.cuda.matmul.allow_tf32 = True
        with torch.cuda.stream(ts):
            out = f(F.linear(f(F.linear(tX, params[0], biases[0])), params[1], biases[1]))
            torch.autograd.grad(out, (tX, *params, *biases), tg)
    return fn


def cupy_act(z, act):
    if act == "relu":
        return cp.maximum(z, 0)
    if act == "gelu":
        return 0.5 * z * (1 + cp.tanh(0.7978845608 * (z + 0.044715 * z ** 3)))
    return z / (1 + cp.exp(-z))


def cupy_act_grad(z, act):
    if act == "relu":
        return z > 0
    if act == "gelu":
        u = 0.7978845608 * (z + 0.044715 * z ** 3)
        t = cp.tanh(u)
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * 0.7978845608 * (1 + 3 * 0.044715 * z * z)
    sg = 1 / (1 + cp.exp(-z))
    return sg * (1 + z * (1 - sg))


def cupy_forward(A, B, bias, Y, Z, act):
    """How CuPy code writes it: matmul, add the bias, apply the activation (unfused)."""
    def fn():
        cp.matmul(A, B, out=Z)
        Z.__iadd__(bias)
        Y[...] = cupy_act(Z, act)
    return fn


def cupy_backward(A, B, gY, Z, dZ, gA, gB, gb, act):
    def fn():
        cp.multiply(gY, cupy_act_grad(Z, act), out=dZ)
        cp.sum(dZ, axis=0, out=gb)
        cp.matmul(dZ, B.T, out=gA)
        cp.matmul(A.T, dZ, out=gB)
    return fn


def torch_backward(A, B, bias, gY, act, s):
    """The backward of F.linear + activation by autograd (the forward run once, outside the timing)."""
    torch = C.torch
    F = torch.nn.functional
    tA = C.as_torch(A).clone().requires_grad_(True)
    tW = C.as_torch(B).T.contiguous().requires_grad_(True)
    tb = C.as_torch(bias).clone().requires_grad_(True)
    tg = C.as_torch(gY)
    f = {"relu": F.relu, "gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}[act]
    ts = torch.cuda.ExternalStream(s.ptr)
    with torch.cuda.stream(ts):
        out = f(F.linear(tA, tW, tb))

    def fn():
        with torch.cuda.stream(ts):
            torch.autograd.grad(out, (tA, tW, tb), tg, retain_graph=True)
    return fn
