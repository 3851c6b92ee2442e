"""The graph-level model: node encoder, registered graph layers, readout per graph, prediction head.

`GraphModel` reads a minibatch of whole graphs (`graphs.sampling.kinds.whole_graphs`): one block
(the graphs' induced subgraph of Â, no edge between graphs) for every layer, the nodes' float
features and categorical codes, and ``graph_ptr`` (each graph's first position among the nodes,
plus the total). Its parts:

- the node encoder: a linear map of the float features and of the categorical columns' (e.g.
  atom types) one-hot codes, each one-hot column shifted and scaled to mean 0, variance 1 over
  the training graphs' nodes (``categorical: one_hot_standardized``, set by
  `GraphModel.standardize`; ``one_hot`` leaves the codes as they are, ``embedding`` adds one
  learned vector per categorical column instead; BENCHMARKS.md measures the three); a graph
  with neither starts every node at one learned vector;
- ``num_layers`` layers of a registered kind (`training.layer_registry`; GIN by default), each
  ``conv -> batch norm -> relu -> dropout``, over the block without its self loops for a layer
  that adds the node's own state itself (the ``own_term`` trait: GIN), with them otherwise;
- with ``virtual_node``, one extra state per graph (the OGB examples' virtual node, starting at a
  learned vector): added to every node's state before each layer, and between layers replaced
  by ``MLP(sum of the graph's node states + its own state)`` (``Linear -> BN -> ReLU`` twice);
- a readout per graph of every layer's node states, the input's included (sum, mean, max, or
  attention: a softmax gate per node within its graph), each through its own linear map to the
  output, summed: the GIN paper's and DGL's GIN example's jumping-knowledge head.

The output is [graphs, classes] logits for class labels or [graphs, 1] for values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from training.blocks import Block, remove_self_loops
from training.dropout import Dropout
from training.layer_registry import LayerOptions, layer_kind

__all__ = ["READOUTS", "GraphModel", "GraphShape", "readout"]

READOUTS = ("sum", "mean", "max", "attention")
CATEGORICAL = ("embedding", "one_hot", "one_hot_standardized")


@dataclass(frozen=True)
class GraphShape:
    """What the model's input and output sizes follow from: the data."""

    feature_dim: int  # float features per node (0: none)
    categorical: tuple[int, ...]  # the cardinality of each categorical column
    outputs: int  # classes, or 1 for a value


def _owners(graph_ptr: torch.Tensor) -> torch.Tensor:
    """[n] the graph of each node position."""
    counts = graph_ptr[1:] - graph_ptr[:-1]
    return torch.repeat_interleave(torch.arange(len(counts), device=graph_ptr.device), counts)


