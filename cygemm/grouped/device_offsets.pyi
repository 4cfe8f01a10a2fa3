from typing import Dict

DEVICE_OFFSET_ROUTES: Dict[str, str]
