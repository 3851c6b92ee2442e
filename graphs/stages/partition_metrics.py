"""Halos and quality metrics of a node partition: what `graphs.stages.partition` reports.

Every node belongs to exactly one part (its *core* nodes); the *halo* of part p is the set of
nodes outside p with an edge into p's core (the sources of p's in-edges, DGL's convention; for
a symmetrized graph, simply the 1-hop neighbours of p that live elsewhere). `csr_halos` and
`csr_metrics` compute them from the CSR in chunks (no whole src array); `core_and_halo` and
`partition_metrics` do the same from (src, dst) edge arrays. The metrics: edge-cut ratio, node
and edge balance (max part / mean part), halo replication factor, and, for a weighted graph,
the cut weight over the total weight. `partition_problems` says what breaks "every node in
exactly one part".
"""

from __future__ import annotations

import numpy as np

from graphs.kernels.coarsen import row_chunks

__all__ = [
    "core_and_halo",
    "csr_halos",
    "csr_metrics",
    "partition_metrics",
    "partition_problems",
    "train_balance",
    "type_balance",
]


def _csr_edges(indptr: np.ndarray, indices: np.ndarray, edges_per_chunk: int = 1 << 22):
    """(edge slice, src, dst) of the CSR in chunks, src rebuilt per chunk only."""
    for r0, r1 in row_chunks(indptr, edges_per_chunk):
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        if e1 == e0:
            continue
        src = np.repeat(np.arange(r0, r1, dtype=np.int64), np.diff(indptr[r0 : r1 + 1]))
        yield slice(e0, e1), src, indices[e0:e1]


