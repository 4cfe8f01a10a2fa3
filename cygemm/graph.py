"""CUDA graphs of cygemm calls: :func:`capture` a stream's work into a :class:`Graph`, launch it
again and again (``cygemm/engine/graph.pyx``, beside the release queue it coordinates with)."""
from cygemm.engine.graph import Graph, capture

__all__ = ["capture", "Graph"]
