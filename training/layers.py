"""GNN layers and the node-classification model, in plain torch over :class:`Block`.

The layers compute exactly what DGL's ``SAGEConv``, ``GraphConv``, ``GATConv`` and
``GINConv`` compute, with the same parameter names (a DGL module's ``state_dict`` loads
into ours and back), but read the CSC arrays of a :class:`~training.blocks.Block`
instead of a ``DGLGraph``, so training runs where DGL is not installed and on GPUs the
CPU-only PyPI DGL wheel cannot use. ``tests/test_layers.py`` checks each one against DGL
to 1e-5, and ``tests/test_layers_pyg.py`` SAGE, GCN, GAT and GIN against PyG (with `make peers`). All neighbour reductions go through :func:`training.aggregate.aggregate`.

Each layer's ``forward(block, x)`` takes the features of the block's *source* nodes
``[num_src, F]`` and returns those of its destination nodes; the destination nodes are
the first ``num_dst`` source nodes, so a layer reads their own features as
``x[:num_dst]``.

Edge weights: a sampled block carries Â's entries (``edge_weight``) and, apart, the
sampler's correction (``correction``); :func:`sampled_edge_weight` applies both per layer
type: GCN aggregates ``Â·c``, GIN scales its sum by ``c``, SAGE-mean takes the c-weighted
mean ``Σ c x / Σ c`` (:func:`weighted_mean_weights`; a per-row factor such as uniform
neighbour rescaling cancels), so each is the full-neighbourhood aggregation in expectation.
With ``ModelConfig.edge_weights`` SAGE and GIN also weigh by Â's entries (``w = Â·c``): SAGE
the weighted mean ``Σ w x / Σ w``, GIN the weighted sum (an unbiased estimate of ``(Â x)_v``).
On a weighted graph Â carries the edge weight.

:class:`GNN` stacks layers: ``forward(blocks, x)`` over sampled blocks (one per layer)
for training, ``inference(full_block, x)`` layer by layer over the whole graph for
evaluation. Build it from a :class:`ModelConfig` with :func:`build_model`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from graphs.config_checks import MAX_LAYERS, MAX_WIDTH, bounded_repr, check_fields, help_text
from training.aggregate import aggregate, edge_softmax
from training.blocks import Block, drop_edge_scale, drop_edges, slice_dst

__all__ = [
    "Aggregating",
    "CONVS",
    "GATConv",
    "GINConv",
    "GNN",
    "GraphConv",
    "ModelConfig",
    "NORMS",
    "SAGEConv",
    "build_model",
    "sampled_edge_weight",
    "weighted_mean_weights",
    "use_aggregation",
]

CONVS = ("sage", "sage_pool", "gcn", "gat", "gin")
NORMS = ("batch", "layer")


def _per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values [N]`` shaped to broadcast over the rows of ``like [N, ...]``."""
    return values.to(like.dtype).view(-1, *([1] * (like.dim() - 1)))


def weighted_mean_weights(block: Block, edge_weight: torch.Tensor) -> torch.Tensor:
    """Per-edge multipliers that turn a mean (sum / in-degree) into the weighted mean
    ``Σ w x / Σ w`` of each destination: ``w_vu · deg(v) / Σ_u w_vu`` (0 where a row's weights sum to 0)."""
    dst = block.dst_ids()
    w = edge_weight.to(torch.float32 if edge_weight.dtype in (torch.float16, torch.bfloat16) else edge_weight.dtype)
    row_sum = torch.zeros(block.num_dst, dtype=w.dtype, device=w.device).index_add_(0, dst, w)
    scale = torch.where(row_sum > 0, block.in_degrees().to(w.dtype) / row_sum, torch.zeros_like(row_sum))
    return w * scale[dst]


class Aggregating(nn.Module):
    """A layer that aggregates over a block: ``aggregation`` is the `training.aggregate`
    backend its aggregations use ("auto", "torch" or "dgl"; see `use_aggregation`)."""

    aggregation: str = "auto"
    # set for one training forward pass by `training.compensation.VRGCN.attach`: a callable
    # that replaces `aggregate` (VR-GCN's control variate); None = plain aggregation
    control_variate = None

    def aggregate(
        self, block: Block, x: torch.Tensor, reduce: str, edge_weight: torch.Tensor | None, transform=None
    ) -> torch.Tensor:
        """`training.aggregate.aggregate` with this layer's backend (or its control variate, when
        set). ``transform``: the linear map the layer applied to its input to get ``x`` (None: x is
        the input), which the control variate applies to the input without dropout."""
        if self.control_variate is not None:
            return self.control_variate(block, x, reduce, edge_weight, self.aggregation, transform)
        return aggregate(block, x, reduce=reduce, edge_weight=edge_weight, backend=self.aggregation)


