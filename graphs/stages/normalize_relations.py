"""The relational Â of a typed graph: one normalized adjacency per relation, in one CSR over the
destinations, each entry tagged with its relation.

For relation r with edges u -> v (u of r's source type, v of its destination type), the entry is

    Â_r[v, u] = w_uv · D_r,out(u)^-1/2 · D_r,in(v)^-1/2

with D_r,out(u) the (weighted) out-degree of u under r and D_r,in(v) the in-degree of v under r:
GCN's symmetric normalization applied to each relation on its own, which is what
``HeteroGraphConv({r: GraphConv(norm="both")})`` computes, and what R-GCN's per-relation
normalization 1/c_{v,r} becomes on a bipartite relation. There is no self loop (a node is never
its own neighbour across types; relational layers transform a node's own row with a weight of
their own). Every entry lies in (0, 1] and each relation's Â_r has spectral norm <= 1.

Rows are destinations: row v holds v's in-edges of every relation, sorted by (source, relation),
so a neighbour sampler drawing row v draws v's in-neighbours (`graphs.sampling.base.Adjacency`
reads it as it reads Â). Files (in the normalized_adjacency folder, beside Â of the graph's
homogeneous view; names owned by `graphs.stages.normalize.Adjacency`):

    rel_indptr.npy    int64   [n + 1]
    rel_indices.npy   int32   [nnz]   source ids (int64 when n >= 2^31)
    rel_weights.npy   float32 [nnz]   Â_r's entries
    rel_etypes.npy    int16   [nnz]   each entry's relation index (`graphs.stages.typed_graph.TypedSchema`)

Read from canonical_graph's typed_edges.parquet, already sorted by (dst, src, etype), in record
batches: memory is O(n · relations) for the degrees plus one batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.npyrows import create_npy_memmap

__all__ = ["RelationalCSR", "write_relational_adjacency"]

BATCH_ROWS = 1 << 22


class RelationalCSR(NamedTuple):
    """The relational Â's arrays (module docstring)."""

    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray
    etypes: np.ndarray

    @property
    def n(self) -> int:
        return len(self.indptr) - 1


def _batches(path: Path, weighted: bool):
    columns = ["src", "dst", "etype"] + (["weight"] if weighted else [])
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=columns):
        cols = [np.asarray(batch.column(i).to_numpy()) for i in range(len(columns))]
        yield (
            cols[0].astype(np.int64),
            cols[1].astype(np.int64),
            cols[2].astype(np.int64),
            (cols[3].astype(np.float64) if weighted else None),
        )


def write_relational_adjacency(graph: CanonicalGraph, out: Path, names: dict[str, str], relations: int) -> dict:
    """The relational Â of the typed canonical graph `graph` into `out` (files named by `names`:
    indptr, indices, weights, etypes); its summary facts."""
    path = graph.verified(graph.TYPED_EDGES)
    n = graph.num_nodes
    weighted = "weight" in pq.read_schema(path).names
    out_sum = np.zeros(n * relations, dtype=np.float64)
    in_sum = np.zeros(n * relations, dtype=np.float64)
    in_count = np.zeros(n, dtype=np.int64)
    last = -1
    for src, dst, etype, w in _batches(path, weighted):
        key = dst * np.int64(relations) + etype
        if len(dst) and (dst[0] < last or np.any(np.diff(dst) < 0)):
            raise ValueError(f"{path}: rows are not sorted by dst; re-run canonical_graph")
        last = int(dst[-1]) if len(dst) else last
        ones = np.ones(len(src)) if w is None else w
        out_sum += np.bincount(src * np.int64(relations) + etype, weights=ones, minlength=n * relations)
        in_sum += np.bincount(key, weights=ones, minlength=n * relations)
        in_count += np.bincount(dst, minlength=n)
    out_scale = np.zeros_like(out_sum)
    in_scale = np.zeros_like(in_sum)
    np.divide(1.0, np.sqrt(out_sum), out=out_scale, where=out_sum > 0)
    np.divide(1.0, np.sqrt(in_sum), out=in_scale, where=in_sum > 0)
    nnz = int(in_count.sum())
    index_dtype = np.int32 if n < 2**31 else np.int64
    indptr = create_npy_memmap(out / names["indptr"], dtype=np.int64, shape=(n + 1,))
    indptr[0] = 0
    np.cumsum(in_count, out=indptr[1:])
    indices = create_npy_memmap(out / names["indices"], dtype=index_dtype, shape=(nnz,))
    weights = create_npy_memmap(out / names["weights"], dtype=np.float32, shape=(nnz,))
    etypes = create_npy_memmap(out / names["etypes"], dtype=np.int16, shape=(nnz,))
    k = 0
    for src, dst, etype, w in _batches(path, weighted):
        m = len(src)
        entry = out_scale[src * np.int64(relations) + etype] * in_scale[dst * np.int64(relations) + etype]
        if w is not None:
            entry = entry * w
        indices[k : k + m] = src
        weights[k : k + m] = entry
        etypes[k : k + m] = etype
        k += m
    for arr in (indptr, indices, weights, etypes):
        arr.flush()
    per_relation = np.bincount(np.asarray(etypes), minlength=relations) if nnz else np.zeros(relations, np.int64)
    del indptr, indices, weights, etypes
    return {
        "relations": relations,
        "nnz": nnz,
        "entries_per_relation": [int(c) for c in per_relation],
        "max_in_degree": int(in_count.max()) if n else 0,
        "nodes_without_in_edges": int(np.count_nonzero(in_count == 0)),
    }
