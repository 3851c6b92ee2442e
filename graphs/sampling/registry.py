"""The samplers of the minibatch_shards stage, by name, each with the traits it declares.

A sampler is a `graphs.sampling.base.MinibatchSampler` subclass in its own module of
`graphs.sampling.kinds`, registered with `register_sampler` under its ``name``. Every module
of that package is imported on the first lookup, so adding a sampler is one new file there
(plus its test); a sampler defined elsewhere (a test, a user's package imported before the
stage runs) registers the same way. Its own settings are the fields of its ``Settings`` dataclass (users write them under
``samplers: {<name>: {...}}``). Checks read the declared `SamplerTraits`, never a name:
the settings check in `ShardConfig`, the manifest the writer records
(``shared_block``, ``non_uniform_draws``), and through the manifest the layer check in
training. docs/extending.md walks through a new sampler.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from graphs.infra.variants import Registry

__all__ = ["SamplerTraits", "register_sampler", "sampler_class", "sampler_names"]


@dataclass(frozen=True, kw_only=True)
class SamplerTraits:
    """What a sampler is, as the rest of gnnflow needs to know it.

    - ``seeds``: minibatches grow around seed nodes drawn from the training nodes, so
      ``batch_size``, ``placement: partition`` and ``seed_weighting`` apply (else the sampler
      draws whole subgraphs and its loss nodes are their training nodes).
    - ``shares_block``: one stored block stands for every layer (an induced subgraph).
    - ``non_uniform``: edges are drawn with unequal probabilities, so each carries a
      correction that only a (weighted) sum or mean can use (a layer's ``linear`` trait).
    - ``needs_clusters``: reads metis_partitions' clusters (``cluster_id.npy``).
    - ``whole_graphs``: minibatches are graphs of a graph collection (whole, or each cut to a
      subgraph of its own nodes), the loss items graphs (a graph-level task's sampler; a
      node-level sampler draws from one graph).
    - ``typed``: it draws a typed graph's blocks from its relational Â and stores each edge's
      relation (``etype``), as relational models need.
    - ``own_edges``: it can draw each rank's minibatches from that rank's own edges only (the
      sampler's ``rank`` and ``own_edges``), as a placement with ``own_edges`` needs (vertex cut).
    """

    seeds: bool
    shares_block: bool = False
    non_uniform: bool = False
    needs_clusters: bool = False
    whole_graphs: bool = False
    own_edges: bool = False
    typed: bool = False


def _check_traits(cls: type) -> None:
    if not isinstance(getattr(cls, "traits", None), SamplerTraits):
        raise TypeError(f"sampler {cls.name!r} ({cls.__qualname__}) declares no SamplerTraits in `traits`")
    settings = getattr(cls, "Settings", None)
    if not (isinstance(settings, type) and dataclasses.is_dataclass(settings)):
        raise TypeError(f"sampler {cls.name!r} ({cls.__qualname__}): `Settings` must be a dataclass")
    missing = [f.name for f in dataclasses.fields(settings) if f.default is f.default_factory is dataclasses.MISSING]
    if missing:
        raise TypeError(f"sampler {cls.name!r}: Settings fields {missing} need defaults")


SAMPLERS = Registry("sampler", "sampler", "graphs.sampling.kinds", _check_traits)


def register_sampler(cls: type) -> type:
    """Class decorator: register `cls` under ``cls.name``, with its ``cls.traits``."""
    return SAMPLERS.register(cls)


def sampler_names() -> tuple[str, ...]:
    """The registered sampler names (the built-in ones first)."""
    return SAMPLERS.names()


def sampler_class(name: str) -> type:
    """The sampler class registered as `name` (ValueError naming the registered ones otherwise)."""
    return SAMPLERS.get(name)