def csr_halos(indptr: np.ndarray, indices: np.ndarray, part: np.ndarray, k: int, budget_bytes: int = 1 << 28):
    """Per part: ascending core node ids and ascending halo node ids (int64), from the CSR
    in chunks. The halo of part p: nodes outside p with an edge into p's core (the sources of
    its in-edges). Marks go into a bool [parts, n] table for as many parts at a time as fit
    in `budget_bytes`, one pass over the edges per group."""
    n = len(part)
    order = np.argsort(part, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(part, minlength=k))])
    cores = [order[bounds[p] : bounds[p + 1]].astype(np.int64) for p in range(k)]
    del order
    halos: list[np.ndarray] = []
    group = max(1, min(k, budget_bytes // max(n, 1)))
    for p0 in range(0, k, group):
        p1 = min(k, p0 + group)
        mark = np.zeros((p1 - p0, n), dtype=bool)
        for _, src, dst in _csr_edges(indptr, indices):
            ps, pd = part[src], part[dst]
            sel = (ps != pd) & (pd >= p0) & (pd < p1)
            mark[pd[sel] - p0, src[sel]] = True
        halos.extend(np.flatnonzero(row).astype(np.int64) for row in mark)
        del mark
    return cores, halos


def csr_metrics(
    indptr: np.ndarray,
    indices: np.ndarray,
    part: np.ndarray,
    k: int,
    halos: list[np.ndarray],
    weight: np.ndarray | None = None,
) -> dict:
    """`partition_metrics` over the CSR in chunks (no whole src array)."""
    n, m = len(part), len(indices)
    nodes = np.bincount(part, minlength=k)
    edges = np.zeros(k, dtype=np.int64)
    cut, cut_weight = 0, 0.0
    for sl, src, dst in _csr_edges(indptr, indices):
        pd = part[dst]
        edges += np.bincount(pd, minlength=k)
        is_cut = part[src] != pd
        cut += int(np.count_nonzero(is_cut))
        if weight is not None:
            cut_weight += float(weight[sl][is_cut].sum())
    return _metrics(n, m, k, nodes, edges, cut, halos, cut_weight, weight)


def train_balance(part: np.ndarray, k: int, train: np.ndarray) -> dict:
    """Training nodes per part and their imbalance (largest part over the mean; 1 = even):
    the seed share of each part's owner under ``placement: partition``. {} without training nodes."""
    if not train.any():
        return {}
    per_part = np.bincount(part[train], minlength=k)
    return {"train_nodes": per_part.tolist(), "train_imbalance": round(float(per_part.max() / per_part.mean()), 4)}


def type_balance(part: np.ndarray, k: int, node_types: np.ndarray, names: tuple[str, ...]) -> dict:
    """A typed graph's nodes of each type per part and their imbalance (largest part over the mean)."""
    per_type = {}
    for t, name in enumerate(names):
        per_part = np.bincount(part[node_types == t], minlength=k)
        per_part_mean = per_part.mean()
        per_type[name] = {
            "nodes": per_part.tolist(),
            "imbalance": round(float(per_part.max() / per_part_mean), 4) if per_part_mean else 1.0,
        }
    return {"node_types": per_type}


def core_and_halo(
    src: np.ndarray, dst: np.ndarray, part: np.ndarray, k: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per part: ascending core node ids and ascending halo node ids (int64)."""
    n = len(part)
    order = np.argsort(part, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(part, minlength=k))])
    cores = [order[bounds[p] : bounds[p + 1]].astype(np.int64) for p in range(k)]
    part_src, part_dst = part[src], part[dst]
    cut = part_src != part_dst
    keys = np.unique(part_dst[cut].astype(np.int64) * n + src[cut])  # (dst part, halo node)
    hb = np.searchsorted(keys, np.arange(k + 1, dtype=np.int64) * n)
    halos = [keys[hb[p] : hb[p + 1]] - p * n for p in range(k)]
    return cores, halos


def partition_metrics(
    src: np.ndarray,
    dst: np.ndarray,
    part: np.ndarray,
    k: int,
    halos: list[np.ndarray],
    weight: np.ndarray | None = None,
) -> dict:
    """Edge-cut ratio, node and edge balance (max part / mean part), halo replication factor;
    with `weight`, also the cut weight over the total weight (``weight_cut_ratio``).

    An edge belongs to the part of its destination (DGL's rule), so "edges per part" is the
    in-degree sum of its core nodes.
    """
    n, m = len(part), len(src)
    nodes = np.bincount(part, minlength=k)
    edges = np.bincount(part[dst], minlength=k)
    is_cut = part[src] != part[dst]
    cut = int(np.count_nonzero(is_cut))
    cut_weight = float(weight[is_cut].sum()) if weight is not None else None
    return _metrics(n, m, k, nodes, edges, cut, halos, cut_weight, weight)


def _metrics(n, m, k, nodes, edges, cut, halos, cut_weight, weight) -> dict:
    """The metrics dict of `partition_metrics` and `csr_metrics` (one owner of its keys)."""
    halo_sizes = np.array([len(h) for h in halos], dtype=np.int64)
    weighted = {}
    if weight is not None:
        total = float(weight.sum())
        weighted["weight_cut_ratio"] = cut_weight / total if total else 0.0
    return {
        **weighted,
        "edge_cut": cut,
        "edge_cut_ratio": cut / m if m else 0.0,
        "node_balance": float(nodes.max() / (n / k)) if n else 1.0,
        "edge_balance": float(edges.max() / (m / k)) if m else 1.0,
        "halo_replication": float(halo_sizes.sum() / n) if n else 0.0,
        "nodes_per_part": nodes.tolist(),
        "edges_per_part": edges.tolist(),
        "halo_per_part": halo_sizes.tolist(),
    }


def partition_problems(part: np.ndarray, k: int, cores: list[np.ndarray]) -> list[str]:
    """What breaks "every node in exactly one part"; empty when the partition is sound."""
    n = len(part)
    problems = []
    out_of_range = int(np.count_nonzero((part < 0) | (part >= k)))
    if out_of_range:
        problems.append(f"{out_of_range} part ids outside 0..{k - 1}")
    if len(cores) != k:
        problems.append(f"{len(cores)} core sets for {k} parts")
    sizes = sum(len(c) for c in cores)
    if sizes != n:
        problems.append(f"core sets hold {sizes} nodes in total, the graph has {n}")
    covered = np.zeros(n, dtype=np.int64)
    for p, core in enumerate(cores):
        inside = core[(core >= 0) & (core < n)]
        if len(inside) != len(core):
            problems.append(f"part {p}: {len(core) - len(inside)} core ids outside 0..{n - 1}")
        np.add.at(covered, inside, 1)
        wrong = int(np.count_nonzero(part[inside] != p))
        if wrong:
            problems.append(f"part {p}: {wrong} core nodes have another part_id")
    if (covered != 1).any():
        problems.append(
            f"{int(np.count_nonzero(covered == 0))} nodes in no core set, "
            f"{int(np.count_nonzero(covered > 1))} in more than one"
        )
    return problems
