"""The one check every GPU entry of cygemm.nn makes first: without a usable GPU it raises
cygemm's own plain-words reason (:func:`cygemm.require_gpu`), before CuPy is asked for a stream
or memory and answers with a CUDA status of its own."""
from cygemm import require_gpu

__all__ = ["require_gpu"]
