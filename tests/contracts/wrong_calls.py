"""Calls the stubs must refuse, one a line (tests/contracts/test_stubs.py counts mypy's errors). Not run."""
import cupy as cp  # type: ignore[import-untyped]

import cygemm
from cygemm import backend, nn

a = cp.ones((4, 4), cp.float32)
cygemm.gemm(a, a, math="fp16")  # WRONG
cygemm.matmul(a, a, determinism="sometimes")  # WRONG
cygemm.set_options(determinism="always")  # WRONG
cygemm.GemmPlan(a, a, a, batched="yes")  # WRONG
nn.MLP([4, 2], precision="fp4")  # WRONG
backend.CUDABackend(math=3)  # WRONG
