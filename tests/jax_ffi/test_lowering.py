"""cygemm.jax on the CPU: each function's abstract evaluation, and its lowering for CUDA
(jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))) giving cygemm's custom call with
the right operands, layouts, results and attributes; gradients and vmap lower to the calls
they should. No GPU: a CPU jaxlib lowers for CUDA without running."""
import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import cygemm  # noqa: E402
import cygemm.jax as cj  # noqa: E402
from cygemm.jax import calls  # noqa: E402

S = jax.ShapeDtypeStruct


def _calls(f, *args):
    """The custom calls of f's lowering for CUDA: [(target, operand layouts, result types, attributes)]."""
    text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    found = []
    for line in text.splitlines():
        m = re.search(r"stablehlo\.custom_call @(\w+)\(.*mhlo\.backend_config = \{(.*?)\}, operand_layouts = \[(.*?)\], "
                      r"result_layouts.*-> (.*)$", line)
        if m:
            attrs = dict(re.findall(r"(\w+) = (\"[^\"]*\"|[^,}]+)", m.group(2)))
            layouts = re.findall(r"dense<\[?([\d, ]+)\]?>", m.group(3))
            found.append((m.group(1), [tuple(int(v) for v in l.split(",")) for l in layouts], m.group(4), attrs))
    return found


def test_matmul_lowers_to_one_call_with_its_options_and_numpys_shapes():
    (call,) = _calls(lambda a, b: cj.matmul(a, b, math="fp32", determinism="batch_invariant"),
                     S((4, 8, 16), jnp.float32), S((16, 5), jnp.float32))
    target, layouts, result, attrs = call
    assert target == "cygemm_matmul"
    assert layouts == [(2, 1, 0), (1, 0)]           # row-major operands
    assert "tensor<4x8x5xf32>" in result
    assert attrs == {"autotune": '""', "determinism": '"batch_invariant"', "math": '"fp32"'}


@pytest.mark.parametrize("sa, sb, want", [((16,), (16, 5), (5,)), ((3, 16), (16,), (3,)), ((2, 1, 3, 16), (4, 16, 5),
                                                                                             (2, 4, 3, 5))])
def test_matmul_has_jnp_matmuls_shapes_and_promotes_as_jnp(sa, sb, want):
    out = jax.eval_shape(cj.matmul, S(sa, jnp.float16), S(sb, jnp.float32))
    assert out.shape == want and out.dtype == jnp.float32


def test_int_mm_asks_xla_for_a_column_major_b():
    ((target, layouts, result, _),) = _calls(cj.int_mm, S((8, 32), jnp.int8), S((32, 4), jnp.int8))
    assert target == "cygemm_int_mm" and layouts == [(1, 0), (0, 1)] and "tensor<8x4xi32>" in result


def test_the_dense_layer_and_its_gradients_lower_to_the_forward_and_backward_calls():
    x, k, b = S((2, 8, 16), jnp.bfloat16), S((16, 4), jnp.bfloat16), S((4,), jnp.bfloat16)
    ((target, _, result, attrs),) = _calls(lambda x, k, b: cj.dense(x, k, b, act="gelu"), x, k, b)
    assert target == "cygemm_dense_forward" and attrs["save_z"] == "false" and "tensor<16x4xbf16>" in result
    grad = jax.grad(lambda x, k, b: cj.dense(x, k, b, act="gelu").astype(jnp.float32).sum(), argnums=(0, 1, 2))
    fwd, bwd = _calls(grad, x, k, b)
    assert fwd[0] == "cygemm_dense_forward" and fwd[3]["save_z"] == "true"      # gelu: the backward reads Z
    assert bwd[0] == "cygemm_dense_backward" and bwd[3]["saves"] == '"z"' and bwd[3]["has_bias"] == "true"
    # gx, gkernel, gbias and dZ's scratch, all from XLA
    assert re.findall(r"tensor<[\dx]+bf16>", bwd[2]) == ["tensor<16x16xbf16>", "tensor<16x4xbf16>", "tensor<4xbf16>",
                                                         "tensor<16x4xbf16>"]
    relu = _calls(jax.grad(lambda x, k: cj.dense(x, k, act="relu").astype(jnp.float32).sum(), argnums=(0, 1)), x, k)
    assert relu[0][3]["save_z"] == "false" and relu[1][3]["saves"] == '"y"'     # relu: from the output


