"""A graph collection with a planted property, in the landing layout of `graphs.stages.collection`:
small random graphs (a random tree plus a few extra edges, like molecules) whose nodes carry an
integer ``atom_type`` in 0..types-1 and a short float ``feat``.

The planted property needs the structure, not only the node types: every graph has one node of
type 1 and one of type 2, and a graph is positive exactly when they are adjacent (so counting
types cannot tell). With ``label_kind="value"`` the label is instead the number of distinct
edges joining two nodes of type 0 (plus Gaussian noise of standard deviation 0.1). With
``label_kind="multi_label"`` it is a list of three binary labels, each missing (null) with
probability ``missing``: the planted property, "at least two type-0 pairs joined", and "more
nodes than the middle size".
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from graphs.stages.landing import EDGES_FILE, GRAPHS_FILE, NODES_FILE

__all__ = ["generate_collection"]


def _graph(rng: np.random.Generator, n: int, types: int, positive: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, atom_type) of one graph of `n` nodes: a random tree plus about n/4 extra edges;
    one node of type 1 and one of type 2, adjacent exactly when `positive`, the others of types
    0 and 3..types-1."""
    src = np.arange(1, n, dtype=np.int64)
    dst = (rng.random(n - 1) * src).astype(np.int64)  # each node joins an earlier one: a tree
    a, b = rng.integers(0, n, size=(2, max(1, n // 4)))
    keep = a != b
    src, dst = np.concatenate([src, a[keep]]), np.concatenate([dst, b[keep]])
    others = np.array([0] + list(range(3, types)), dtype=np.int64)
    atom = others[rng.integers(0, len(others), size=n)]
    e = int(rng.integers(0, len(src)))
    u = int(src[e])
    near = np.zeros(n, dtype=bool)
    near[dst[src == u]] = near[src[dst == u]] = True
    near[u] = True
    far = np.flatnonzero(~near)
    if positive or not far.size:  # a node adjacent to every other one: the graph is positive
        v = int(dst[e])
    else:
        v = int(rng.choice(far))
    atom[u], atom[v] = 1, 2
    return src, dst, atom


def generate_collection(
    out_dir: str | os.PathLike,
    graphs: int = 400,
    *,
    seed: int = 0,
    min_nodes: int = 6,
    max_nodes: int = 24,
    types: int = 5,
    feat_dim: int = 4,
    label_kind: str = "class",
    with_split: bool = True,
    missing: float = 0.2,
) -> dict:
    """Write graphs.parquet, nodes.parquet and edges.parquet of `graphs` graphs into `out_dir`
    (module docstring); graph ids are strings ``mol-<k>``, node ids integers local to their
    graph. Returns the counts and the mean label (the share of positive graphs for classes)."""
    if label_kind not in ("class", "value", "multi_label"):
        raise ValueError(f"label_kind={label_kind!r} is not 'class', 'value' or 'multi_label'")
    rng = np.random.default_rng(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sizes = rng.integers(min_nodes, max_nodes + 1, size=graphs)
    positive = rng.random(graphs) < 0.5
    rows = {"e": [], "n": []}
    labels = np.zeros(graphs, dtype=np.float64)
    tasks = np.zeros((graphs, 3), dtype=np.float64)
    for g in range(graphs):  # one small graph at a time; each graph's arrays are built vectorised
        src, dst, atom = _graph(rng, int(sizes[g]), types, bool(positive[g]))
        joins = ((atom[src] == 1) & (atom[dst] == 2)) | ((atom[src] == 2) & (atom[dst] == 1))
        zero_pairs = len(
            {
                (min(u, v), max(u, v))
                for u, v in zip(
                    src[(atom[src] == 0) & (atom[dst] == 0)].tolist(), dst[(atom[src] == 0) & (atom[dst] == 0)].tolist()
                )
            }
        )
        labels[g] = float(joins.any()) if label_kind != "value" else zero_pairs
        tasks[g] = (joins.any(), zero_pairs >= 2, sizes[g] > (min_nodes + max_nodes) / 2)
        rows["e"].append((np.full(len(src), g), src, dst))
        rows["n"].append((np.full(len(atom), g), np.arange(len(atom)), atom))
    ids = np.array([f"mol-{g}" for g in range(graphs)], dtype=object)
    eg, es, ed = (np.concatenate(c) for c in zip(*rows["e"]))
    ng, nn, na = (np.concatenate(c) for c in zip(*rows["n"]))
    feat = rng.normal(size=(len(na), feat_dim)).astype(np.float32)
    feat[:, 0] += na  # a feature that follows the type, as a real atom feature would
    pq.write_table(pa.table({"graph_id": ids[eg].tolist(), "src": es, "dst": ed}), out / EDGES_FILE)
    feat_col = pa.FixedSizeListArray.from_arrays(pa.array(feat.ravel()), feat_dim).cast(pa.list_(pa.float32()))
    pq.write_table(
        pa.table({"graph_id": ids[ng].tolist(), "node_id": nn, "atom_type": na, "feat": feat_col}),
        out / NODES_FILE,
    )
    table = {"graph_id": ids.tolist()}
    if label_kind == "class":
        table["label"] = labels.astype(np.int64)
    elif label_kind == "multi_label":
        given = np.where(rng.random(tasks.shape) < missing, None, tasks.astype(np.int64)).tolist()
        table["label"] = pa.array(given, type=pa.list_(pa.int64()))
    else:
        table["label"] = labels + rng.normal(scale=0.1, size=graphs)
    if with_split:
        u = rng.random(graphs)
        table["split"] = np.where(u < 0.7, "train", np.where(u < 0.85, "valid", "test")).tolist()
    pq.write_table(pa.table(table), out / GRAPHS_FILE)
    return {"graphs": graphs, "nodes": int(len(na)), "edges": int(len(es)), "label_mean": float(labels.mean())}
