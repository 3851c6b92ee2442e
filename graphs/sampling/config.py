"""Settings of the minibatch_shards stage: `ShardConfig` (samplers in `graphs.sampling`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

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
    check_fields,
    parse_fanouts,
)
from graphs.sampling.registry import sampler_class, sampler_names
from graphs.stages.negatives import DISTRIBUTIONS as NEGATIVE_DISTRIBUTIONS
from graphs.stages.negatives import FILTERS as NEGATIVE_FILTERS

# the automatic per-rank batch size (ShardConfig.batch_size = 0): see `auto_batch_size`
AUTO_BATCH_MAX = 1024
AUTO_MINIBATCHES = 4
SAINT_MODES = ("node", "edge", "walk")
PLACEMENTS = ("random", "partition")
NEIGHBOR_PROBS = ("uniform", "weight", "adaptive")
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


@dataclass(kw_only=True)
class ShardConfig:
    """Settings of the minibatch_shards stage (sampler, batch geometry, epochs, ranks)."""

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
            "help": f"How seeds go to ranks, one of {PLACEMENTS}: 'random' cuts a permutation of the training "
            "nodes into W parts; 'partition' gives rank r the training nodes of the METIS parts assigned to it "
            "(metis_partitions' part_id.npy; parts go to ranks balancing training nodes), moving only the "
            "surplus over an equal share to other ranks, so step counts and batch sizes stay those of 'random'. "
            "neighbor and importance samplers."
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
    neighbor_rescale: bool = field(
        default=True,
        metadata={
            "help": "neighbor: store the correction deg/sampled per sampled edge (1 when off), so each "
            "layer type's aggregation is unbiased (training.layers.sampled_edge_weight)."
        },
    )
    neighbor_prob: str = field(
        default="uniform",
        metadata={
            "help": "neighbor: 'uniform' (without replacement) or 'weight' (with replacement, in proportion "
            "to Â's entries, so heavy edges of a weighted graph are drawn more often; unbiased by S_v / draws) "
            "or 'adaptive' (with replacement, in proportion to p(u) = α·deg(u)/Σdeg + (1−α)·g(u)/Σg with g the "
            "previous training run's per-node gradient norms, trained_model's node_grad_norm.npz written with "
            "training.node_grad_stats; degree only until that file exists; unbiased by P_v / (p(u) · draws), "
            "graphs.sampling.weighting)."
        },
    )
    adaptive_alpha: float = field(
        default=0.5,
        metadata={"help": "neighbor_prob 'adaptive': α, the weight of the degree term (1 = degree only), in [0, 1]."},
    )
    seed_weighting: str = field(
        default="uniform",
        metadata={
            "help": f"neighbor / importance seeds per epoch, one of {SEED_WEIGHTINGS}: 'uniform' = every training "
            "node once (a permutation); 'class_balanced' = as many seeds drawn with replacement, in proportion to "
            "1 / (training nodes of the node's class), so each class fills an equal share (imbalanced classes)."
        },
    )
    importance_nodes: int = field(
        default=2048, metadata={"max": MAX_BATCH, "help": "importance: nodes drawn (with replacement) per layer."}
    )
    cluster_batch: int = field(
        default=20, metadata={"max": 1 << 20, "help": "cluster_gcn: METIS clusters per minibatch."}
    )
    saint_mode: str = field(default="node", metadata={"help": f"saint: sampler mode, one of {SAINT_MODES}."})
    saint_budget: int = field(
        default=6000,
        metadata={
            "max": MAX_BATCH,
            "help": "saint: nodes (node mode), edges (edge mode) or walk roots (walk mode) per subgraph.",
        },
    )
    saint_walk_length: int = field(default=2, metadata={"max": 1024, "help": "saint walk mode: random-walk length."})
    saint_coverage: float = field(
        default=20.0,
        metadata={
            "max": 1000.0,
            "help": "saint: pre-sample until each node is expected in this many subgraphs (normalization).",
        },
    )
    saint_subgraphs: int = field(
        default=0,
        metadata={"max": 1 << 20, "help": "saint: subgraphs per epoch per rank; 0 = about n / (W * subgraph nodes)."},
    )
    # link prediction (the dataset's task: link_prediction; graphs/sampling/link.py): batch_size
    # then counts seed edges per minibatch, and the fields below apply
    negatives: int = field(
        default=1,
        metadata={
            "max": 1 << 12,
            "help": "link prediction: negatives per positive seed edge (its destination corrupted).",
        },
    )
    negative_filter: str = field(
        default="bloom",
        metadata={
            "help": f"link prediction: how candidate negatives that are edges are rejected, one of {NEGATIVE_FILTERS}: "
            "'bloom' = compressed_graph's per-part Bloom filters (all edges, held-out ones included; no edge ever "
            "passes), 'exact' = sorted int64 keys of every edge, 'none' = self pairs only (DGL's uniform sampler)."
        },
    )
    negative_distribution: str = field(
        default="uniform",
        metadata={
            "help": f"link prediction: candidate destinations, one of {NEGATIVE_DISTRIBUTIONS}: uniform over the "
            "nodes, or in proportion to degree^0.75 in the message-passing graph."
        },
    )
    exclude_seed_edges: bool = field(
        default=True,
        metadata={
            "help": "link prediction: leave each minibatch's seed edges and their reverses out of its sampled "
            "blocks (DGL's exclude='reverse_id'), so no positive is predicted from its own edge."
        },
    )

    def __post_init__(self) -> None:
        check_fields(self)
        kind = sampler_class(self.sampler)  # ValueError naming the registered samplers
        parse_fanouts(self.fanouts)
        if self.batch_size < 0:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1, or 0 (automatic)")
        if self.workers < 0:
            raise ValueError(f"workers={self.workers} must be >= 1, or 0 (one per CPU core)")
        for name in (
            "epochs",
            "world_size",
            "minibatches_per_shard",
            "importance_nodes",
            "cluster_batch",
            "saint_budget",
            "saint_walk_length",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} must be >= 0")
        if self.neighbor_prob not in NEIGHBOR_PROBS:
            raise ValueError(f"neighbor_prob={bounded_repr(self.neighbor_prob)} is not one of {NEIGHBOR_PROBS}")
        if not 0.0 <= self.adaptive_alpha <= 1.0:
            raise ValueError(f"adaptive_alpha={self.adaptive_alpha} must lie in [0, 1]")
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
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement={bounded_repr(self.placement)} is not one of {PLACEMENTS}")
        if self.placement == "partition" and not kind.traits.seeds:
            raise ValueError(
                f"placement='partition' places seed nodes; sampler={bounded_repr(self.sampler)} draws whole subgraphs "
                f"(use a sampler that grows minibatches from seeds: {seed_samplers()}, or placement 'random')"
            )
        if self.saint_mode not in SAINT_MODES:
            raise ValueError(f"saint_mode={bounded_repr(self.saint_mode)} is not one of {SAINT_MODES}")
        if self.saint_coverage <= 0:
            raise ValueError(f"saint_coverage={self.saint_coverage} must be > 0")
        if self.negatives < 1:
            raise ValueError(f"negatives={self.negatives} must be at least 1")
        if self.negative_filter not in NEGATIVE_FILTERS:
            raise ValueError(f"negative_filter={bounded_repr(self.negative_filter)} is not one of {NEGATIVE_FILTERS}")
        if self.negative_distribution not in NEGATIVE_DISTRIBUTIONS:
            raise ValueError(
                f"negative_distribution={bounded_repr(self.negative_distribution)} is not one of {NEGATIVE_DISTRIBUTIONS}"
            )
        if self.saint_subgraphs < 0:
            raise ValueError(f"saint_subgraphs={self.saint_subgraphs} must be >= 0 (0 = automatic)")

    @property
    def fanout_list(self) -> list[int]:
        return parse_fanouts(self.fanouts)

    @property
    def num_layers(self) -> int:
        return len(self.fanout_list)


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
