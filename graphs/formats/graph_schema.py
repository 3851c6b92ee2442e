"""The names of a typed graph: its node types and relations (canonical edge types), in one order.

- `Relation` is one canonical edge type ``(src_type, name, dst_type)``; its ``key`` is
  ``src_type__name__dst_type``, the name of its landing file (``edges/<key>.parquet``) and of the
  relation in every stage's files.
- `GraphSchema` is the node types and the relations, in a fixed order: a node type's index and a
  relation's index are positions in these tuples (the ingest, `graphs.stages.typed_graph`, orders
  both by name, reverse relations after the given ones).
- `TypedSchema` is a typed canonical graph's ``types.json``: the schema, each type's node count
  (type t's global ids are ``offsets[t] ..``), feature width and id kind, each relation's edge
  count, and the target node type (`graphs.stages.typed_graph` documents the file).

Names are checked wherever they come from (a landing file's name, a stage's types.json, a model
file): 1-64 letters, digits, ``_`` or ``-``, starting with a letter, never ``__``, so a name is
safe in a path and a key splits back into its three parts. Pure Python: the writer (`graphs/`)
and the reader (`training/`, without DGL) share it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["REVERSE_PREFIX", "TYPES_FILE", "GraphSchema", "Relation", "TypedSchema", "check_type_name"]

REVERSE_PREFIX = "rev-"  # a reverse relation's name: rev-<relation> (add_reverse)
TYPES_FILE = "types.json"  # a typed canonical graph's schema (`TypedSchema`; canonical_graph's folder)
TYPES_FORMAT = 1

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


def check_type_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or "__" in name:
        raise ValueError(
            f"{kind} name {name!r} must be 1-64 letters, digits, '_' or '-', start with a letter "
            "and hold no '__' (it separates the parts of a relation's key)"
        )
    return name


@dataclass(frozen=True)
class Relation:
    """One canonical edge type: edges from `src_type` nodes to `dst_type` nodes, named `name`."""

    src_type: str
    name: str
    dst_type: str

    def __post_init__(self) -> None:
        check_type_name("node type", self.src_type)
        check_type_name("relation", self.name)
        check_type_name("node type", self.dst_type)

    @property
    def key(self) -> str:
        """``src_type__name__dst_type``: the relation's landing file name without ``.parquet``."""
        return f"{self.src_type}__{self.name}__{self.dst_type}"

    @classmethod
    def from_key(cls, key: str) -> "Relation":
        """The relation whose key is `key` (ValueError unless it has three ``__``-separated parts)."""
        parts = key.split("__")
        if len(parts) != 3:
            raise ValueError(f"relation key {key!r} must be <src_type>__<relation>__<dst_type>")
        return cls(*parts)


@dataclass(frozen=True)
class GraphSchema:
    """The node types and the relations of a typed graph, in index order."""

    node_types: tuple[str, ...]
    relations: tuple[Relation, ...]

    def __post_init__(self) -> None:
        for t in self.node_types:
            check_type_name("node type", t)
        if len(set(self.node_types)) != len(self.node_types):
            raise ValueError(f"node types {self.node_types} are not unique")
        if len(set(self.relations)) != len(self.relations):
            raise ValueError(f"relations {[r.key for r in self.relations]} are not unique")
        for r in self.relations:
            for t in (r.src_type, r.dst_type):
                if t not in self.node_types:
                    raise ValueError(f"relation {r.key!r} names node type {t!r}, not one of {self.node_types}")
        if not self.relations:
            raise ValueError("a typed graph needs at least one relation")

    def type_index(self, node_type: str) -> int:
        """The index of `node_type` (ValueError naming the node types otherwise)."""
        if node_type not in self.node_types:
            raise ValueError(f"unknown node type {node_type!r}; the node types are {self.node_types}")
        return self.node_types.index(node_type)

    def dst_type_index(self, relation: int) -> int:
        """The type index of relation `relation`'s destination nodes."""
        return self.node_types.index(self.relations[relation].dst_type)

    def src_type_index(self, relation: int) -> int:
        """The type index of relation `relation`'s source nodes."""
        return self.node_types.index(self.relations[relation].src_type)


@dataclass(frozen=True)
class TypedSchema:
    """A typed canonical graph's types.json (module docstring), read back."""

    schema: GraphSchema
    counts: tuple[int, ...]
    feat_widths: tuple[int, ...]
    target: str | None
    relation_edges: tuple[int, ...] = ()
    id_kinds: tuple[str, ...] = ()

    @property
    def offsets(self) -> np.ndarray:
        """int64 [T + 1]: type t's global ids are offsets[t] .. offsets[t+1] - 1."""
        return np.concatenate([[0], np.cumsum(self.counts, dtype=np.int64)])

    def node_types_of(self, nodes: np.ndarray) -> np.ndarray:
        """int64: the type index of each global node id."""
        return np.searchsorted(self.offsets, np.asarray(nodes), side="right").astype(np.int64) - 1

    def to_json(self) -> dict:
        s = self.schema
        reverse = {r.key: None for r in s.relations}
        for r in s.relations:
            if r.name.startswith(REVERSE_PREFIX):
                given = Relation(r.dst_type, r.name[len(REVERSE_PREFIX) :], r.src_type)
                if given in s.relations:
                    reverse[r.key] = given.key
        return {
            "format_version": TYPES_FORMAT,
            "node_types": [
                {"name": t, "count": int(c), "offset": int(o), "feat_width": int(w), "id_kind": k}
                for t, c, o, w, k in zip(s.node_types, self.counts, self.offsets, self.feat_widths, self.id_kinds)
            ],
            "relations": [
                {"key": r.key, "edges": int(e), "reverse_of": reverse[r.key]}
                for r, e in zip(s.relations, self.relation_edges)
            ],
            "target": self.target,
        }

    @classmethod
    def from_json(cls, data: dict, where: str) -> "TypedSchema":
        """The schema of a types.json's content; ValueError naming `where` when it is malformed."""
        try:
            if data["format_version"] != TYPES_FORMAT:
                raise ValueError(f"format_version {data['format_version']!r}, this code reads {TYPES_FORMAT}")
            types = data["node_types"]
            schema = GraphSchema(
                tuple(str(t["name"]) for t in types), tuple(Relation.from_key(r["key"]) for r in data["relations"])
            )
            target = data["target"]
            if target is not None and target not in schema.node_types:
                raise ValueError(f"target {target!r} is not a node type")
            return cls(
                schema,
                tuple(int(t["count"]) for t in types),
                tuple(int(t["feat_width"]) for t in types),
                target,
                tuple(int(r["edges"]) for r in data["relations"]),
                tuple(str(t["id_kind"]) for t in types),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: not a typed graph's schema ({exc}); re-run canonical_graph") from None

    @classmethod
    def read(cls, folder: str | Path) -> "TypedSchema | None":
        """The schema in `folder`'s types.json, None when the folder holds no typed graph."""
        path = Path(folder) / TYPES_FILE
        if not path.exists():
            return None
        return cls.from_json(json.loads(path.read_text()), str(path))
