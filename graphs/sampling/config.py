"""Settings of the minibatch_shards stage: `ShardConfig` (samplers in `graphs.sampling`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from graphs.formats.shard_format import (
    FEATURE_ENCODINGS,
    WEIGHT_ENCODINGS,
)
from graphs.infra.config_checks import (
    DEFAULT_FANOUTS,
    MAX_BATCH,
    MAX_RANKS,
    MAX_SEED,
    MAX_THREADS,
    bounded_repr,
    bounded_text,
    check_fields,
    parse_fanouts,
)
from graphs.sampling.placement import placement_class, placement_names
from graphs.sampling.registry import sampler_class, sampler_names
from graphs.stages.negatives import DISTRIBUTIONS as NEGATIVE_DISTRIBUTIONS
from graphs.stages.negatives import FILTERS as NEGATIVE_FILTERS

# the automatic per-rank batch size (ShardConfig.batch_size = 0): see `auto_batch_size`
AUTO_BATCH_MAX = 1024
AUTO_MINIBATCHES = 4
SEED_WEIGHTINGS = ("uniform", "class_balanced")
# weight_encoding settings: 'auto' picks the stored encoding (`stored_weight_encoding`)
WEIGHT_SETTINGS = ("auto",) + tuple(e for e in WEIGHT_ENCODINGS if e != "factors")


def stored_weight_encoding(setting: str, factors_available: bool) -> str:
    """The weight encoding (`graphs.formats.shard_format.WEIGHT_ENCODINGS`) the shards are written in:
    'factors' for 'auto' where Â has its scale factors, 'fp32' for 'auto' elsewhere, else the setting."""
    if setting != "auto":
        return setting
    return "factors" if factors_available else "fp32"


# ----------------------------------------------------------------------------- config

# settings of the flat shape, now in a sampler's block or the link block: refused naming the new key
MOVED_SETTINGS = {
    "neighbor_rescale": "samplers.neighbor.rescale",
    "neighbor_prob": "samplers.neighbor.prob",
    "adaptive_alpha": "samplers.neighbor.adaptive_alpha",
    "importance_nodes": "samplers.importance.nodes",
    "cluster_batch": "samplers.cluster_gcn.clusters",
    "saint_mode": "samplers.saint.mode",
    "saint_budget": "samplers.saint.budget",
    "saint_walk_length": "samplers.saint.walk_length",
    "saint_coverage": "samplers.saint.coverage",
    "saint_subgraphs": "samplers.saint.subgraphs",
    "negatives": "link.negatives",
    "negative_filter": "link.filter",
    "negative_distribution": "link.distribution",
    "exclude_seed_edges": "link.exclude_seed_edges",
}


def sampler_settings_classes() -> dict[str, type]:
    """{sampler name: its ``Settings`` dataclass} of every registered sampler."""
    return {name: sampler_class(name).Settings for name in sampler_names()}


@dataclass(kw_only=True)
class LinkShardSettings:
    """Link prediction's shard settings (``link: {...}``; the dataset's task: link_prediction,
    `graphs.sampling.link`): ``batch_size`` then counts seed edges per minibatch."""

    negatives: int = field(
        default=1,
        metadata={"max": 1 << 12, "help": "negatives per positive seed edge (its destination corrupted)."},
    )
    filter: str = field(
        default="bloom",
        metadata={
            "help": f"how candidate negatives that are edges are rejected, one of {NEGATIVE_FILTERS}: 'bloom' = "
            "compressed_graph's per-part Bloom filters (all edges, held-out ones included; no edge ever passes), "
            "'exact' = sorted int64 keys of every edge, 'none' = self pairs only (DGL's uniform sampler)."
        },
    )
    distribution: str = field(
        default="uniform",
        metadata={
            "help": f"candidate destinations, one of {NEGATIVE_DISTRIBUTIONS}: uniform over the nodes, or in "
            "proportion to degree^0.75 in the message-passing graph."
        },
    )
    exclude_seed_edges: bool = field(
        default=True,
        metadata={
            "help": "leave each minibatch's seed edges and their reverses out of its sampled blocks (DGL's "
            "exclude='reverse_id'), so no positive is predicted from its own edge."
        },
    )

    def __post_init__(self) -> None:
        check_fields(self, "link")
        if self.negatives < 1:
            raise ValueError(f"link.negatives={self.negatives} must be at least 1")
        if self.filter not in NEGATIVE_FILTERS:
            raise ValueError(f"link.filter={bounded_repr(self.filter)} is not one of {NEGATIVE_FILTERS}")
        if self.distribution not in NEGATIVE_DISTRIBUTIONS:
            raise ValueError(
                f"link.distribution={bounded_repr(self.distribution)} is not one of {NEGATIVE_DISTRIBUTIONS}"
            )


@dataclass(kw_only=True)
class ShardConfig:
    """Settings of the minibatch_shards stage (sampler, batch geometry, epochs, ranks)."""

    MOVED_SETTINGS: ClassVar[dict[str, str]] = MOVED_SETTINGS

    sampler: str = field(
        default="neighbor",
        metadata={
            "help": "Sampler, by its registered name: the built-in neighbor, importance, cluster_gcn and saint "
            "(graphs/sampling/kinds/), or one a module registers (docs/extending.md)."
        },
    )
    fanouts: str = field(
        default=DEFAULT_FANOUTS,
        metadata={
            "help": "Neighbours sampled per node for each layer, input layer first (DGL's order); "
            "-1 = all. Its length is the number of layers for every sampler (and the model's, by default)."
        },
    )
    batch_size: int = field(
        default=0,
        metadata={
            "max": MAX_BATCH,
            "help": "Seeds per minibatch per rank (upper bound), neighbor and importance samplers; "
            f"0 = automatic: min({AUTO_BATCH_MAX}, ceil(T / (W x {AUTO_MINIBATCHES}))) for T training nodes "
            f"and W ranks, so a small graph still gets {AUTO_MINIBATCHES} optimizer steps per sampled epoch "
            f"and a large one minibatches of at most {AUTO_BATCH_MAX}. The manifest records the resolved value.",
        },
    )
    epochs: int = field(default=3, metadata={"max": 10_000, "help": "Epochs of shards to write."})
    world_size: int = field(
        default=2, metadata={"max": MAX_RANKS, "help": "DDP ranks W; one shard stream per rank and epoch."}
    )
    seed: int = field(
        default=0, metadata={"max": MAX_SEED, "help": "Seed of every random draw (shards are deterministic)."}
    )
    placement: str = field(
        default="random",
        metadata={
            "help": "How seeds go to ranks, by its registered name (graphs/sampling/placements/): 'random' cuts a "
            "permutation of the training "
            "nodes into W parts; 'partition' gives rank r the training nodes of the METIS parts assigned to it "
            "(metis_partitions' part_id.npy; parts go to ranks balancing training nodes), moving only the "
            "surplus over an equal share to other ranks, so step counts and batch sizes stay those of 'random'; "
            "'vertex_cut' does the same with the masters of metis_partitions' vertex cut (its vertex_cut setting) "
            "and rank r samples only from the edges of its parts, holding the feature rows they touch. "
            "neighbor and importance samplers ('vertex_cut': neighbor with prob 'uniform')."
        },
    )
    replicate: float = field(
        default=0.0,
        metadata={
            "max": 1.0,
            "help": "Hybrid partitioning (PaGraph's rule): this share of the feature rows (0..1), those of the "
            "highest-degree nodes, is held by every rank besides its own parts, so they are never remote; the "
            "remote-row measurement counts them as local, the manifest records them, and training keeps them "
            "in its feature cache's hot tier (training.feature_cache_hot is raised to this share). Needs "
            "metis_partitions with at least world_size parts. 0 = off",
        },
    )
    rebalance: bool = field(
        default=False,
        metadata={
            "help": "Between retrains: share every epoch's seeds between ranks in proportion to each rank's speed "
            "in trained_model's last run (seeds per second reading and forwarding its minibatches, from "
            "metrics.parquet), every rank keeping the same number of minibatches (a slower rank gets smaller "
            "ones); training weights each rank's loss by its share, so the gradient stays the mean over all "
            "seeds (graphs.sampling.rebalance). neighbor and importance samplers."
        },
    )
    rebalance_tolerance: float = field(
        default=0.1,
        metadata={
            "max": 1.0,
            "help": "rebalance: ranks whose speeds differ by less than this fraction keep equal shares "
            "(the shard files are then those of rebalance: false); 1 = never rebalance",
        },
    )
    minibatches_per_shard: int = field(default=8, metadata={"max": 1 << 20, "help": "Minibatches per shard file."})
    workers: int = field(
        default=0,
        metadata={
            "max": MAX_THREADS,
            "help": "Processes that sample and write the shard files, forked from the stage's process (the "
            "graph is shared, not copied); 0 = one per CPU core this process may use. The files are "
            "byte-identical for any number.",
        },
    )
    weight_encoding: str = field(
        default="auto",
        metadata={
            "help": f"Edge-weight encoding in the shards, one of {WEIGHT_SETTINGS}: 'auto' stores none per edge "
            "where Â factors into row and column scales (an unweighted graph: training recomputes each weight "
            "bit for bit from normalized_adjacency's two vectors) and 'fp32' elsewhere; 'fp32' and 'int8' "
            "(+ scale per row) store them per edge always."
        },
    )
    feature_encoding: str = field(
        default="fp32",
        metadata={
            "help": f"Features the shards name, one of {FEATURE_ENCODINGS}: 'fp32' reads the canonical "
            "features.npy, 'compressed' reads compressed_graph's codes (its encoding and transform), "
            "decoded per batch on the training device."
        },
    )
    self_loops: bool = field(
        default=True,
        metadata={"help": "Add each destination's self loop with weight Â_vv to every block (when Â has them)."},
    )
    seed_weighting: str = field(
        default="uniform",
        metadata={
            "help": f"neighbor / importance seeds per epoch, one of {SEED_WEIGHTINGS}: 'uniform' = every training "
            "node once (a permutation); 'class_balanced' = as many seeds drawn with replacement, in proportion to "
            "1 / (training nodes of the node's class), so each class fills an equal share (imbalanced classes)."
        },
    )
    samplers: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "blocks": sampler_settings_classes,
            "help": "Each sampler's own settings, under its name (e.g. samplers: {saint: {coverage: 5}}); the "
            "chosen sampler's block applies and the others are checked only. Every sampler declares them in its "
            "module of graphs/sampling/kinds/ with their help texts).",
        },
    )
    link: LinkShardSettings = field(
        default_factory=lambda: LinkShardSettings(),
        metadata={"help": "link prediction (gnnflow.yaml task: link_prediction): negatives and seed-edge exclusion"},
    )

    def __post_init__(self) -> None:
        check_fields(self)
        kind = sampler_class(self.sampler)  # ValueError naming the registered samplers
        parse_fanouts(self.fanouts)
        if self.batch_size < 0:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1, or 0 (automatic)")
        if self.workers < 0:
            raise ValueError(f"workers={self.workers} must be >= 1, or 0 (one per CPU core)")
        for name in ("epochs", "world_size", "minibatches_per_shard"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} must be >= 0")
        if self.seed_weighting not in SEED_WEIGHTINGS:
            raise ValueError(f"seed_weighting={bounded_repr(self.seed_weighting)} is not one of {SEED_WEIGHTINGS}")
        if self.seed_weighting != "uniform" and not kind.traits.seeds:
            raise ValueError(
                f"seed_weighting={bounded_repr(self.seed_weighting)} weights seed nodes; sampler={bounded_repr(self.sampler)} draws "
                f"whole subgraphs (use a sampler that grows minibatches from seeds: {seed_samplers()})"
            )
        if self.weight_encoding not in WEIGHT_SETTINGS:
            raise ValueError(f"weight_encoding={bounded_repr(self.weight_encoding)} is not one of {WEIGHT_SETTINGS}")
        if self.feature_encoding == "int8":
            raise ValueError(
                "feature_encoding='int8' is now 'compressed': the shards read compressed_graph's features "
                "(set compressed_graph's feature_encoding to 'int8' for INT8 codes)"
            )
        if self.feature_encoding not in FEATURE_ENCODINGS:
            raise ValueError(
                f"feature_encoding={bounded_repr(self.feature_encoding)} is not one of {FEATURE_ENCODINGS}"
            )
        if placement_class(self.placement).traits.places_seeds and not kind.traits.seeds:
            raise ValueError(
                f"placement={bounded_repr(self.placement)} places seed nodes; sampler={bounded_repr(self.sampler)} "
                f"draws whole subgraphs (use a sampler that grows minibatches from seeds: {seed_samplers()}, or a "
                f"placement that places none: {unplaced_seeds()})"
            )
        if placement_class(self.placement).traits.own_edges and self.replicate > 0:
            raise ValueError(
                f"replicate={self.replicate:g} adds rows to each rank's METIS parts; placement="
                f"{bounded_repr(self.placement)} already holds every row its rank's edges touch (set replicate to 0)"
            )
        if placement_class(self.placement).traits.own_edges and not kind.traits.own_edges:
            raise ValueError(
                f"placement={bounded_repr(self.placement)} samples each rank's own edges; "
                f"sampler={bounded_repr(self.sampler)} does not (samplers that do: {own_edge_samplers()})"
            )
        if self.rebalance and not kind.traits.seeds:
            raise ValueError(
                f"rebalance shares seed nodes between ranks; sampler={bounded_repr(self.sampler)} draws whole "
                f"subgraphs (use a sampler that grows minibatches from seeds: {seed_samplers()})"
            )
        if self.rebalance_tolerance < 0:
            raise ValueError(f"rebalance_tolerance={self.rebalance_tolerance} must be in [0, 1]")
        self.samplers = {self.sampler: _sampler_settings(self.samplers)[self.sampler]}

    @property
    def options(self):
        """The chosen sampler's settings (an instance of its ``Settings`` dataclass)."""
        return self.samplers[self.sampler]

    @property
    def fanout_list(self) -> list[int]:
        return parse_fanouts(self.fanouts)

    @property
    def num_layers(self) -> int:
        return len(self.fanout_list)


