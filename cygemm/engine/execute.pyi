# The one execute: the engine and the features cimport it (see execute.pxd); refuse_next is the
# tests' way to reach its refusal policies.

def refuse_next(count: int = ...) -> int: ...


# The int8 GEMM has no Python API of its own: cygemm.int_mm and cygemm.gemm reach it (see execute.pxd).
