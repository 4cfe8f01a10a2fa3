# The route chooser: features cimport it (see routes.pxd); no Python API but the table's type.
from typing import Tuple

class RouteTable:
    kind: str
    names: Tuple[str, ...]
