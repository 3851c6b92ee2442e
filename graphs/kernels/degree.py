"""The highest-degree nodes: what hybrid partitioning replicates on every rank and the feature
cache's hot tier and ``degree`` policy hold (neighbour sampling reads a node in proportion to its
degree)."""

from __future__ import annotations

import numpy as np

__all__ = ["top_degree_nodes"]


def top_degree_nodes(degree: np.ndarray, count: int) -> np.ndarray:
    """Ascending ids of the `count` nodes of highest degree (ties: lower id first)."""
    count = max(0, min(int(count), len(degree)))
    if count == 0:
        return np.empty(0, dtype=np.int64)
    order = np.argsort(-np.asarray(degree, dtype=np.int64), kind="stable")[:count]
    return np.sort(order).astype(np.int64)
