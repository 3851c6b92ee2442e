"""Node features and labels for training: preprocessing, degree features, the full matrix.

Where features come from: the shards' manifest names them (``features``: the canonical
``features.npy`` in FP32, or compressed_graph's codes and scales, see `graphs.formats.shard_format`). Training gathers the rows of each minibatch from there
(`training.data.ShardStream`, in its prefetch thread) and applies the configured
preprocessing to the gathered rows on the device (:class:`FeatureTransform`), so nothing
n x D is materialized on the ranks for training. Rank 0 builds the full matrix once for
the full-graph inference (:func:`full_features`).

Preprocessing (``training.feature_norm``):

- ``row``: every row divided by its L1 norm (all-zero rows stay zero); for the 0/1
  bag-of-words features of Cora/CiteSeer this is the row normalization of the Planetoid
  papers. Row-local, so it is applied per minibatch with the same result.
- ``standard``: per column ``(x - mean) / std`` with the mean and std over all nodes
  (computed in chunks from the feature file; std clamped at 1e-6).
- ``none``.

A dataset without features gets one-hot buckets ``floor(log2(degree))`` of the degree in
the normalized adjacency (self loop included), capped at ``degree_buckets - 1``
(:func:`degree_features`): structure-only input that separates hubs from leaves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.graph_schema import TypedSchema
from graphs.formats.shard_references import open_features

__all__ = [
    "FeatureTransform",
    "NodeTable",
    "degree_features",
    "feature_chunks",
    "full_features",
    "read_node_table",
]

SPLITS = ("train", "val", "test")


@dataclass
class NodeTable:
    """Per-node labels, split masks and the user's original ids (from canonical_graph)."""

    labels: torch.Tensor  # int64 [n], -1 = unknown
    masks: dict[str, torch.Tensor]  # split name -> bool [n] (known labels only)
    original_id: "object"  # pyarrow Array [n], int64 or string
    predicted: np.ndarray | None = (
        None  # int64: the nodes predictions are written for (a typed graph's target type), None = all
    )

    @property
    def n(self) -> int:
        return self.labels.numel()


def read_node_table(canonical_dir: str | os.PathLike) -> NodeTable:
    """Labels, train/val/test masks and original ids of ``canonical_dir/nodes.parquet``."""
    path = CanonicalGraph.open(canonical_dir).nodes_path
    try:
        table = pq.read_table(path, columns=["node_id", "original_id", "label", "split"])
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing; materialize canonical_graph first") from None
    node_id = table.column("node_id").to_numpy()
    if (node_id != np.arange(len(node_id))).any():
        raise ValueError(f"{path}: column 'node_id' is not 0..n-1 in order; re-materialize canonical_graph")
    labels = torch.from_numpy(table.column("label").to_numpy().astype(np.int64))
    split = table.column("split")  # compared in Arrow: no Python string per node
    masks = {
        s: torch.from_numpy(pc.equal(split, s).fill_null(False).to_numpy(zero_copy_only=False)) & (labels >= 0)
        for s in SPLITS
    }
    typed = TypedSchema.read(path.parent)
    predicted = None
    if typed is not None:
        target = typed.schema.node_types.index(typed.target) if typed.target is not None else 0
        predicted = np.arange(typed.offsets[target], typed.offsets[target + 1], dtype=np.int64)
    return NodeTable(
        labels=labels, masks=masks, original_id=table.column("original_id").combine_chunks(), predicted=predicted
    )


def degree_features(indptr: np.ndarray, buckets: int) -> torch.Tensor:
    """float32 [n, buckets]: one-hot ``min(floor(log2(max(deg, 1))), buckets - 1)``."""
    deg = np.diff(np.asarray(indptr)).astype(np.float64)
    bucket = np.minimum(np.floor(np.log2(np.maximum(deg, 1.0))), buckets - 1).astype(np.int64)
    out = torch.zeros(len(bucket), buckets)
    out[torch.arange(len(bucket)), torch.from_numpy(bucket)] = 1.0
    return out


def feature_chunks(manifest: dict, shards_dir: str | os.PathLike, rows: int = 1 << 16) -> Iterator[torch.Tensor]:
    """The manifest's features as float32 row chunks (decoded, transform undone); nothing when absent."""
    feats = open_features(manifest, shards_dir)
    if feats is None:
        return
    for a in range(0, feats.num_rows, rows):
        block = feats.decode_gathered(feats.codes[a : a + rows], np.arange(a, min(a + rows, feats.num_rows)))
        yield torch.from_numpy(np.array(block, dtype=np.float32))


def full_features(manifest: dict, shards_dir: str | os.PathLike) -> torch.Tensor | None:
    """The whole float32 [n, D] feature matrix the shards' manifest names, or None."""
    chunks = list(feature_chunks(manifest, shards_dir))
    if not chunks:
        return None
    return torch.cat(chunks)


class FeatureTransform:
    """``training.feature_norm`` as a function of gathered feature rows (see module docstring)."""

    def __init__(self, kind: str, mean: torch.Tensor | None = None, std: torch.Tensor | None = None):
        if kind not in ("row", "standard", "none"):
            raise ValueError(f"training.feature_norm={kind!r}: must be row, standard or none")
        if kind == "standard" and (mean is None or std is None):
            raise ValueError("standard normalization needs the column mean and std")
        self.kind, self.mean, self.std = kind, mean, std

    @classmethod
    def fit(cls, kind: str, chunks: Iterator[torch.Tensor]) -> "FeatureTransform":
        """The transform; for ``standard`` the column statistics of all rows in ``chunks``."""
        if kind != "standard":
            return cls(kind)
        total = total_sq = None
        count = 0
        for c in chunks:
            c = c.double()
            s, sq = c.sum(0), (c * c).sum(0)
            total = s if total is None else total + s
            total_sq = sq if total_sq is None else total_sq + sq
            count += c.shape[0]
        if count == 0:
            return cls("none")
        mean = total / count
        var = (total_sq / count - mean * mean).clamp(min=0)
        return cls(kind, mean.float(), var.sqrt().float().clamp(min=1e-6))

    def __call__(self, x: torch.Tensor | None) -> torch.Tensor | None:
        if x is None or self.kind == "none":
            return x
        if self.kind == "row":
            return x / x.abs().sum(1, keepdim=True).clamp(min=1e-12)
        if self.mean.device != x.device:
            self.mean, self.std = self.mean.to(x.device), self.std.to(x.device)
        return (x - self.mean) / self.std
