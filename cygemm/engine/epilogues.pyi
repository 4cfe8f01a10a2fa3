from typing import Dict, List

ACTIVATIONS: Dict[str, int]

def parse_activation(act: str) -> int: ...
def activation_table() -> List[dict]: ...
EPILOGUES: tuple[dict, ...]
EPILOGUE_NAMES: Dict[int, str]
EPILOGUE_ACTS: str
