"""A dense layer's three GEMMs in FP8 (precision "fp8-tensor", "fp8-rowwise", "fp8-block"), around
bfloat16 activations and gradients and float32 master parameters (their bfloat16 copy is what is
quantized, as bf16-mixed's GEMMs read it).

Every step quantizes what each GEMM reads with current scaling (this step's amax, no history)
through cygemm.fp8.quantize_scaled and runs it through cygemm.fp8.scaled_matmul (b = w.T):

=========  ======================  ==========================  ==========================
GEMM       computes                a (groups along its K)       b = (what is quantized).T
=========  ======================  ==========================  ==========================
forward    z  = x @ W.T            x (M, K)                     W (N, K)
dgrad      gx = dz @ W             dz (M, N)                    W.T (K, N), quantized from W
wgrad      gW = dz.T @ x           dz.T (N, M), from dz         x.T (K, M), from x
=========  ======================  ==========================  ==========================

The recipes (the scale modes of activations, weights and gradients, and their formats):

- ``fp8-tensor``: one scale per tensor; gradients in E5M2 (Transformer Engine's hybrid format).
- ``fp8-rowwise``: one scale per row of each GEMM's operands (along its K); E4M3 throughout.
- ``fp8-block``: DeepSeek-V3's: activations and gradients in 1 x 128 tiles, weights in 128 x 128
  blocks, E4M3 throughout, power-of-two scales.

FP8 GEMMs read 16-byte rows: in_features, out_features and the batch must be multiples of 16.
"""
import cupy as cp

from cygemm import fp8

RECIPES = {
    "fp8-tensor": dict(x="tensor", w="tensor", g="tensor", grad_format="e5m2", pow2=False),
    "fp8-rowwise": dict(x="rowwise", w="rowwise", g="rowwise", grad_format="e4m3", pow2=False),
    "fp8-block": dict(x="1x128", w="128x128", g="1x128", grad_format="e4m3", pow2=True),
}
ALIGN = 16          # elements (bytes of FP8) a size must be a multiple of


def fits(in_features, out_features):
    """Whether a layer of these sizes can run its GEMMs in FP8."""
    return in_features % ALIGN == 0 and out_features % ALIGN == 0


class _Quantized:
    """FP8 codes of one operand (rows, cols) and their scales, written each step."""

    def __init__(self, mode, rows, cols, fmt, pow2):
        self.mode, self.fmt, self.pow2 = mode, fmt, pow2
        self.q = cp.empty((rows, cols), cp.uint8)
        self.scale = fp8.empty_scale(mode, rows, cols)             # (on the current stream: bind's)

    def of(self, x, stream, transpose=False):
        fp8.quantize_scaled(x, self.mode, format=self.fmt, transpose=transpose, pow2=self.pow2, out=self.q,
                            scale=self.scale, stream=stream)
        return self


def _gemm(a, b, out, stream):
    """out = a.q @ b.q.T with their scales (a's along K, b's transposed as scaled_matmul's b)."""
    fp8.scaled_matmul(a.q, b.q.T, a.scale, b.scale.T, out=out, format_a=a.fmt, format_b=b.fmt, stream=stream)


class FP8Gemms:
    """The buffers and GEMMs of one layer for `batch` rows (allocated here: bind's; the calls
    allocate nothing, so a step that runs them can be captured)."""

    def __init__(self, precision, batch, in_features, out_features):
        r = RECIPES[precision]
        M, N, K = batch, out_features, in_features
        if M % ALIGN:
            raise ValueError(f"batch: precision={precision!r} needs a multiple of {ALIGN} rows (the weight "
                             f"gradient's FP8 GEMM reads them as 16-byte rows), got {M}")
        g_fmt = r["grad_format"]
        self.x = _Quantized(r["x"], M, K, "e4m3", r["pow2"])             # forward's a
        self.w = _Quantized(r["w"], N, K, "e4m3", r["pow2"])             # forward's b
        self.wt = _Quantized(r["w"], K, N, "e4m3", r["pow2"])            # dgrad's b
        self.g = _Quantized(r["g"], M, N, g_fmt, r["pow2"])              # dgrad's a
        self.gt = _Quantized(r["g"], N, M, g_fmt, r["pow2"])             # wgrad's a
        self.xt = _Quantized(r["x"], K, M, "e4m3", r["pow2"])            # wgrad's b

    def forward(self, x, w, out, stream):
        """out = x @ w.T (bfloat16), x (M, K) and w (N, K) bfloat16."""
        _gemm(self.x.of(x, stream), self.w.of(w, stream), out, stream)

    def backward(self, dz, x, w, gx_out, gw_out, stream):
        """gx_out = dz @ w (unless None) and gw_out = dz.T @ x, dz (M, N) bfloat16."""
        if gx_out is not None:
            _gemm(self.g.of(dz, stream), self.wt.of(w, stream, transpose=True), gx_out, stream)
        _gemm(self.gt.of(dz, stream, transpose=True), self.xt.of(x, stream, transpose=True), gw_out, stream)


def predict(precision, x, w, stream):
    """x @ w.T (bfloat16, a new array) for any number of rows, quantized as the forward pass is
    (the rows padded with zeros to a multiple of 16 on the way: block scales need M % 4 == 0)."""
    r = RECIPES[precision]
    s = stream.ptr
    rows = x.shape[0]
    with stream:
        if rows % ALIGN:
            padded = cp.zeros((-(-rows // ALIGN) * ALIGN, x.shape[1]), x.dtype)
            padded[:rows] = x
            x = padded
        qx, sx = fp8.quantize_scaled(x, r["x"], pow2=r["pow2"], stream=s)
        qw, sw = fp8.quantize_scaled(w, r["w"], pow2=r["pow2"], stream=s)
        y = fp8.scaled_matmul(qx, qw.T, sx, sw.T, format_a="e4m3", format_b="e4m3", stream=s)
        return y[:rows]
