# The GEMM reader has no Python API beyond the error a conjugate layout raises (see operands.pxd).
class ConjugateLayoutError(ValueError):
    operand: str
    def __init__(self, message: str, operand: str) -> None: ...
