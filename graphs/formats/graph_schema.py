"""The names of a typed graph: its node types and relations (canonical edge types), in one order.

- `Relation` is one canonical edge type ``(src_type, name, dst_type)``; its ``key`` is
  ``src_type__name__dst_type``, the name of its landing file (``edges/<key>.parquet``) and of the
  relation in every stage's files.
- `GraphSchema` is the node types and the relations, in a fixed order: a node type's index and a
  relation's index are positions in these tuples (the ingest, `graphs.stages.typed_graph`, orders
  both by name, reverse relations after the given ones).

Names are checked wherever they come from (a landing file's name, a stage's types.json, a model
file): 1-64 letters, digits, ``_`` or ``-``, starting with a letter, never ``__``, so a name is
safe in a path and a key splits back into its three parts. Pure Python: the writer (`graphs/`)
and the reader (`training/`, without DGL) share it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["GraphSchema", "Relation", "check_type_name"]

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
