"""Any registered homogeneous layer type run once per relation of a typed graph, the relations'
outputs combined per destination node (= ``dgl.nn.HeteroGraphConv``).

For relation r, the layer type's module for r runs over `TypedBlock.relation_subgraph(r)` (r's
edges over the destinations of r's destination type and the sources those edges read), with the
weights the layer type gives that block, and its output goes to those destinations. A relation without edges in the block is
skipped, as DGL skips it. Across the relations into a node type the outputs are summed,
averaged or max-pooled (``combine``); a destination no relation reaches (none of its type's
relations has an edge in the block) gets zeros, where DGL leaves its type out of the output; so
does every destination of a block without edges.

Each module runs over its destination type's rows only, as `HeteroGraphConv` runs each
relation's module on the relation's destination type. A layer type with a form that computes
every relation at once (`LayerKind.per_relation`, e.g. SAGE-mean summed or averaged) runs that
instead, with the same result.
"""

from __future__ import annotations

import torch
from torch import nn

from training.aggregate import per_row
from training.layer_registry import LayerKind, LayerOptions
from training.typed_blocks import GraphSchema, TypedBlock

__all__ = ["COMBINES", "RelationalConv"]

COMBINES = ("sum", "mean", "max")


class RelationalConv(nn.Module):
    """One `kind` layer per relation of `schema` (``convs[relation.key]``), combined by `combine`."""

    def __init__(
        self,
        kind: type[LayerKind],
        schema: GraphSchema,
        d_in: int,
        d_out: int,
        last: bool,
        opts: LayerOptions,
        combine: str = "sum",
    ):
        super().__init__()
        if combine not in COMBINES:
            raise ValueError(f"relations are combined by one of {COMBINES}, got {combine!r}")
        self.kind, self.schema, self.last, self.opts, self.combine = kind, schema, last, opts, combine
        self.convs = nn.ModuleDict({r.key: kind.build(d_in, d_out, last, opts) for r in schema.relations})
        self.fused = True  # the layer type's all-relations-at-once form where it has one (`LayerKind.per_relation`)

    def forward(self, block: TypedBlock, x: torch.Tensor) -> torch.Tensor:
        if block.schema != self.schema:
            raise ValueError("the block's schema is not the one this layer was built for")
        if self.fused:
            out = self.kind.per_relation(self.convs, block, x, self.opts, self.combine)
            if out is not None:
                return out
        out = reached = None
        for r, relation in enumerate(self.schema.relations):
            rows, nodes, sub = block.relation_subgraph(r)
            if sub.num_edges == 0:
                continue
            weight = self.kind.edge_weight(sub, self.opts)
            y = self.kind.forward(self.convs[relation.key], sub, x.index_select(0, nodes), weight, self.last)
            if out is None:
                shape = (block.num_dst, *y.shape[1:])
                out = y.new_full(shape, float("-inf")) if self.combine == "max" else y.new_zeros(shape)
                reached = y.new_zeros(block.num_dst)
            if self.combine == "max":
                out = out.index_copy(0, rows, torch.maximum(out[rows], y))
            else:
                out = out.index_add(0, rows, y)
            reached = reached.index_add(0, rows, torch.ones_like(rows, dtype=y.dtype))
        if out is None:  # no relation has an edge here: zeros, in the shape a layer gives
            first = self.schema.relations[0].key
            y = self.kind.forward(self.convs[first], block.relation_block(0), x, None, self.last)
            return torch.zeros_like(y)
        if self.combine == "mean":
            out = out / per_row(reached.clamp(min=1), out)
        elif self.combine == "max":
            out = torch.where(per_row(reached, out) > 0, out, torch.zeros_like(out))
        return out
