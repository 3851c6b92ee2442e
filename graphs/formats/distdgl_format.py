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

Memory: the CSR (already held by the stage), one new edge id per edge (int32 while the graph has
at most 2^31 edges, else int64), two node-sized scratch arrays, and one part at a time: its
graph's arrays (src, dst, _ID: int64, inner_edge: uint8; 25 bytes per edge of the part, each
built once in place: inner edges scattered to their position, outgoing ones sorted by edge id
in place), freed before its node data is gathered. A memory-mapped node array (the stage's
features.npy) is read sequentially in blocks of `GATHER_BLOCK_BYTES` through one buffer
(`gather_rows`), so none of its file pages is mapped into the process: fancy-indexing the
mapping would leave every touched page of the file in the process's RSS (at 10M x 128 float32,
the whole 4.8 GB file for each part).
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

import numba
import numpy as np

from graphs.kernels.coarsen import CHUNK_EDGES, row_chunks

NTYPE_NAME = "_N"
ETYPE_NAME = "_N:_E:_N"  # DGL's canonical edge type of a homogeneous graph, as a string
GATHER_BLOCK_BYTES = 1 << 26  # bytes of a memory-mapped node array read at a time by `gather_rows`


def edge_id_dtype(num_edges: int) -> np.dtype:
    """The dtype of the new edge ids held for a graph of `num_edges` edges (ids 0..num_edges-1):
    int32 while they fit, else int64. What is written (``_ID``) is always int64, as DGL's."""
    return np.dtype(np.int32 if num_edges <= np.iinfo(np.int32).max + 1 else np.int64)


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


@numba.njit(cache=True, nogil=True)
def _edge_id_kernel(indices, new_of_old, eid):  # pragma: no cover
    cursor = np.zeros(len(new_of_old) + 1, np.int64)
    for e in range(len(indices)):
        cursor[new_of_old[indices[e]] + 1] += 1
    for i in range(len(new_of_old)):
        cursor[i + 1] += cursor[i]
    for e in range(len(indices)):
        d = new_of_old[indices[e]]
        eid[e] = cursor[d]
        cursor[d] += 1


def reshuffled_edge_ids(indptr: np.ndarray, indices: np.ndarray, new_of_old: np.ndarray) -> np.ndarray:
    """New edge id of every CSR edge (dtype `edge_id_dtype`): edges grouped by new destination
    id, in CSR order within one destination (a stable counting sort)."""
    m = int(indptr[-1])
    eid = np.empty(m, dtype=edge_id_dtype(m))
    _edge_id_kernel(indices[:m], new_of_old, eid)
    return eid


@numba.njit(cache=True, nogil=True)
def _part_edges_kernel(
    indptr, indices, part, new_of_old, eid, p, edge_start, n_in, src, dst, ids, mark
):  # pragma: no cover
    """Part p's edges in new ids: into the core at eid - edge_start (< n_in), from the core to
    another part appended from n_in on in CSR order; marks their nodes. Returns (inner, end)."""
    inner, o = 0, n_in
    for u in range(len(indptr) - 1):
        from_core = part[u] == p
        nu = new_of_old[u]
        for e in range(indptr[u], indptr[u + 1]):
            v = indices[e]
            if part[v] == p:
                pos = eid[e] - edge_start
                if pos < 0 or pos >= n_in:
                    return -1, o
                src[pos] = nu
                dst[pos] = new_of_old[v]
                mark[nu] = True
                inner += 1
            elif from_core:
                if o == len(src):
                    return inner, -1
                nv = new_of_old[v]
                src[o], dst[o], ids[o] = nu, nv, eid[e]
                mark[nv] = True
                o += 1
    return inner, o


def _mapped_file_region(values) -> tuple[str, int] | None:
    """(file, byte position of row 0) when `values` is a C-contiguous read-only memory map of a
    file (`np.load(..., mmap_mode="r")`, or a row range of one), else None."""
    if not isinstance(values, np.memmap) or values.mode != "r" or not values.filename:
        return None
    if values.ndim == 0 or not values.flags.c_contiguous:
        return None
    mapping = values
    while isinstance(mapping, np.ndarray):
        mapping = mapping.base
    if not isinstance(mapping, mmap.mmap):
        return None
    # numpy maps the file from the allocation-granularity boundary at or below its offset
    mapped_from = values.offset - values.offset % mmap.ALLOCATIONGRANULARITY
    first = np.frombuffer(mapping, dtype=np.uint8, count=1).ctypes.data
    return values.filename, mapped_from + (values.ctypes.data - first)


