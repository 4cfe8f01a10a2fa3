"""How cygemm.jax calls cygemm's XLA targets: their registration with JAX (at import), and one
call of a target, with the scratch buffer XLA allocates for it, the registration XLA may trace
into its command buffers, and one call per element under ``jax.vmap``."""
import jax
import jax.numpy as jnp

from cygemm import describe_moe
from cygemm.engine.context import ALIGNMENT, PART_BYTES
from cygemm.engine.settings import get_options
from cygemm.jax import targets as _targets  # noqa: F401  (gives the handlers their runners)
from cygemm.jax.ffi import CAPTURABLE, capsules, cpu_capsule

__all__ = ["ffi_call", "grouped_capturable", "pair", "policy"]

try:                                # (the registration's traits; the handlers say them too)
    from jaxlib.xla_client import CustomCallTargetTraits as _TRAITS
except ImportError:
    _TRAITS = None


def _register():
    for name, capsule in capsules().items():
        # (a capturable registration's handler says so when XLA asks; its registration says it too)
        traits = {} if _TRAITS is None or not name.endswith("_capturable") else dict(
            traits=_TRAITS.COMMAND_BUFFER_COMPATIBLE)
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA", **traits)
        # (on the CPU, cygemm's own error: these run on NVIDIA GPUs)
        jax.ffi.register_ffi_target(name, cpu_capsule(), platform="cpu")


_register()


def policy(autotune, determinism):
    """The options as the handlers' string attributes ("": not given)."""
    return dict(autotune=autotune or "", determinism=determinism or "")


def ffi_call(target, results, *, parts=1, sequential=False, capturable=True, **options):
    """``jax.ffi.ffi_call`` of a cygemm target with one more result, XLA's scratch buffer for the
    call, which cygemm works in (cuBLAS's workspace and cygemm's table: ``parts`` of
    :data:`cygemm.engine.context.PART_BYTES`, two giving a dense backward's concurrent branches
    one each, and room to align its start) and the caller never sees: the call allocates nothing
    of its own. With the option ``jax_command_buffers`` on, a call that can be captured
    (``capturable``) is made by its target's "_capturable" registration, which tells XLA so.
    sequential: under ``jax.vmap``, one call per batch element (a ``lax.map`` over the batched
    operands; each call's scratch is its own, never stacked)."""
    single = not isinstance(results, (tuple, list))
    if capturable and target in CAPTURABLE and get_options()["jax_command_buffers"]:
        target += "_capturable"         # (the registration that tells XLA it may capture the call)
    scratch = jax.ShapeDtypeStruct((parts * PART_BYTES + ALIGNMENT,), jnp.uint8)
    call = jax.ffi.ffi_call(target, ((results,) if single else tuple(results)) + (scratch,), **options)

    def run(*args, **attrs):
        def one(*args):
            out = call(*args, **attrs)
            return out[0] if single else tuple(out[:-1])
        if not sequential:
            return one(*args)
        one = jax.custom_batching.custom_vmap(one)

        @one.def_vmap
        def _each(axis_size, in_batched, *args):
            def element(batched):
                it = iter(batched)
                return one(*[next(it) if b else x for x, b in zip(args, in_batched)])
            out = jax.lax.map(element, [x for x, b in zip(args, in_batched) if b])
            return out, jax.tree_util.tree_map(lambda _: True, out)
        return one(*args)
    return run


class _DeviceOffsets:
    """G + 1 int32 offsets on the GPU as describe_moe reads them: a layout, never read."""

    def __init__(self, n):
        self.__cuda_array_interface__ = dict(shape=(n,), typestr="<i4", data=(0x7000_0000_0000, False), version=3,
                                             strides=None)


def pair(x):
    """x's (shape, dtype name), the stand-in describe_* read for a C-ordered operand's layout
    (None for None)."""
    return None if x is None else (tuple(x.shape), jnp.dtype(x.dtype).name)


def grouped_capturable(kind, a, b, out, groups, layout, math, determinism):
    """Whether a grouped call can be captured: cuBLASLt's grouped matmul takes it (the group
    sizes read on the GPU); else cygemm would read them to the host, which no capture allows."""
    if not get_options()["jax_command_buffers"]:
        return False
    found = describe_moe(pair(a), pair(b), _DeviceOffsets(groups + 1), pair(out), kind=kind, math=math,
                         determinism=determinism, capturing=True, **{"w_layout" if kind == "forward" else "dw_layout": layout})
    return "lt_grouped" in found["routes"]
