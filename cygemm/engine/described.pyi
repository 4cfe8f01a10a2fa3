from typing import Tuple

class ArrayLayout:
    dtype: str
    shape: Tuple[int, ...]

class Addresses: ...

def is_pair(x: object) -> bool: ...