def test_ragged_dot_lowers_with_offsets_and_its_two_gradients():
    lhs, rhs, sizes = S((64, 16), jnp.float32), S((4, 16, 8), jnp.float32), S((4,), jnp.int32)
    ((target, layouts, result, attrs),) = _calls(cj.ragged_dot, lhs, rhs, sizes)
    assert target == "cygemm_ragged_dot" and attrs["w_layout"] == '"kn"'
    assert layouts == [(1, 0), (2, 1, 0), (0,)] and "tensor<64x8xf32>" in result
    calls = _calls(jax.value_and_grad(lambda l, r, g: cj.ragged_dot(l, r, g).sum(), argnums=(0, 1)), lhs, rhs, sizes)
    assert [(c[0], c[3].get("w_layout")) for c in calls] == [
        ("cygemm_ragged_dot", '"kn"'), ("cygemm_ragged_dot", '"nk"'), ("cygemm_ragged_dot_wgrad", None)]
    assert "tensor<4x16x8xf32>" in calls[2][2]


def test_ragged_dot_has_lax_ragged_dots_meaning_for_what_it_does_not_take():
    lhs, rhs, sizes = S((64, 16), jnp.bfloat16), S((4, 16, 8), jnp.bfloat16), S((4,), jnp.int32)
    assert _calls(lambda l, r, g: cj.ragged_dot(l, r, g, preferred_element_type=jnp.float32), lhs, rhs, sizes) == []
    assert _calls(cj.ragged_dot, S((64, 16), jnp.int8), S((4, 16, 8), jnp.int8), sizes) == []      # (no int GEMM here)
    want = jax.eval_shape(jax.lax.ragged_dot, lhs, rhs, sizes)
    got = jax.eval_shape(cj.ragged_dot, lhs, rhs, sizes)
    assert (got.shape, got.dtype) == (want.shape, want.dtype)


@pytest.mark.parametrize("modes, sa, sb, sent", [
    (None, (1,), (1,), [(1,), (1,)]),
    (None, (256, 1), (1, 128), [(256, 1), (1, 128)]),
    (("1x128", "128x128"), (256, 5), (5, 1), [(5, 256), (1, 8)]),          # a's grid transposed, b's padded to 8
    ("1x128", (256, 5), (5, 128), [(5, 256), (5, 128)]),
])
def test_scaled_matmul_sends_each_modes_scales_as_cublaslt_reads_them(modes, sa, sb, sent):
    a, b = S((256, 528), jnp.float8_e4m3fn), S((528, 128), jnp.float8_e4m3fn)     # (K: 5 blocks, the last short)
    f = lambda a, b, x, y: cj.scaled_matmul(a, b, x, y, scale_mode=modes, out_dtype="float32")  # noqa: E731
    text = jax.jit(f).trace(a, b, S(sa, jnp.float32), S(sb, jnp.float32)).lower(lowering_platforms=("cuda",)).as_text()
    line = next(l for l in text.splitlines() if "@cygemm_scaled_matmul" in l)
    operands = re.search(r"\} : \((.*)\) ->", line).group(1)
    shapes = [tuple(int(d) for d in t.split("x")[:-1]) for t in re.findall(r"tensor<([\dx]*[a-zA-Z]\w*)>", operands)]
    assert shapes[2:] == sent
    ((_, layouts, result, attrs),) = _calls(f, a, b, S(sa, jnp.float32), S(sb, jnp.float32))
    assert layouts[1] == (0, 1) and "tensor<256x128xf32>" in result


