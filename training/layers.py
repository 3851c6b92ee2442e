"""The node-classification model (`GNN`, `ModelConfig`), in plain torch over :class:`Block`.

Its layers are the registered layer types of `training.layer_registry` (``model.conv``; the
built-in ones in `training.convs`), which compute exactly what DGL's ``SAGEConv``,
``GraphConv``, ``GATConv`` and ``GINConv`` compute, with the same parameter names (a DGL
module's ``state_dict`` loads into ours and back), but read the CSC arrays of a
:class:`~training.blocks.Block` instead of a ``DGLGraph``, so training runs where DGL is not
installed and on GPUs the CPU-only PyPI DGL wheel cannot use. ``tests/test_layers.py`` checks
each one against DGL to 1e-5, and ``tests/test_layers_pyg.py`` SAGE, GCN, GAT and GIN against
PyG (with `make peers`). All neighbour reductions go through
:func:`training.aggregate.aggregate`.

Each layer's ``forward(block, x)`` takes the features of the block's *source* nodes
``[num_src, F]`` and returns those of its destination nodes; the destination nodes are
the first ``num_dst`` source nodes, so a layer reads their own features as
``x[:num_dst]``.

Edge weights: a sampled block carries Â's entries (``edge_weight``) and, apart, the
sampler's correction (``correction``); :func:`sampled_edge_weight` applies both per layer
type: GCN aggregates ``Â·c``, GIN scales its sum by ``c``, SAGE-mean takes the c-weighted
mean ``Σ c x / Σ c`` (`training.aggregate.weighted_mean_weights`; a per-row factor such as uniform
neighbour rescaling cancels), so each is the full-neighbourhood aggregation in expectation.
With ``ModelConfig.edge_weights`` SAGE and GIN also weigh by Â's entries (``w = Â·c``): SAGE
the weighted mean ``Σ w x / Σ w``, GIN the weighted sum (an unbiased estimate of ``(Â x)_v``).
On a weighted graph Â carries the edge weight.

:class:`GNN` stacks layers: ``forward(blocks, x)`` over sampled blocks (one per layer)
for training, ``inference(full_block, x)`` layer by layer over the whole graph for
evaluation. Build it from a :class:`ModelConfig` with :func:`build_model`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from graphs.formats.graph_schema import TypedSchema
from graphs.infra.config_checks import MAX_LAYERS, MAX_WIDTH, bounded_repr, check_fields, help_text
from training.aggregate import use_aggregation
from training.blocks import Block, drop_edge_scale, drop_edges, slice_dst
from training.dropout import Dropout
from training.layer_registry import LayerOptions, layer_kind
from training.relational import COMBINES
from training.relational_model import TypedGNN

__all__ = [
    "GNN",
    "ModelConfig",
    "NORMS",
    "build_model",
    "sampled_edge_weight",
    "use_aggregation",
]

NORMS = ("batch", "layer")


# --------------------------------------------------------------------------------- model


@dataclass(kw_only=True)
class ModelConfig:
    """The GNN architecture: one field per hyperparameter, validated on construction."""

    conv: str = field(
        default="sage",
        metadata={
            "help": "layer type, by its registered name: the built-in sage, sage_pool, gcn, gat, gin and rgcn "
            "(training/convs/), or one a module registers (docs/extending.md)"
        },
    )
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
    relation_combine: str = field(
        default="sum",
        metadata={
            "help": "typed graphs: how a layer that is not relational itself (sage, gcn, gat, gin) combines "
            f"its per-relation outputs at a node, one of {COMBINES} (rgcn always sums)"
        },
    )
    num_bases: int = field(
        default=0,
        metadata={
            "max": 1 << 16,
            "help": "typed graphs, rgcn: basis decomposition of the relation weights into this many shared "
            "bases (0 = one full weight per relation); fewer parameters when relations are many",
        },
    )

    RENAMED_FIELDS: ClassVar[dict[str, str]] = {"norm": "hidden_norm"}

    def __post_init__(self) -> None:
        check_fields(self, "model")
        if self.hidden_norm == "none":  # YAML-friendly spelling of None
            self.hidden_norm = None
        kind = layer_kind(self.conv)  # ValueError naming the registered layers
        if self.hidden_norm is not None and self.hidden_norm not in NORMS:
            raise ValueError(f"model.hidden_norm={bounded_repr(self.hidden_norm)} is not one of {NORMS} or None")
        for name in ("hidden", "heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name}={getattr(self, name)} must be at least 1")
        if self.num_layers < 0:
            raise ValueError(f"model.num_layers={self.num_layers} must be >= 0 (0 = follow the shards)")
        if self.relation_combine not in COMBINES:
            raise ValueError(f"model.relation_combine={bounded_repr(self.relation_combine)} is not one of {COMBINES}")
        if self.num_bases < 0:
            raise ValueError(f"model.num_bases={self.num_bases} must be >= 0 (0 = no basis decomposition)")
        for name in ("dropout", "attn_dropout", "drop_edge"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be in [0, 1)")
        kind.check(self)

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
        self.kind = layer_kind(conv)
        self.conv, self.num_layers = conv, num_layers
        self.drop_edge, self.gcn_edge_weight, self.edge_weights = drop_edge, gcn_edge_weight, edge_weights
        self.options = LayerOptions(heads, attn_dropout, edge_weights, gcn_edge_weight)
        self.activation_checkpointing = activation_checkpointing
        dims = [in_feats] + [hidden] * (num_layers - 1) + [num_classes]
        self.convs = nn.ModuleList()
        self.norms = nn.ModuleList()
        self.residuals = nn.ModuleList() if residual else None
        for layer in range(num_layers):
            d_in, d_out = dims[layer], dims[layer + 1]
            last = layer == num_layers - 1
            self.convs.append(self.kind.build(d_in, d_out, last, self.options))
            if last:
                continue
            self.norms.append(_make_norm(hidden_norm, d_out))
            if residual:
                self.residuals.append(nn.Identity() if d_in == d_out else nn.Linear(d_in, d_out, bias=False))
        self.dropout = Dropout(dropout)

    def forward(self, blocks: list[Block], x: torch.Tensor) -> torch.Tensor:
        """Logits of ``blocks[-1]``'s destination nodes; ``x``: ``blocks[0]``'s source features."""
        if len(blocks) != self.num_layers:
            raise ValueError(f"got {len(blocks)} blocks for a {self.num_layers}-layer model")
        h = x
        for layer, block in enumerate(blocks):
            scale = None
            if self.training and self.drop_edge > 0:
                block = drop_edges(block, self.drop_edge)
                # sums (GIN, GCN over Â) keep their expectation when the kept edges count
                # 1/(1-p); means, attention softmax and max run over the kept edges
                if self.kind.sums:
                    scale = drop_edge_scale(block, self.drop_edge)
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                h = checkpoint(self.layer, layer, block, h, scale, use_reentrant=False)
            else:
                h = self.layer(layer, block, h, scale)
        return h

    def layer(self, index: int, block: Block, h: torch.Tensor, edge_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Layer ``index`` on one block: features of its sources -> of its destinations.

        ``edge_scale`` (per edge; DropEdge's 1/(1-p)) multiplies the messages of summing layers
        (the kind's ``sums`` trait); the other layers ignore it.
        """
        last = index == self.num_layers - 1
        variate = getattr(self.convs[index], "control_variate", None)
        if variate is not None:  # VR-GCN keeps histories of the input before dropout
            variate.undropped = h
        weight = self.kind.edge_weight(block, self.options, edge_scale)
        out = self.kind.forward(self.convs[index], block, self.dropout(h), weight, last)
        if last:
            return out
        if self.residuals is not None:
            out = out + self.residuals[index](h[: block.num_dst])
        return F.relu(self.norms[index](out))

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
    """The per-edge weights layer type ``conv`` aggregates with over ``block``
    (`training.layer_registry.LayerKind.edge_weight`).

    A sampled block carries ``correction`` (the inverse inclusion probability of each edge,
    `graphs.formats.shard_format`); DropEdge passes ``edge_scale`` (1/(1-p) per kept edge). Each
    layer type applies both the way its aggregation needs, so that the expected aggregation
    over the draws equals the full-neighbourhood one (tests/test_sampling.py checks this per
    type): gcn ``Â·c`` (· scale), gin ``c`` (· Â with ``edge_weights``) (· scale), sage the
    weighted mean ``Σ c x / Σ c``; gat and sage_pool take no correction (a softmax ratio and a
    max have no unbiased form: training refuses non-uniform draws for layers that are not
    ``linear``, `training.run_plan.check_sampler_supports`).
    """
    opts = LayerOptions(edge_weights=edge_weights, gcn_edge_weight=gcn_edge_weight)
    return layer_kind(conv).edge_weight(block, opts, edge_scale)


