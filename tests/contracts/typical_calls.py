"""Typical calls of cygemm, checked by mypy against the stubs (tests/contracts/test_stubs.py):
every line here must type-check. Not run."""
import cupy as cp  # type: ignore[import-untyped]
import numpy as np

import cygemm
from cygemm import backend, dense, fp8, grouped, nn

a = cp.ones((64, 64), cp.float32)
b = cp.ones((64, 64), cp.float32)
out = cp.empty((64, 64), cp.float32)

cygemm.gemm(a, b, out, trans_a=True, alpha=2.0, beta=0.5, math="fp32", stream=None, autotune="off")
cygemm.gemm(a, b, math="cupy", determinism="run_to_run")
cygemm.gemm_strided_batched(a[None], b[None], determinism="batch_invariant")
c = cygemm.matmul(a, b, math="cupy", determinism="run_to_run", autotune="exhaustive")
cygemm.int_mm(a, b, determinism="off")
cygemm.describe_gemm(((64, 64), "float32"), ((64, 64), "float32"))
cygemm.describe_matmul(np.ones((2, 3)), np.ones((3, 4)))
cygemm.set_options(determinism="batch_invariant", autotune="auto", tuning_cache=None)
options = cygemm.get_options()
with cygemm.GemmPlan(a, b, out, bias=None, act="relu", math="tf32", determinism="run_to_run") as plan:
    plan.autotune("exhaustive")
    plan.execute(stream=cp.cuda.Stream())
dense.forward_into(a, b, out, None, act="gelu", save_z=False, determinism="off")
grouped.grouped_gemm([a], [b], [out], determinism="run_to_run", autotune="off")
grouped.moe_gemm(a, b[None], [0, 64], out, determinism="batch_invariant")
scale = fp8.empty_scale("rowwise", 64, 64, stream=None)
model = nn.MLP([64, 128, 10], act="relu", precision="bf16-mixed", seed=0)
be = backend.CUDABackend(dtype="float32", math="fp32")


class Buffer:
    """A typed device array of a user's own library: results of calls that make one are of the
    first operand's type, so its attributes type-check."""

    shape: "tuple[int, ...]" = (64, 64)

    @property
    def __cuda_array_interface__(self) -> "dict[str, object]":
        return {}

    def sum(self) -> float:
        return 0.0


buf = Buffer()
shape: "tuple[int, ...]" = cygemm.matmul(buf, buf).shape
total: float = cygemm.gemm(buf, buf).sum() + cygemm.int_mm(buf, buf).sum()
batched_shape: "tuple[int, ...]" = cygemm.gemm_strided_batched(buf, buf).shape
scaled_shape: "tuple[int, ...]" = fp8.scaled_matmul(buf, buf, buf, buf).shape
given: Buffer = fp8.scaled_matmul(buf, buf, buf, buf, out=buf)
grouped.moe_gemm(a, b[None], np.array([0, 32, 64]), out)
includes: "list[str]" = cygemm.get_include()
why: "str | None" = cygemm.gpu_unavailable_reason()