def test_scaled_matmul_with_an_fp8_result_returns_its_amax():
    a, b = S((64, 128), jnp.float8_e4m3fn), S((128, 32), jnp.float8_e4m3fn)
    s = S((), jnp.float32)
    out = jax.eval_shape(lambda *t: cj.scaled_matmul(*t, out_dtype="e4m3", scale_out=t[2], return_amax=True), a, b, s, s)
    assert (out[0].shape, out[0].dtype, out[1].shape, out[1].dtype) == ((64, 32), jnp.float8_e4m3fn, (), jnp.float32)


def test_a_bias_of_one_row_is_taken_and_differentiated_as_a_vector():
    x, k, b = S((8, 16), jnp.float32), S((16, 4), jnp.float32), S((1, 4), jnp.float32)
    grads = jax.eval_shape(jax.grad(lambda x, k, b: cj.dense(x, k, b, act="relu").sum(), argnums=(0, 1, 2)), x, k, b)
    assert [g.shape for g in grads] == [(8, 16), (16, 4), (1, 4)]


def test_bad_arguments_are_refused_before_tracing_goes_on():
    with pytest.raises(TypeError, match="bias: expected x's dtype float32, got bfloat16"):
        jax.eval_shape(lambda x, k, b: cj.dense(x, k, b), S((4, 8), jnp.float32), S((8, 2), jnp.float32),
                       S((2,), jnp.bfloat16))
    a, b = S((256, 520), jnp.float8_e4m3fn), S((520, 128), jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"scale_a: a '1x128' grid of a \(256, 520\) is \(256, 5\), got \(256, 3\)"):
        jax.eval_shape(lambda *t: cj.scaled_matmul(*t, scale_mode="1x128"), a, b, S((256, 3), jnp.float32),
                       S((5, 128), jnp.float32))
    with pytest.raises(ValueError, match=r"scale_b: a '128x128' grid of b \(520, 128\) is \(5, 1\), got \(4, 1\)"):
        jax.eval_shape(lambda *t: cj.scaled_matmul(*t, scale_mode=("1x128", "128x128")), a, b,
                       S((256, 5), jnp.float32), S((4, 1), jnp.float32))
    with pytest.raises(ValueError, match=r"group_sizes: expected one size per group, shape \(4,\), got \(3,\)"):
        jax.eval_shape(cj.ragged_dot, S((64, 16), jnp.float32), S((4, 16, 8), jnp.float32), S((3,), jnp.int32))
    with pytest.raises(ValueError, match="act"):
        jax.eval_shape(lambda x, k: cj.dense(x, k, act="swish2"), S((4, 8), jnp.float32), S((8, 2), jnp.float32))
    with pytest.raises(ValueError, match="scale_mode: the scales' shapes"):
        jax.eval_shape(cj.scaled_matmul, S((256, 256), jnp.float8_e4m3fn), S((256, 128), jnp.float8_e4m3fn),
                       S((256, 2), jnp.float32), S((2, 128), jnp.float32))
    # a dtype object for out_dtype, and Python numbers for per-tensor scales, are taken as the eager call takes them
    out = jax.eval_shape(lambda a, b: cj.scaled_matmul(a, b, 0.5, 2.0, out_dtype=jnp.float16), S((64, 128), jnp.float8_e4m3fn),
                         S((128, 32), jnp.float8_e4m3fn))
    assert (out.shape, out.dtype) == ((64, 32), jnp.float16)
    with pytest.raises(ValueError, match="out_dtype"):
        jax.eval_shape(lambda *t: cj.scaled_matmul(*t, out_dtype="float128"), S((64, 128), jnp.float8_e4m3fn),
                       S((128, 32), jnp.float8_e4m3fn), S((), jnp.float32), S((), jnp.float32))


def test_vmap_of_matmul_is_one_broadcast_call_and_of_dense_a_loop():
    calls = _calls(jax.vmap(lambda a, b: cj.matmul(a, b)), S((3, 8, 16), jnp.float32), S((3, 16, 4), jnp.float32))
    assert len(calls) == 1 and "tensor<3x8x4xf32>" in calls[0][2]
    text = jax.jit(jax.vmap(lambda x, k: cj.dense(x, k))).trace(S((3, 8, 16), jnp.float32), S((3, 16, 4), jnp.float32)) \
        .lower(lowering_platforms=("cuda",)).as_text()
    assert "stablehlo.while" in text and "@cygemm_dense_forward" in text