def _make_norm(hidden_norm: str | None, width: int) -> nn.Module:
    # Left in float32 on purpose: autocast runs batch/layer norm in float32 itself.
    if hidden_norm is None:
        return nn.Identity()
    if hidden_norm == "batch":
        return nn.BatchNorm1d(width)
    if hidden_norm == "layer":
        return nn.LayerNorm(width)
    raise ValueError(f"hidden_norm={hidden_norm!r} is not one of {NORMS} or None")


def build_model(
    cfg: ModelConfig, in_feats: int, num_classes: int, typed: dict | None = None, sparse_embeddings: bool = True
) -> GNN | TypedGNN:
    """The :class:`GNN` described by ``cfg`` for ``in_feats`` inputs and ``num_classes``; for a
    typed graph (`typed`: its schema, canonical_graph's types.json) the `TypedGNN` of that layer
    type over its relations (its featureless types' vectors sparse unless `sparse_embeddings` is off)."""
    if cfg.num_layers < 1:
        raise ValueError(
            f"model.num_layers={cfg.num_layers}: resolve it against the shards first "
            "(training.run_plan.resolve_num_layers; 0 means 'the shards' block count')"
        )
    if typed is not None:
        return _typed_model(cfg, num_classes, typed, sparse_embeddings)
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


def _typed_model(cfg: ModelConfig, num_classes: int, typed: dict, sparse: bool) -> TypedGNN:
    """The `TypedGNN` of `cfg` over the schema `typed`; settings a relational model has no use for are refused."""
    unused = [
        name
        for name, value, default in (
            ("residual", cfg.residual, False),
            ("hidden_norm", cfg.hidden_norm, None),
            ("drop_edge", cfg.drop_edge, 0.0),
            ("activation_checkpointing", cfg.activation_checkpointing, False),
        )
        if value != default
    ]
    if unused:
        raise ValueError(f"model.{unused[0]} is not used by the relational models of typed graphs; leave it unset")
    schema = TypedSchema.from_json(typed, "the typed schema")
    model = TypedGNN(
        schema.schema,
        list(schema.feat_widths),
        list(schema.counts),
        cfg.hidden,
        num_classes,
        num_layers=cfg.num_layers,
        conv=cfg.conv,
        combine=cfg.relation_combine,
        dropout=cfg.dropout,
        heads=cfg.heads,
        num_bases=cfg.num_bases,
        sparse=sparse,
    )
    model.typed_doc = typed  # what a model file records, to build the same model back
    return model