def readout(kind: str, h: torch.Tensor, graph_ptr: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
    """[graphs, d] per-graph readout `kind` of node states `h` [n, d]; graph g's nodes are
    ``graph_ptr[g]:graph_ptr[g + 1]``; `gate` [n, 1] the attention logits for ``attention``."""
    counts = graph_ptr[1:] - graph_ptr[:-1]
    owner = _owners(graph_ptr)
    out = h.new_zeros(len(counts), h.shape[1])
    if kind == "sum":
        return out.index_add(0, owner, h)
    if kind == "mean":
        return out.index_add(0, owner, h) / counts.clamp(min=1).unsqueeze(1).to(h.dtype)
    if kind == "max":
        return out.index_reduce(0, owner, h, "amax", include_self=False)
    if kind == "attention":
        g = gate.squeeze(1)
        top = g.new_full((len(counts),), float("-inf")).index_reduce(0, owner, g, "amax", include_self=True)
        w = torch.exp(g - top[owner])
        w = w / w.new_zeros(len(counts)).index_add(0, owner, w)[owner]
        return out.index_add(0, owner, h * w.unsqueeze(1))
    raise ValueError(f"readout={kind!r} is not one of {READOUTS}")


class GraphModel(nn.Module):
    """Node encoder, ``num_layers`` registered layers and a jumping-knowledge readout head (module docstring)."""

    def __init__(
        self,
        shape: GraphShape,
        *,
        conv: str = "gin",
        hidden: int = 64,
        num_layers: int = 3,
        dropout: float = 0.2,
        readout: str = "sum",
        categorical: str = "one_hot_standardized",
        heads: int = 1,
        virtual_node: bool = False,
    ):
        super().__init__()
        if readout not in READOUTS:
            raise ValueError(f"readout={readout!r} is not one of {READOUTS}")
        if categorical not in CATEGORICAL:
            raise ValueError(f"categorical={categorical!r} is not one of {CATEGORICAL}")
        self.shape, self.readout_kind, self.categorical = shape, readout, categorical
        self.kind = layer_kind(conv)
        self.options = LayerOptions(heads=heads)
        self.embeddings = nn.ModuleList(nn.Embedding(k, hidden) for k in shape.categorical)
        one_hot_dim = sum(shape.categorical) if categorical != "embedding" else 0
        self.register_buffer("hot_mean", torch.zeros(one_hot_dim))
        self.register_buffer("hot_scale", torch.ones(one_hot_dim))
        self.embeddings = self.embeddings if categorical == "embedding" else nn.ModuleList()
        in_dim = shape.feature_dim + one_hot_dim
        self.linear_in = nn.Linear(in_dim, hidden) if in_dim else None
        self.start = nn.Parameter(torch.zeros(hidden)) if not in_dim and not len(self.embeddings) else None
        self.convs = nn.ModuleList(self.kind.build(hidden, hidden, False, self.options) for _ in range(num_layers))
        self.norms = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in range(num_layers))
        self.heads = nn.ModuleList(nn.Linear(hidden, shape.outputs) for _ in range(num_layers + 1))
        self.gates = (
            nn.ModuleList(nn.Linear(hidden, 1) for _ in range(num_layers + 1)) if readout == "attention" else None
        )
        self.dropout = Dropout(dropout)
        self.virtual = nn.Parameter(torch.zeros(hidden)) if virtual_node else None
        self.virtual_mlps = nn.ModuleList(
            nn.Sequential(
                nn.Linear(hidden, hidden),
                nn.BatchNorm1d(hidden),
                nn.ReLU(),
                nn.Linear(hidden, hidden),
                nn.BatchNorm1d(hidden),
                nn.ReLU(),
            )  # fmt: skip
            for _ in range(num_layers - 1 if virtual_node else 0)
        )

    def standardize(self, codes: torch.Tensor) -> None:
        """For ``one_hot_standardized``: set each one-hot column's shift and scale from the
        categorical codes [n, K] of the training graphs' nodes (a value seen in all or none of
        them keeps scale 1)."""
        if self.categorical != "one_hot_standardized":
            return
        share = torch.cat(
            [torch.bincount(codes[:, k], minlength=c).to(torch.float32) for k, c in enumerate(self.shape.categorical)]
        ) / max(len(codes), 1)
        std = torch.sqrt(share * (1 - share))
        self.hot_mean.copy_(share)
        self.hot_scale.copy_(torch.where(std > 0, 1 / std.clamp(min=1e-12), torch.ones_like(std)))

    def encode(self, x: torch.Tensor | None, codes: torch.Tensor | None, n: int) -> torch.Tensor:
        """[n, hidden] input states of the nodes from their float features and categorical codes."""
        parts = []
        if self.categorical != "embedding" and codes is not None:
            hot = torch.cat([F.one_hot(codes[:, k], c) for k, c in enumerate(self.shape.categorical)], 1)
            hot = (hot.to(torch.float32) - self.hot_mean) * self.hot_scale
            x = hot if x is None else torch.cat([x, hot], 1)
        if self.linear_in is not None:
            parts.append(self.linear_in(x))
        parts.extend(emb(codes[:, k]) for k, emb in enumerate(self.embeddings))
        if self.start is not None:
            parts.append(self.start.expand(n, -1))
        return torch.stack(parts).sum(0)

    def forward(
        self, block: Block, x: torch.Tensor | None, codes: torch.Tensor | None, graph_ptr: torch.Tensor
    ) -> torch.Tensor:
        """[graphs, outputs] predictions of the graphs whose nodes `block` holds (module docstring)."""
        h = self.encode(x, codes, block.num_dst)
        if self.kind.own_term:  # e.g. GIN: its (1 + eps) x_v is the node's own term
            block = remove_self_loops(block)
        weight = self.kind.edge_weight(block, self.options, None)
        out = self._head(0, h, graph_ptr)
        virtual = None if self.virtual is None else self.virtual.expand(len(graph_ptr) - 1, -1)
        owner = _owners(graph_ptr) if virtual is not None else None
        for layer, conv in enumerate(self.convs):
            if virtual is not None:
                h = h + virtual[owner]
                if layer < len(self.virtual_mlps):
                    virtual = self.dropout(self.virtual_mlps[layer](readout("sum", h, graph_ptr) + virtual))
            h = self.kind.forward(conv, block, h, weight, False)
            h = self.dropout(F.relu(self.norms[layer](h)))
            out = out + self._head(layer + 1, h, graph_ptr)
        return out

    def _head(self, layer: int, h: torch.Tensor, graph_ptr: torch.Tensor) -> torch.Tensor:
        gate = self.gates[layer](h) if self.gates is not None else None
        return self.heads[layer](readout(self.readout_kind, h, graph_ptr, gate))