@pytest.mark.parametrize("sa, sb, in_axes", [
    ((3, 2, 8, 16), (16, 4), (0, None)),        # vmap's axis on a, b shared: b broadcast, uncopied
    ((8, 16), (3, 2, 16, 4), (None, 0)),        # on b, whose batch axes outnumber a's
    ((5, 8, 16), (3, 5, 16, 4), (0, 1)),        # on both, at other axes
])
def test_vmap_of_matmul_is_one_call_with_jnps_shapes(sa, sb, in_axes):
    f = jax.vmap(cj.matmul, in_axes=in_axes)
    want = jax.eval_shape(jax.vmap(jnp.matmul, in_axes=in_axes), S(sa, jnp.float32), S(sb, jnp.float32))
    assert jax.eval_shape(f, S(sa, jnp.float32), S(sb, jnp.float32)) == want
    (call,) = _calls(f, S(sa, jnp.float32), S(sb, jnp.float32))
    assert f"tensor<{'x'.join(map(str, want.shape))}xf32>, tensor<{ONE}xui8>" in call[2]
    grads = _calls(jax.vmap(jax.value_and_grad(lambda a, b: cj.matmul(a, b).sum(), argnums=(0, 1)), in_axes=in_axes),
                   S(sa, jnp.float32), S(sb, jnp.float32))
    assert [c[0] for c in grads] == ["cygemm_matmul"] * 3 and all(f"tensor<{ONE}xui8>" in c[2] for c in grads)


PART = 33619968         # the bytes of one part of a call's scratch: cuBLAS's 32 MiB workspace and a 64 KiB table
ONE, TWO = PART + 256, 2 * PART + 256       # (and 256 bytes to reach cuBLASLt's alignment)


def test_every_call_gets_its_scratch_buffer_from_xla_as_its_last_result():
    """One part each (the dense backward two: its concurrent branches one each), unbatched under
    vmap, never returned."""
    f8, x, k = jnp.float8_e4m3fn, S((16, 32), jnp.bfloat16), S((32, 8), jnp.bfloat16)
    calls = (_calls(lambda a, b: cj.matmul(a, b), x, k)
             + _calls(cj.int_mm, S((8, 32), jnp.int8), S((32, 4), jnp.int8))
             + _calls(lambda a, b, sa, sb: cj.scaled_matmul(a, b, sa, sb, return_amax=True, out_dtype="e4m3"),
                      S((16, 32), f8), S((32, 16), f8), S((), jnp.float32), S((), jnp.float32))
             + _calls(jax.grad(lambda x, k: cj.dense(x, k, act="gelu").astype(jnp.float32).sum(), argnums=(0, 1)), x, k)
             + _calls(jax.grad(lambda l, r, g: cj.ragged_dot(l, r, g).astype(jnp.float32).sum(), argnums=(0, 1)),
                      x, S((4, 32, 8), jnp.bfloat16), S((4,), jnp.int32)))
    scratch = {c[0] + ("" if i == 0 else f"#{i}"): re.findall(r"tensor<(\d+)xui8>", c[2]) for i, c in enumerate(calls)
               if c[0] not in [d[0] for d in calls[:i]]}
    assert {k.split("#")[0]: v for k, v in scratch.items()} == {
        "cygemm_matmul": [str(ONE)], "cygemm_int_mm": [str(ONE)], "cygemm_scaled_matmul": [str(ONE)],
        "cygemm_dense_forward": [str(ONE)], "cygemm_dense_backward": [str(TWO)],
        "cygemm_ragged_dot": [str(ONE)], "cygemm_ragged_dot_wgrad": [str(ONE)]}
    for c in calls:         # the scratch is the last result
        assert c[2].rstrip(")").endswith("xui8>")
    out, amax = jax.eval_shape(lambda a, b, sa, sb: cj.scaled_matmul(a, b, sa, sb, return_amax=True, out_dtype="e4m3"),
                               S((16, 32), f8), S((32, 16), f8), S((), jnp.float32), S((), jnp.float32))
    assert (out.shape, amax.shape) == ((16, 16), ())


