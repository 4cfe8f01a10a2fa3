from contextlib import AbstractContextManager
from typing import Any, Dict, Optional, Tuple

GROUPED_MIN_CUBLASLT: int
KTAIL_FIXED_CUBLASLT: int
GROUPED_MAJORS: Tuple[int, ...]
FEATURES: Tuple[str, ...]

def major(device: int = 0) -> int: ...
def feature_gate(name: str, device: int = 0) -> Optional[str]: ...
VERIFIED_CUBLASLT: tuple[int, ...]
def features(device: int = 0) -> Dict[str, Dict[str, Any]]: ...
def _pretend(version: Optional[int] = None, *, grouped: Optional[bool] = None,
             stream_heuristic: Optional[bool] = None, batch_invariance: Optional[bool] = None,
             major: Optional[int] = None) -> AbstractContextManager[None]: ...
