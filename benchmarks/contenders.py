"""The libraries cygemm is measured against, behind one interface: each `*_gemm` returns a
zero-argument callable that enqueues one GEMM on the given stream, or raises Skip with
the reason (a missing contender is reported as skipped, never as an error)."""
import cupy as cp
from cupy._core import _routines_linalg as cupy_linalg

import cygemm


class Skip(Exception):
    pass


torch = None
nvmath = None
IMPORT_ERRORS = {}


def import_optional():
    """Import torch and nvmath-python if present (after the host-time rounds: torch's
    threads made host timings noisier)."""
    global torch, nvmath
    try:
        import torch as t
        torch = t
        # Like for like with cuBLAS COMPUTE_32F: no reduced-precision fp16/bf16 reductions.
        t.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        t.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    except Exception as exc:
        IMPORT_ERRORS["torch"] = f"{type(exc).__name__}: {exc}"
    try:
        import nvmath as n
        import nvmath.linalg.advanced  # noqa: F401
        nvmath = n
    except Exception as exc:
        IMPORT_ERRORS["nvmath"] = f"{type(exc).__name__}: {exc}"


def versions():
    return {"torch": torch.__version__ if torch else f"skipped ({IMPORT_ERRORS.get('torch', 'not imported')})",
            "nvmath": nvmath.__version__ if nvmath else f"skipped ({IMPORT_ERRORS.get('nvmath', 'not imported')})"}


# ---------------------------------------------------------------- operands

DTYPES = {"tf32": "float32", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def operand(shape, prec, seed):
    """A random (never zero) operand: a CuPy array, or a torch tensor for bfloat16
    (CuPy has no bfloat16; cygemm reads torch's through DLPack)."""
    rng = cp.random.default_rng(seed)
    if prec == "bf16":
        if torch is None:
            raise Skip("bfloat16 operands need torch")
        return torch.as_tensor(rng.standard_normal(shape, dtype=cp.float32), device="cuda").to(torch.bfloat16)
    return rng.standard_normal(shape, dtype=cp.float32).astype(DTYPES[prec])


def as_torch(x):
    if torch is None:
        raise Skip("torch not importable")
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x, device="cuda")


def op(x, t):
    return x.T if t else x


# ---------------------------------------------------------------- GEMM contenders

def cygemm_gemm(A, B, C, prec, ta, tb, stream):
    math = "fp32" if prec == "fp32" else "tf32"
    return lambda: cygemm.gemm(A, B, C, trans_a=ta, trans_b=tb, math=math, stream=stream)


def cupy_matmul(A, B, C, prec, ta, tb, stream):
    if prec == "bf16":
        raise Skip("CuPy has no bfloat16")
    # float32: TF32 for the tf32 rows (what CUPY_TF32=1 selects), strict for fp32 rows.
    ct = {"tf32": cupy_linalg.COMPUTE_TYPE_TF32, "fp32": cupy_linalg.COMPUTE_TYPE_FP32}.get(prec)
    a, b = op(A, ta), op(B, tb)

    def call():
        if ct is not None:
            cupy_linalg.set_compute_type(C.dtype, ct)
        with stream:
            cp.matmul(a, b, out=C)
    return call


def _torch_stream(stream):
    return torch.cuda.ExternalStream(stream.ptr)


def torch_mm(A, B, C, prec, ta, tb, stream):
    if torch is None:
        raise Skip("torch not importable")
    a, b, c = op(as_torch(A), ta), op(as_torch(B), tb), as_torch(C)
    ts = _torch_stream(stream)
    allow = prec == "tf32"

    def call():
        torch.backends.cuda.matmul.allow_tf32 = allow
        with torch.cuda.stream(ts):
            torch.mm(a, b, out=c)
    return call


def _nvmath_options(prec):
    ct = nvmath.linalg.ComputeType
    return {"compute_type": ct.COMPUTE_32F_FAST_TF32 if prec == "tf32" else ct.COMPUTE_32F}


def nvmath_matmul(A, B, C, prec, ta, tb, stream, epilog=None, bias=None):
    """nvmath-python's stateful Matmul, planned once (its recommended use for repeats)."""
    if nvmath is None:
        raise Skip("nvmath-python not importable")
    adv = nvmath.linalg.advanced
    if torch is not None and isinstance(A, torch.Tensor):
        stream = _torch_stream(stream)          # nvmath wants the operands' package's stream
    mm = adv.Matmul(op(A, ta), op(B, tb), options=_nvmath_options(prec), stream=stream)
    if epilog is None:
        mm.plan(stream=stream)
    else:
        mm.plan(epilog=getattr(adv.MatmulEpilog, epilog), epilog_inputs={"bias": bias}, stream=stream)
    call = lambda: mm.execute(stream=stream)   # noqa: E731  (allocates its result, as nvmath does)
    call.keepalive = mm
    return call


GEMM_CONTENDERS = {"cygemm.gemm": cygemm_gemm, "cp.matmul": cupy_matmul, "torch.mm": torch_mm,
                   "nvmath Matmul": nvmath_matmul}


def batched_contenders(A, B, C, prec, stream):
    """cygemm.gemm_strided_batched, cp.matmul, torch.matmul, nvmath Matmul on (batch, m, k) @ (batch|1, k, n)."""
    out = {}
    math = "fp32" if prec == "fp32" else "tf32"
    out["cygemm.gemm_strided_batched"] = lambda: cygemm.gemm_strided_batched(A, B, C, math=math, stream=stream)
    try:
        out["cp.matmul"] = cupy_matmul(A, B, C, prec, False, False, stream)
    except Skip as s:
        out["cp.matmul"] = s
    if torch is not None:
        a, b, c = as_torch(A), as_torch(B), as_torch(C)
        ts = _torch_stream(stream)

        def tcall():
            torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
            with torch.cuda.stream(ts):
                torch.matmul(a, b, out=c)
        out["torch.matmul"] = tcall
    else:
        out["torch.matmul"] = Skip("torch not importable")
    try:
        out["nvmath Matmul"] = nvmath_matmul(A, B, C, prec, False, False, stream)
    except Skip as s:
        out["nvmath Matmul"] = s
    except Exception as exc:   # e.g. a broadcast layout nvmath does not take
        out["nvmath Matmul"] = Skip(f"{type(exc).__name__}: {str(exc)[:120]}")
    return out


def torch_cuda_graph(warm, capture=None, rounds=3):
    """A torch.cuda.CUDAGraph of `capture` (default: `warm`), after `rounds` runs of `warm` on a
    side stream, as torch's documentation prescribes before capturing."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(rounds):
            warm()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        (capture or warm)()
    torch.cuda.synchronize()
    return g