@pytest.mark.parametrize("f, operands, in_axes", [
    (lambda x, k: cj.dense(x, k), [((3, 8, 16), jnp.float32), ((16, 4), jnp.float32)], (0, None)),
    (cj.int_mm, [((3, 8, 32), jnp.int8), ((3, 32, 4), jnp.int8)], (0, 0)),
    (lambda l, r, g: cj.ragged_dot(l, r, g), [((3, 16, 8), jnp.float32), ((4, 8, 2), jnp.float32), ((4,), jnp.int32)],
     (0, None, None)),
])
def test_vmap_of_a_sequential_call_keeps_each_calls_scratch_its_own(f, operands, in_axes):
    """(one call per element: the scratch is never stacked over the batch, also outside jit)"""
    jaxpr = str(jax.make_jaxpr(jax.vmap(f, in_axes=in_axes))(*[jnp.zeros(s, d) for s, d in operands]))
    assert re.findall(r"u8\[(\d+)\]", jaxpr) and not re.findall(r"u8\[\d+,", jaxpr)
    assert "scan[" in jaxpr


def test_the_option_calls_the_capturable_registrations_but_ragged_dots():
    old = cygemm.set_options(jax_command_buffers=True)
    try:
        x, k = S((16, 32), jnp.float32), S((32, 8), jnp.float32)
        calls = (_calls(jax.value_and_grad(lambda x, k: cj.dense(x, cj.matmul(k, k.T), act="relu").sum(), (0, 1)), x,
                        S((32, 32), jnp.float32))
                 + _calls(jax.value_and_grad(lambda l, r, g: cj.ragged_dot(l, r, g).sum(), (0, 1)), x,
                          S((4, 32, 8), jnp.float32), S((4,), jnp.int32)))
    finally:
        cygemm.set_options(**old)
    assert sorted({c[0] for c in calls}) == [
        "cygemm_dense_backward_capturable", "cygemm_dense_forward_capturable", "cygemm_matmul_capturable",
        "cygemm_ragged_dot", "cygemm_ragged_dot_wgrad"]
    assert {c[0] for c in _calls(lambda x, k: cj.dense(x, k), x, k)} == {"cygemm_dense_forward"}     # off again


def test_a_ragged_dot_is_called_capturable_where_cuBLASLts_grouped_matmul_takes_it(monkeypatch):
    """(no GPU here: describe_moe says where lt_grouped applies; a stand-in answers, and what
    ragged_dot asks it is checked: device offsets, described inside a capture)"""
    asked = []

    def describe(a, b, offsets, out, **kw):
        asked.append((a, b, offsets.__cuda_array_interface__["shape"], out, kw))
        return {"routes": ["lt_grouped"] if a[1] == "bfloat16" else []}
    monkeypatch.setattr(calls, "describe_moe", describe)
    old = cygemm.set_options(jax_command_buffers=True)
    try:
        grads = jax.value_and_grad(lambda l, r, g: cj.ragged_dot(l, r, g).astype(jnp.float32).sum(), (0, 1))
        bf = _calls(grads, S((64, 16), jnp.bfloat16), S((4, 16, 8), jnp.bfloat16), S((4,), jnp.int32))
        f32 = _calls(grads, S((64, 16), jnp.float32), S((4, 16, 8), jnp.float32), S((4,), jnp.int32))
    finally:
        cygemm.set_options(**old)
    assert [c[0] for c in bf] == ["cygemm_ragged_dot_capturable"] * 2 + ["cygemm_ragged_dot_wgrad_capturable"]
    assert [c[0] for c in f32] == ["cygemm_ragged_dot"] * 2 + ["cygemm_ragged_dot_wgrad"]
    fwd, bwd, wgrad = asked[:3]
    assert fwd[:4] == (((64, 16), "bfloat16"), ((4, 16, 8), "bfloat16"), (5,), ((64, 8), "bfloat16"))
    assert fwd[4]["kind"] == "forward" and fwd[4]["w_layout"] == "kn" and fwd[4]["capturing"] is True
    assert bwd[4]["w_layout"] == "nk" and bwd[3] == ((64, 16), "bfloat16")
    assert wgrad[4]["kind"] == "wgrad" and wgrad[3] == ((4, 16, 8), "bfloat16")


