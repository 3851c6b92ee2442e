"""The canonical_graph folder as a typed artifact: its file names, format version and summary.

The format itself (dtypes, order, what each file holds) is documented where it is written,
`graphs.stages.canonical`; this module is the one place its file names live, shared by that writer
and by every reader (the later stages, training, the assets and the benchmarks). The edge
split's message-passing graph (`graphs.stages.edge_split`) is written in this layout too, so it opens
as a `CanonicalGraph` as well.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from graphs.formats.graph_schema import TYPES_FILE
from graphs.formats.label_classes import LABEL_CLASSES
from graphs.formats.stage_artifact import StageArtifact

__all__ = ["CanonicalGraph", "edge_batches", "read_summary"]


class CanonicalGraph(StageArtifact):
    """A canonical graph's folder (`graphs.stages.canonical` documents the files)."""

    STAGE = "canonical_graph"
    FORMAT_VERSION = 1
    EDGES = "edges.parquet"
    NODES = "nodes.parquet"
    FEATURES = "features.npy"
    LABEL_CLASSES = LABEL_CLASSES
    GRAPHS = "graphs.parquet"  # graph collections only (graphs.formats.graph_table)
    CATEGORIES = "categories.npy"  # graph collections with categorical node columns only
    TYPES = TYPES_FILE  # typed graphs only (graphs.formats.graph_schema.TypedSchema)
    TYPED_EDGES = "typed_edges.parquet"  # typed graphs only: every relation's edges
    DEGREE_PLOT = "degree_distribution.png"

    @property
    def num_nodes(self) -> int:
        return int(self.summary["nodes"])

    @property
    def num_edges(self) -> int:
        return int(self.summary["edges"])

    @property
    def symmetrized(self) -> bool:
        return bool(self.summary.get("symmetrized", True))

    @property
    def weighted(self) -> bool:
        return bool(self.summary.get("weighted", False))

    @property
    def edges_path(self) -> Path:
        return self.path(self.EDGES)

    @property
    def nodes_path(self) -> Path:
        return self.path(self.NODES)

    @property
    def features_path(self) -> Path:
        return self.path(self.FEATURES)

    @property
    def typed(self) -> bool:
        """Whether the graph has node types and relations (types.json, `graphs.stages.typed_graph`)."""
        return self.has(self.TYPES)

    @property
    def has_features(self) -> bool:
        return self.has(self.FEATURES)


def read_summary(canonical_dir: str | os.PathLike) -> dict:
    """The summary.json written next to a canonical graph (`CanonicalGraph.open`: refused when
    missing or of another format version)."""
    return CanonicalGraph.open(canonical_dir).summary


def edge_batches(canonical_dir: str | os.PathLike, batch_rows: int = 1 << 22, *, with_weight: bool = False):
    """Stream a canonical graph's edges.parquet: (src, dst) int64 arrays of up to `batch_rows`
    edges, in the file's (src, dst) order; memory is one batch whatever the edge count.
    With `with_weight`, (src, dst, weight float64) of a weighted graph. The file is first
    checked against the folder's hashes.json (`graphs.infra.storage.verified`)."""
    graph = CanonicalGraph.open(canonical_dir)
    path = graph.verified(graph.EDGES)
    columns = ["src", "dst", "weight"] if with_weight else ["src", "dst"]
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows, columns=columns):
        ids = (
            np.asarray(batch.column(0).to_numpy(), dtype=np.int64),
            np.asarray(batch.column(1).to_numpy(), dtype=np.int64),
        )
        yield (*ids, np.asarray(batch.column(2).to_numpy(), dtype=np.float64)) if with_weight else ids
