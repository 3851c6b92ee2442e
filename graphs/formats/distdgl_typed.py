"""DGL's distributed partition format of a heterogeneous graph (what `dgl.distributed.load_partition`
and DistDGL's `DistGraph` read, dgl 2.1), written part by part as `graphs.formats.distdgl_format`
writes a homogeneous one: from the relation multigraph (a CSR by source with one relation index
per edge), the node types and the assignment, without a whole-graph DGL object.

What DGL's `partition_graph(g, name, k, out, return_mapping=True)` writes for a heterograph `g`,
and what `write_typed_distdgl_parts` writes the same way:

- **Node ids**: one homogeneous id space, type after type (`TypedSchema.offsets`, the order of
  DGL's `to_homogeneous`), reshuffled so that each part's nodes of each type are one contiguous
  range: new id = position in ``torch.sort(part * T + type)`` (DGL's call, so identical);
  ``node_map[<type>][p] = [start, end)``.
- **Edge ids**: grouped by (part of the destination, relation index), so
  ``edge_map["<src>:<rel>:<dst>"][p]`` is one contiguous range of the size of DGL's; within a group
  by new destination id, then position in the CSR (DGL's order within a group comes from its C++
  edge reassignment; no reader needs it).
- ``part{p}/graph.dgl``: the homogeneous format's part graph (core nodes in new-id order, then the
  halo; edges into the core, then edges from the core to the halo) plus ``_TYPE`` node data (the
  node type index) and ``_TYPE`` edge data (the relation index), both int32 as DGL writes them.
- ``part{p}/node_feat.dgl``: ``"<type>/<name>"`` -> the part's core nodes of that type, in new-id
  order (a type's own feature width; featureless types carry none);
  ``part{p}/edge_feat.dgl``: ``"<src>:<rel>:<dst>/<name>"`` -> the part's inner edges of that
  relation, in edge-id order.
- ``<graph_name>.json``: the homogeneous format's keys, ``ntypes`` and ``etypes`` mapping each node
  type and each relation (``<src>:<rel>:<dst>``, DGL's string form) to its index.

With k = 1 nothing is reshuffled (DGL's single part holds the whole graph in the homogeneous ids)
and the edge ids group the edges by relation. `tests/test_distdgl_typed.py` compares the files with
DGL's `partition_graph` of the same heterograph and assignment.

Memory: the homogeneous writer's (one new edge id per edge, one part at a time) plus two more
int64 arrays per edge (the edges in new-destination order, and with edge data each new id's CSR
position).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numba
import numpy as np

from graphs.formats.distdgl_format import (
    Reshuffle,
    edge_id_dtype,
    gather_rows,
    part_edge_counts,
    part_ranges,
    partition_config,
    reshuffled_edge_ids,
)
from graphs.formats.graph_schema import TypedSchema

__all__ = ["etype_name", "write_typed_distdgl_parts"]

NTYPE_FIELD = "_TYPE"  # dgl.NTYPE and dgl.ETYPE: the type index of each node / edge of a part graph


def etype_name(relation) -> str:
    """``src:rel:dst``: DGL's string form of a canonical edge type in the partition config."""
    return f"{relation.src_type}:{relation.name}:{relation.dst_type}"


@numba.njit(cache=True, nogil=True)
def _grouped_edge_id_kernel(indices, etype, part, relations, by_dst, cursor, eid):  # pragma: no cover
    """eid[e]: edges grouped by part[dst] * relations + etype (cursor: each group's first id), in
    the order of `by_dst` (new edge ids by new destination) within a group."""
    order = np.empty(len(indices), np.int64)
    for e in range(len(indices)):
        order[by_dst[e]] = e
    for i in range(len(indices)):
        e = order[i]
        b = part[indices[e]] * relations + etype[e]
        eid[e] = cursor[b]
        cursor[b] += 1