@contextlib.contextmanager
def use_aggregation(model: nn.Module, backend: str):
    """Within the block, every layer of `model` aggregates with `backend`; restored after."""
    layers = [m for m in model.modules() if isinstance(m, Aggregating)]
    old = [m.aggregation for m in layers]
    for m in layers:
        m.aggregation = backend
    try:
        yield
    finally:
        for m, name in zip(layers, old):
            m.aggregation = name


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
        if self.aggregator == "pool":
            pooled = F.relu(self.fc_pool(x))
            h_neigh = self.fc_neigh(self.aggregate(block, pooled, "max", edge_weight))
        elif self.in_feats > self.out_feats:
            h_neigh = self.aggregate(block, self.fc_neigh(x), "mean", edge_weight, self.fc_neigh)
        else:
            h_neigh = self.fc_neigh(self.aggregate(block, x, "mean", edge_weight))
        return self.fc_self(x[: block.num_dst]) + h_neigh


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
            x = x * _per_row(deg.rsqrt() if norm == "both" else deg.reciprocal(), x)
        # Multiply by W on the smaller side of the aggregation.
        if self.weight is not None and self.in_feats > self.out_feats:
            h = self.aggregate(block, x @ self.weight, "sum", edge_weight, lambda t: t @ self.weight)
        else:
            h = self.aggregate(block, x, "sum", edge_weight)
            if self.weight is not None:
                h = h @ self.weight
        if norm in ("right", "both"):
            deg = block.in_degrees().clamp(min=1).to(h.dtype)
            h = h * _per_row(deg.rsqrt() if norm == "both" else deg.reciprocal(), h)
        if self.bias is not None:
            h = h + self.bias
        return h


