"""rgcn: the relational GCN of Schlichtkrull et al. (= ``dgl.nn.RelGraphConv``), with optional
basis decomposition of the relation weights.

``h_v = Σ_r Σ_{u ∈ N_r(v)} w_uv / (Σ_{u' ∈ N_r(v)} w_u'v) · x_u W_r + x_v W_0 + b``: a weighted
mean over each relation's in-edges (R-GCN's ``1/c_{v,r}``, with w the sampler's correction, times
Â's entries with ``model.edge_weights``), transformed by the relation's weight, summed over the
relations. With ``num_bases`` B < R, ``W_r = Σ_b a_rb V_b``. Over a :class:`TypedBlock` each
edge's relation comes from the block; over a plain block every edge is of one relation, so the
layer is ``x_v W_0 + mean_u x_u W_1 + b`` on a homogeneous graph.

Each relation's neighbours are averaged before the transform (``(Σ n_e x_u) W_r``, exact by
linearity): one sparse product over the block's rows per (destination, relation)
(`training.typed_blocks.TypedBlock.relation_rows`) gives every relation's mean, and one matrix
product with the stacked relation weights ``[R · in, out]`` transforms them, over the destinations
only, instead of over every edge as DGL's gather does. The parameter names are DGL's (``linear_r.W``, ``linear_r.coeff``,
``loop_weight``, ``h_bias``): a ``RelGraphConv`` state_dict loads into this module and back.
"""

from __future__ import annotations

import torch
from torch import nn

from training.aggregate import Aggregating, weighted_mean_weights
from training.blocks import Block
from training.layer_registry import LayerKind, LayerOptions, register_layer
from training.typed_blocks import TypedBlock

__all__ = ["RelGraphConv", "Rgcn", "TypedLinear"]


class TypedLinear(nn.Module):
    """One weight per relation, ``W [R, in, out]``, or with bases ``W [B, in, out]`` and
    ``coeff [R, B]`` (DGL's ``TypedLinear`` with regularizer ``basis``)."""

    def __init__(self, in_size: int, out_size: int, num_types: int, num_bases: int | None = None):
        super().__init__()
        self.in_size, self.out_size, self.num_types = in_size, out_size, num_types
        self.num_bases = num_bases if num_bases is not None and num_bases < num_types else None
        self.W = nn.Parameter(torch.empty(self.num_bases or num_types, in_size, out_size))
        self.coeff = nn.Parameter(torch.empty(num_types, self.num_bases)) if self.num_bases else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():  # DGL's: nn.Linear's bound on W, Xavier on the coefficients
            nn.init.uniform_(self.W, -1 / self.in_size**0.5, 1 / self.in_size**0.5)
            if self.coeff is not None:
                nn.init.xavier_uniform_(self.coeff, gain=nn.init.calculate_gain("relu"))

    def weights(self) -> torch.Tensor:
        """``[R, in, out]``: each relation's weight."""
        if self.coeff is None:
            return self.W
        return (self.coeff @ self.W.view(self.num_bases, -1)).view(self.num_types, self.in_size, self.out_size)


class RelGraphConv(Aggregating):
    """R-GCN over a :class:`TypedBlock` (or a plain block: one relation); see the module docstring."""

    def __init__(
        self,
        in_feat: int,
        out_feat: int,
        num_rels: int,
        num_bases: int | None = None,
        bias: bool = True,
        self_loop: bool = True,
    ):
        super().__init__()
        self.linear_r = TypedLinear(in_feat, out_feat, num_rels, num_bases)
        self.h_bias = nn.Parameter(torch.zeros(out_feat)) if bias else None
        self.loop_weight = None
        if self_loop:
            self.loop_weight = nn.Parameter(torch.empty(in_feat, out_feat))
            nn.init.xavier_uniform_(self.loop_weight, gain=nn.init.calculate_gain("relu"))

    def forward(self, block: Block | TypedBlock, x: torch.Tensor, edge_weight: torch.Tensor | None = None):
        """`edge_weight [num_edges]`: each edge's weight in its relation's weighted mean (None: 1)."""
        rels = self.linear_r.num_types
        if isinstance(block, TypedBlock):
            if len(block.schema.relations) != rels:
                raise ValueError(
                    f"rgcn was built for {rels} relations; the block's schema has {len(block.schema.relations)}"
                )
            rows, perm = block.relation_rows()
        else:
            if rels != 1:
                raise ValueError(f"rgcn was built for {rels} relations but was given a block without relation types")
            rows, perm = block, None
        w_all = self.linear_r.weights()  # [R, in, out]
        w = edge_weight if edge_weight is None or perm is None else edge_weight[perm]
        if w is not None:
            w = weighted_mean_weights(rows, w)
        # every relation's mean at once ([num_dst * R, in]), then one product with the stacked weights
        agg = self.aggregate(rows, x, "mean", w).reshape(block.num_dst, rels * x.shape[1])
        h = agg @ w_all.reshape(rels * x.shape[1], w_all.shape[2])
        if self.h_bias is not None:
            h = h + self.h_bias
        if self.loop_weight is not None:
            h = h + x[: block.num_dst] @ self.loop_weight
        return h


@register_layer
class Rgcn(LayerKind):
    """R-GCN: a weighted mean per relation, one weight (or basis mix) per relation, a self loop."""

    name = "rgcn"
    linear = True
    relational = True
    aggregates_by = "mean per relation"

    @classmethod
    def build(cls, d_in: int, d_out: int, last: bool, opts: LayerOptions) -> nn.Module:
        return RelGraphConv(d_in, d_out, opts.relations, opts.num_bases or None)

    @classmethod
    def compensation_problem(cls, cfg) -> str | None:
        return "aggregates each relation apart, which its history of one aggregate per layer does not hold"
