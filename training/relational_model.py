"""A relational GNN over typed blocks (`training.typed_blocks.TypedBlock`), in plain torch.

- `TypedInput` brings every node type to one width: a linear map of the type's features, or,
  for a type without features, a learned vector per node (``nn.Embedding(sparse=True)``: a
  step's gradient holds only the rows its minibatch touched, for a sparse optimizer such as
  ``torch.optim.SparseAdam``; `RelationalGNN.sparse_parameters` names them).
- `RelationalGNN` stacks layers of one registered layer type: a type that reads the relations
  itself (its ``relational`` trait, as ``rgcn``) takes each typed block whole; any other runs
  once per relation through `training.relational.RelationalConv`. Dropout before every layer,
  ReLU between them, as `training.layers.GNN`.

`TypedGNN` is the same model behind the interface of `training.layers.GNN` (``forward(blocks, x)``,
``inference(full_block, x)``), so the training loop, evaluation and predictions run it unchanged:
``x`` holds every source node's features at the widest type's width (a type's own columns first,
zeros after, as canonical_graph stores a typed graph's features) and the typed blocks carry the
source nodes' global ids, from which a featureless type's rows are looked up.

The node types' rows are passed per type in the order of their positions in the first block's
sources: ``feats[t]`` the features of type t's source nodes (``[n_t, width_t]``), ``ids[t]`` the
type-local ids of a featureless type's source nodes (``[n_t]``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from training.dropout import Dropout
from training.layer_registry import LayerOptions, layer_kind
from training.relational import RelationalConv
from training.typed_blocks import GraphSchema, TypedBlock

__all__ = ["RelationalGNN", "TypeInput", "TypedGNN", "TypedInput"]


@dataclass(frozen=True)
class TypeInput:
    """What one node type brings: `width` features per node, or none (width 0) and then a
    learned vector for each of its `num_nodes` nodes."""

    width: int
    num_nodes: int = 0

    def __post_init__(self) -> None:
        if self.width < 0 or self.num_nodes < 0:
            raise ValueError(f"a node type's width and num_nodes are counts, got {self.width} and {self.num_nodes}")
        if self.width == 0 and self.num_nodes == 0:
            raise ValueError("a node type without features needs num_nodes > 0 for its embeddings")


class TypedInput(nn.Module):
    """Each node type's rows at width `width` (see the module docstring)."""

    def __init__(self, schema: GraphSchema, inputs: dict[str, TypeInput], width: int, sparse: bool = True):
        super().__init__()
        missing = [t for t in schema.node_types if t not in inputs]
        if missing:
            raise ValueError(f"node types {missing} have no input (features or a node count)")
        self.schema, self.width = schema, width
        self.proj = nn.ModuleDict({t: nn.Linear(i.width, width) for t, i in inputs.items() if i.width})
        self.embed = nn.ModuleDict(
            {t: nn.Embedding(i.num_nodes, width, sparse=sparse) for t, i in inputs.items() if not i.width}
        )
        for e in self.embed.values():
            nn.init.normal_(e.weight, std=width**-0.5)

    def forward(
        self, src_types: torch.Tensor, feats: dict[str, torch.Tensor], ids: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        h = None
        for t_index, t in enumerate(self.schema.node_types):
            rows = (src_types == t_index).nonzero().view(-1)
            if t in self.proj:
                part = self.proj[t](feats[t])
            else:
                part = self.embed[t](ids[t])
            if part.shape[0] != rows.numel():
                raise ValueError(f"node type {t!r} has {rows.numel()} source nodes but {part.shape[0]} input rows")
            if h is None:
                h = part.new_zeros(src_types.numel(), self.width)
            h = h.index_copy(0, rows, part)
        return h


class RelationalGNN(nn.Module):
    """`num_layers` layers of layer type `conv` over typed blocks, `hidden` wide, `out` outputs."""

    def __init__(
        self,
        schema: GraphSchema,
        inputs: dict[str, TypeInput],
        hidden: int,
        out: int,
        num_layers: int = 2,
        conv: str = "rgcn",
        combine: str = "sum",
        dropout: float = 0.5,
        heads: int = 1,
        num_bases: int = 0,
        sparse: bool = True,
    ):
        super().__init__()
        self.kind = layer_kind(conv)
        self.schema, self.num_layers = schema, num_layers
        self.options = LayerOptions(heads=heads, relations=len(schema.relations), num_bases=num_bases)
        self.input = TypedInput(schema, inputs, hidden, sparse)
        dims = [hidden] * num_layers + [out]
        self.convs = nn.ModuleList()
        for layer in range(num_layers):
            last = layer == num_layers - 1
            if self.kind.relational:
                self.convs.append(self.kind.build(dims[layer], dims[layer + 1], last, self.options))
            else:
                self.convs.append(
                    RelationalConv(self.kind, schema, dims[layer], dims[layer + 1], last, self.options, combine)
                )
        self.dropout = Dropout(dropout)

    def sparse_parameters(self) -> list[nn.Parameter]:
        """The embedding tables when their gradients are sparse (a dense optimizer cannot take them)."""
        return [e.weight for e in self.input.embed.values() if e.sparse]

    def dense_parameters(self) -> list[nn.Parameter]:
        """Every other parameter."""
        sparse = {id(p) for p in self.sparse_parameters()}
        return [p for p in self.parameters() if id(p) not in sparse]

    def forward(
        self,
        blocks: list[TypedBlock],
        feats: dict[str, torch.Tensor],
        ids: dict[str, torch.Tensor] | None = None,
        with_embeddings: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Outputs of ``blocks[-1]``'s destinations; `feats` / `ids` per type, see the module
        docstring. With `with_embeddings`, (the last layer's input, outputs)."""
        if len(blocks) != self.num_layers:
            raise ValueError(f"got {len(blocks)} blocks for a {self.num_layers}-layer model")
        h = self.input(blocks[0].src_types, feats, ids or {})
        emb = h
        for layer, block in enumerate(blocks):
            last = layer == self.num_layers - 1
            emb = h
            h = self.dropout(h)
            if self.kind.relational:
                weight = self.kind.edge_weight(block.block, self.options)
                h = self.kind.forward(self.convs[layer], block, h, weight, last)
            else:
                h = self.convs[layer](block, h)
            if not last:
                h = F.relu(h)
        return (emb, h) if with_embeddings else h


class TypedGNN(nn.Module):
    """`RelationalGNN` over a typed graph's padded feature rows (see the module docstring).

    `widths` and `offsets` are per node type (in the schema's order): the feature width (0: the
    type learns a vector per node) and the first global id of the type."""

    def __init__(self, schema: GraphSchema, widths: list[int], counts: list[int], hidden: int, out: int, **options):
        super().__init__()
        self.schema, self.widths = schema, [int(w) for w in widths]
        self.register_buffer("offsets", torch.tensor([0, *counts], dtype=torch.int64).cumsum(0)[:-1], persistent=False)
        inputs = {t: TypeInput(w, 0 if w else c) for t, w, c in zip(schema.node_types, self.widths, counts)}
        self.net = RelationalGNN(schema, inputs, hidden, out, **options)
        self.num_layers = self.net.num_layers

    def sparse_parameters(self) -> list[nn.Parameter]:
        return self.net.sparse_parameters()

    def _inputs(self, first: TypedBlock, x: torch.Tensor | None) -> tuple[dict, dict]:
        feats, ids = {}, {}
        for i, t in enumerate(self.schema.node_types):
            rows = first.src_types == i
            if self.widths[i]:
                if x is None:
                    raise ValueError(f"node type {t!r} has features but the minibatch brought none")
                feats[t] = x[rows, : self.widths[i]]
            else:
                if first.src_nodes is None:
                    raise ValueError(f"node type {t!r} learns a vector per node: the typed block needs src_nodes")
                ids[t] = first.src_nodes[rows] - self.offsets[i]
        return feats, ids

    def forward(self, blocks: list[TypedBlock], x: torch.Tensor | None) -> torch.Tensor:
        """Logits of ``blocks[-1]``'s destinations; ``x``: ``blocks[0]``'s source rows."""
        return self.net(blocks, *self._inputs(blocks[0], x))

    def inference(self, full_block: TypedBlock, x: torch.Tensor | None, batch_size: int | None = None) -> torch.Tensor:
        """Logits of every node over the whole typed graph (no sampling)."""
        return self.inference_with_embeddings(full_block, x, batch_size)[1]

    @torch.no_grad()
    def inference_with_embeddings(
        self, full_block: TypedBlock, x: torch.Tensor | None, batch_size: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(embeddings, logits) of every node: the whole graph at once, every layer over
        `full_block` (``batch_size`` is not used: a typed graph is evaluated in memory)."""
        if full_block.num_src != full_block.num_dst:
            raise ValueError("inference needs a full-graph block (num_src == num_dst)")
        blocks = [full_block] * self.num_layers
        return self.net(blocks, *self._inputs(full_block, x), with_embeddings=True)
