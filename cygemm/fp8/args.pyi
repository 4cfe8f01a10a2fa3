# Reading scaled_matmul's arguments has no Python API beyond these tables (see args.pxd).
from typing import Dict

OUT_DTYPES: Dict[str, int]
DEFAULT_OUT: str
SCALE_MODES: Dict[str, int]
