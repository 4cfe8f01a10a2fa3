"""cygemm.jax inside XLA's command buffers (CUDA graphs), on an NVIDIA GPU: a training step of a
dense layer and a matmul, jitted with XLA's command buffers taking custom calls and cygemm's
option ``jax_command_buffers`` on, gives the bits of the same step with the option off (the
calls then outside XLA's graphs), allocates no workspace of cygemm's own either way (each call
works in XLA's scratch), and should replay without running cygemm's handlers (not yet seen:
marked as an expected failure, strict, so that the day it holds is noticed).

Each configuration runs in a process of its own: XLA reads its flags once, when its backend
starts. Skipped where JAX has no CUDA device."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")     # (the steps run in processes of their own)
jax = pytest.importorskip("jax")
from gpu_util import jax_has_gpu  # noqa: E402


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not jax_has_gpu(jax), reason="needs JAX with a CUDA GPU")]

_STEP = textwrap.dedent('''
    import json, os, sys
    os.environ["XLA_FLAGS"], os.environ["CYGEMM_JAX_COMMAND_BUFFERS"] = sys.argv[1], sys.argv[3]
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"], os.environ["CYGEMM_TUNING_CACHE"] = "false", "off"
    import jax, jax.numpy as jnp, numpy as np
    import cygemm.jax as cj
    from cygemm.engine import context, tuning
    from cygemm.jax import ffi

    tuning.force_routes(backward="branches")    # the dense backward forks (its side stream in a capture)
    keys = jax.random.split(jax.random.key(7), 4)

    def dense_step(x, k, b, w):
        h = cj.dense(x, k, b, act="gelu")
        return (cj.matmul(h, w, math="fp32") ** 2).astype(jnp.float32).sum()

    def ragged_step(x, w, sizes):
        return (cj.ragged_dot(x, w, sizes).astype(jnp.float32) ** 2).sum()

    if sys.argv[4] == "dense":
        loss, argnums = dense_step, (0, 1, 2, 3)
        args = [jax.random.normal(key, shape, jnp.float32) for key, shape in
                zip(keys, ((256, 512), (512, 384), (384,), (384, 128)))]
    else:                                       # 4 experts, one of them empty
        loss, argnums = ragged_step, (0, 1)
        args = [jax.random.normal(keys[0], (1024, 256), jnp.bfloat16),
                jax.random.normal(keys[1], (4, 256, 128), jnp.bfloat16), jnp.array([300, 0, 500, 224], jnp.int32)]
    # (each result through a fusion: the custom calls write XLA's temporaries, whose addresses
    # stay from one execution to the next, so a captured graph can be replayed as it is)
    grad = jax.value_and_grad(loss, argnums=argnums)
    step = jax.jit(lambda *a: jax.tree_util.tree_map(lambda t: t * 2.0, grad(*a)))
    allocated = context.workspace_allocations()
    jax.block_until_ready(step(*args))          # compiles and runs once (XLA's first run is not captured)
    first = ffi.executed()
    for _ in range(4):                          # recorded once, then replayed where XLA captured the calls
        out = jax.block_until_ready(step(*args))
    np.savez(sys.argv[2], *[np.asarray(o) for o in jax.tree_util.tree_leaves(out)])
    print(json.dumps(dict(handler_runs=ffi.executed() - first, first_runs=first,
                          allocated=context.workspace_allocations() - allocated)))
''')

# XLA's flags, and cygemm's option: its capturable registrations, or not
_FLAGS = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"


def _run(option, tmp_path, name, step="dense"):
    path = str(tmp_path / f"{name}.npz")
    done = subprocess.run([sys.executable, "-c", _STEP, _FLAGS, path, option, step], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), np.load(path)


# Seen on an H100 (JAX 0.11.2, cuBLAS 13.1, 2026-12-05): with the option on, XLA called every
# handler at every step (20 in 4 steps, as with it off), so no call was replayed from a graph.
_NOT_REPLAYED = pytest.mark.xfail(strict=True, reason="XLA (JAX 0.11.2) called cygemm's capturable handlers at "
                                  "every step on an H100: not yet replayed from its command buffers")


def _both_ways(tmp_path_factory, step):
    """The step with the option on ((summary, results) "captured") and off ("uncaptured")."""
    tmp = tmp_path_factory.mktemp(f"{step}_steps")
    return _run("1", tmp, "captured", step), _run("0", tmp, "uncaptured", step)


def _check_same_bits_and_no_allocation(captured, got, eager, want, calls, results):
    # Every execution outside command buffers runs every call's handler (`calls` a step).
    assert eager["first_runs"] == calls and eager["handler_runs"] == 4 * calls, eager
    assert captured["first_runs"] == calls, captured
    assert sorted(got.files) == sorted(want.files) and len(want.files) == results
    for key in want.files:
        assert (got[key].dtype, got[key].shape) == (want[key].dtype, want[key].shape), key
        assert got[key].tobytes() == want[key].tobytes(), key
    # Each call worked in XLA's scratch buffer: no workspace of cygemm's own, captured or not.
    assert captured["allocated"] == 0 and eager["allocated"] == 0


@pytest.fixture(scope="module")
def dense_steps(tmp_path_factory):
    return _both_ways(tmp_path_factory, "dense")


def test_a_training_step_offered_to_xlas_command_buffers_gives_the_same_bits_and_allocates_nothing(dense_steps):
    (captured, got), (eager, want) = dense_steps
    # the dense forward, the matmul, its two gradients and the dense backward: 5 calls a step;
    # the gradients of x, kernel, bias and w and the loss: 5 results
    _check_same_bits_and_no_allocation(captured, got, eager, want, calls=5, results=5)


@_NOT_REPLAYED
def test_a_training_step_replays_from_xlas_command_buffers(dense_steps):
    # In command buffers, the execution that records runs the handlers once more and a replay
    # runs none.
    (captured, _), _ = dense_steps
    assert captured["handler_runs"] <= 5, captured


@pytest.fixture(scope="module")
def ragged_steps(tmp_path_factory):
    from cygemm.engine import lt_features
    why = lt_features.feature_gate("grouped_gemm")
    if why is not None:
        pytest.skip(f"cuBLASLt's grouped matmul: {why}")
    return _both_ways(tmp_path_factory, "ragged")


def test_a_ragged_dot_step_offered_where_cublaslts_grouped_matmul_takes_it_gives_the_same_bits(ragged_steps):
    (captured, got), (eager, want) = ragged_steps
    # the forward and the backward's two grouped GEMMs: 3 calls a step; the gradients of x and
    # w and the loss: 3 results
    _check_same_bits_and_no_allocation(captured, got, eager, want, calls=3, results=3)


@_NOT_REPLAYED
def test_a_ragged_dot_step_replays_from_xlas_command_buffers(ragged_steps):
    (captured, _), _ = ragged_steps
    assert captured["handler_runs"] <= 3, captured
