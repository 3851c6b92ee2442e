"""The node arrays metis_partitions reads beside the graph: what DistDGL's parts carry (features,
labels, split masks) and the training nodes its balance constraint and reports count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph

__all__ = ["node_data", "train_mask"]


def node_data(canonical: Path, n: int) -> dict[str, np.ndarray]:
    """Node arrays for the DistDGL parts: feat (memory-mapped), label, train/val/test masks
    (when present)."""
    data, graph = {}, CanonicalGraph.open(canonical)
    if graph.has_features:
        data["feat"] = np.load(graph.verified(graph.FEATURES), mmap_mode="r", allow_pickle=False)
    nodes = pq.read_table(graph.verified(graph.NODES), columns=["label", "split"])
    label = nodes.column("label").to_numpy().astype(np.int64)
    if (label >= 0).any():
        data["label"] = label
        split = nodes.column("split")  # compared in Arrow: no Python string per node
        for name in ("train", "val", "test"):
            data[f"{name}_mask"] = pc.fill_null(pc.equal(split, name), False).to_numpy(zero_copy_only=False)
    for name, values in data.items():
        if len(values) != n:
            raise ValueError(
                f"{canonical}: {name} has {len(values)} rows for {n} nodes; re-materialize canonical_graph"
            )
    return data


def train_mask(canonical: Path, n: int) -> np.ndarray:
    """bool per node: a training node (split 'train' with a label >= 0)."""
    graph = CanonicalGraph.open(canonical)
    nodes = pq.read_table(graph.verified(graph.NODES), columns=["label", "split"])
    labelled = nodes.column("label").to_numpy() >= 0
    train = pc.fill_null(pc.equal(nodes.column("split"), "train"), False).to_numpy(zero_copy_only=False)
    if len(train) != n:
        raise ValueError(
            f"{canonical}: nodes.parquet has {len(train)} rows for {n} nodes; re-materialize canonical_graph"
        )
    return train & labelled