def _typed_plan(
    indptr, indices, etype, part, k, node_type, types: int, relations: int
) -> tuple[Reshuffle, np.ndarray, np.ndarray]:
    """(the reshuffle, node bounds per (part, type), edge bounds per (part, relation))."""
    import torch

    n = len(indptr) - 1
    if k == 1:  # DGL does not reshuffle one part
        orig_nids = np.arange(n, dtype=np.int64)
    else:
        key = torch.from_numpy(part * np.int64(types) + node_type)
        orig_nids = torch.sort(key)[1].numpy()
    new_of_old = np.empty_like(orig_nids)
    new_of_old[orig_nids] = np.arange(n, dtype=np.int64)
    type_bounds = np.zeros(k * types + 1, dtype=np.int64)
    np.cumsum(np.bincount(part * np.int64(types) + node_type, minlength=k * types), out=type_bounds[1:])
    groups = np.zeros(k * relations + 1, dtype=np.int64)
    np.cumsum(np.bincount(part[indices] * np.int64(relations) + etype, minlength=k * relations), out=groups[1:])
    eid = np.empty(len(indices), dtype=edge_id_dtype(len(indices)))
    by_dst = reshuffled_edge_ids(indptr, indices, new_of_old)
    _grouped_edge_id_kernel(indices, etype, part, np.int64(relations), by_dst, groups[:-1].copy(), eid)
    del by_dst
    _, out_counts = part_edge_counts(indptr, indices, part, k)
    shuffle = Reshuffle(
        indptr=indptr,
        indices=indices,
        part=part,
        orig_nids=orig_nids,
        new_of_old=new_of_old,
        eid=eid,
        node_bounds=type_bounds[::types].copy(),
        edge_bounds=groups[::relations].copy(),
        out_counts=out_counts,
    )
    return shuffle, type_bounds, groups


def _part_graph(shuffle: Reshuffle, p: int, k: int, node_type: np.ndarray, groups: np.ndarray, relations: int):
    """Part `p`'s DGL graph in new ids with DGL's node and edge data, types included."""
    import dgl
    import torch

    src, dst, ids, nodes, n_in = shuffle.part_graph(p)
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=len(nodes))
    del src, dst
    canonical = shuffle.orig_nids[nodes]
    if k > 1:
        g.ndata["part_id"] = torch.from_numpy(shuffle.part[canonical].astype(np.int64))
    g.ndata["inner_node"] = torch.from_numpy(
        (np.arange(len(nodes)) < shuffle.node_bounds[p + 1] - shuffle.node_bounds[p]).astype(np.uint8)
    )
    g.ndata["_ID"] = torch.from_numpy(nodes)
    g.ndata[NTYPE_FIELD] = torch.from_numpy(node_type[canonical].astype(np.int32))
    inner_edge = np.zeros(len(ids), dtype=np.uint8)
    inner_edge[:n_in] = 1
    g.edata["inner_edge"] = torch.from_numpy(inner_edge)
    g.edata["_ID"] = torch.from_numpy(ids)
    relation = (np.searchsorted(groups, ids, side="right") - 1) % relations
    g.edata[NTYPE_FIELD] = torch.from_numpy(relation.astype(np.int32))
    return g


