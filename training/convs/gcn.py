"""gcn: the graph convolution of Kipf & Welling, a weighted sum over Â's entries times the
sampler's correction (or, without edge weights, normalized by the block's degrees)."""

from __future__ import annotations

import torch
from torch import nn

from training.aggregate import Aggregating, per_row
from training.blocks import Block
from training.layer_registry import LayerKind, LayerOptions, register_layer

__all__ = ["Gcn", "GraphConv"]


class GraphConv(Aggregating):
    """GCN layer (Kipf & Welling) (= ``dgl.nn.GraphConv`` with ``allow_zero_in_degree=True``).

    ``norm="both"`` scales sources by ``out_degree^-1/2`` and destinations by
    ``in_degree^-1/2`` (degrees counted in the block, clamped at 1); ``"right"`` divides by
    the in-degree, ``"left"`` by the out-degree, ``"none"`` does neither. With
    ``edge_weight`` each message is also multiplied by its weight: pass the normalized
    adjacency weights with ``norm="none"`` to get ``Â x W``.
    """

    def __init__(
        self,
        in_feats: int,
        out_feats: int,
        norm: str = "both",
        weight: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        self.in_feats, self.out_feats, self.norm = in_feats, out_feats, _check_gcn_norm(norm)
        if weight:
            self.weight = nn.Parameter(torch.empty(in_feats, out_feats))
        else:
            self.register_parameter("weight", None)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_feats))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.xavier_uniform_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(
        self,
        block: Block,
        x: torch.Tensor,
        edge_weight: torch.Tensor | None = None,
        *,
        norm: str | None = None,
    ) -> torch.Tensor:
        """``norm`` overrides the module's normalization for this call."""
        norm = self.norm if norm is None else _check_gcn_norm(norm)
        if norm in ("left", "both"):
            deg = block.out_degrees().clamp(min=1).to(x.dtype)
            x = x * per_row(deg.rsqrt() if norm == "both" else deg.reciprocal(), x)
        # Multiply by W on the smaller side of the aggregation.
        if self.weight is not None and self.in_feats > self.out_feats:
            h = self.aggregate(block, x @ self.weight, "sum", edge_weight, lambda t: t @ self.weight)
        else:
            h = self.aggregate(block, x, "sum", edge_weight)
            if self.weight is not None:
                h = h @ self.weight
        if norm in ("right", "both"):
            deg = block.in_degrees().clamp(min=1).to(h.dtype)
            h = h * per_row(deg.rsqrt() if norm == "both" else deg.reciprocal(), h)
        if self.bias is not None:
            h = h + self.bias
        return h


def _check_gcn_norm(norm: str) -> str:
    if norm not in ("none", "both", "right", "left"):
        raise ValueError(f"GraphConv norm must be 'none', 'both', 'right' or 'left', got {norm!r}")
    return norm


@register_layer
class Gcn(LayerKind):
    """GCN over ``Â·c`` (· DropEdge's scale) with norm 'none'; with ``gcn_edge_weight`` off or no
    weights in the block, the block's degrees normalize it (norm 'both')."""

    name = "gcn"
    linear = True
    sums = True
    aggregates_by = "weighted sum"

    @classmethod
    def build(cls, d_in: int, d_out: int, last: bool, opts: LayerOptions) -> nn.Module:
        return GraphConv(d_in, d_out, norm="both")

    @classmethod
    def edge_weight(cls, block: Block, opts: LayerOptions, edge_scale: torch.Tensor | None = None):
        w = block.edge_weight if opts.gcn_edge_weight else None
        if w is None:
            return None
        c = block.correction
        w = w if c is None else w * c
        return w if edge_scale is None else w * edge_scale

    @classmethod
    def forward(cls, module: nn.Module, block: Block, h: torch.Tensor, weight, last: bool) -> torch.Tensor:
        if weight is not None:
            return module(block, h, edge_weight=weight, norm="none")
        return module(block, h)  # degree normalization over the (kept) edges: a mean, no scale

    @classmethod
    def compensation_problem(cls, cfg) -> str | None:
        if not cfg.gcn_edge_weight:
            return (
                "with model.conv='gcn' needs model.gcn_edge_weight: true (the control variate's full term "
                "is Â's rows; degree normalization over the sampled block has no such form)"
            )
        return None