def _read_exact(f, position: int, buffer: memoryview) -> None:
    f.seek(position)
    done = 0
    while done < len(buffer):
        got = f.readinto(buffer[done:])
        if not got:
            raise OSError(f"{f.name}: ends before byte {position + len(buffer)}")
        done += got


def gather_rows(values, rows: np.ndarray, block_bytes: int = GATHER_BLOCK_BYTES) -> np.ndarray:
    """``values[rows]`` (rows in any order, repeats allowed) as a new C-contiguous array.

    A read-only memory-mapped array (`np.load(path, mmap_mode="r")`) is not indexed through its
    mapping: its file is read in ascending row order, in blocks of at most `block_bytes` that
    start at the next wanted row, through one reused buffer, so none of its pages enters the
    process's RSS. Any other array is fancy-indexed."""
    rows = np.asarray(rows)
    region = _mapped_file_region(values)
    if region is None:
        return np.ascontiguousarray(np.asarray(values)[rows])
    path, position = region
    n = values.shape[0]
    out = np.empty((len(rows), *values.shape[1:]), dtype=values.dtype)
    if len(rows) and (int(rows.min()) < -n or int(rows.max()) >= n):
        raise IndexError(f"row ids outside {-n}..{n - 1} for {n} rows of {path}")
    row_bytes = out.itemsize * int(np.prod(values.shape[1:], dtype=np.int64))
    if len(rows) == 0 or row_bytes == 0:
        return out
    if int(rows.min()) < 0:
        rows = np.where(rows < 0, rows + n, rows)
    ascending = bool(np.all(rows[1:] > rows[:-1]))
    order = None if ascending else np.argsort(rows, kind="stable")
    wanted = rows if order is None else rows[order]
    per_block = max(1, block_bytes // row_bytes)
    buf = np.empty((per_block, *values.shape[1:]), dtype=values.dtype)
    raw = memoryview(buf.reshape(-1).view(np.uint8))
    with open(path, "rb", buffering=0) as f:
        i = 0
        while i < len(wanted):
            r0 = int(wanted[i])
            j = int(np.searchsorted(wanted, r0 + per_block, side="left"))
            r1 = int(wanted[j - 1]) + 1
            _read_exact(f, position + r0 * row_bytes, raw[: (r1 - r0) * row_bytes])
            local = wanted[i:j] - r0
            if order is None:
                np.take(buf, local, axis=0, out=out[i:j])
            else:
                out[order[i:j]] = buf[local]
            i = j
    return out


def part_edge_counts(indptr, indices, part, k) -> tuple[np.ndarray, np.ndarray]:
    """int64 [k] each: edges into part p (destination in p), and edges out of p (source in p,
    destination elsewhere)."""
    into, out_of = np.zeros(k, dtype=np.int64), np.zeros(k, dtype=np.int64)
    for _, src, dst in _chunk_edges(indptr, indices):
        ps, pd = part[src], part[dst]
        into += np.bincount(pd, minlength=k)
        out_of += np.bincount(ps[ps != pd], minlength=k)
    return into, out_of


@dataclass
class Reshuffle:
    """The whole-graph arrays every part is cut from, plus two node-sized scratch arrays that
    each part leaves as it found them."""

    indptr: np.ndarray
    indices: np.ndarray
    part: np.ndarray  # part id per canonical node
    orig_nids: np.ndarray  # int64 [n] new id -> canonical id
    new_of_old: np.ndarray  # int64 [n] canonical id -> new id
    eid: np.ndarray  # [m] new edge id per CSR edge (edge_id_dtype)
    node_bounds: np.ndarray  # int64 [k + 1] new-id range of each part
    edge_bounds: np.ndarray  # int64 [k + 1] edge-id range of each part's inner edges
    out_counts: np.ndarray  # int64 [k] edges from each part's core to another part
    mark: np.ndarray = field(init=False)  # bool [n] scratch, all False
    local: np.ndarray = field(init=False)  # int64 [n] scratch, all -1

    def __post_init__(self) -> None:
        n = len(self.orig_nids)
        self.mark, self.local = np.zeros(n, dtype=bool), np.full(n, -1, dtype=np.int64)

    def part_graph(self, p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """(local src, local dst, new edge ids, new node ids, inner edge count) of part p's graph:
        edges into the core first, in edge-id order, then edges from the core to a halo node,
        in edge-id order; nodes: the core in new-id order, then the halo ascending."""
        start, end = int(self.node_bounds[p]), int(self.node_bounds[p + 1])
        edge_start, n_in = int(self.edge_bounds[p]), int(self.edge_bounds[p + 1] - self.edge_bounds[p])
        total = n_in + int(self.out_counts[p])
        src, dst, ids = (np.empty(total, dtype=np.int64) for _ in range(3))
        ids[:n_in] = np.arange(edge_start, edge_start + n_in, dtype=np.int64)
        mark = self.mark
        inner, o = _part_edges_kernel(
            self.indptr, self.indices, self.part, self.new_of_old, self.eid, p, edge_start, n_in, src, dst, ids, mark
        )
        if inner < 0:
            raise AssertionError(f"part {p}: inner edge ids are not the range starting at {edge_start}")
        if o < 0:
            raise AssertionError(f"part {p}: more outgoing edges than counted")
        if inner != n_in or o != total:
            raise AssertionError(
                f"part {p}: {inner} inner and {o - n_in} outgoing edges, counted {n_in} and {total - n_in}"
            )
        order = np.argsort(ids[n_in:], kind="stable")
        for a in (src, dst, ids):
            a[n_in:] = a[n_in:][order]
        del order
        mark[start:end] = False
        halo = np.flatnonzero(mark)
        mark[halo] = False
        local = self.local
        local[start:end] = np.arange(end - start, dtype=np.int64)
        local[halo] = np.arange(end - start, end - start + len(halo), dtype=np.int64)
        for b in range(0, total, CHUNK_EDGES):
            src[b : b + CHUNK_EDGES] = local[src[b : b + CHUNK_EDGES]]
            dst[b : b + CHUNK_EDGES] = local[dst[b : b + CHUNK_EDGES]]
        local[start:end] = -1
        local[halo] = -1
        nodes = np.concatenate([np.arange(start, end, dtype=np.int64), halo])
        return src, dst, ids, nodes, n_in


def _whole_graph(indptr: np.ndarray, indices: np.ndarray):
    """k = 1: the whole graph in the canonical edge order, DGL's single part (no reshuffle)."""
    import dgl
    import torch

    n, m = len(indptr) - 1, int(indptr[-1])
    src = np.repeat(np.arange(n, dtype=np.int64), np.diff(np.asarray(indptr, dtype=np.int64)))
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(np.asarray(indices, dtype=np.int64))), num_nodes=n)
    g.ndata["_ID"] = torch.arange(n, dtype=torch.int64)
    g.ndata["inner_node"] = torch.ones(n, dtype=torch.uint8)
    g.edata["_ID"] = torch.arange(m, dtype=torch.int64)
    g.edata["inner_edge"] = torch.ones(m, dtype=torch.uint8)
    return g


