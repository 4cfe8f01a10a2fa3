"""Benchmark section "dtypes": float64 and complex GEMMs, every contender on the same operands,
interleaved: cygemm.matmul against cp.matmul and torch.matmul at 2048^3 to 8192^3 in float64 and
complex128 (fp64 everywhere), and complex64 strict fp32 and TF32 (cp.matmul's compute type set
per call as CUPY_TF32 would; torch's allow_tf32 set per call). Rows carry TFLOP/s: a complex
multiply-add counts 8 real flops. Then int8 x int8 -> int32: cygemm.int_mm against torch._int_mm
on the same operands (a C-ordered (M, K), b = w.T of a C-ordered (N, K) weight, the layout both
read along K) at 4096^3, 8192^3 and inference shapes (M 32-256, K 4096-8192); TOPS in the
TFLOP/s column (an integer multiply-add counts 2 operations)."""
import cupy as cp
import numpy as np

import cygemm
from hopper import _on_torch_stream, _torch


def _operands(rng, n, dtype):
    x = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal((n, n))
    return cp.asarray(x.astype(dtype))


def dtypes_section(R, s, floor):
    from cupy._core import _routines_linalg as cupy_linalg
    torch = _torch()
    sizes = (2048,) if R.quick else (2048, 4096, 8192)
    rng = np.random.default_rng(11)
    for dtype, math in (("float64", "fp32"), ("complex128", "fp32"), ("complex64", "fp32"), ("complex64", "tf32")):
        for n in sizes:
            case = f"{dtype}{' tf32' if math == 'tf32' else ''} {n}^3"
            R.progress(case)
            with s:
                a, b = _operands(rng, n, dtype), _operands(rng, n, dtype)
                out = cp.empty((n, n), dtype)
            ta, tb, tout = (torch.from_dlpack(x) for x in (a, b, out))
            tf32 = math == "tf32"
            kind = cupy_linalg.COMPUTE_TYPE_TF32 if tf32 else cupy_linalg.COMPUTE_TYPE_DEFAULT

            def theirs(a=a, b=b, out=out, kind=kind, dtype=dtype):
                cupy_linalg.set_compute_type(np.dtype(dtype), kind)
                with s:
                    cp.matmul(a, b, out=out)

            def torch_mm(ta=ta, tb=tb, tout=tout, tf32=tf32):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                torch.matmul(ta, tb, out=tout)

            flop = (8.0 if dtype.startswith("complex") else 2.0) * n ** 3
            rows = R.measure(case, {
                "cygemm.matmul": lambda a=a, b=b, out=out: cygemm.matmul(a, b, out, math=math, stream=s),
                "cp.matmul": theirs,
                "torch.matmul": _on_torch_stream(s, torch_mm),
            }, s, flop, reps=10 if n >= 8192 else 20, rounds=5)
            for r in rows:
                r["tflops"] = flop / r["value"] / 1e9
            cupy_linalg.set_compute_type(np.dtype(dtype), cupy_linalg.COMPUTE_TYPE_DEFAULT)
            torch.backends.cuda.matmul.allow_tf32 = False
            del a, b, out, ta, tb, tout
            cp.get_default_memory_pool().free_all_blocks()
    int8_cases(R, s, torch, rng)


INT8_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (32, 14336, 4096), (128, 8192, 8192), (256, 4096, 8192))


def int8_cases(R, s, torch, rng):
    shapes = INT8_SHAPES[:1] + INT8_SHAPES[2:3] if R.quick else INT8_SHAPES
    for m, n, k in shapes:
        case = f"int8 {m}x{n}x{k}"
        R.progress(case)
        with s:
            a = cp.asarray(rng.integers(-128, 128, (m, k), dtype=np.int8))
            w = cp.asarray(rng.integers(-128, 128, (n, k), dtype=np.int8))
            out = cp.empty((m, n), cp.int32)
        ta, tw, tout = (torch.from_dlpack(x) for x in (a, w, out))
        s.synchronize()
        cygemm.int_mm(a, w.T, out, stream=s)
        check = cp.asnumpy(out)
        torch.cuda.synchronize()
        with torch.cuda.stream(torch.cuda.ExternalStream(s.ptr)):
            theirs = torch._int_mm(ta, tw.t()).cpu().numpy()
        assert (check == theirs).all(), f"{case}: cygemm.int_mm and torch._int_mm differ"

        def torch_int_mm(ta=ta, tw=tw, tout=tout):
            torch._int_mm(ta, tw.t(), out=tout)

        flop = 2.0 * m * n * k
        rows = R.measure(case, {
            "cygemm.int_mm": lambda a=a, w=w, out=out: cygemm.int_mm(a, w.T, out, stream=s),
            "torch._int_mm": _on_torch_stream(s, torch_int_mm),
        }, s, flop, reps=10 if m * n * k >= 8192 ** 3 else 20, rounds=5)
        for r in rows:
            r["tflops"] = flop / r["value"] / 1e9
        del a, w, out, ta, tw, tout
        cp.get_default_memory_pool().free_all_blocks()