def write_typed_distdgl_parts(
    indptr: np.ndarray,
    indices: np.ndarray,
    etype: np.ndarray,
    typed: TypedSchema,
    part: np.ndarray,
    k: int,
    out_dir: str | os.PathLike,
    graph_name: str,
    node_data: dict[str, dict[str, np.ndarray]] | None = None,
    edge_data: dict[str, np.ndarray] | None = None,
    part_method: str = "metis",
) -> np.ndarray:
    """Write DGL's heterogeneous partition format (module docstring) into `out_dir`; returns
    orig_nids (new id -> homogeneous id, types at `typed.offsets`).

    The graph is a CSR by source over the homogeneous ids with `etype` (the relation index of
    `typed.schema.relations`) per edge. `node_data` maps a node type to its arrays, each indexed
    by the type's own ids (row i is node ``offsets[t] + i``); `edge_data` maps a name to an array
    over the CSR's edges, written for every relation."""
    import dgl
    import torch
    from dgl.data.utils import save_tensors

    schema, n, m = typed.schema, len(indptr) - 1, int(indptr[-1])
    types, relations = len(schema.node_types), len(schema.relations)
    part, etype, node_type = _checked(indptr, indices, etype, typed, part, k, node_data or {}, edge_data or {})
    shuffle, type_bounds, groups = _typed_plan(indptr, indices, etype, part, k, node_type, types, relations)
    position = None
    if edge_data:
        position = np.empty(m, dtype=np.int64)  # CSR position of each new edge id
        position[shuffle.eid] = np.arange(m, dtype=np.int64)
    names = [etype_name(r) for r in schema.relations]
    metadata = partition_config(
        graph_name,
        n,
        m,
        part_method,
        k,
        {t: part_ranges(type_bounds, types, i) for i, t in enumerate(schema.node_types)},
        {name: part_ranges(groups, relations, r) for r, name in enumerate(names)},
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    offsets = typed.offsets
    for p in range(k):
        part_dir = out / f"part{p}"
        part_dir.mkdir(exist_ok=True)
        dgl.save_graphs(str(part_dir / "graph.dgl"), [_part_graph(shuffle, p, k, node_type, groups, relations)])
        feats = {}
        for i, t in enumerate(schema.node_types):
            core = shuffle.orig_nids[type_bounds[p * types + i] : type_bounds[p * types + i + 1]] - offsets[i]
            for name, values in (node_data or {}).get(t, {}).items():
                feats[f"{t}/{name}"] = torch.from_numpy(gather_rows(values, core))
        save_tensors(str(part_dir / "node_feat.dgl"), feats)
        del feats
        edge_feats = {}
        for r, rel in enumerate(names):
            if position is None:
                break
            inner = position[groups[p * relations + r] : groups[p * relations + r + 1]]
            for name, values in edge_data.items():
                edge_feats[f"{rel}/{name}"] = torch.from_numpy(np.ascontiguousarray(values[inner]))
        save_tensors(str(part_dir / "edge_feat.dgl"), edge_feats)
    (out / f"{graph_name}.json").write_text(json.dumps(metadata, indent=4))
    return shuffle.orig_nids


def _checked(indptr, indices, etype, typed: TypedSchema, part, k, node_data, edge_data):
    """(part int64, etype int64, node type per node) after checking the inputs against each other."""
    n, m = len(indptr) - 1, int(indptr[-1])
    if int(typed.offsets[-1]) != n:
        raise ValueError(f"the schema counts {int(typed.offsets[-1])} nodes, the graph has {n}")
    etype = np.asarray(etype, dtype=np.int64)
    if len(etype) != m or len(indices) < m:
        raise ValueError(f"{len(etype)} relation ids and {len(indices)} destinations for {m} edges")
    if m and (int(etype.min()) < 0 or int(etype.max()) >= len(typed.schema.relations)):
        raise ValueError(f"relation ids outside 0..{len(typed.schema.relations) - 1}")
    part = np.asarray(part)
    if part.dtype.kind not in "iu" or len(part) != n:
        raise ValueError(f"the assignment must be {n} integer part ids, got {len(part)} of {part.dtype}")
    part = part.astype(np.int64)
    if k > 1 and n and (int(part.min()) < 0 or int(part.max()) >= k):
        raise ValueError(f"part ids outside 0..{k - 1}: {int(part.min())}..{int(part.max())}")
    if k == 1:
        part = np.zeros(n, dtype=np.int64)
    for t, arrays in node_data.items():
        count = typed.counts[typed.schema.type_index(t)]
        for name, values in arrays.items():
            if len(values) != count:
                raise ValueError(f"node data {t}/{name} has {len(values)} rows for {count} nodes of type {t!r}")
    for name, values in edge_data.items():
        if len(values) != m:
            raise ValueError(f"edge data {name!r} has {len(values)} rows for {m} edges")
    return part, etype, typed.node_types_of(np.arange(n))