def part_ranges(bounds, step: int = 1, first: int = 0) -> list[list[int]]:
    """``[[start, end), ...]`` of every part: ``bounds[p * step + first]`` and the next one."""
    k = (len(bounds) - 1) // step
    return [[int(bounds[p * step + first]), int(bounds[p * step + first + 1])] for p in range(k)]


def partition_config(
    graph_name: str, num_nodes: int, num_edges: int, part_method: str, k: int, node_map: dict, edge_map: dict
) -> dict:
    """DGL's partition config (``<graph_name>.json``), its keys in DGL's order: `node_map` and
    `edge_map` give each node type's and relation's id range in every part, and their order the
    type ids; each part's files are ``part{p}/graph.dgl``, ``node_feat.dgl``, ``edge_feat.dgl``."""
    return {
        "graph_name": graph_name,
        "num_nodes": num_nodes,
        "num_edges": num_edges,
        "part_method": part_method,
        "num_parts": k,
        "halo_hops": 1,
        "node_map": node_map,
        "edge_map": edge_map,
        "ntypes": {t: i for i, t in enumerate(node_map)},
        "etypes": {e: i for i, e in enumerate(edge_map)},
        **{
            f"part-{p}": {
                "node_feats": f"part{p}/node_feat.dgl",
                "edge_feats": f"part{p}/edge_feat.dgl",
                "part_graph": f"part{p}/graph.dgl",
            }
            for p in range(k)
        },
    }


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
    part = _checked_assignment(part, k, n, node_data)
    part, orig_nids, node_bounds, edge_bounds, shuffle = _reshuffle_plan(indptr, indices, part, k)
    metadata = partition_config(
        graph_name, n, m, part_method, k, {NTYPE_NAME: part_ranges(node_bounds)}, {ETYPE_NAME: part_ranges(edge_bounds)}
    )
    for p in range(k):
        part_dir = out / f"part{p}"
        part_dir.mkdir(exist_ok=True)
        if shuffle is None:
            g = _whole_graph(indptr, indices)
        else:
            g = _reshuffled_part_graph(shuffle, p)
        dgl.save_graphs(str(part_dir / "graph.dgl"), [g])
        del g  # the part's graph goes before its node data is gathered
        core = orig_nids[node_bounds[p] : node_bounds[p + 1]]
        feats = {
            f"{NTYPE_NAME}/{name}": torch.from_numpy(gather_rows(values, core)) for name, values in node_data.items()
        }
        save_tensors(str(part_dir / "node_feat.dgl"), feats)
        del feats
        save_tensors(str(part_dir / "edge_feat.dgl"), {})
    (out / f"{graph_name}.json").write_text(json.dumps(metadata, indent=4))
    return orig_nids


