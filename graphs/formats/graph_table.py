"""The graph table of a graph collection's canonical graph: which nodes form each graph, its label
and split (`GraphTable`), read from the canonical folder's ``graphs.parquet`` (`read_graph_table`).

A graph collection (many small graphs, e.g. molecules; `graphs.stages.collection` ingests it) is
stored as one canonical graph, the disjoint union of its graphs: graph ``g``'s nodes are the
contiguous ids ``first_node[g] .. first_node[g] + num_nodes[g] - 1`` and no edge joins two graphs,
so every stage that works on one graph (Â, METIS, INT8 features) works on a collection unchanged,
and Â normalizes each graph by its own degrees. Graphs are numbered in the order of the user's
graph ids. ``graphs.parquet`` columns:

    graph_id     the user's id, as given (any id type)
    first_node   int64, the graph's first node id in the union
    num_nodes    int64, its nodes (at least one)
    split        string, train / val / test / other
    label        by the summary's ``collection.label_kind``: "class", the int64 class index
                 (-1 = missing); "value", float64 (NaN = missing); "multi_label", a fixed-size
                 list of ``num_tasks`` float64 0.0 / 1.0 (NaN = missing); absent without labels
                 ("none")
    label_value  "class" only: the user's label as given (class index c stands for the value
                 of the rows whose label is c; classes are the sorted distinct values)

``categories.npy`` (int64 [n, K], only with categorical node columns) holds each node's code
0..cardinality-1 in each of the K categorical columns the summary's ``collection.categorical``
names with its cardinality, in that order. NumPy and pyarrow only: training reads this too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph

__all__ = ["LABEL_KINDS", "SPLITS", "GraphTable", "is_collection", "read_categories", "read_graph_table"]

LABEL_KINDS = ("class", "value", "multi_label", "none")
SPLITS = ("train", "val", "test", "other")


@dataclass(frozen=True)
class GraphTable:
    """The graphs of a collection (module docstring), arrays over the graph index 0..G-1."""

    graph_id: list  # the user's ids, as given
    first_node: np.ndarray  # int64 [G]
    num_nodes: np.ndarray  # int64 [G]
    split: np.ndarray  # int8 [G], the index in SPLITS
    label_kind: str  # one of LABEL_KINDS
    labels: np.ndarray | None  # int64 [G] (-1 missing), float64 [G] or [G, tasks] (NaN missing); None without
    num_classes: int  # classes of a "class" label, 2 for "multi_label", else 0
    categorical: dict[str, int]  # categorical node column -> cardinality, in the order of categories.npy
    num_tasks: int = 1  # labels per graph ("multi_label": one binary label per task)
    classes: list | None = None  # "class": the user's value of each class index

    @property
    def num_graphs(self) -> int:
        return len(self.first_node)

    def of_split(self, name: str) -> np.ndarray:
        """int64 indices of the graphs in split `name` that have a label (all of them without labels)."""
        keep = self.split == SPLITS.index(name)
        if self.labels is not None:
            keep &= self.has_label
        return np.flatnonzero(keep).astype(np.int64)

    @property
    def has_label(self) -> np.ndarray:
        """bool [G]: whether each graph's label is present."""
        if self.labels is None:
            return np.zeros(self.num_graphs, dtype=bool)
        if self.label_kind == "multi_label":
            return ~np.isnan(self.labels).all(axis=1)
        return ~np.isnan(self.labels) if self.label_kind == "value" else self.labels >= 0

    def node_ranges(self, graphs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(node ids of `graphs`, concatenated in that order; int64 [len(graphs) + 1] offsets of
        each graph's nodes in them)."""
        graphs = np.asarray(graphs, dtype=np.int64)
        counts = self.num_nodes[graphs]
        ptr = np.zeros(len(graphs) + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        shift = np.repeat(self.first_node[graphs] - ptr[:-1], counts)
        return shift + np.arange(int(ptr[-1]), dtype=np.int64), ptr

    def induced(self, indptr: np.ndarray, indices: np.ndarray, graphs: np.ndarray):
        """The subgraph of a CSR over the union (e.g. Â) induced by whole `graphs`: (its int64
        indptr and indices over positions 0..m-1 of their nodes, the CSR entry of each of its
        edges, the graphs' node offsets as in `node_ranges`). No edge leaves a graph, so each
        entry's column is shifted by its row's graph's offset."""
        nodes, ptr = self.node_ranges(graphs)
        counts = (np.asarray(indptr[nodes + 1]) - np.asarray(indptr[nodes])).astype(np.int64)
        sub = np.zeros(len(nodes) + 1, dtype=np.int64)
        np.cumsum(counts, out=sub[1:])
        entry = np.repeat(np.asarray(indptr[nodes], dtype=np.int64) - sub[:-1], counts) + np.arange(sub[-1])
        shift = np.repeat(ptr[:-1] - self.first_node[np.asarray(graphs, dtype=np.int64)], self.num_nodes[graphs])
        local = np.asarray(indices[entry], dtype=np.int64) + np.repeat(shift, counts)
        return sub, local, entry, ptr


def is_collection(canonical_dir: str | os.PathLike) -> bool:
    """Whether a canonical graph folder is a graph collection's (its summary says so)."""
    return "collection" in CanonicalGraph.open(canonical_dir).summary


def read_graph_table(canonical_dir: str | os.PathLike, *, verify: bool = True) -> GraphTable:
    """The graph table of a collection's canonical folder (ValueError naming the folder when it
    is not a collection's); with `verify`, its file is checked against the folder's hashes.json."""
    graph = CanonicalGraph.open(canonical_dir, verify=verify)
    facts = graph.summary.get("collection")
    if not isinstance(facts, dict):
        raise ValueError(f"{Path(canonical_dir)}: not a graph collection's canonical graph (no graphs.parquet)")
    path = graph.verified(graph.GRAPHS) if verify else graph.path(graph.GRAPHS)
    t = pq.read_table(path)
    kind = facts["label_kind"]
    labels, classes, tasks = None, None, int(facts.get("num_tasks", 1))
    if kind == "class":
        labels = t.column("label").to_numpy().astype(np.int64)
        classes = _class_values(t, labels, int(facts.get("num_classes", 0)))
    elif kind == "value":
        labels = t.column("label").to_numpy(zero_copy_only=False).astype(np.float64)
    elif kind == "multi_label":
        flat = t.column("label").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        labels = flat.astype(np.float64).reshape(len(t), tasks)
    split_names = t.column("split").to_numpy(zero_copy_only=False).astype(str)
    split = np.full(len(split_names), SPLITS.index("other"), dtype=np.int8)
    for code, name in enumerate(SPLITS):
        split[split_names == name] = code
    return GraphTable(
        graph_id=t.column("graph_id").to_pylist(),
        first_node=t.column("first_node").to_numpy().astype(np.int64),
        num_nodes=t.column("num_nodes").to_numpy().astype(np.int64),
        split=split,
        label_kind=kind,
        labels=labels,
        num_classes=int(facts.get("num_classes", 0)),
        categorical={str(k): int(v) for k, v in facts.get("categorical", {}).items()},
        num_tasks=tasks,
        classes=classes,
    )


def _class_values(t, labels: np.ndarray, num_classes: int) -> list | None:
    """The user's value of each class index (from ``label_value``), None where the folder has none."""
    if "label_value" not in t.column_names:
        return None
    first = np.full(num_classes, -1, dtype=np.int64)
    rows = np.flatnonzero(labels >= 0)
    first[labels[rows][::-1]] = rows[::-1]  # any row of each class; the first one
    values = t.column("label_value").take(pa.array(np.maximum(first, 0))).to_pylist()
    return [v if f >= 0 else None for v, f in zip(values, first)]


def read_categories(canonical_dir: str | os.PathLike, *, verify: bool = True) -> np.ndarray | None:
    """int64 [n, K] categorical codes of a collection's nodes, None without categorical columns."""
    graph = CanonicalGraph.open(canonical_dir, verify=verify)
    if not graph.has(graph.CATEGORIES):
        return None
    path = graph.verified(graph.CATEGORIES) if verify else graph.path(graph.CATEGORIES)
    return np.load(path, allow_pickle=False)
