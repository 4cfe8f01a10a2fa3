"""Row-major GEMMs, by operand swap onto column-major cuBLAS: :func:`gemm`,
:func:`gemm_strided_batched` and :func:`int_mm` (``gemm.pyx``), :class:`GemmPlan`, a GEMM planned
once and run many times (``plan.pyx``), and :func:`matmul`, NumPy's matmul on device arrays
(``matmul.pyx``); ``describe_*`` say what each would run, without a GPU. All are cygemm's own
calls (``cygemm.gemm`` is ``cygemm.rowmajor.gemm``)."""
from cygemm.rowmajor.gemm import describe_gemm, gemm, gemm_strided_batched, int_mm
from cygemm.rowmajor.plan import GemmPlan
from cygemm.rowmajor.matmul import describe_matmul, matmul
from cygemm.rowmajor import promise_checks as _promise_checks  # noqa: F401 (registers them)

__all__ = ["describe_gemm", "gemm", "gemm_strided_batched", "int_mm", "GemmPlan", "describe_matmul", "matmul"]
