"""DGL's distributed partition format (what `dgl.distributed.load_partition` and DistDGL's
`DistGraph` read, dgl 2.1), written part by part from our assignment and the CSR, so no
whole-graph DGL object (or DGL's `partition_graph`, which holds several) is ever built.

What DGL's `partition_graph(g, name, k, out, num_hops=1, return_mapping=True)` writes for a
homogeneous graph, and what `write_distdgl_parts` writes the same way:

- **Node ids are reshuffled** so each part's nodes are one contiguous range: new id = position
  in ``torch.sort(part)`` (``orig_nids``, new -> canonical id; DGL's own call, so identical);
  ``node_map["_N"][p] = [start_p, end_p)``.
- **Edge ids are reshuffled** so the edges of part p (those whose destination lies in p) are
  one contiguous range ``edge_map["_N:_E:_N"][p]``, of the same sizes as DGL's. Within a
  part, ours are ordered by (new destination id, position in the canonical edge order); DGL's
  order within a part comes from its C++ edge reassignment and follows neither key (it is
  not documented and not needed by any reader: `load_partition` checks only that each part's
  inner edges are one contiguous range).
- ``part{p}/graph.dgl``: the part's graph in COO: its core ("inner") nodes first, in new-id
  order, then its halo nodes (nodes of other parts with an edge to or from a core node; ours
  ascending by new id, DGL's in its C++ traversal order); edges: every edge into a core node
  (``inner_edge`` = 1), in edge-id order, then every edge from a core node to a halo node
  (``inner_edge`` = 0), in edge-id order (as DGL's). Node data ``_ID`` (new global id, int64),
  ``inner_node`` (uint8), ``part_id`` (int64); edge data ``_ID`` (new global edge id, int64),
  ``inner_edge`` (uint8). With k = 1 DGL does not reshuffle: one part holding the whole
  graph in the canonical edge order, without ``part_id``; so does this writer.
- ``part{p}/node_feat.dgl``: ``"_N/<name>"`` -> the core nodes' rows of each node array
  (features, labels, split masks), ``part{p}/edge_feat.dgl``: empty; written with DGL's
  `save_tensors`.
- ``<graph_name>.json``: graph_name, num_nodes, num_edges, part_method, num_parts,
  halo_hops (1), node_map, edge_map, ntypes, etypes, and ``part-{p}`` paths (DGL's keys and order).

`tests/test_distdgl_format.py` compares every file with DGL's `partition_graph` given the same
assignment: the JSON, orig_nids, node data and features equal; each part's halo node set,
edge set (as global (src, dst) pairs) and inner-edge flags equal; edge ids within a part equal
up to DGL's internal order.

Memory: the CSR (already held by the stage), one int64 edge id per edge, and one part's edges
at a time; the node arrays may be memory-mapped (only the core rows of one part are read).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from graphs.coarsen import row_chunks

NTYPE_NAME = "_N"
ETYPE_NAME = "_N:_E:_N"  # DGL's canonical edge type of a homogeneous graph, as a string


def reshuffled_node_ids(part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(orig_nids, new_of_old): new id -> canonical id, and its inverse. The order of DGL's
    reshuffle: ``torch.sort`` of the int64 part ids (grouped by part; within a part the order of
    torch's unstable sort, deterministic for the same input), the call DGL 2.1 makes."""
    import torch

    orig_nids = torch.sort(torch.from_numpy(np.asarray(part, dtype=np.int64)))[1].numpy()
    new_of_old = np.empty_like(orig_nids)
    new_of_old[orig_nids] = np.arange(len(orig_nids), dtype=np.int64)
    return orig_nids, new_of_old


def _chunk_edges(indptr: np.ndarray, indices: np.ndarray):
    """(first edge position, src, dst) of the CSR in row chunks; src and dst int64."""
    for r0, r1 in row_chunks(indptr):
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        if e0 == e1:
            continue
        src = np.repeat(np.arange(r0, r1, dtype=np.int64), np.diff(np.asarray(indptr[r0 : r1 + 1], dtype=np.int64)))
        yield e0, src, np.asarray(indices[e0:e1], dtype=np.int64)


def reshuffled_edge_ids(indptr: np.ndarray, indices: np.ndarray, new_of_old: np.ndarray) -> np.ndarray:
    """int64 new edge id of every CSR edge: edges grouped by new destination id, in CSR order
    within one destination (a stable counting sort, chunk by chunk)."""
    n = len(new_of_old)
    counts = np.zeros(n, dtype=np.int64)
    for _, _, dst in _chunk_edges(indptr, indices):
        counts += np.bincount(new_of_old[dst], minlength=n)
    cursor = np.zeros(n, dtype=np.int64)
    np.cumsum(counts[:-1], out=cursor[1:])
    del counts
    eid = np.empty(int(indptr[-1]), dtype=np.int64)
    for e0, _, dst in _chunk_edges(indptr, indices):
        nd = new_of_old[dst]
        order = np.argsort(nd, kind="stable")
        nd = nd[order]
        starts = np.flatnonzero(np.r_[True, nd[1:] != nd[:-1]])
        sizes = np.diff(np.r_[starts, len(nd)])
        rank = np.arange(len(nd), dtype=np.int64) - np.repeat(starts, sizes)
        eid[e0 + order] = cursor[nd] + rank
        cursor[nd[starts]] += sizes
    return eid


