"""cygemm inside ``jax.jit``: its GEMMs as XLA custom calls (XLA's FFI), on NVIDIA GPUs.

    import cygemm.jax as cj

    y = cj.matmul(a, b, determinism="batch_invariant")        # jnp.matmul's meaning
    h = cj.dense(x, kernel, bias, act="gelu")                  # act(x @ kernel + bias)
    out = cj.ragged_dot(tokens, experts, group_sizes)         # jax.lax.ragged_dot's meaning
    y = cj.scaled_matmul(a8, b8, sa, sb, scale_mode="1x128")   # FP8, DeepSeek's block scales
    c = cj.int_mm(a8, b8)                                      # int8 x int8 -> exact int32

Importing this module registers cygemm's FFI targets with JAX for the CUDA platform. Each
function gives XLA the result's shape and dtype without running (its abstract evaluation);
``matmul``, ``dense`` and ``ragged_dot`` are differentiable (``jax.grad``, ``jax.vjp``;
``ragged_dot``'s weight gradient is the ragged-K grouped GEMM); under ``jax.vmap``, ``matmul``
batches by broadcasting (one call), the others call once per batch element. A call runs on
XLA's stream; its results are XLA's buffers, written in place, and it works in a scratch
buffer XLA allocates with them (one more result of the custom call, never returned): it
allocates nothing of its own. The handlers are built with cygemm (no jaxlib at build time);
each execution takes the GIL for cygemm's checks and plan, as an eager call does. With the
option ``jax_command_buffers`` on, the calls may be traced into XLA's command buffers (CUDA
graphs, where XLA's flags let custom calls in), ``ragged_dot``'s where cuBLASLt's grouped
matmul takes them (else cygemm reads the group sizes to the host, which no capture allows).
"""
import math as _math
import warnings
from functools import partial

try:
    import jax
except ImportError as exc:          # (cygemm itself needs no JAX)
    raise ImportError("cygemm.jax needs JAX with CUDA (pip install 'jax[cuda13]', or cygemm's 'jax' extra)") from exc
import jax.numpy as jnp
import numpy as np

from cygemm import describe_matmul
from cygemm.fp8 import describe_scaled_matmul
from cygemm.dense import backward_reads
from cygemm.engine.dtypes import LEVELS, expected, names, row_of_name
from cygemm.fp8 import SCALE_MODES
from cygemm.jax.calls import ffi_call as _ffi_call, grouped_capturable as _capturable, pair as _pair, policy as _policy
from cygemm.jax.ffi import TARGETS

__all__ = ["matmul", "dense", "int_mm", "scaled_matmul", "ragged_dot", "TARGETS"]

_COLUMNS = (1, 0)       # a 2-D operand's layout, major-to-minor: column-major (read along its rows' axis)


def _sum_to(x, shape):
    """x summed over the axes that broadcasting added or stretched to reach x's shape."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


# ---------------------------------------------------------------- argument checks, while tracing
# (a call's arrays are only shapes and dtypes here: what cygemm's eager readers check of them is
# checked before XLA compiles anything, naming the argument)

_WIDE = {jnp.dtype(n) for n in names(LEVELS["wide"])}       # matmul's dtypes
_FLOAT = {jnp.dtype(n) for n in names(LEVELS["float"])}     # the dense layer's and the grouped GEMMs'
_FP8 = {jnp.dtype(n) for n in names(LEVELS["fp8"])}
_F32 = jnp.dtype(jnp.float32)


def _options(math, autotune, determinism):
    """cygemm's own checks of the options (its describe_matmul of a 1 x 1 product: no GPU)."""
    describe_matmul(((1, 1), _F32.name), ((1, 1), _F32.name), math=math, autotune=autotune, determinism=determinism)


def _ndim(x, name, want):
    if x.ndim not in want:
        raise ValueError(f"{name}: expected a {' or '.join(f'{n}-D' for n in want)} array, got {x.ndim}-D {x.shape}")


def _dtype(x, name, allowed, listed):
    if x.dtype not in allowed:
        raise TypeError(f"{name}: expected {listed}, got {x.dtype}")