def _check_gcn_norm(norm: str) -> str:
    if norm not in ("none", "both", "right", "left"):
        raise ValueError(f"GraphConv norm must be 'none', 'both', 'right' or 'left', got {norm!r}")
    return norm


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
        self.feat_drop = nn.Dropout(feat_drop)
        self.attn_drop = nn.Dropout(attn_drop)
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

    def forward(self, block: Block, x: torch.Tensor, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        num_dst, heads, out = block.num_dst, self.num_heads, self.out_feats
        h = self.feat_drop(x)
        ft = self.fc(h).view(-1, heads, out)
        el = (ft * self.attn_l).sum(-1)  # [num_src, heads]
        er = (ft[:num_dst] * self.attn_r).sum(-1)  # [num_dst, heads]
        scores = self.leaky_relu(el[block.indices] + er[block.dst_ids()])  # [E, heads]
        attn = self.attn_drop(edge_softmax(block, scores))
        if edge_weight is not None:
            attn = attn * edge_weight.view(-1, 1)
        rst = aggregate(block, ft, reduce="sum", edge_weight=attn, backend=self.aggregation)  # [num_dst, heads, out]
        if self.res_fc is not None:
            rst = rst + self.res_fc(h[:num_dst]).view(num_dst, -1, out)
        if self.bias is not None:
            rst = rst + self.bias.view(1, heads, out)
        return rst


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


# --------------------------------------------------------------------------------- model


@dataclass(kw_only=True)
class ModelConfig:
    """The GNN architecture: one field per hyperparameter, validated on construction."""

    conv: str = field(default="sage", metadata={"help": f"layer type, one of {CONVS}"})
    hidden: int = field(default=256, metadata={"max": MAX_WIDTH, "help": "hidden width (all heads together for GAT)"})
    num_layers: int = field(
        default=0,
        metadata={
            "max": MAX_LAYERS,
            "help": "message-passing layers; 0 = the shards' blocks per minibatch (one per fanout). "
            "With neighbor/importance shards any other value must equal that count; cluster_gcn and saint "
            "shards hold one block that serves any number of layers",
        },
    )
    dropout: float = field(default=0.5, metadata={"help": "dropout on each layer's input features (incl. the first)"})
    attn_dropout: float = field(default=0.0, metadata={"help": "GAT attention dropout"})
    heads: int = field(default=4, metadata={"max": 1024, "help": "GAT heads of hidden layers (output: 1)"})
    residual: bool = field(
        default=False,
        metadata={"help": "add each hidden layer's input (linearly projected if widths differ)"},
    )
    hidden_norm: str | None = field(
        default=None,
        metadata={"help": "normalization after each hidden layer: 'batch', 'layer' or None"},
    )
    drop_edge: float = field(
        default=0.0,
        metadata={
            "help": "DropEdge: fraction p of each block's edges dropped per training step (self loops kept); "
            "for gin (sum) and gcn over edge weights the kept edges count 1/(1-p), so the aggregation keeps "
            "its expectation; sage (mean), gat (softmax) and sage_pool (max) aggregate over the kept edges"
        },
    )
    edge_weights: bool = field(
        default=False,
        metadata={
            "help": "sage/gin: aggregate with the block's edge weights (Â's entries, so a weighted graph's "
            "weights, times the sampler's correction): sage a weighted mean, gin a weighted sum"
        },
    )
    gcn_edge_weight: bool = field(
        default=True,
        metadata={
            "help": "gcn: use the block's edge weights (normalized adjacency) with norm='none' "
            "when present; False: ignore them and use the block's degrees (norm='both')"
        },
    )
    activation_checkpointing: bool = field(
        default=False,
        metadata={"help": "recompute each layer in backward instead of storing activations"},
    )

    RENAMED_FIELDS: ClassVar[dict[str, str]] = {"norm": "hidden_norm"}

    def __post_init__(self) -> None:
        check_fields(self, "model")
        if self.hidden_norm == "none":  # YAML-friendly spelling of None
            self.hidden_norm = None
        if self.conv not in CONVS:
            raise ValueError(f"model.conv={bounded_repr(self.conv)} is not one of {CONVS}")
        if self.hidden_norm is not None and self.hidden_norm not in NORMS:
            raise ValueError(f"model.hidden_norm={bounded_repr(self.hidden_norm)} is not one of {NORMS} or None")
        for name in ("hidden", "heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name}={getattr(self, name)} must be at least 1")
        if self.num_layers < 0:
            raise ValueError(f"model.num_layers={self.num_layers} must be >= 0 (0 = follow the shards)")
        for name in ("dropout", "attn_dropout", "drop_edge"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be in [0, 1)")
        if self.conv == "gat" and self.num_layers != 1 and self.hidden % self.heads:
            raise ValueError(
                f"model.hidden={self.hidden} must be divisible by model.heads={self.heads} "
                "for conv='gat' (each head gets hidden / heads features)"
            )

    @classmethod
    def field_help(cls) -> dict[str, str]:
        """Field name -> help text (for CLI and Dagster config descriptions)."""
        return {f.name: help_text(f) for f in fields(cls)}


class GNN(nn.Module):
    """A stack of ``num_layers`` graph convolutions for node classification.

    Each hidden layer is ``dropout -> conv -> (+ residual) -> hidden_norm -> relu``; the last is
    ``dropout -> conv`` and returns class logits. GAT hidden layers concatenate their
    ``heads`` heads of ``hidden // heads`` features; its output layer has one head.
    """

    def __init__(
        self,
        in_feats: int,
        hidden: int,
        num_classes: int,
        num_layers: int,
        conv: str = "sage",
        *,
        dropout: float = 0.0,
        residual: bool = False,
        hidden_norm: str | None = None,
        drop_edge: float = 0.0,
        heads: int = 1,
        attn_dropout: float = 0.0,
        gcn_edge_weight: bool = True,
        edge_weights: bool = False,
        activation_checkpointing: bool = False,
    ):
        super().__init__()
        if conv not in CONVS:
            raise ValueError(f"conv={conv!r} is not one of {CONVS}")
        if conv == "gat" and num_layers > 1 and hidden % heads:
            raise ValueError(f"GAT hidden={hidden} must be divisible by heads={heads}")
        self.conv, self.num_layers = conv, num_layers
        self.drop_edge, self.gcn_edge_weight, self.edge_weights = drop_edge, gcn_edge_weight, edge_weights
        self.activation_checkpointing = activation_checkpointing
        dims = [in_feats] + [hidden] * (num_layers - 1) + [num_classes]
        self.convs = nn.ModuleList()
        self.norms = nn.ModuleList()
        self.residuals = nn.ModuleList() if residual else None
        for layer in range(num_layers):
            d_in, d_out = dims[layer], dims[layer + 1]
            last = layer == num_layers - 1
            self.convs.append(_make_conv(conv, d_in, d_out, 1 if last else heads, attn_dropout))
            if last:
                continue
            self.norms.append(_make_norm(hidden_norm, d_out))
            if residual:
                self.residuals.append(nn.Identity() if d_in == d_out else nn.Linear(d_in, d_out, bias=False))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks: list[Block], x: torch.Tensor) -> torch.Tensor:
        """Logits of ``blocks[-1]``'s destination nodes; ``x``: ``blocks[0]``'s source features."""
        if len(blocks) != self.num_layers:
            raise ValueError(f"got {len(blocks)} blocks for a {self.num_layers}-layer model")
        h = x
        for layer, block in enumerate(blocks):
            scale = None
            if self.training and self.drop_edge > 0:
                block = drop_edges(block, self.drop_edge)
                # sums (GIN) and weighted sums (GCN over Â) keep their expectation when the kept
                # edges count 1/(1-p); means, attention softmax and max run over the kept edges
                if self.conv in ("gin", "gcn"):
                    scale = drop_edge_scale(block, self.drop_edge)
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                h = checkpoint(self.layer, layer, block, h, scale, use_reentrant=False)
            else:
                h = self.layer(layer, block, h, scale)
        return h

    def layer(self, index: int, block: Block, h: torch.Tensor, edge_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Layer ``index`` on one block: features of its sources -> of its destinations.

        ``edge_scale`` (per edge; DropEdge's 1/(1-p)) multiplies the messages of sum and
        weighted-sum layers (gin, gcn); the other layers ignore it.
        """
        last = index == self.num_layers - 1
        if self.convs[index].control_variate is not None:  # VR-GCN keeps histories of the input before dropout
            self.convs[index].control_variate.undropped = h
        out = self._conv(index, block, self.dropout(h), edge_scale)
        if last:
            return out
        if self.residuals is not None:
            out = out + self.residuals[index](h[: block.num_dst])
        return F.relu(self.norms[index](out))

    def _conv(self, index: int, block: Block, h: torch.Tensor, edge_scale: torch.Tensor | None) -> torch.Tensor:
        conv = self.convs[index]
        weight = sampled_edge_weight(self.conv, block, self.gcn_edge_weight, edge_scale, self.edge_weights)
        if self.conv == "gcn":
            if weight is not None:
                return conv(block, h, edge_weight=weight, norm="none")
            return conv(block, h)  # degree normalization over the (kept) edges: a mean, no scale
        if self.conv in ("gin", "sage", "sage_pool"):
            return conv(block, h, edge_weight=weight)
        if self.conv == "gat":
            out = conv(block, h)  # [num_dst, heads, out]
            return out.mean(1) if index == self.num_layers - 1 else out.flatten(1)
        return conv(block, h)

    @torch.no_grad()
    def inference(
        self,
        full_block: Block,
        x: torch.Tensor,
        batch_size: int | None = None,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """Logits of every node, computed layer by layer over the whole graph (no sampling);
        see `inference_with_embeddings`."""
        return self.inference_with_embeddings(full_block, x, batch_size, device)[1]

    @torch.no_grad()
    def inference_with_embeddings(
        self,
        full_block: Block,
        x: torch.Tensor,
        batch_size: int | None = None,
        device: torch.device | str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(embeddings, logits) of every node, computed layer by layer over the whole graph.

        ``full_block`` is the full graph (``num_src == num_dst``, e.g. the normalized
        adjacency CSR with its weights). The embeddings are the input of the last layer (the
        last hidden representation; the input features for a one-layer model). With
        ``batch_size`` (None or 0: all at once) each layer runs over destination chunks of
        that size (:func:`training.blocks.slice_dst`), computed on ``device`` (default:
        ``x``'s) and gathered on ``x``'s device, bounding the memory of one step. Call
        ``model.eval()`` first, as for any evaluation.
        """
        if full_block.num_src != full_block.num_dst:
            raise ValueError(
                "inference needs a full-graph block (num_src == num_dst); got "
                f"num_src={full_block.num_src}, num_dst={full_block.num_dst}"
            )
        n = full_block.num_dst
        device = torch.device(device) if device is not None else x.device
        h = emb = x
        if not batch_size or batch_size >= n:
            block = full_block.to(device)
            h = h.to(device)
            for layer in range(self.num_layers):
                emb = h
                h = self.layer(layer, block, h)
            return emb.to(x.device), h.to(x.device)
        chunks = [slice_dst(full_block, s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
        for layer in range(self.num_layers):
            emb = h
            h = torch.cat([self.layer(layer, sub.to(device), h[src].to(device)).to(x.device) for sub, src in chunks])
        return emb, h


def sampled_edge_weight(
    conv: str,
    block: Block,
    gcn_edge_weight: bool = True,
    edge_scale: torch.Tensor | None = None,
    edge_weights: bool = False,
) -> torch.Tensor | None:
    """The per-edge weights layer type ``conv`` aggregates with over ``block``.

    A sampled block carries ``correction`` (the inverse inclusion probability of each edge,
    `graphs.shard_format`); DropEdge passes ``edge_scale`` (1/(1-p) per kept edge). Both are
    applied the way each aggregation needs, so that the expected aggregation over the draws
    equals the full-neighbourhood one (tests/test_sampling.py checks this per type). With
    ``edge_weights`` (``ModelConfig.edge_weights``) SAGE and GIN also weigh by Â's entries.

    - ``gcn``: ``Â_vu · c_uv`` (· scale), a weighted sum; None with ``gcn_edge_weight`` off or
      no weights (the layer then normalizes by the block's degrees).
    - ``gin``: ``c_uv`` (· Â_vu with edge_weights) (· scale): the sum scaled by the inverse
      inclusion probability.
    - ``sage`` (mean): the weighted mean ``Σ c x / Σ c`` (c · Â with edge_weights) through
      `weighted_mean_weights`; None with neither (a plain mean). A correction that is one value
      per destination (``block.correction_per_dst``) cancels and is left out.
    - ``gat``, ``sage_pool``: no correction (a softmax ratio and a max have no unbiased form;
      training refuses non-uniform draws for them, `training.train.check_sampler_supports`);
      sage_pool weighs by Â's entries with edge_weights.
    """
    # Â's weights and the correction are read only where used: a block read from shards
    # computes them from their compact forms on first access (training.blocks)
    if conv == "gcn":
        w = block.edge_weight if gcn_edge_weight else None
        if w is None:
            return None
        c = block.correction
        w = w if c is None else w * c
        return w if edge_scale is None else w * edge_scale
    if conv == "sage_pool":  # a max: Â's weights when asked, no correction
        w = block.edge_weight if edge_weights else None
        return None if w is None else weighted_mean_weights(block, w)
    if conv not in ("gin", "sage"):
        return None
    base = block.edge_weight if edge_weights else None
    # one correction per destination cancels in SAGE's weighted mean Σ c x / Σ c
    c = None if conv == "sage" and block.correction_per_dst else block.correction
    if c is not None:
        base = c if base is None else base * c
    if conv == "gin":
        if edge_scale is not None:
            base = edge_scale if base is None else base * edge_scale
        return base
    return None if base is None else weighted_mean_weights(block, base)


def _make_conv(conv: str, d_in: int, d_out: int, heads: int, attn_dropout: float) -> nn.Module:
    if conv == "sage":
        return SAGEConv(d_in, d_out, "mean")
    if conv == "sage_pool":
        return SAGEConv(d_in, d_out, "pool")
    if conv == "gcn":
        return GraphConv(d_in, d_out, norm="both")
    if conv == "gat":
        return GATConv(d_in, d_out // heads, heads, attn_drop=attn_dropout)
    return GINConv(d_in, d_out)


def _make_norm(hidden_norm: str | None, width: int) -> nn.Module:
    # Left in float32 on purpose: autocast runs batch/layer norm in float32 itself.
    if hidden_norm is None:
        return nn.Identity()
    if hidden_norm == "batch":
        return nn.BatchNorm1d(width)
    if hidden_norm == "layer":
        return nn.LayerNorm(width)
    raise ValueError(f"hidden_norm={hidden_norm!r} is not one of {NORMS} or None")


def build_model(cfg: ModelConfig, in_feats: int, num_classes: int) -> GNN:
    """The :class:`GNN` described by ``cfg`` for ``in_feats`` inputs and ``num_classes``."""
    if cfg.num_layers < 1:
        raise ValueError(
            f"model.num_layers={cfg.num_layers}: resolve it against the shards first "
            "(training.train.resolve_num_layers; 0 means 'the shards' block count')"
        )
    return GNN(
        in_feats,
        cfg.hidden,
        num_classes,
        cfg.num_layers,
        cfg.conv,
        dropout=cfg.dropout,
        residual=cfg.residual,
        hidden_norm=cfg.hidden_norm,
        drop_edge=cfg.drop_edge,
        heads=cfg.heads,
        attn_dropout=cfg.attn_dropout,
        gcn_edge_weight=cfg.gcn_edge_weight,
        edge_weights=cfg.edge_weights,
        activation_checkpointing=cfg.activation_checkpointing,
    )