def _part_edges(indptr, indices, part, p, new_of_old, eid):
    """(new src, new dst, new eid) of the edges into part p, then of those out of p, each by eid."""
    inner, outer = [], []
    for e0, src, dst in _chunk_edges(indptr, indices):
        pd = part[dst]
        into = pd == p
        out = (part[src] == p) & ~into
        ids = eid[e0 : e0 + len(src)]
        inner.append((new_of_old[src[into]], new_of_old[dst[into]], ids[into]))
        outer.append((new_of_old[src[out]], new_of_old[dst[out]], ids[out]))

    def ordered(pieces):
        s, d, e = (np.concatenate([x[i] for x in pieces]) if pieces else np.empty(0, np.int64) for i in range(3))
        order = np.argsort(e, kind="stable")
        return s[order], d[order], e[order]

    return ordered(inner), ordered(outer)


def write_distdgl_parts(
    indptr: np.ndarray,
    indices: np.ndarray,
    part: np.ndarray,
    k: int,
    out_dir: str | os.PathLike,
    graph_name: str,
    node_data: dict[str, np.ndarray] | None = None,
    part_method: str = "metis",
) -> np.ndarray:
    """Write DGL's partition format for the CSR graph and assignment `part` (see the module
    docstring) into `out_dir`; returns orig_nids (new id -> canonical id)."""
    import dgl
    import torch
    from dgl.data.utils import save_tensors

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n, m = len(indptr) - 1, int(indptr[-1])
    node_data = node_data or {}
    for name, values in node_data.items():
        if len(values) != n:
            raise ValueError(f"node data {name!r} has {len(values)} rows for {n} nodes")
    part = np.asarray(part, dtype=np.int64)
    if k == 1:  # DGL does not reshuffle one part
        part = np.zeros(n, dtype=np.int64)
        orig_nids = new_of_old = np.arange(n, dtype=np.int64)
    else:
        orig_nids, new_of_old = reshuffled_node_ids(part)
    eid = reshuffled_edge_ids(indptr, indices, new_of_old) if k > 1 else None
    node_bounds = np.concatenate([[0], np.cumsum(np.bincount(part, minlength=k))]).astype(np.int64)
    metadata = {
        "graph_name": graph_name,
        "num_nodes": n,
        "num_edges": m,
        "part_method": part_method,
        "num_parts": k,
        "halo_hops": 1,
        "node_map": {NTYPE_NAME: [[int(node_bounds[p]), int(node_bounds[p + 1])] for p in range(k)]},
        "edge_map": {ETYPE_NAME: []},
        "ntypes": {NTYPE_NAME: 0},
        "etypes": {ETYPE_NAME: 0},
    }
    edge_start = 0
    for p in range(k):
        start, end = int(node_bounds[p]), int(node_bounds[p + 1])
        if k == 1:
            src = np.concatenate([s for _, s, _ in _chunk_edges(indptr, indices)]) if m else np.empty(0, np.int64)
            g = dgl.graph((torch.from_numpy(src), torch.from_numpy(np.asarray(indices, dtype=np.int64))), num_nodes=n)
            g.ndata["_ID"] = torch.arange(n, dtype=torch.int64)
            g.ndata["inner_node"] = torch.ones(n, dtype=torch.uint8)
            g.edata["_ID"] = torch.arange(m, dtype=torch.int64)
            g.edata["inner_edge"] = torch.ones(m, dtype=torch.uint8)
            inner_edges = m
        else:
            (s_in, d_in, e_in), (s_out, d_out, e_out) = _part_edges(indptr, indices, part, p, new_of_old, eid)
            inner_edges = len(e_in)
            halo = np.unique(np.concatenate([s_in[(s_in < start) | (s_in >= end)], d_out]))
            nodes = np.concatenate([np.arange(start, end, dtype=np.int64), halo])

            def local(ids, start=start, end=end, halo=halo):
                inside = (ids >= start) & (ids < end)
                return np.where(inside, ids - start, (end - start) + np.searchsorted(halo, ids))

            src = local(np.concatenate([s_in, s_out]))
            dst = local(np.concatenate([d_in, d_out]))
            g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=len(nodes))
            g.ndata["part_id"] = torch.from_numpy(part[orig_nids[nodes]])
            g.ndata["inner_node"] = torch.from_numpy((np.arange(len(nodes)) < end - start).astype(np.uint8))
            g.ndata["_ID"] = torch.from_numpy(nodes)
            g.edata["inner_edge"] = torch.from_numpy(
                np.concatenate([np.ones(len(e_in), np.uint8), np.zeros(len(e_out), np.uint8)])
            )
            g.edata["_ID"] = torch.from_numpy(np.concatenate([e_in, e_out]))
            if len(e_in) and (e_in[0] != edge_start or e_in[-1] != edge_start + len(e_in) - 1):
                raise AssertionError(f"part {p}: inner edge ids are not the range starting at {edge_start}")
        metadata["edge_map"][ETYPE_NAME].append([edge_start, edge_start + inner_edges])
        edge_start += inner_edges
        part_dir = out / f"part{p}"
        part_dir.mkdir(exist_ok=True)
        core = orig_nids[start:end]
        feats = {
            f"{NTYPE_NAME}/{name}": torch.from_numpy(np.ascontiguousarray(np.asarray(values)[core]))
            for name, values in node_data.items()
        }
        save_tensors(str(part_dir / "node_feat.dgl"), feats)
        save_tensors(str(part_dir / "edge_feat.dgl"), {})
        dgl.save_graphs(str(part_dir / "graph.dgl"), [g])
        metadata[f"part-{p}"] = {
            "node_feats": f"part{p}/node_feat.dgl",
            "edge_feats": f"part{p}/edge_feat.dgl",
            "part_graph": f"part{p}/graph.dgl",
        }
        del g
    (out / f"{graph_name}.json").write_text(json.dumps(metadata, indent=4))
    return orig_nids


__all__ = ["reshuffled_edge_ids", "reshuffled_node_ids", "write_distdgl_parts"]