def _inner(a, b, names_, ka, kb):
    if ka != kb:
        raise ValueError(f"{names_[1]}: its rows must match {names_[0]}'s columns ({ka}), got shapes {a.shape} "
                         f"and {b.shape}")


# ---------------------------------------------------------------- matmul

def _matmul_call(a, b, math, autotune, determinism):
    """One cygemm.matmul of a and b (batch axes broadcast); under jax.vmap, one call of the
    batched operands (an operand vmap does not batch broadcasts, uncopied)."""
    @jax.custom_batching.custom_vmap
    def call(a, b):
        shape = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        return _ffi_call("cygemm_matmul", jax.ShapeDtypeStruct(shape, a.dtype))(
            a, b, math=math, **_policy(autotune, determinism))

    @call.def_vmap
    def _batched(axis_size, in_batched, a, b):
        # (vmap's axis leads a batched operand; both get as many batch axes, so that it lines up)
        ranks = [x.ndim - 2 - bool(batched) for x, batched in zip((a, b), in_batched)]
        lead = max(ranks)
        a, b = [x.reshape(x.shape[:1] + (1,) * (lead - r) + x.shape[1:]) if batched
                else x.reshape((1,) * (lead - r + 1) + x.shape) for x, r, batched in zip((a, b), ranks, in_batched)]
        return _matmul_call(a, b, math, autotune, determinism), True

    return call(a, b)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _matmul(a, b, math, autotune, determinism):
    return _matmul_call(a, b, math, autotune, determinism)


def _matmul_fwd(a, b, math, autotune, determinism):
    return _matmul(a, b, math, autotune, determinism), (a, b)


