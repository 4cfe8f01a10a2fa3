"""The one check every GPU entry of cygemm.nn and cygemm.backend makes first: without a usable
GPU it raises cygemm's own plain-words reason (:func:`cygemm.gpu_unavailable_reason`), before
CuPy is asked for a stream or memory and answers with a CUDA status of its own."""
from cygemm import _context
from cygemm._errors import CygemmError


def require_gpu():
    """Raise CygemmError whose message is :func:`cygemm.gpu_unavailable_reason`, and nothing
    else, where no GPU is usable; return at once where one is (the device count is cached)."""
    if _context.device_count() == 0:
        raise CygemmError(_context.gpu_unavailable_reason())