def _checked_assignment(part: np.ndarray, k: int, n: int, node_data: dict[str, np.ndarray]) -> np.ndarray:
    """`part` as a signed integer array, after checking it and the node data against the `n` nodes and `k` parts."""
    for name, values in node_data.items():
        if len(values) != n:
            raise ValueError(f"node data {name!r} has {len(values)} rows for {n} nodes")
    part = np.asarray(part)
    if part.dtype.kind not in "iu":
        raise TypeError(f"part ids must be integers, got {part.dtype}")
    if not np.can_cast(part.dtype, np.int64):  # uint64: bincount takes int64 at most
        part = part.astype(np.int64)
    if len(part) != n:
        raise ValueError(f"the assignment has {len(part)} part ids for {n} nodes")
    if k > 1 and n and (int(part.min()) < 0 or int(part.max()) >= k):
        raise ValueError(f"part ids outside 0..{k - 1}: {int(part.min())}..{int(part.max())}")
    return part


def _reshuffle_plan(indptr: np.ndarray, indices: np.ndarray, part: np.ndarray, k: int):
    """(part, orig_nids, node bounds, edge bounds, `Reshuffle` or None for one part) of the new id order."""
    n, m = len(indptr) - 1, int(indptr[-1])
    if k == 1:  # DGL does not reshuffle one part
        bounds = np.array([0, n], dtype=np.int64), np.array([0, m], dtype=np.int64)
        return np.zeros(n, dtype=np.int64), np.arange(n, dtype=np.int64), *bounds, None
    orig_nids, new_of_old = reshuffled_node_ids(part)
    node_bounds = np.concatenate([[0], np.cumsum(np.bincount(part, minlength=k))]).astype(np.int64)
    into, out_counts = part_edge_counts(indptr, indices, part, k)
    edge_bounds = np.concatenate([[0], np.cumsum(into)]).astype(np.int64)
    shuffle = Reshuffle(
        indptr=indptr,
        indices=indices,
        part=part,
        orig_nids=orig_nids,
        new_of_old=new_of_old,
        eid=reshuffled_edge_ids(indptr, indices, new_of_old),
        node_bounds=node_bounds,
        edge_bounds=edge_bounds,
        out_counts=out_counts,
    )
    return part, orig_nids, node_bounds, edge_bounds, shuffle


def _reshuffled_part_graph(shuffle: "Reshuffle", p: int):
    """Part `p`'s DGL graph in new ids, with its part_id, inner_node, inner_edge and _ID data."""
    import dgl
    import torch

    src, dst, ids, nodes, n_in = shuffle.part_graph(p)
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=len(nodes))
    del src, dst
    g.ndata["part_id"] = torch.from_numpy(shuffle.part[shuffle.orig_nids[nodes]].astype(np.int64))
    g.ndata["inner_node"] = torch.from_numpy(
        (np.arange(len(nodes)) < shuffle.node_bounds[p + 1] - shuffle.node_bounds[p]).astype(np.uint8)
    )
    g.ndata["_ID"] = torch.from_numpy(nodes)
    inner_edge = np.zeros(len(ids), dtype=np.uint8)
    inner_edge[:n_in] = 1
    g.edata["inner_edge"] = torch.from_numpy(inner_edge)
    g.edata["_ID"] = torch.from_numpy(ids)
    return g


__all__ = [
    "GATHER_BLOCK_BYTES",
    "Reshuffle",
    "edge_id_dtype",
    "gather_rows",
    "part_edge_counts",
    "part_ranges",
    "partition_config",
    "reshuffled_edge_ids",
    "reshuffled_node_ids",
    "write_distdgl_parts",
]