def _sampler_settings(blocks: Any) -> dict[str, Any]:
    """Every registered sampler's settings: its block of `blocks` (a mapping of sampler names to
    mappings or ``Settings`` instances) checked and completed with the defaults."""
    if not isinstance(blocks, Mapping):
        raise ValueError(f"samplers={bounded_repr(blocks)}: must be a mapping of sampler names to their settings")
    classes = sampler_settings_classes()
    out = {name: cls() for name, cls in classes.items()}
    for name, given in blocks.items():
        cls = classes.get(name) if isinstance(name, str) else None
        if cls is None:
            raise ValueError(f"samplers.{bounded_text(str(name))}: not a sampler; the samplers are {tuple(classes)}")
        out[name] = given if isinstance(given, cls) else _settings_from(cls, given, f"samplers.{name}")
    return out


def _settings_from(cls: type, given: Any, where: str) -> Any:
    """`cls` built from the mapping `given`, an unknown key named with the known ones."""
    if given is None:
        return cls()
    if not isinstance(given, Mapping):
        raise ValueError(f"{where}={bounded_repr(given)}: must be a mapping of settings")
    known = [f.name for f in fields(cls)]
    for key in given:
        if key not in known:
            raise ValueError(f"{where}.{bounded_text(str(key))}: not a setting of this sampler; its settings: {known}")
    return cls(**given)


