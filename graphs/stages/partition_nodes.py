"""What metis_partitions reads beside the graph: the node arrays DistDGL's parts carry (features,
labels, split masks; per node type for a typed graph), the training nodes its balance constraint
and reports count, and `write_distdgl`, the DistDGL export of either kind of graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.distdgl_format import write_distdgl_parts
from graphs.formats.distdgl_typed import write_typed_distdgl_parts
from graphs.formats.graph_schema import TypedSchema

__all__ = ["node_data", "train_mask", "typed_node_data", "write_distdgl"]


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


def typed_node_data(canonical: Path, typed: TypedSchema) -> dict[str, dict[str, np.ndarray]]:
    """Each node type's arrays for the heterogeneous DistDGL parts, indexed by the type's own ids:
    ``feat`` at the type's own width (none for a featureless type), and on the target type its
    label and split masks."""
    data = node_data(canonical, int(typed.offsets[-1]))
    out = {}
    for i, t in enumerate(typed.schema.node_types):
        o0, o1, width = int(typed.offsets[i]), int(typed.offsets[i + 1]), typed.feat_widths[i]
        arrays = {}
        if "feat" in data and width:
            feat = data["feat"][o0:o1]  # rows of the memory map: gathered part by part
            arrays["feat"] = feat if width == feat.shape[1] else np.ascontiguousarray(feat[:, :width])
        if t == typed.target:
            arrays.update({name: values[o0:o1] for name, values in data.items() if name != "feat"})
        if arrays:
            out[t] = arrays
    return out


def relation_csr(canonical: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """(indptr, dst, relation index, weight or None) of a typed graph's relation multigraph
    (typed_edges.parquet) as a CSR by source, each source's edges in the file's (dst, relation) order."""
    graph = CanonicalGraph.open(canonical)
    table = pq.read_table(graph.verified(graph.TYPED_EDGES))
    src = table.column("src").to_numpy().astype(np.int64)
    order = np.argsort(src, kind="stable")
    indptr = np.zeros(graph.num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=graph.num_nodes), out=indptr[1:])
    del src
    dst = table.column("dst").to_numpy().astype(np.int64)[order]
    etype = table.column("etype").to_numpy().astype(np.int64)[order]
    weight = None
    if "weight" in table.column_names:
        weight = table.column("weight").to_numpy().astype(np.float32)[order]
    return indptr, dst, etype, weight


def write_distdgl(canonical: Path, out: Path, indptr, indices, part: np.ndarray, k: int, graph_name: str) -> np.ndarray:
    """DGL's partition format of the canonical graph under `out` for the assignment `part`:
    heterogeneous (`graphs.formats.distdgl_typed`, the relations with their weights) for a typed
    graph, else homogeneous (`graphs.formats.distdgl_format`, over the CSR given); returns orig_nids."""
    typed = TypedSchema.read(canonical)
    if typed is None:
        return write_distdgl_parts(indptr, indices, part, k, out, graph_name, node_data(canonical, len(indptr) - 1))
    rel_indptr, dst, etype, weight = relation_csr(canonical)
    edge_data = {} if weight is None else {"weight": weight}
    return write_typed_distdgl_parts(
        rel_indptr, dst, etype, typed, part, k, out, graph_name, typed_node_data(canonical, typed), edge_data
    )
