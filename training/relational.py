"""Any registered homogeneous layer type run once per relation of a typed graph, the relations'
outputs combined per destination node (= ``dgl.nn.HeteroGraphConv``).

For relation r, the layer type's module for r runs over `TypedBlock.relation_block(r)` (r's edges
over all the block's nodes), with the weights the layer type gives that block, and its output
counts for the destinations of r's destination type. A relation without edges in the block is
skipped, as DGL skips it. Across the relations into a node type the outputs are summed,
averaged or max-pooled (``combine``); a destination no relation reaches (none of its type's
relations has an edge in the block) gets zeros, where DGL leaves its type out of the output; so
does every destination of a block without edges.

A homogeneous module runs over every destination of the block, of every type, and the rows
of other types are dropped: simple, and R times the work of a destination-only pass, which
matters when many relations share a block.
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

    def forward(self, block: TypedBlock, x: torch.Tensor) -> torch.Tensor:
        if block.schema != self.schema:
            raise ValueError("the block's schema is not the one this layer was built for")
        out = reached = None
        for r, relation in enumerate(self.schema.relations):
            sub = block.relation_block(r)
            if sub.num_edges == 0:
                continue
            y = self.kind.forward(self.convs[relation.key], sub, x, self.kind.edge_weight(sub, self.opts), self.last)
            mine = block.dst_of_type(self.schema.dst_type_index(r)).view(-1, *([1] * (y.dim() - 1)))
            if out is None:
                out = torch.full_like(y, float("-inf")) if self.combine == "max" else torch.zeros_like(y)
                reached = torch.zeros(block.num_dst, dtype=y.dtype, device=y.device)
            if self.combine == "max":
                out = torch.where(mine, torch.maximum(out, y), out)
            else:
                out = out + torch.where(mine, y, torch.zeros_like(y))
            reached = reached + mine.view(-1).to(y.dtype)
        if out is None:  # no relation has an edge here: zeros, in the shape a layer gives
            first = self.schema.relations[0].key
            y = self.kind.forward(self.convs[first], block.relation_block(0), x, None, self.last)
            return torch.zeros_like(y)
        if self.combine == "mean":
            out = out / per_row(reached.clamp(min=1), out)
        elif self.combine == "max":
            out = torch.where(per_row(reached, out) > 0, out, torch.zeros_like(out))
        return out
