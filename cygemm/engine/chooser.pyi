# The one chooser: plans and routes cimport it (see chooser.pxd); walk shows its order.
from typing import Tuple

def walk(answers: dict[str, list[object]], read_table: bool, may_time: bool, capturing: bool = ...,
         key: tuple[object, ...] = ..., device: int = ...) -> tuple[str, list[str]]: ...


# The route chooser: features cimport it (see chooser.pxd); no Python API but the table's type.

class RouteTable:
    kind: str
    names: Tuple[str, ...]
