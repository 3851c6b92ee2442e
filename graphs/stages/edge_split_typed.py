"""The edge split of a typed graph: one target relation's edges held out (`split_relation`).

A recommender asks "which items will this user buy", not "which nodes are joined": on a typed
graph link prediction targets one relation ``edge_split.relation`` (``user__buys__item``, or
its name ``buys`` when no other relation has it; a graph with one given relation needs no
setting). Its edges, directed from its source type to its destination type, are the pairs the
split permutes and holds out; every other relation's edges stay in the message-passing graph,
so a held-out purchase may still be known to the model as a view. Each held-out edge leaves the
message-passing graph in both directions: as an edge of the target relation and, when
canonical_graph added reverses, as its ``rev-`` edge. A relation that joins a type to itself
(papers citing papers) is split as the untyped graph is, by unordered pairs: (u, v) and (v, u)
are held out or kept together, and its split pairs are (min, max).

The split folder is then a typed canonical graph of its own (`graphs.stages.edge_split`'s files
plus the canonical typed files, so normalized_adjacency builds its relational Â and the samplers
draw typed blocks from it):

- ``typed_edges.parquet``: canonical_graph's rows (same columns, same (dst, src, etype) order)
  without the held-out edges and their reverses;
- ``types.json``: canonical_graph's schema, each relation's edge count that of the split's graph;
- ``edges.parquet``: the homogeneous view, every remaining pair once per direction;
- split pairs ``(src, dst)`` of the target relation in its direction (source-type id first);
  evaluation negatives with a source of the source type and a destination of the destination
  type, no edge of the full graph in either direction.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.graph_schema import TypedSchema
from graphs.infra.config_checks import bounded_repr
from graphs.stages.negatives import EdgeKeys

__all__ = ["TargetRelation", "relation_edge_keys", "resolve_relation", "split_relation"]

_BATCH_ROWS = 1 << 22


@dataclasses.dataclass(frozen=True)
class TargetRelation:
    """The relation link prediction targets on a typed graph: its index, its reverse's (None
    without one), and the global id ranges of its source and destination types."""

    index: int
    key: str
    reverse: int | None
    src_range: tuple[int, int]
    dst_range: tuple[int, int]

    @property
    def symmetric(self) -> bool:
        """Whether the relation joins a type to itself (papers citing papers): its pairs are
        then unordered, (u, v) and (v, u) one pair held out or kept together."""
        return self.src_range == self.dst_range

    def pair_keys(self, src: np.ndarray, dst: np.ndarray, etype: np.ndarray, n: np.int64) -> np.ndarray:
        """int64 per edge: the key ``u * n + v`` of the pair (u, v) it is an edge of, (u, v) in the
        relation's direction (a reverse edge (v, u) read back as (u, v); a symmetric relation's
        pairs as (min, max)); -1 for an edge of another relation."""
        key = np.full(len(src), -1, np.int64)
        mine = etype == self.index
        key[mine] = src[mine] * n + dst[mine]
        if self.reverse is not None:
            back = etype == self.reverse
            key[back] = dst[back] * n + src[back]
        if self.symmetric:
            at = key >= 0
            u, v = np.divmod(key[at], n)
            key[at] = np.minimum(u, v) * n + np.maximum(u, v)
        return key

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> "TargetRelation":
        return cls(
            int(doc["index"]),
            str(doc["key"]),
            None if doc["reverse"] is None else int(doc["reverse"]),
            tuple(int(v) for v in doc["src_range"]),
            tuple(int(v) for v in doc["dst_range"]),
        )


def resolve_relation(typed: TypedSchema, name: str, where: str) -> TargetRelation:
    """The relation `name` (a key ``src__rel__dst`` or a relation name held by one relation;
    "" = the graph's only given relation) of `typed`; ValueError naming `where` and the choices."""
    doc = typed.to_json()["relations"]
    given = [i for i, r in enumerate(doc) if not _is_reverse(doc, i)]
    keys = [r.key for r in typed.schema.relations]
    if name == "":
        if len(given) != 1:
            raise ValueError(
                f"{where}: a typed graph with {len(given)} relations needs edge_split.relation, one of "
                f"{[keys[i] for i in given]}"
            )
        index = given[0]
    else:
        hits = [i for i, r in enumerate(typed.schema.relations) if name in (r.key, r.name)]
        if len(hits) != 1:
            why = "names no relation" if not hits else "names several relations; give the key"
            raise ValueError(f"{where}: edge_split.relation={bounded_repr(name)} {why}; the relations are {keys}")
        index = hits[0]
    reverse = next((i for i, r in enumerate(doc) if r["reverse_of"] == keys[index]), None)
    offsets = typed.offsets
    rel = typed.schema.relations[index]
    s, d = typed.schema.type_index(rel.src_type), typed.schema.type_index(rel.dst_type)
    return TargetRelation(
        index,
        keys[index],
        reverse,
        (int(offsets[s]), int(offsets[s + 1])),
        (int(offsets[d]), int(offsets[d + 1])),
    )


def _is_reverse(doc: list[dict], i: int) -> bool:
    key = doc[i]["key"]
    return any(r["reverse_of"] is not None and doc[j]["key"] == key for j, r in enumerate(doc))


def _typed_batches(path: Path):
    """(src, dst, etype, pyarrow batch) of typed_edges.parquet, batch by batch."""
    for batch in pq.ParquetFile(path).iter_batches(batch_size=_BATCH_ROWS):
        cols = {name: batch.column(name).to_numpy() for name in ("src", "dst", "etype")}
        yield cols["src"].astype(np.int64), cols["dst"].astype(np.int64), cols["etype"].astype(np.int64), batch


def target_keys(graph: CanonicalGraph, target: TargetRelation) -> np.ndarray:
    """Sorted unique int64 keys of the target relation's pairs (`TargetRelation.pair_keys`)."""
    n = np.int64(graph.num_nodes)
    keys = []
    for s, d, e, _ in _typed_batches(graph.verified(graph.TYPED_EDGES)):
        k = target.pair_keys(s, d, e, n)
        keys.append(k[e == target.index])
    return np.unique(np.concatenate(keys)) if keys else np.empty(0, np.int64)


def _held(src, dst, etype, target: TargetRelation, held: np.ndarray, n: np.int64) -> np.ndarray:
    """bool: the rows that are edges of a held-out pair (the target relation's or their reverses)."""
    if not len(held):
        return np.zeros(len(src), bool)
    key = target.pair_keys(src, dst, etype, n)
    pos = np.minimum(np.searchsorted(held, key), len(held) - 1)
    return (key >= 0) & (held[pos] == key)


def split_relation(
    graph: CanonicalGraph, typed: TypedSchema, target: TargetRelation, held: np.ndarray, tmp: Path
) -> np.ndarray:
    """Write the split's typed files into `tmp` (module docstring): typed_edges.parquet without
    the `held` keys (sorted, ``src * n + dst`` of the target relation) and their reverses, and
    types.json with the remaining counts. Returns the remaining pairs' sorted unique undirected
    keys ``min * n + max`` (the homogeneous view)."""
    n = np.int64(graph.num_nodes)
    counts = np.zeros(len(typed.schema.relations), np.int64)
    undirected = []
    path = graph.verified(graph.TYPED_EDGES)
    with pq.ParquetWriter(tmp / graph.TYPED_EDGES, pq.read_schema(path)) as writer:
        for src, dst, etype, batch in _typed_batches(path):
            keep = ~_held(src, dst, etype, target, held, n)
            writer.write_table(pa.Table.from_batches([batch]).filter(pa.array(keep)))
            counts += np.bincount(etype[keep], minlength=len(counts))
            lo, hi = np.minimum(src[keep], dst[keep]), np.maximum(src[keep], dst[keep])
            undirected.append(np.unique(lo * n + hi))
    remaining = dataclasses.replace(typed, relation_edges=tuple(int(c) for c in counts))
    (tmp / graph.TYPES).write_text(json.dumps(remaining.to_json(), indent=2))
    return np.unique(np.concatenate(undirected)) if undirected else np.empty(0, np.int64)


def relation_edge_keys(folder, target: TargetRelation):
    """`EdgeKeys` of the target relation's pairs in a typed graph's folder (`TargetRelation.pair_keys`
    of its edges and its reverse's): what a held-out pair must not be in the message-passing graph."""
    graph = CanonicalGraph.open(folder)
    n = np.int64(graph.num_nodes)
    keys = []
    for src, dst, etype, _ in _typed_batches(graph.verified(graph.TYPED_EDGES)):
        k = target.pair_keys(src, dst, etype, n)
        keys.append(k[k >= 0])
    return EdgeKeys(np.unique(np.concatenate(keys)) if keys else np.empty(0, np.int64), int(n))
