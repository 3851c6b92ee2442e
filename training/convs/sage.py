"""sage and sage_pool: GraphSAGE with a mean (linear: takes the sampler's correction as a
weighted mean) or a max-pool aggregator (no unbiased form over a non-uniform draw)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from training.aggregate import Aggregating, weighted_mean_weights, with_dst_rows
from training.blocks import Block, correction_is_per_dst
from training.layer_registry import LayerKind, LayerOptions, register_layer

__all__ = ["SAGEConv", "Sage", "SagePool"]


class SAGEConv(Aggregating):
    """GraphSAGE: ``fc_self(x_v) + fc_neigh(reduce_{u->v} x_u)`` (= ``dgl.nn.SAGEConv``).

    ``aggregator="mean"`` averages the neighbours; ``"pool"`` takes the element-wise max of
    ``relu(fc_pool(x_u))``. For mean with ``in_feats > out_feats``, ``fc_neigh`` is applied
    before aggregating (same result, fewer features to move), as DGL does.
    """

    def __init__(self, in_feats: int, out_feats: int, aggregator: str = "mean", bias: bool = True):
        super().__init__()
        if aggregator not in ("mean", "pool"):
            raise ValueError(f"SAGEConv aggregator must be 'mean' or 'pool', got {aggregator!r}")
        self.in_feats, self.out_feats, self.aggregator = in_feats, out_feats, aggregator
        if aggregator == "pool":
            self.fc_pool = nn.Linear(in_feats, in_feats)
        self.fc_neigh = nn.Linear(in_feats, out_feats, bias=False)
        self.fc_self = nn.Linear(in_feats, out_feats, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        gain = nn.init.calculate_gain("relu")
        if self.aggregator == "pool":
            nn.init.xavier_uniform_(self.fc_pool.weight, gain=gain)
        nn.init.xavier_uniform_(self.fc_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.fc_neigh.weight, gain=gain)

    def forward(self, block: Block, x: torch.Tensor, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        # fc_self(x_v) + fc_neigh(reduced) as products accumulating into one output, not a third
        # pass adding two [num_dst, out] tensors
        x, x_dst = with_dst_rows(x, block.num_dst)
        if self.in_feats > self.out_feats and self.aggregator == "mean":
            h_neigh = self.aggregate(block, self.fc_neigh(x), "mean", edge_weight, self.fc_neigh)
            out = torch.addmm(h_neigh, x_dst, self.fc_self.weight.t())
            return out if self.fc_self.bias is None else out.add_(self.fc_self.bias)
        if self.aggregator == "pool":
            reduced = self.aggregate(block, F.relu(self.fc_pool(x)), "max", edge_weight)
        else:
            reduced = self.aggregate(block, x, "mean", edge_weight)
        return torch.addmm(F.linear(reduced, self.fc_neigh.weight, self.fc_self.bias), x_dst, self.fc_self.weight.t())


@register_layer
class Sage(LayerKind):
    """GraphSAGE-mean: the c-weighted mean ``Σ c x / Σ c`` (c · Â with ``edge_weights``)."""

    name = "sage"
    linear = True
    aggregates_by = "mean"

    @classmethod
    def build(cls, d_in: int, d_out: int, last: bool, opts: LayerOptions) -> nn.Module:
        return SAGEConv(d_in, d_out, "mean")

    @classmethod
    def edge_weight(cls, block: Block, opts: LayerOptions, edge_scale: torch.Tensor | None = None):
        """A weighted mean through `weighted_mean_weights`; None for a plain mean. A correction
        that is one value per destination (``block.correction_per_dst``) cancels and is left out."""
        base = block.edge_weight if opts.edge_weights else None
        c = None if block.correction_per_dst else block.correction
        if c is not None:
            base = c if base is None else base * c
        return None if base is None else weighted_mean_weights(block, base)

    @classmethod
    def per_relation(cls, modules: dict, block, h: torch.Tensor, opts: LayerOptions, combine: str):
        """SAGE-mean per relation, summed or averaged (``dgl.nn.HeteroGraphConv`` of ``SAGEConv``),
        by linearity as R-GCN computes it: one product of every (destination, relation)'s mean
        with the stacked ``fc_neigh`` weights, plus per destination type the ``fc_self`` weights
        and biases of the relations into it that have edges in the block. None (run relation by
        relation) for "max" or under VR-GCN's control variate."""
        convs = list(modules.values())
        if combine not in ("sum", "mean") or any(c.control_variate is not None for c in convs):
            return None
        schema, inner = block.schema, block.block
        rows, perm = block.relation_rows()
        w_e = inner.edge_weight if opts.edge_weights else None
        c = None if inner.correction_per_dst else inner.correction
        if perm is not None:
            w_e, c = (None if t is None else t[perm] for t in (w_e, c))
        if c is not None and c.device.type == "cpu" and correction_is_per_dst(rows.indptr.numpy(), c.numpy()):
            c = None  # one correction per (destination, relation) cancels in its mean
        base = c if w_e is None else (w_e if c is None else w_e * c)
        w = None if base is None else weighted_mean_weights(rows, base)
        rels, width = len(schema.relations), h.shape[1]
        agg = convs[0].aggregate(rows, h, "mean", w).reshape(block.num_dst, rels * width)
        out = agg @ torch.cat([conv.fc_neigh.weight.t() for conv in convs])
        has_edges = [count > 0 for count in block.relation_counts()]
        reached = torch.zeros(block.num_dst, dtype=out.dtype, device=out.device) if combine == "mean" else None
        for t in range(len(schema.node_types)):
            into = [r for r in range(rels) if has_edges[r] and schema.dst_type_index(r) == t]
            if not into:
                continue
            dst = block.dst_of_type(t).nonzero().view(-1)
            weight = sum(convs[r].fc_self.weight for r in into)
            bias = sum(convs[r].fc_self.bias for r in into) if convs[0].fc_self.bias is not None else None
            out = out.index_add(0, dst, F.linear(h.index_select(0, dst), weight, bias))
            if reached is not None:
                reached[dst] = len(into)
        return out if reached is None else out / reached.clamp(min=1).unsqueeze(1)


@register_layer
class SagePool(LayerKind):
    """GraphSAGE-pool: the element-wise max of ``relu(fc_pool(x_u))``; Â's weights with
    ``edge_weights``, no sampling correction (a max has no unbiased form)."""

    name = "sage_pool"
    linear = False
    aggregates_by = "max"

    @classmethod
    def build(cls, d_in: int, d_out: int, last: bool, opts: LayerOptions) -> nn.Module:
        return SAGEConv(d_in, d_out, "pool")

    @classmethod
    def edge_weight(cls, block: Block, opts: LayerOptions, edge_scale: torch.Tensor | None = None):
        w = block.edge_weight if opts.edge_weights else None
        return None if w is None else weighted_mean_weights(block, w)