def _matmul_bwd(math, autotune, determinism, saved, g):
    # JAX's cotangents of a @ b (transposes, not conjugates, for complex operands too)
    a, b = saved
    ga = _matmul(g, jnp.swapaxes(b, -1, -2), math, autotune, determinism)
    gb = _matmul(jnp.swapaxes(a, -1, -2), g, math, autotune, determinism)
    return _sum_to(ga, a.shape), _sum_to(gb, b.shape)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def matmul(a, b, *, math="tf32", autotune=None, determinism=None):
    """``jnp.matmul(a, b)`` through :func:`cygemm.matmul`, inside ``jax.jit`` or not.

    Parameters
    ----------
    a, b : jax.Array
        float16, bfloat16, float32, float64, complex64 or complex128 (mixed dtypes are promoted
        as jnp does, first); 1-D operands and broadcast batch axes as ``jnp.matmul``.
    math, autotune, determinism
        As :func:`cygemm.matmul`.

    Returns
    -------
    jax.Array
        The product; differentiable in a and b.
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"{'a' if a.ndim == 0 else 'b'}: matmul needs at least 1 dimension, got a 0-D array")
    dtype = jnp.result_type(a, b)
    if dtype not in _WIDE:
        raise TypeError(f"a, b: expected {expected(LEVELS['wide'])} (after jnp's promotion), got {a.dtype} and {b.dtype}")
    _inner(a, b, ("a", "b"), a.shape[-1], b.shape[-2] if b.ndim > 1 else b.shape[0])
    try:
        jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"a, b: their batch axes {a.shape[:-2]} and {b.shape[:-2]} do not broadcast") from None
    _options(math, autotune, determinism)
    a, b = a.astype(dtype), b.astype(dtype)
    y = _matmul(a[None] if a.ndim == 1 else a, b[:, None] if b.ndim == 1 else b, math, autotune, determinism)
    if b.ndim == 1:
        y = y[..., 0]
    if a.ndim == 1:
        y = y[..., 0, :] if b.ndim > 1 else y[..., 0]
    return y


# ---------------------------------------------------------------- the dense layer

def _dense_call(x, kernel, bias, act, leaky_slope, math, autotune, determinism, save_z):
    m, n = x.shape[0], kernel.shape[1]
    y = jax.ShapeDtypeStruct((m, n), x.dtype)
    call = _ffi_call("cygemm_dense_forward", (y, y) if save_z else (y,), sequential=True)
    args = (x, kernel) if bias is None else (x, kernel, bias)
    return call(*args, act=act, leaky_slope=np.float64(leaky_slope), save_z=np.bool_(save_z), math=math,
                **_policy(autotune, determinism))


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _dense(x, kernel, bias, act, leaky_slope, math, autotune, determinism):
    return _dense_call(x, kernel, bias, act, leaky_slope, math, autotune, determinism, False)[0]


def _dense_fwd(x, kernel, bias, act, leaky_slope, math, autotune, determinism):
    saves = backward_reads(act, leaky_slope)
    out = _dense_call(x, kernel, bias, act, leaky_slope, math, autotune, determinism, saves == "z")
    return out[0], (x, kernel, bias is not None, out[1] if saves == "z" else (out[0] if saves == "y" else None))


def _dense_bwd(act, leaky_slope, math, autotune, determinism, saved, gy):
    x, kernel, has_bias, kept = saved
    (m, k), n = x.shape, kernel.shape[1]
    shapes = [jax.ShapeDtypeStruct((m, k), x.dtype), jax.ShapeDtypeStruct((k, n), x.dtype)]
    if has_bias:
        shapes.append(jax.ShapeDtypeStruct((n,), x.dtype))
    saves = backward_reads(act, leaky_slope)
    if saves is not None:       # an activation: dZ's scratch, from XLA
        shapes.append(jax.ShapeDtypeStruct((m, n), x.dtype))
    call = _ffi_call("cygemm_dense_backward", tuple(shapes), parts=2, sequential=True)
    grads = call(x, kernel, gy, gy if kept is None else kept, act=act, leaky_slope=np.float64(leaky_slope),
                 has_bias=np.bool_(has_bias), saves=saves or "", math=math,
                 **_policy(autotune, determinism))
    return grads[0], grads[1], grads[2] if has_bias else None


_dense.defvjp(_dense_fwd, _dense_bwd)


def dense(x, kernel, bias=None, *, act="none", leaky_slope=0.01, math="tf32", autotune=None, determinism=None):
    """A dense layer, ``act(x @ kernel + bias)``, through :func:`cygemm.gemm_ops.forward_into`
    (the bias and activation fused into the GEMM's epilogue or cygemm's kernel), and its
    gradients through :func:`cygemm.gemm_ops.backward_into`.

    Parameters
    ----------
    x : jax.Array (..., K)
        float32, float16 or bfloat16.
    kernel : jax.Array (K, N)
        x's dtype (flax's ``Dense`` kernel layout).
    bias : jax.Array (N,), optional
    act, leaky_slope, math, autotune, determinism
        As :func:`cygemm.gemm_ops.forward_into`.

    Returns
    -------
    jax.Array (..., N)
        Differentiable in x, kernel and bias.
    """
    x, kernel = jnp.asarray(x), jnp.asarray(kernel)
    if isinstance(leaky_slope, bool) or not isinstance(leaky_slope, (int, float, np.integer, np.floating)):
        raise TypeError(f"leaky_slope: expected a real number, got {type(leaky_slope).__name__} {leaky_slope!r}")
    backward_reads(act, leaky_slope)        # (an unknown activation: ValueError, before tracing further)
    _ndim(kernel, "kernel", (2,))
    if x.ndim == 0:
        raise ValueError("x: expected an array of at least 1 dimension (..., K), got a 0-D array")
    _dtype(x, "x", _FLOAT, expected(LEVELS["float"]))
    if kernel.dtype != x.dtype:
        raise TypeError(f"kernel: expected x's dtype {x.dtype}, got {kernel.dtype}")
    _inner(x, kernel, ("x", "kernel"), x.shape[-1], kernel.shape[0])
    if not (float(leaky_slope) >= 0 and _math.isfinite(float(leaky_slope))):
        raise ValueError(f"leaky_slope: expected a finite number >= 0, got {leaky_slope!r}")
    _options(math, autotune, determinism)
    if bias is not None:
        bias = jnp.asarray(bias)
        if bias.size != kernel.shape[-1] or bias.ndim > 2 or (bias.ndim == 2 and bias.shape[0] != 1):
            raise ValueError(f"bias: expected shape ({kernel.shape[-1]},) or (1, {kernel.shape[-1]}), got {bias.shape}")
        if bias.dtype != x.dtype:
            raise TypeError(f"bias: expected x's dtype {x.dtype}, got {bias.dtype}")
        bias = bias.reshape(-1)
    y = _dense(x.reshape(-1, x.shape[-1]), kernel, bias, act, float(leaky_slope), math, autotune, determinism)
    return y.reshape(*x.shape[:-1], kernel.shape[1])


# ---------------------------------------------------------------- int8 and FP8

def int_mm(a, b, *, autotune=None, determinism=None):
    """int8 ``a @ b`` summed exactly in int32, through :func:`cygemm.int_mm`.

    Parameters
    ----------
    a : jax.Array (M, K), int8
    b : jax.Array (K, N), int8
        XLA hands it to cuBLAS column-major (read along K), transposing where it is laid out
        otherwise (``w.T`` of a row-major (N, K) weight costs nothing).

    Returns
    -------
    jax.Array (M, N), int32
        Not differentiable.
    """
    for x, name in ((a, "a"), (b, "b")):
        _ndim(x, name, (2,))
        _dtype(x, name, {jnp.dtype(jnp.int8)}, jnp.dtype(jnp.int8).name)
    _inner(a, b, ("a", "b"), a.shape[1], b.shape[0])
    _options("tf32", autotune, determinism)
    call = _ffi_call("cygemm_int_mm", jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.int32),
                     input_layouts=[None, _COLUMNS], sequential=True)
    return call(a, b, **_policy(autotune, determinism))


def _laid_out(shape, dtype, strides):
    """A stand-in of `shape` with element `strides` that describe_* read for its layout alone."""
    dt = np.dtype(dtype)     # (as_strided keeps only a typestr, which ml_dtypes' FP8 types share: viewed after)
    raw = np.empty(1, f"V{dt.itemsize}")
    return np.lib.stride_tricks.as_strided(raw, shape, tuple(st * dt.itemsize for st in strides)).view(dt)


def _pad_k(grid, kb4, axis):
    pad = [(0, 0), (0, 0)]
    pad[axis] = (0, kb4 - grid.shape[axis])
    return jnp.pad(grid, pad)


def _scale_mode(scale_mode, scale_a, scale_b, m, n):
    """(a's mode, b's mode): as given, or told by the scales' shapes (tensor or rowwise)."""
    if scale_mode is not None:
        return (scale_mode, scale_mode) if isinstance(scale_mode, str) else tuple(scale_mode)
    if scale_a.size == 1 and scale_b.size == 1:
        return ("tensor", "tensor")
    if scale_a.shape == (m, 1) and scale_b.shape == (1, n):
        return ("rowwise", "rowwise")
    raise ValueError(f"scale_mode: the scales' shapes {scale_a.shape} and {scale_b.shape} are not per tensor nor "
                     "rowwise; name the block modes (e.g. scale_mode=('1x128', '128x128'))")