def own_edge_samplers() -> str:
    """The registered samplers that can sample each rank's own edges, for messages."""
    return ", ".join(repr(n) for n in sampler_names() if sampler_class(n).traits.own_edges)


def unplaced_seeds() -> str:
    """The registered placements that leave seeds where the permutation puts them, for messages."""
    return ", ".join(repr(n) for n in placement_names() if not placement_class(n).traits.places_seeds)


def seed_samplers() -> str:
    """The registered samplers that grow minibatches from seed nodes, for messages."""
    return ", ".join(repr(n) for n in sampler_names() if sampler_class(n).traits.seeds)


def auto_batch_size(train_nodes: int, world_size: int) -> int:
    """``min(AUTO_BATCH_MAX, ceil(T / (W * AUTO_MINIBATCHES)))`` (at least 1): the per-rank
    batch of ``ShardConfig.batch_size = 0``, giving a small graph several steps per epoch."""
    return max(1, min(AUTO_BATCH_MAX, math.ceil(train_nodes / (world_size * AUTO_MINIBATCHES))))


def resolve_batch_size(cfg: ShardConfig, train_nodes: int) -> ShardConfig:
    """``cfg`` with ``batch_size`` resolved (0 = `auto_batch_size`)."""
    if cfg.batch_size:
        return cfg
    return replace(cfg, batch_size=auto_batch_size(train_nodes, cfg.world_size))
