from typing import Tuple
from cygemm.typing import DeviceArray


class ArrayLayout:
    dtype: str
    shape: Tuple[int, ...]

class Addresses: ...

def is_pair(x: object) -> bool: ...


def describe_array(x: DeviceArray, name: str = "x") -> dict: ...
def is_torch_tensor(x: object) -> bool: ...
