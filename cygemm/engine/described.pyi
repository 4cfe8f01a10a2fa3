from typing import Tuple

class ArrayLayout:
    dtype: str
    shape: Tuple[int, ...]

class Addresses: ...