def test_every_target_is_one_the_handlers_serve():
    from cygemm.jax.targets import RUNNERS
    assert set(cj.TARGETS) == set(RUNNERS)


F8, E5 = jnp.float8_e4m3fn, jnp.float8_e5m2
f32, bf16, i8 = jnp.float32, jnp.bfloat16, jnp.int8
BAD = [     # (function, its operands' (shape, dtype), keywords, error, message)
    (cj.matmul, [((8, 16), f32), ((17, 4), f32)], {}, ValueError, r"^b: its rows must match a's columns \(16\)"),
    (cj.matmul, [((8, 16), jnp.int32), ((16, 4), jnp.int32)], {}, TypeError, r"^a, b: expected .* got int32 and int32"),
    (cj.matmul, [((2, 8, 16), f32), ((3, 16, 4), f32)], {}, ValueError, r"^a, b: their batch axes"),
    (cj.matmul, [((8, 16), f32), ((16, 4), f32)], dict(math="bogus"), ValueError, "math"),
    (cj.matmul, [((8, 16), f32), ((16, 4), f32)], dict(determinism="bogus"), ValueError, "determinism"),
    (cj.dense, [((8, 16), f32), ((17, 4), f32)], {}, ValueError, r"^kernel: its rows must match x's columns"),
    (cj.dense, [((8, 16), f32), ((16, 4), bf16)], {}, TypeError, r"^kernel: expected x's dtype float32"),
    (cj.dense, [((8, 16), f32), ((2, 16, 4), f32)], {}, ValueError, r"^kernel: expected a 2-D array"),
    (cj.dense, [((8, 16), f32), ((16, 4), f32)], dict(act="leaky_relu", leaky_slope=-1), ValueError, r"^leaky_slope"),
    (cj.ragged_dot, [((64, 16), f32), ((16, 8), f32), ((4,), jnp.int32)], {}, ValueError,
     r"^rhs: expected a 3-D array, got 2-D"),
    (cj.ragged_dot, [((64, 16), f32), ((4, 17, 8), f32), ((4,), jnp.int32)], {}, ValueError,
     r"^rhs: its rows must match lhs's columns"),
    (cj.ragged_dot, [((64, 16), f32), ((4, 16, 8), f32), ((4,), f32)], {}, TypeError,
     r"^group_sizes: expected an integer array"),
    (cj.scaled_matmul, [((64, 128), bf16), ((128, 32), F8), ((), f32), ((), f32)], {}, TypeError,
     r"^a: expected float8_e4m3fn or float8_e5m2, got bfloat16"),
    (cj.scaled_matmul, [((64, 128), F8), ((128, 32), F8), ((), jnp.float16), ((), f32)], {}, TypeError,
     r"^scale_a: expected float32, got float16"),
    (cj.scaled_matmul, [((64, 128), F8), ((128, 32), F8), ((64, 2), f32), ((1, 32), f32)], dict(scale_mode="rowwise"),
     ValueError, r"^scale_a, scale_b: rowwise scales"),
    (cj.scaled_matmul, [((64, 128), F8), ((128, 32), F8), ((), f32), ((), f32)], dict(scale_mode="64x64"), ValueError,
     r"^scale_mode: expected one of"),
    # what the eager scaled_matmul checks, asked of it while tracing (describe_scaled_matmul)
    (cj.scaled_matmul, [((64, 128), E5), ((128, 32), E5), ((), f32), ((), f32)], {}, TypeError,
     r"^a/b: cuBLASLt has no E5M2 x E5M2 GEMM"),
    (cj.scaled_matmul, [((64, 128), F8), ((128, 32), F8), ((), f32), ((), f32)], dict(out_dtype="int8"), ValueError,
     r"^out_dtype: expected one of float16, bfloat16, float32, float8_e4m3fn, float8_e5m2 \(a name or a dtype\), "
     r"got 'int8'"),
    (cj.scaled_matmul, [((64, 128), F8), ((128, 32), F8), ((), f32), ((), f32)], dict(act="tanh"), ValueError,
     r"^act: FP8 GEMMs \(cuBLASLt epilogues\) apply 'none', 'relu' or 'gelu', got 'tanh'"),
    (cj.scaled_matmul, [((64, 128), F8), ((128, 32), F8), ((), f32), ((), f32)], dict(bias=jnp.zeros(32, f32)),
     TypeError, r"^bias: an FP8 GEMM with a bfloat16 output takes a bfloat16 bias, got float32"),
    (cj.scaled_matmul, [((64, 128), F8), ((128, 32), F8), ((), f32), ((), f32)], dict(bias=jnp.zeros(7, bf16)),
     ValueError, r"^bias: expected shape \(32,\)"),
    (cj.scaled_matmul, [((64, 128), F8), ((128, 32), F8), ((), f32), ((), f32)], dict(scale_out=jnp.ones((), f32)),
     ValueError, r"^scale_out: quantizes an FP8 output; out is bfloat16"),
    (cj.scaled_matmul, [((64, 20), F8), ((20, 32), F8), ((), f32), ((), f32)], {}, ValueError,
     r"^a: FP8 GEMMs need K to be a multiple of 16 here, got K = 20"),
    (cj.scaled_matmul, [((64, 128), F8), ((128, 32), F8), ((), f32), ((), f32)], dict(fast_accum="yes"), TypeError,
     r"^fast_accum: expected True or False, got 'yes'"),
    (cj.scaled_matmul, [((64, 128), F8), ((128, 32), F8), ((), f32), ((), f32)],
     dict(scale_mode=("1x128", "1x128", "tensor")), ValueError, r"^scale_mode: expected one of .* or a pair of them"),
    (lambda x, k: cj.dense(x, k, act="leaky_relu", leaky_slope="a"), [((8, 16), f32), ((16, 4), f32)], {}, TypeError,
     r"^leaky_slope: expected a real number, got str 'a'"),
    (cj.int_mm, [((8, 16), f32), ((16, 4), f32)], {}, TypeError, r"^a: expected int8, got float32"),
    (cj.int_mm, [((8, 16), i8), ((15, 4), i8)], {}, ValueError, r"^b: its rows must match a's columns"),
]


