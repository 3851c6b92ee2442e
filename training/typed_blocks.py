"""Typed message-flow blocks: a :class:`~training.blocks.Block` whose nodes have types and whose
edges have relations, in one homogeneous id space (as DGL stores a heterogeneous graph
underneath, and as ``dgl.nn.RelGraphConv`` reads one).

- :class:`Relation` and :class:`GraphSchema` (`graphs.formats.graph_schema`) name the node types
  and relations; an index is a position in the schema's tuples.
- :class:`TypedBlock` is a block plus ``etypes`` (each edge's relation index) and ``src_types``
  (each source node's type index), and optionally ``src_nodes`` (their global ids, which a node
  type without features needs to look up its learned vectors). The destination nodes are the first ``num_dst`` source
  nodes, as in every block, so ``src_types[:num_dst]`` are the destinations' types. Every edge
  of relation r leaves a node of r's source type and enters one of r's destination type.

Views built once per block and shared by every layer that runs over it: `relation_block` (one
relation's edges over the same sources and destinations), `relation_subgraph` (one relation's
edges over its destination type's rows and the sources they read: what `training.relational` runs
a homogeneous layer on) and `relation_rows` (every edge as a row per (destination, relation): what
R-GCN aggregates in one product). Nothing here imports DGL.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import numpy as np
import torch

from graphs.formats.graph_schema import GraphSchema, Relation, TypedSchema
from training.blocks import Block, correction_is_per_dst, mask_edges

__all__ = ["GraphSchema", "Relation", "TypedBlock", "typed_blocks", "typed_schema"]


@dataclass(eq=False)  # identity equality, as a Block's
class TypedBlock:
    """A block with node types and edge relations (see the module docstring)."""

    block: Block
    etypes: torch.Tensor  # int64 [num_edges]: each edge's relation index in schema.relations
    src_types: torch.Tensor  # int64 [num_src]: each source node's type index in schema.node_types
    schema: GraphSchema
    src_nodes: torch.Tensor | None = None  # int64 [num_src]: global ids, where learned node vectors need them
    check: InitVar[bool] = True  # False: the types are known to fit (read from checked shards)
    _by_relation: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self, check: bool = True) -> None:
        if self.etypes.dtype != torch.int64 or self.src_types.dtype != torch.int64:
            raise TypeError(f"etypes and src_types must be int64, got {self.etypes.dtype} and {self.src_types.dtype}")
        if self.etypes.shape != (self.block.num_edges,):
            raise ValueError(f"etypes has shape {list(self.etypes.shape)}; the block has {self.block.num_edges} edges")
        if self.src_types.shape != (self.block.num_src,):
            raise ValueError(
                f"src_types has shape {list(self.src_types.shape)}; the block has {self.block.num_src} source nodes"
            )
        if self.src_nodes is not None and self.src_nodes.shape != (self.block.num_src,):
            raise ValueError(f"src_nodes has shape {list(self.src_nodes.shape)}; the block has {self.block.num_src}")
        if check and self.etypes.device.type == "cpu":  # the checks below read values: no device sync
            self._check_types()

    def _check_types(self) -> None:
        rels, types = len(self.schema.relations), len(self.schema.node_types)
        if self.etypes.numel() and not (0 <= int(self.etypes.min()) and int(self.etypes.max()) < rels):
            raise ValueError(f"etypes must lie in [0, {rels}) (the schema's relations)")
        if self.src_types.numel() and not (0 <= int(self.src_types.min()) and int(self.src_types.max()) < types):
            raise ValueError(f"src_types must lie in [0, {types}) (the schema's node types)")
        src_of = torch.tensor([self.schema.src_type_index(r) for r in range(rels)])
        dst_of = torch.tensor([self.schema.dst_type_index(r) for r in range(rels)])
        wrong_src = self.src_types[self.block.indices] != src_of[self.etypes]
        wrong_dst = self.dst_types[self.block.dst_ids()] != dst_of[self.etypes]
        for wrong, end in ((wrong_src, "source"), (wrong_dst, "destination")):
            if bool(wrong.any()):
                e = int(wrong.nonzero()[0, 0])
                rel = self.schema.relations[int(self.etypes[e])]
                raise ValueError(
                    f"edge {e} of relation {rel.key!r} has a {end} node of another type than the relation's"
                )

    @property
    def num_src(self) -> int:
        return self.block.num_src

    @property
    def num_dst(self) -> int:
        return self.block.num_dst

    @property
    def dst_types(self) -> torch.Tensor:
        """int64 ``[num_dst]``: each destination node's type index."""
        return self.src_types[: self.block.num_dst]

    def to(self, device, non_blocking: bool = False) -> "TypedBlock":
        """The same typed block on ``device`` (``self`` when already there)."""
        block = self.block.to(device, non_blocking)
        if block is self.block:
            return self
        etypes, src_types = (t.to(device, non_blocking=non_blocking) for t in (self.etypes, self.src_types))
        nodes = None if self.src_nodes is None else self.src_nodes.to(device, non_blocking=non_blocking)
        return TypedBlock(block, etypes, src_types, self.schema, nodes, check=False)

    def relation_mask(self, relation: int) -> torch.Tensor:
        """bool ``[num_edges]``: the edges of relation `relation`, built once."""
        got = self._by_relation.get(("mask", relation))
        if got is None:
            got = self._by_relation[("mask", relation)] = self.etypes == relation
        return got

    def relation_edges(self, relation: int) -> torch.Tensor:
        """int64: the positions of relation `relation`'s edges, ascending; one stable sort of the
        block's relations serves every relation."""
        got = self._by_relation.get("grouped")
        if got is None:
            if self.etypes.device.type == "cpu" and len(self.schema.relations) <= 1 << 15:
                order = torch.from_numpy(np.argsort(self.etypes.numpy().astype(np.int16), kind="stable"))  # radix
            else:
                order = torch.sort(self.etypes, stable=True)[1]
            got = self._by_relation["grouped"] = (order, np.concatenate([[0], np.cumsum(self.relation_counts())]))
        order, bounds = got
        return order[int(bounds[relation]) : int(bounds[relation + 1])]

    def relation_counts(self) -> list[int]:
        """The number of edges of each relation in the block, built once."""
        got = self._by_relation.get("counts")
        if got is None:
            got = self._by_relation["counts"] = torch.bincount(
                self.etypes, minlength=len(self.schema.relations)
            ).tolist()
        return got

    def relation_block(self, relation: int) -> Block:
        """The block of relation `relation`'s edges over all source and destination nodes (each
        edge's weight and correction kept, in the block's order), built once."""
        got = self._by_relation.get(relation)
        if got is None:
            got = self._by_relation[relation] = mask_edges(self.block, self.relation_mask(relation))
        return got

    def relation_subgraph(self, relation: int) -> tuple[torch.Tensor, torch.Tensor, Block]:
        """(rows, nodes, block) of relation `relation` over its destination type only: ``rows``
        the destinations of that type (ascending positions among the block's destinations),
        ``nodes`` the sources the relation reads (``rows`` first, then the other sources of its
        edges, ascending), ``block`` its edges in CSC over ``rows`` with sources indexing
        ``nodes`` (each edge's weight and correction kept). A layer run over it on ``x[nodes]``
        gives the rows of ``rows``; built once and shared by the layers."""
        key = ("sub", relation)
        got = self._by_relation.get(key)
        if got is None:
            rows = self.dst_of_type(self.schema.dst_type_index(relation)).nonzero().view(-1)
            keep = self.relation_edges(relation)
            src, dst = self.block.indices.index_select(0, keep), self.block.dst_ids().index_select(0, keep)
            local = torch.full((self.num_src,), -1, dtype=torch.int64, device=rows.device)
            local[rows] = torch.arange(rows.numel(), device=rows.device)
            dst_local = local[dst]
            wanted = torch.zeros(self.num_src, dtype=torch.bool, device=rows.device)
            wanted[src] = True
            wanted[rows] = False
            others = wanted.nonzero().view(-1)  # the edges' other sources, ascending (no sort)
            local[others] = torch.arange(rows.numel(), rows.numel() + others.numel(), device=rows.device)
            nodes = torch.cat([rows, others])
            indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=rows.device)
            torch.cumsum(torch.bincount(dst_local, minlength=rows.numel()), 0, out=indptr[1:])
            b = self.block
            weight = None if b.edge_weight is None else b.edge_weight.index_select(0, keep)
            correction = None if b.correction is None else b.correction.index_select(0, keep)
            # draws per relation give each (destination, relation) one correction: per destination here
            # (checked on the host; a layer then skips a correction that cancels, as SAGE's mean does)
            per_dst = b.correction_per_dst or (
                correction is not None
                and correction.device.type == "cpu"
                and correction_is_per_dst(indptr.numpy(), correction.numpy())
            )
            sub = Block(indptr, local[src], nodes.numel(), rows.numel(), weight, correction, per_dst)
            got = self._by_relation[key] = (rows, nodes, sub)
        return got

    def relation_rows(self) -> tuple[Block, torch.Tensor | None]:
        """(rows, perm): the block's edges as rows per (destination, relation), row
        ``v * R + r`` holding v's in-edges of relation r, over the same sources; ``perm`` the
        edges' order in it (None when the block's edges are already sorted by destination, then
        relation, as the shards store them). One sparse product over it aggregates every relation
        at once; built once and shared by the layers."""
        got = self._by_relation.get("rows")
        if got is None:
            rels = len(self.schema.relations)
            key = self.block.dst_ids() * rels + self.etypes
            perm = None
            if key.numel() > 1 and bool((key[1:] < key[:-1]).any()):
                key, perm = torch.sort(key, stable=True)
            counts = torch.bincount(key, minlength=self.num_dst * rels)
            indptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
            indices = self.block.indices if perm is None else self.block.indices[perm]
            rows = Block(indptr, indices, self.num_src, self.num_dst * rels, dst_in_src=False)
            got = self._by_relation["rows"] = (rows, perm)
        return got

    def dst_of_type(self, node_type: int) -> torch.Tensor:
        """bool ``[num_dst]``: the destinations of type index `node_type`."""
        return self.dst_types == node_type


def typed_schema(manifest: dict) -> TypedSchema | None:
    """The typed schema a shard manifest carries (``typed``), None for an untyped graph."""
    doc = manifest.get("typed")
    return None if doc is None else TypedSchema.from_json(doc, "the shard manifest's typed schema")


def typed_blocks(
    blocks: list[Block], etypes: list[torch.Tensor], node_types: torch.Tensor, input_nodes: torch.Tensor, schema
) -> list[TypedBlock]:
    """A minibatch's blocks as typed blocks: block l's sources are the first ``num_src`` input
    nodes, so their types and ids are prefixes of `node_types` and `input_nodes`."""
    return [
        TypedBlock(b, e, node_types[: b.num_src], schema, input_nodes[: b.num_src], check=False)
        for b, e in zip(blocks, etypes)
    ]
