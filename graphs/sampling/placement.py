"""How seeds go to ranks (minibatch_shards' ``placement``), by name, each strategy with the traits it declares.

A placement is a `Placement` subclass in its own module of `graphs.sampling.placements`,
registered with `register_placement` under its ``name``; every module of that package is imported
on the first lookup, so a new strategy is one new file there (plus its test). Checks read the
declared `PlacementTraits`, never a name:

- ``needs_parts``: it reads metis_partitions' ``part_id.npy`` (minibatch_shards fails, naming the
  file, without it);
- ``places_seeds``: rank r takes its seeds first from the nodes it owns (`owners`), the surplus
  over its share going to other ranks (`graphs.sampling.schedule._place_on_owners`), so it
  applies to samplers that grow minibatches from seeds only (`ShardConfig` refuses the others);
- ``own_edges``: rank r samples from its own edges only and holds the feature rows of every node
  they touch (`Placement.own_edges`, a vertex cut), so it applies to samplers that declare
  ``own_edges`` (`graphs.sampling.registry.SamplerTraits`).

Every strategy also says which rank owns each node (`Placement.owners`), against which the writer
measures per step the share of gathered feature rows owned by another rank (manifest
``placement``); by default the ranks of the METIS parts when there are at least as many parts as
ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from graphs.infra.variants import Registry

__all__ = [
    "OwnEdges",
    "Placement",
    "PlacementTraits",
    "placement_class",
    "placement_names",
    "ranks_of_parts",
    "register_placement",
]


@dataclass(frozen=True, kw_only=True)
class PlacementTraits:
    """What a placement is (the module docstring says what each means)."""

    needs_parts: bool
    places_seeds: bool
    own_edges: bool = False


@dataclass
class OwnEdges:
    """What each rank samples from and holds under an ``own_edges`` placement."""

    rank_of_edge: np.ndarray  # int [m]: the rank of every off-diagonal entry of Â (canonical edge order)
    holders: np.ndarray  # uint64 [n]: bit r set when rank r holds the node's feature row
    facts: dict = field(default_factory=dict)  # what the manifest records of it


class Placement:
    """A placement strategy: its traits and the rank owning each node."""

    name: ClassVar[str]
    traits: ClassVar[PlacementTraits]

    @classmethod
    def owners(cls, inputs, cfg) -> tuple[np.ndarray, np.ndarray] | None:
        """``(rank_of_part int64 [k], rank_of_node int64 [n])`` for `inputs` (a
        `graphs.sampling.inputs.ShardInputs`) under `cfg` (a ShardConfig), or None when no rank owns
        nodes (no parts, or fewer parts than ranks): the METIS parts' ranks
        (`ranks_of_parts`) when there are enough parts."""
        if inputs.part_id is None or int(np.max(inputs.part_id)) + 1 < cfg.world_size:
            return None
        part_id = np.asarray(inputs.part_id, dtype=np.int64)
        rank_of_part = ranks_of_parts(part_id, inputs.train_nodes, cfg.world_size)
        return rank_of_part, rank_of_part[part_id]

    @classmethod
    def own_edges(cls, inputs, cfg, rank_of_part: np.ndarray, adj) -> OwnEdges:
        """The ranks' own edges and held rows (``traits.own_edges``); `adj` is the sampler's
        `graphs.sampling.base.Adjacency` (its off-diagonal CSR is in canonical edge order)."""
        raise NotImplementedError(f"placement {cls.name!r} declares own_edges and implements no own_edges()")


def ranks_of_parts(part_id: np.ndarray, train_nodes: np.ndarray, world_size: int) -> np.ndarray:
    """Rank of every METIS part (int64 [k]): parts in decreasing order of training nodes, each
    to the rank holding the fewest training nodes so far (longest-processing-time greedy).

    METIS balances nodes, not training nodes, so this evens the ranks' own seed counts; a
    loop over parts (k is the number of machines or trainers, not nodes).
    """
    part_id = np.asarray(part_id)
    k = int(part_id.max()) + 1 if len(part_id) else 0
    if k < world_size:
        raise ValueError(
            f"placement='partition' needs at least one METIS part per rank: {k} parts for world_size={world_size}; "
            "set metis_partitions num_parts to a multiple of world_size"
        )
    per_part = np.bincount(part_id[np.asarray(train_nodes, dtype=np.int64)], minlength=k)
    owner = np.empty(k, dtype=np.int64)
    load = np.zeros(world_size, dtype=np.int64)
    for p in np.argsort(-per_part, kind="stable").tolist():
        r = int(np.argmin(load))
        owner[p] = r
        load[r] += per_part[p]
    return owner


def _check_traits(cls: type) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Placement)):
        raise TypeError(f"{cls!r} is not a Placement subclass")
    if not isinstance(getattr(cls, "traits", None), PlacementTraits):
        raise TypeError(f"placement {cls.name!r} ({cls.__qualname__}) declares no PlacementTraits in `traits`")


PLACEMENTS = Registry("placement", "placement", "graphs.sampling.placements", _check_traits)


def register_placement(cls: type[Placement]) -> type[Placement]:
    """Class decorator: register the `Placement` subclass `cls` under ``cls.name``."""
    return PLACEMENTS.register(cls)


def placement_names() -> tuple[str, ...]:
    """The registered placement names (the built-in ones first)."""
    return PLACEMENTS.names()


def placement_class(name: str) -> type[Placement]:
    """The placement registered as `name` (ValueError naming the registered ones otherwise)."""
    return PLACEMENTS.get(name)