@pytest.mark.parametrize("fn, operands, kwargs, error, message", BAD)
def test_bad_shapes_dtypes_and_options_are_refused_while_tracing_naming_the_argument(fn, operands, kwargs, error,
                                                                                      message):
    with pytest.raises(error, match=message):
        jax.eval_shape(lambda *t: fn(*t, **kwargs), *[S(shape, dtype) for shape, dtype in operands])


def test_a_ragged_dot_cygemm_does_not_take_says_it_runs_xlas():
    with pytest.warns(UserWarning, match=r"ragged_dot: preferred_element_type=float32 with bfloat16 operands"):
        jax.eval_shape(lambda l, r, g: cj.ragged_dot(l, r, g, preferred_element_type=jnp.float32),
                       S((64, 16), jnp.bfloat16), S((4, 16, 8), jnp.bfloat16), S((4,), jnp.int32))


def test_a_call_placed_on_the_cpu_fails_with_cygemms_message():
    """XLA's CPU runs the handler every target has there (a real XLA execution, no GPU): it
    answers XLA's version question and fails naming why, instead of XLA's 'no handler'."""
    with pytest.raises(Exception, match=r"FAILED_PRECONDITION: cygemm: cygemm.jax runs on NVIDIA GPUs"):
        jax.block_until_ready(jax.jit(cj.matmul, backend="cpu")(jnp.ones((8, 16)), jnp.ones((16, 4))))