def scaled_matmul(a, b, scale_a, scale_b, *, out_dtype="bfloat16", bias=None, act="none", scale_out=None,
                  return_amax=False, fast_accum=False, scale_mode=None, determinism=None, autotune=None):
    """FP8 ``act(scale_a * scale_b * (a @ b) + bias)`` through :func:`cygemm.fp8.scaled_matmul`.

    Parameters
    ----------
    a : jax.Array (M, K)
        ``float8_e4m3fn`` or ``float8_e5m2``.
    b : jax.Array (K, N)
        FP8, not both E5M2; handed to cuBLASLt column-major (``w.T`` of a row-major (N, K) weight
        costs nothing).
    scale_a, scale_b : jax.Array, float32
        Shaped as :func:`cygemm.fp8.scaled_matmul` takes them for each mode (per tensor, rowwise
        (M, 1) and (1, N), "1x128" (M, ceil(K/128)) and (ceil(K/128), N), "128x128" (ceil(M/128),
        ceil(K/128)) and (ceil(K/128), ceil(N/128))); their storage is arranged here as cuBLASLt
        reads it.
    out_dtype : {"bfloat16", "float16", "float32", "e4m3", "e5m2"}
    bias : jax.Array (N,), optional
        bfloat16 (float16 for a float16 result).
    act : {"none", "relu", "gelu"}
    scale_out : jax.Array, float32 scalar, optional
        An FP8 result's quantizing scale.
    return_amax : bool
        Also return max(abs(result)) before ``scale_out`` (FP8 results), a float32 scalar.
    fast_accum, scale_mode, determinism, autotune
        As :func:`cygemm.fp8.scaled_matmul` (``scale_mode`` None: per tensor or rowwise, told
        by the scales' shapes).

    Returns
    -------
    jax.Array (M, N), or (result, amax) with ``return_amax``
        Not differentiable.
    """
    outs = names(LEVELS["float"]) + names(LEVELS["fp8"])
    try:
        row = row_of_name(out_dtype if isinstance(out_dtype, str) else jnp.dtype(out_dtype).name)
    except TypeError:
        row = None
    if row is None or row["name"] not in outs:
        raise ValueError(f"out_dtype: expected one of {', '.join(outs)} (a name or a dtype), got {out_dtype!r}")
    a, b, scale_a, scale_b, bias, scale_out = (None if x is None else jnp.asarray(x)
                                               for x in (a, b, scale_a, scale_b, bias, scale_out))
    for x, name in ((a, "a"), (b, "b")):
        _ndim(x, name, (2,))
        _dtype(x, name, _FP8, expected(LEVELS["fp8"]))
    _inner(a, b, ("a", "b"), a.shape[1], b.shape[0])
    for x, name in ((scale_a, "scale_a"), (scale_b, "scale_b")) + (((scale_out, "scale_out"),) if scale_out is not None else ()):
        _dtype(x, name, {_F32}, _F32.name)
    if not (scale_mode is None or isinstance(scale_mode, str) or len(tuple(scale_mode)) == 2):
        raise ValueError(f"scale_mode: expected one of {sorted(SCALE_MODES)} or a pair of them, got {scale_mode!r}")
    for mode in ((scale_mode,) if isinstance(scale_mode, str) else tuple(scale_mode or ())):
        if mode not in SCALE_MODES:
            raise ValueError(f"scale_mode: expected one of {sorted(SCALE_MODES)} or a pair of them, got {mode!r}")
    _options("tf32", autotune, determinism)
    m, k = a.shape
    n = b.shape[1]
    mode_a, mode_b = _scale_mode(scale_mode, scale_a, scale_b, m, n)
    if mode_a == "tensor" and (scale_a.size != 1 or scale_b.size != 1):
        raise ValueError(f"scale_a, scale_b: per-tensor scales have one element each, got {scale_a.shape} and "
                         f"{scale_b.shape}")
    if mode_a == "rowwise" and (scale_a.shape != (m, 1) or scale_b.shape != (1, n)):
        raise ValueError(f"scale_a, scale_b: rowwise scales of ({m}, {k}) @ ({k}, {n}) are ({m}, 1) and (1, {n}), "
                         f"got {scale_a.shape} and {scale_b.shape}")
    kb = -(-k // 128)
    kb4 = -(-kb // 4) * 4
    blocks = {"1x128": (m, kb), "128x128": (-(-m // 128), kb)}     # a's grid by mode; b's below
    if mode_a in blocks and tuple(scale_a.shape) != blocks[mode_a]:
        raise ValueError(f"scale_a: a {mode_a!r} grid of a ({m}, {k}) is {blocks[mode_a]}, got {tuple(scale_a.shape)}")
    blocks = {"1x128": (kb, n), "128x128": (kb, -(-n // 128))}
    if mode_b in blocks and tuple(scale_b.shape) != blocks[mode_b]:
        raise ValueError(f"scale_b: a {mode_b!r} grid of b ({k}, {n}) is {blocks[mode_b]}, got {tuple(scale_b.shape)}")
    sa = scale_a.T if mode_a == "1x128" else (_pad_k(scale_a, kb4, 1) if mode_a == "128x128" else scale_a)
    sb = _pad_k(scale_b.T, kb4, 1) if mode_b == "128x128" else scale_b
    # The eager call's own checks (its formats, out_dtype, act, bias, scale_out, K, flags), of
    # stand-ins laid out as the handler hands them over (cygemm.jax.targets): no memory read.
    describe_scaled_matmul(
        _pair(a), _laid_out((k, n), b.dtype, (1, k)), _laid_out((m, kb), _F32, (1, m)) if mode_a == "1x128" else
        _laid_out((-(-m // 128), kb), _F32, (kb4, 1)) if mode_a == "128x128" else _pair(scale_a),
        _laid_out((kb, -(-n // 128)), _F32, (1, kb4)) if mode_b == "128x128" else _pair(scale_b),
        out=((m, n), row["name"]), bias=_pair(bias), act=act, scale_out=_pair(scale_out),
        amax_out=((), _F32.name) if return_amax else None, fast_accum=fast_accum,
        scale_mode=(mode_a, mode_b) if scale_mode else None, determinism=determinism, autotune=autotune)
    args = [a, b, sa, sb] + ([bias] if bias is not None else []) + ([scale_out] if scale_out is not None else [])
    shapes = [jax.ShapeDtypeStruct((m, n), jnp.dtype(row["name"]))]
    if return_amax:
        shapes.append(jax.ShapeDtypeStruct((), jnp.float32))
    layouts = [None, _COLUMNS] + [None] * (len(args) - 2)
    call = _ffi_call("cygemm_scaled_matmul", tuple(shapes), input_layouts=layouts, sequential=True)
    out = call(*args, act=act, fast_accum=np.bool_(fast_accum), scale_mode_a=mode_a if scale_mode else "",
               scale_mode_b=mode_b if scale_mode else "", has_bias=np.bool_(bias is not None),
               has_scale_out=np.bool_(scale_out is not None), has_amax=np.bool_(return_amax),
               **_policy(autotune, determinism))
    return tuple(out) if return_amax else out[0]


# ---------------------------------------------------------------- ragged_dot

# What cygemm's grouped GEMMs take (the dense layer's float types, from the dtype table).
_GROUPED_DTYPES = {jnp.dtype(name) for name in names(LEVELS["float"])}

def _offsets(group_sizes, m):
    """G + 1 offsets, on the device: 0 and the running sums of the group sizes, the last one M
    (cygemm's grouped GEMMs cover every row: rows past the groups go to the last group, and
    are masked to zeros), and the rows the groups hold."""
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1], jnp.full((1,), m, jnp.int32)]), ends[-1]


def _in_groups(x, total):
    """x with its rows past the groups' (row >= total) zeroed: jax.lax.ragged_dot's meaning."""
    return jnp.where(jnp.arange(x.shape[0])[:, None] < total, x, jnp.zeros((), x.dtype))


def _grouped(lhs, rhs, offsets, w_layout, math, autotune, determinism):
    n = rhs.shape[2] if w_layout == "kn" else rhs.shape[1]
    out = jax.ShapeDtypeStruct((lhs.shape[0], n), lhs.dtype)
    call = _ffi_call("cygemm_ragged_dot", out, sequential=True,
                     capturable=_capturable("forward", lhs, rhs, out, rhs.shape[0], w_layout, math, determinism))
    return call(lhs, rhs, offsets, w_layout=w_layout, math=math, **_policy(autotune, determinism))


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _ragged(lhs, rhs, offsets, total, math, autotune, determinism):
    return _in_groups(_grouped(lhs, rhs, offsets, "kn", math, autotune, determinism), total)


def _ragged_fwd(lhs, rhs, offsets, total, math, autotune, determinism):
    _options(math, autotune, determinism)
    return _ragged(lhs, rhs, offsets, total, math, autotune, determinism), (lhs, rhs, offsets, total)


def _ragged_bwd(math, autotune, determinism, saved, g):
    lhs, rhs, offsets, total = saved
    # (the rows past the groups took no part: zeros, so that an inf or NaN there stays out)
    g, lhs = _in_groups(g, total), _in_groups(lhs, total)
    # d lhs: g's rows times each group's rhs transposed (read in place: the "nk" layout);
    # d rhs: the ragged-K product, lhs[rows].T @ g[rows] per group (zeros for an empty group)
    glhs = _grouped(g, rhs, offsets, "nk", math, autotune, determinism)
    out = jax.ShapeDtypeStruct(rhs.shape, rhs.dtype)
    call = _ffi_call("cygemm_ragged_dot_wgrad", out, sequential=True,
                     capturable=_capturable("wgrad", lhs, g, out, rhs.shape[0], "kn", math, determinism))
    grhs = call(lhs, g, offsets, math=math, **_policy(autotune, determinism))
    zero = np.zeros((), jax.dtypes.float0)
    return glhs, grhs, np.zeros(offsets.shape, jax.dtypes.float0), zero


_ragged.defvjp(_ragged_fwd, _ragged_bwd)


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None, *,
               math="tf32", autotune=None, determinism=None):
    """``jax.lax.ragged_dot`` through cygemm's grouped GEMMs (:func:`cygemm.moe_gemm` with the
    offsets on the device: no sync).

    Parameters
    ----------
    lhs : jax.Array (M, K)
        Rows sorted by group: group g's are the next ``group_sizes[g]`` rows.
    rhs : jax.Array (G, K, N)
        One matrix per group, lhs's dtype (float16, bfloat16 or float32).
    group_sizes : jax.Array (G,), integer
        Rows per group, on the device; rows past their sum give zeros.
    precision, preferred_element_type, group_offset
        As ``jax.lax.ragged_dot``; a call that sets any of them, mixes dtypes, or has a dtype
        other than float16, bfloat16 and float32 or no groups, runs ``jax.lax.ragged_dot`` itself.
    math, autotune, determinism
        As :func:`cygemm.moe_gemm`.

    Returns
    -------
    jax.Array (M, N)
        Differentiable in lhs and rhs (rhs's gradient is the ragged-K grouped GEMM).
    """
    lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
    _ndim(lhs, "lhs", (2,))
    _ndim(rhs, "rhs", (3,))
    _inner(lhs, rhs, ("lhs", "rhs"), lhs.shape[1], rhs.shape[1])
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(f"group_sizes: expected an integer array, got {group_sizes.dtype}")
    if group_sizes.shape != (rhs.shape[0],):
        raise ValueError(f"group_sizes: expected one size per group, shape ({rhs.shape[0]},), got {group_sizes.shape}")
    why = ("precision" if precision is not None else "group_offset" if group_offset is not None else
           "mixed dtypes" if lhs.dtype != rhs.dtype else "no groups" if rhs.shape[0] == 0 else
           f"{lhs.dtype} operands" if lhs.dtype not in _GROUPED_DTYPES else
           f"preferred_element_type={jnp.dtype(preferred_element_type)} with {lhs.dtype} operands (cygemm's grouped "
           "GEMM writes the operands' dtype)"
           if preferred_element_type is not None and jnp.dtype(preferred_element_type) != lhs.dtype else None)
    if why is not None:
        warnings.warn(f"cygemm.jax.ragged_dot: {why}: running jax.lax.ragged_dot instead", stacklevel=2)
        return jax.lax.ragged_dot(lhs, rhs, group_sizes, precision=precision,
                                  preferred_element_type=preferred_element_type, group_offset=group_offset)
    offsets, total = _offsets(group_sizes, lhs.shape[0])
    _options(math, autotune, determinism)
    return _ragged(lhs, rhs, offsets, total, math, autotune, determinism)
