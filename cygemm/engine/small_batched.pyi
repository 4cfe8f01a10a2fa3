# Batched GEMMs of small matrices: the route table's names and the fit/rule check (see small_batched.pyx).
from typing import Dict, Optional, Tuple

ROUTES: Dict[str, str]
TILES: Tuple[str, ...]

def kernel_launches() -> int: ...
def force_tile(tile: Optional[str] = None) -> None: ...
def kernel_fits(dtype: int, opa: int, opb: int, m: int, n: int, k: int, batch: int, lda: int = 0, ldb: int = 0,
                ldc: int = 0, broadcast_a: bool = False, broadcast_b: bool = False) -> Tuple[bool, bool]: ...
