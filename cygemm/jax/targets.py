"""What each of cygemm's XLA targets runs: the call frame's arrays (views of XLA's buffers,
row-major unless the target asks XLA for another layout, re-viewed here) and attributes,
mapped onto cygemm's public function, on XLA's stream. :mod:`cygemm.jax.ffi` calls these;
:mod:`cygemm.jax` makes the calls (and their layouts) that reach them."""
import cygemm
from cygemm import dense, fp8, grouped
from cygemm.jax.ffi import set_runners, strided

__all__ = ["RUNNERS"]


def _opt(value):
    """An optional string attribute ("" : not given)."""
    return value or None


def _columns(x):
    """x's (rows, cols) as a column-major view (XLA lays the operand out so, as the call asks)."""
    rows, cols = x.shape
    return strided(x, (rows, cols), (1, rows))


def _policy(attrs):
    return dict(autotune=_opt(attrs["autotune"]), determinism=_opt(attrs["determinism"]))


def matmul(stream, args, rets, attrs):
    a, b = args
    cygemm.matmul(a, b, rets[0], math=attrs["math"], stream=stream, **_policy(attrs))


def int_mm(stream, args, rets, attrs):
    a, b = args                     # b: (K, N), column-major (read along K)
    cygemm.int_mm(a, _columns(b), rets[0], stream=stream, **_policy(attrs))


def _scale(x, mode, operand, kb):
    """A scale grid as cuBLASLt reads it (see fp8.scaled_matmul), from the array cygemm.jax
    sends: a's "1x128" grid transposed, (Kb, M); the "128x128" grids padded along K to Kb4 (a
    multiple of 4), a's as (Mb, Kb4), b's transposed, (Nb, Kb4). kb: K's blocks, ceil(K/128)."""
    if mode == "1x128" and operand == "a":
        m = x.shape[1]
        return strided(x, (m, kb), (1, m))
    if mode == "128x128" and operand == "a":
        mb, kb4 = x.shape
        return strided(x, (mb, kb), (kb4, 1))
    if mode == "128x128":
        nb, kb4 = x.shape
        return strided(x, (kb, nb), (1, kb4))
    return x


def scaled_matmul(stream, args, rets, attrs):
    a, b, scale_a, scale_b, *rest = args
    bias = rest.pop(0) if attrs["has_bias"] else None
    scale_out = rest.pop(0) if attrs["has_scale_out"] else None
    mode_a, mode_b = _opt(attrs["scale_mode_a"]), _opt(attrs["scale_mode_b"])
    kb = -(-a.shape[1] // 128)
    fp8.scaled_matmul(a, _columns(b), _scale(scale_a, mode_a, "a", kb), _scale(scale_b, mode_b, "b", kb), out=rets[0],
                      bias=bias, act=attrs["act"], scale_out=scale_out, amax_out=rets[1] if attrs["has_amax"] else None,
                      fast_accum=attrs["fast_accum"], scale_mode=None if mode_a is None else (mode_a, mode_b),
                      stream=stream, **_policy(attrs))


def dense_forward(stream, args, rets, attrs):
    x, kernel, *bias = args
    z = rets[1] if attrs["save_z"] else None
    dense.forward_into(x, kernel, rets[0], bias[0] if bias else None, with_bias=bool(bias), act=attrs["act"],
                       leaky_slope=attrs["leaky_slope"], save_z=z is not None, z_out=z, math=attrs["math"],
                       stream=stream, **_policy(attrs))


def dense_backward(stream, args, rets, attrs):
    """rets: gx, gkernel, then gbias (with a bias), then dZ's scratch (with an activation)."""
    x, kernel, gy, saved = args
    rets = list(rets)
    gx, gk = rets.pop(0), rets.pop(0)
    gb = rets.pop(0) if attrs["has_bias"] else None
    work = rets.pop(0) if attrs["saves"] else None       # (an activation: its dZ scratch)
    saves = attrs["saves"]
    dense.backward_into(x, kernel, gy, saved if saves == "z" else None, y=saved if saves == "y" else None,
                        with_bias=attrs["has_bias"], act=attrs["act"], leaky_slope=attrs["leaky_slope"], gA_out=gx,
                        gB_out=gk, gBias_out=gb, work_dZ=work, math=attrs["math"], stream=stream, **_policy(attrs))


def ragged_dot(stream, args, rets, attrs):
    lhs, rhs, offsets = args
    grouped.moe_gemm(lhs, rhs, offsets, rets[0], w_layout=attrs["w_layout"], math=attrs["math"], stream=stream,
                     **_policy(attrs))


def ragged_dot_wgrad(stream, args, rets, attrs):
    lhs, g, offsets = args
    grouped.moe_gemm_wgrad(lhs, g, offsets, rets[0], dw_layout="kn", math=attrs["math"], stream=stream,
                           **_policy(attrs))


RUNNERS = {"cygemm_matmul": matmul, "cygemm_int_mm": int_mm, "cygemm_scaled_matmul": scaled_matmul,
           "cygemm_dense_forward": dense_forward, "cygemm_dense_backward": dense_backward,
           "cygemm_ragged_dot": ragged_dot, "cygemm_ragged_dot_wgrad": ragged_dot_wgrad}
set_runners(RUNNERS)
