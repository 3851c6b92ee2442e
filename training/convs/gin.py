"""gin: the graph isomorphism layer, a sum scaled by the sampler's correction (a weighted sum
over Â's entries with ``edge_weights``)."""

from __future__ import annotations

import torch
from torch import nn

from training.aggregate import Aggregating
from training.blocks import Block
from training.layer_registry import LayerKind, LayerOptions, register_layer

__all__ = ["GINConv", "Gin"]


class GINConv(Aggregating):
    """Graph isomorphism layer: ``apply_func((1 + eps) x_v + reduce_{u->v} x_u``).

    Equals ``dgl.nn.GINConv(apply_func, aggregator, init_eps, learn_eps)``. The default
    ``apply_func`` is the MLP ``Linear(in, out) -> ReLU -> Linear(out, out)``.
    """

    def __init__(
        self,
        in_feats: int,
        out_feats: int,
        aggregator: str = "sum",
        learn_eps: bool = False,
        init_eps: float = 0.0,
        apply_func: nn.Module | None = None,
    ):
        super().__init__()
        if aggregator not in ("sum", "mean", "max"):
            raise ValueError(f"GINConv aggregator must be sum, mean or max, got {aggregator!r}")
        self.aggregator = aggregator
        self.apply_func = apply_func or nn.Sequential(
            nn.Linear(in_feats, out_feats), nn.ReLU(), nn.Linear(out_feats, out_feats)
        )
        if learn_eps:
            self.eps = nn.Parameter(torch.tensor([float(init_eps)]))
        else:
            self.register_buffer("eps", torch.tensor([float(init_eps)]))

    def forward(self, block: Block, x: torch.Tensor, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        neigh = self.aggregate(block, x, self.aggregator, edge_weight)
        return self.apply_func((1 + self.eps) * x[: block.num_dst] + neigh)


@register_layer
class Gin(LayerKind):
    """GIN with the default MLP; the correction c (· Â with ``edge_weights``) (· DropEdge's scale)."""

    name = "gin"
    linear = True
    sums = True
    own_term = True
    aggregates_by = "sum"

    @classmethod
    def build(cls, d_in: int, d_out: int, last: bool, opts: LayerOptions) -> nn.Module:
        return GINConv(d_in, d_out)
