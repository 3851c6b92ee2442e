"""gat: graph attention, a softmax over each destination's in-edges (no unbiased form over a
non-uniform draw); hidden layers concatenate ``heads`` heads of ``hidden / heads`` features."""

from __future__ import annotations

import torch
from torch import nn

from training.aggregate import Aggregating, aggregate, edge_scores, edge_softmax
from training.blocks import Block
from training.dropout import Dropout
from training.layer_registry import LayerKind, LayerOptions, register_layer

__all__ = ["GATConv", "Gat"]


class GATConv(Aggregating):
    """Graph attention (Veličković et al.) (= ``dgl.nn.GATConv``, ``allow_zero_in_degree=True``).

    Returns ``[num_dst, num_heads, out_feats]``. Attention logits
    ``leaky_relu(a_l·Wx_u + a_r·Wx_v)`` are softmax-normalised over each destination's
    in-edges (:func:`training.aggregate.edge_softmax`), optionally multiplied by
    ``edge_weight``, and used as the aggregation weights.
    """

    def __init__(
        self,
        in_feats: int,
        out_feats: int,
        num_heads: int,
        feat_drop: float = 0.0,
        attn_drop: float = 0.0,
        negative_slope: float = 0.2,
        residual: bool = False,
        bias: bool = True,
    ):
        super().__init__()
        self.in_feats, self.out_feats, self.num_heads = in_feats, out_feats, num_heads
        self.fc = nn.Linear(in_feats, out_feats * num_heads, bias=False)
        self.attn_l = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.attn_r = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.feat_drop = Dropout(feat_drop)
        self.attn_drop = Dropout(attn_drop)
        self.leaky_relu = nn.LeakyReLU(negative_slope)
        # Same attribute layout as DGL: a linear residual carries the bias when present.
        self.has_linear_res = residual and in_feats != out_feats * num_heads
        if not residual:
            self.register_buffer("res_fc", None)
        elif self.has_linear_res:
            self.res_fc = nn.Linear(in_feats, num_heads * out_feats, bias=bias)
        else:
            self.res_fc = nn.Identity()
        if bias and not self.has_linear_res:
            self.bias = nn.Parameter(torch.empty(num_heads * out_feats))
        else:
            self.register_buffer("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_normal_(self.fc.weight, gain=gain)
        nn.init.xavier_normal_(self.attn_l, gain=gain)
        nn.init.xavier_normal_(self.attn_r, gain=gain)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        if isinstance(self.res_fc, nn.Linear):
            nn.init.xavier_normal_(self.res_fc.weight, gain=gain)
            if self.res_fc.bias is not None:
                nn.init.zeros_(self.res_fc.bias)

    def attention_halves(self, h: torch.Tensor, num_dst: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``a_l·Wh_u`` of every source ``[num_src, heads]`` and ``a_r·Wh_v`` of every destination
        ``[num_dst, heads]``, as ``h @ (Wᵀa)``: one narrow product with the attention vectors folded
        into the weight, instead of an element-wise product and sum over ``Wh`` (and their backward)
        at the width of all heads."""
        heads, out = self.num_heads, self.out_feats
        w = self.fc.weight.view(heads, out, -1)  # [heads, out, in]
        folded = torch.cat([(w * self.attn_l.view(heads, out, 1)).sum(1), (w * self.attn_r.view(heads, out, 1)).sum(1)])
        lr = h @ folded.t()  # [num_src, 2 * heads]
        return lr[:, :heads], lr[:num_dst, heads:]

    def forward(self, block: Block, x: torch.Tensor, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        num_dst, heads, out = block.num_dst, self.num_heads, self.out_feats
        h = self.feat_drop(x)
        ft = self.fc(h).view(-1, heads, out)
        el, er = self.attention_halves(h, num_dst)
        scores = self.leaky_relu(edge_scores(block, el, er, self.aggregation))  # [E, heads]
        attn = self.attn_drop(edge_softmax(block, scores, self.aggregation))
        if edge_weight is not None:
            attn = attn * edge_weight.view(-1, 1)
        rst = aggregate(block, ft, reduce="sum", edge_weight=attn, backend=self.aggregation)  # [num_dst, heads, out]
        if self.res_fc is not None:
            rst = rst + self.res_fc(h[:num_dst]).view(num_dst, -1, out)
        if self.bias is not None:
            rst = rst + self.bias.view(1, heads, out)
        return rst


@register_layer
class Gat(LayerKind):
    """GAT without the sampler's correction; heads averaged in the output layer."""

    name = "gat"
    linear = False
    aggregates_by = "softmax attention"

    @classmethod
    def check(cls, cfg) -> None:
        if cfg.num_layers != 1 and cfg.hidden % cfg.heads:
            raise ValueError(
                f"model.hidden={cfg.hidden} must be divisible by model.heads={cfg.heads} "
                "for conv='gat' (each head gets hidden / heads features)"
            )

    @classmethod
    def build(cls, d_in: int, d_out: int, last: bool, opts: LayerOptions) -> nn.Module:
        heads = 1 if last else opts.heads
        if d_out % heads:
            raise ValueError(f"GAT hidden={d_out} must be divisible by heads={heads}")
        return GATConv(d_in, d_out // heads, heads, attn_drop=opts.attn_dropout)

    @classmethod
    def edge_weight(cls, block: Block, opts: LayerOptions, edge_scale: torch.Tensor | None = None):
        return None

    @classmethod
    def forward(cls, module: nn.Module, block: Block, h: torch.Tensor, weight, last: bool) -> torch.Tensor:
        out = module(block, h)  # [num_dst, heads, out]
        return out.mean(1) if last else out.flatten(1)
