"""The one check every GPU entry of cygemm.nn and cygemm.backend makes first: without a usable
GPU it raises cygemm's own plain-words reason (:func:`cygemm.gpu_unavailable_reason`), before
CuPy is asked for a stream or memory and answers with a CUDA status of its own. The check and
its message are the core's (``cygemm.engine.context.require_gpu``): one message path for every module."""
from cygemm.engine.context import require_gpu

__all__ = ["require_gpu"]
