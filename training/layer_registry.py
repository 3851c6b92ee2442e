"""The GNN layer types (``model.conv``), by name, each with the traits it declares.

A layer type is a `LayerKind` subclass registered with `register_layer` under its ``name``;
the built-in ones live one module each in `training.convs` (its module also holds the
``nn.Module``), and every module of that package is imported on the first lookup, so adding a
layer is one new file there plus its test. A layer type defined elsewhere (a test, a user's
package imported before training starts) registers the same way. `training.layers.GNN` builds
and calls layers only through their kind, and every check reads a declared trait:

- ``linear``: the layer combines its messages by a (weighted) sum or mean, so a sampler's
  per-edge correction makes it unbiased under any draw (training refuses shards whose manifest
  records ``non_uniform_draws`` for a layer that is not linear) and VR-GCN's control variate
  applies (`training.compensation`);
- ``sums``: a (weighted) sum, so DropEdge's kept edges count 1/(1-p);
- ``aggregates_by``: its aggregation in words, without an article, for messages ("mean",
  "softmax attention").
- ``relational``: the layer reads each edge's relation itself and takes a typed block whole
  (`training.typed_blocks`, as ``rgcn``); any other layer type runs on a typed graph once per
  relation (`training.relational.RelationalConv`);
- ``own_term``: the layer adds the node's own state itself (GIN's ``(1 + eps) x_v``), so a
  block's self loop would count the node twice: the graph-level model
  (`training.graph_model`) drops self loops from its blocks for such a layer.

docs/extending.md walks through a new layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from graphs.infra.variants import Registry
from training.blocks import Block

__all__ = ["LayerKind", "LayerOptions", "layer_kind", "layer_names", "linear_layer_names", "register_layer"]


@dataclass(frozen=True)
class LayerOptions:
    """The model settings a layer type may read (`training.layers.ModelConfig`'s fields)."""

    heads: int = 1  # attention heads of a hidden layer (the output layer gets 1)
    attn_dropout: float = 0.0
    edge_weights: bool = False  # aggregate with Â's entries too (sage, gin, sage_pool)
    gcn_edge_weight: bool = True  # gcn: Â's entries with norm 'none', else the block's degrees
    relations: int = 1  # relations of a typed graph's blocks (1: a homogeneous graph)
    num_bases: int = 0  # rgcn: bases the relation weights are mixed from (0: one weight per relation)


class LayerKind:
    """A layer type: how to build one layer, call it, and weigh its edges.

    Subclasses set ``name``, ``linear`` and ``aggregates_by`` (and ``sums`` for a sum) and
    implement `build`; `edge_weight`, `forward`, `check` and `compensation_problem` have
    defaults that suit a layer called as ``module(block, x, edge_weight=w)``.
    """

    name: ClassVar[str]
    linear: ClassVar[bool]
    aggregates_by: ClassVar[str]
    sums: ClassVar[bool] = False
    own_term: ClassVar[bool] = False
    relational: ClassVar[bool] = False

    @classmethod
    def build(cls, d_in: int, d_out: int, last: bool, opts: LayerOptions) -> nn.Module:
        """The layer mapping `d_in` features to `d_out` (`last`: the output layer)."""
        raise NotImplementedError(f"layer {cls.name!r} ({cls.__qualname__}) implements no build()")

    @classmethod
    def check(cls, cfg) -> None:
        """Refuse a `training.layers.ModelConfig` this layer type cannot be built from (ValueError)."""

    @classmethod
    def edge_weight(
        cls, block: Block, opts: LayerOptions, edge_scale: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Per-edge weights of one call over `block`: by default the sampler's correction (and
        Â's entries with ``opts.edge_weights``) times `edge_scale` (DropEdge's 1/(1-p), given to
        summing layers only), None where all are absent."""
        w = block.edge_weight if opts.edge_weights else None
        c = block.correction
        if c is not None:
            w = c if w is None else w * c
        if edge_scale is not None:
            w = edge_scale if w is None else w * edge_scale
        return w

    @classmethod
    def forward(cls, module: nn.Module, block: Block, h: torch.Tensor, weight, last: bool) -> torch.Tensor:
        """One call of the layer: source features -> destination features ``[num_dst, width]``."""
        return module(block, h, edge_weight=weight)

    @classmethod
    def per_relation(cls, modules: dict, block, h: torch.Tensor, opts: LayerOptions, combine: str):
        """`training.relational.RelationalConv`'s output (``modules``: its layer per relation key,
        `block` a `training.typed_blocks.TypedBlock`) computed for every relation at once, or None
        where it runs the layer relation by relation (the default)."""
        return None

    @classmethod
    def compensation_problem(cls, cfg) -> str | None:
        """Why VR-GCN's control variate cannot run with this layer and `cfg` (a phrase following
        "training.compensation.vrgcn"), or None."""
        if cls.linear:
            return None
        return (
            f"needs a linear aggregation (model.conv one of {linear_layer_names()}); "
            f"model.conv={cls.name!r} aggregates by {cls.aggregates_by}"
        )


def _check_traits(cls: type) -> None:
    if not (isinstance(cls, type) and issubclass(cls, LayerKind)):
        raise TypeError(f"{cls!r} is not a LayerKind subclass")
    for trait, kind in (("linear", bool), ("aggregates_by", str), ("sums", bool)):
        if not isinstance(getattr(cls, trait, None), kind):
            raise TypeError(f"layer {cls.name!r} ({cls.__qualname__}) declares no {kind.__name__} `{trait}`")


LAYERS = Registry("layer", "model.conv", "training.convs", _check_traits)


def register_layer(cls: type[LayerKind]) -> type[LayerKind]:
    """Class decorator: register the `LayerKind` subclass `cls` under ``cls.name``."""
    return LAYERS.register(cls)


def layer_names() -> tuple[str, ...]:
    """The registered layer names."""
    return LAYERS.names()


def linear_layer_names() -> tuple[str, ...]:
    """The registered layers whose aggregation is linear (a (weighted) sum or mean)."""
    return tuple(n for n in layer_names() if LAYERS.get(n).linear)


def layer_kind(name: str) -> type[LayerKind]:
    """The layer type registered as `name` (ValueError naming the registered ones otherwise)."""
    return LAYERS.get(name)
