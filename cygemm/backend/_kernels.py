"""The CUDABackend's own kernels: row-wise softmax and log-softmax (one warp per row, max
subtracted: exact for logits of any finite size), and a sigmoid that never forms exp of a large
positive number. One launch each; in place when the output is the input."""
import functools

import cupy as cp
import numpy as np

_ROW_TEMPLATE = r"""
extern "C" __global__ void {name}(const {T}* x, {T}* y, long long rows, int cols) {{
    int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (long long r = (long long)blockIdx.x * warps + warp; r < rows; r += (long long)gridDim.x * warps) {{
        const {T}* xr = x + r * cols;
        {T}* yr = y + r * cols;
        {T} m = xr[0];
        for (int j = lane; j < cols; j += 32) m = fmax(m, xr[j]);
        for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
        {T} s = 0;
        for (int j = lane; j < cols; j += 32) s += exp(xr[j] - m);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        {T} log_s = log(s);
        for (int j = lane; j < cols; j += 32) yr[j] = {expr};
    }}
}}
"""

_C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


@functools.lru_cache(maxsize=None)
def _row_kernel(kind, dtype, device_id):
    T = _C_TYPES[np.dtype(dtype)]
    name = f"cygemm_{kind}_{T}"
    # (x - m) is exact for the row's largest values; subtracting log(s) after keeps their
    # small results accurate (x - (m + log s) would lose half an ulp of m).
    expr = "exp(xr[j] - m) / s" if kind == "softmax" else "(xr[j] - m) - log_s"
    return cp.RawKernel(_ROW_TEMPLATE.format(name=name, T=T, expr=expr), name)


def row_op(kind, x, out, stream):
    """softmax or log_softmax of x (C-contiguous, last axis) into out (same shape; may be x)."""
    cols = x.shape[-1] if x.ndim else 1
    rows = x.size // cols if cols else 0
    if rows == 0 or cols == 0:
        return out
    warps = 8
    blocks = int(min(4096, (rows + warps - 1) // warps))
    with stream:
        _row_kernel(kind, x.dtype, cp.cuda.Device().id)((blocks,), (32 * warps,),
                                                         (x, out, np.int64(rows), np.int32(cols)))
    return out


sigmoid = cp.ElementwiseKernel(
    "T x", "T y",
    # For x < 0, exp(x) <= 1: neither branch overflows, and both keep full relative precision.
    "if (x >= 0) { y = 1 / (1 + exp(-x)); } else { T e = exp(x); y = e / (1 + e); }",
    "cygemm_stable_sigmoid")
