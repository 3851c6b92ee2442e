"""Edge-seed minibatches for link prediction (`LinkSampler`, `write_link_shards`).

The configuration of DGL's link-prediction example (``examples/pytorch/graphsage/link_pred.py``:
``as_edge_prediction_sampler(NeighborSampler(fanouts), exclude="reverse_id",
negative_sampler=Uniform(k))``), written once as shards:

- **Seed edges** are the directed edges of the message-passing graph (`graphs.stages.edge_split`:
  the training edges in both directions, i.e. the off-diagonal entries of its Â; edge id =
  position in the off-diagonal CSR, as in `graphs.sampling.base.Adjacency`); on a typed graph,
  the target relation's entries of its relational Â (`relation_seed_edges`), the blocks typed
  like node classification's. Each epoch permutes
  them and cuts them over the ranks and into minibatches of at most ``batch_size`` seed
  edges with equal step counts (`graphs.sampling.schedule.epoch_seed_batches`, the seeds
  being edge ids).
- **Negatives**: ``link.negatives`` per seed edge, its source kept and its destination drawn
  uniformly (or degree-weighted; on a typed graph among the target relation's destination type)
  and rejected when the compressed graph's Bloom filters (or
  the exact keys) call the pair an edge (`graphs.stages.negatives.NegativeSampler`).
- **Blocks** around the union of both pairs' endpoints, by DGL's neighbour sampling over
  the message-passing graph with the minibatch's seed edges and their reverses excluded
  (``link.exclude_seed_edges``), with Â's weights, corrections and self loops exactly as the
  node-classification ``neighbor`` sampler stores them.

Each minibatch is stored through `graphs.formats.shard_format` like any other, plus ``pos_pairs``
and ``neg_pairs`` (positions of the pairs' endpoints among the last block's destination
nodes); the manifest gets ``task: link_prediction`` and a ``link`` entry with the negative
sampler's rejection counts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Callable

import numpy as np

from graphs.formats.canonical_files import read_summary
from graphs.formats.shard_manifest import LINK_PREDICTION
from graphs.sampling.base import SampledMinibatch
from graphs.sampling.config import ShardConfig, resolve_batch_size
from graphs.sampling.inputs import ShardInputs
from graphs.sampling.kinds.neighbor import NeighborSampler
from graphs.sampling.placement import placement_class
from graphs.sampling.schedule import epoch_seed_batches
from graphs.sampling.writer import write_minibatch_shards
from graphs.stages.compress import load_bloom_filters
from graphs.stages.edge_split_typed import TargetRelation
from graphs.stages.negatives import EdgeKeys, NegativeSampler

__all__ = [
    "LinkMinibatch",
    "LinkSampler",
    "negative_sampler_for",
    "relation_seed_edges",
    "seed_edge_reverse",
    "write_link_shards",
]


@dataclass
class LinkMinibatch(SampledMinibatch):
    """A node minibatch around the endpoints of positive and negative pairs (int64 [2, P/Q]
    positions among the last block's destination nodes, which are ``seeds``)."""

    pos_pairs: np.ndarray | None = None
    neg_pairs: np.ndarray | None = None


def seed_edge_reverse(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(destination row of every entry, position of its reverse entry) of a symmetric CSR whose
    columns ascend within rows; raises when an entry has no reverse."""
    n = len(indptr) - 1
    row = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    col = np.asarray(indices, dtype=np.int64)
    keys = row * np.int64(n) + col
    if len(keys) > 1 and (np.diff(keys) <= 0).any():
        raise ValueError("the adjacency's columns do not ascend within its rows")
    rev = np.minimum(np.searchsorted(keys, col * np.int64(n) + row), max(len(keys) - 1, 0))
    if len(keys) and (keys[rev] != col * np.int64(n) + row).any():
        raise ValueError("the message-passing graph is not symmetric: an edge has no reverse")
    return row, rev


def relation_seed_edges(adj, etypes: np.ndarray, target: TargetRelation) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(entry ids, destination rows, partner entry ids [P, k] or -1) of the target relation's
    entries of a typed graph's relational Â (rows are destinations): the seed edges of its link
    prediction, each with the entries of the same pair that sampling must leave out with it: its
    ``rev-`` edge and, for a relation joining a type to itself, the mirrored edge and its reverse."""
    n = adj.n
    etypes = np.asarray(etypes, dtype=np.int64)
    relations = int(etypes.max()) + 1 if len(etypes) else 1
    if n and n * n * relations >= 2**62:
        raise ValueError(f"{n} nodes x {relations} relations: a pair's key would not fit in int64")
    row = np.repeat(np.arange(n, dtype=np.int64), np.diff(adj.indptr))
    col = np.asarray(adj.indices, dtype=np.int64)
    keys = (row * n + col) * relations + etypes  # ascending: rows, then (source, relation) within a row
    order = None if len(keys) < 2 or (np.diff(keys) > 0).all() else np.argsort(keys, kind="stable")
    ordered = keys if order is None else keys[order]

    def find(r: np.ndarray, c: np.ndarray, e: int) -> np.ndarray:
        q = (r * n + c) * relations + e
        pos = np.minimum(np.searchsorted(ordered, q), max(len(ordered) - 1, 0))
        hit = ordered[pos] == q if len(ordered) else np.zeros(len(q), bool)
        at = pos if order is None else order[pos]
        return np.where(hit, at, -1).astype(np.int64)

    seeds = np.flatnonzero(etypes == target.index).astype(np.int64)
    v, u = row[seeds], col[seeds]  # the edge u -> v, stored at row v
    partners = []
    if target.reverse is not None:
        partners.append(find(u, v, target.reverse))  # v -> u of rev, stored at row u
    if target.symmetric:
        partners.append(find(u, v, target.index))  # v -> u of the relation
        if target.reverse is not None:
            partners.append(find(v, u, target.reverse))  # u -> v of rev
    stacked = np.stack(partners, 1) if partners else np.full((len(seeds), 0), -1, np.int64)
    return seeds, v, stacked


def negative_sampler_for(
    cfg: ShardConfig,
    n: int,
    *,
    compressed_dir: str | os.PathLike | None,
    part_id: np.ndarray | None,
    canonical_dir: str | os.PathLike | None,
    degree: np.ndarray | None,
    dst_range: tuple[int, int] | None = None,
) -> NegativeSampler:
    """The `NegativeSampler` of `cfg`: Bloom filters from compressed_graph (routed by
    `part_id`), or exact keys of the full canonical graph, or none; destinations drawn from
    the ids `dst_range` (a typed relation's destination type) when given."""
    filters = part = exact = None
    if cfg.link.filter == "bloom":
        if compressed_dir is None:
            raise ValueError("link.filter='bloom' needs compressed_graph's Bloom filters; materialize it first")
        filters = load_bloom_filters(compressed_dir)
        part = np.zeros(n, np.int64) if part_id is None else np.asarray(part_id, np.int64)
        parts = int(part.max()) + 1 if n else 1
        if len(filters) < parts:
            raise ValueError(
                f"{compressed_dir}: {len(filters)} Bloom filters but the partition has {parts} parts; "
                "rematerialize compressed_graph"
            )
    elif cfg.link.filter == "exact":
        if canonical_dir is None:
            raise ValueError("link.filter='exact' needs the canonical graph (every edge)")
        exact = EdgeKeys.from_canonical(canonical_dir, n)
    return NegativeSampler(
        n,
        filter=cfg.link.filter,
        distribution=cfg.link.distribution,
        filters=filters,
        part=part,
        exact=exact,
        degree=degree,
        dst_range=dst_range,
    )


class LinkSampler(NeighborSampler):
    """Samples the link-prediction minibatches of every (epoch, rank); the interface
    `graphs.sampling.write_minibatch_shards` reads (``schedule``, ``sample``, ``minibatches_per_rank``)."""

    def __init__(
        self,
        inputs: ShardInputs,
        cfg: ShardConfig,
        negatives: NegativeSampler,
        log: Callable[[str], None] | None = None,
        target: TargetRelation | None = None,
    ):
        if cfg.sampler != NeighborSampler.name:  # a LinkSampler is a NeighborSampler around seed edges
            raise ValueError(f"link prediction samples with sampler={NeighborSampler.name!r}, got {cfg.sampler!r}")
        if placement_class(cfg.placement).traits.places_seeds:  # seeds are edges, spread at random
            raise ValueError(
                f"link prediction spreads its seed edges over the ranks at random; placement={cfg.placement!r} "
                "places seed nodes (set placement to 'random')"
            )
        # the state NeighborSampler.sample_neighbor reads; no training nodes are needed
        self.inputs, self.log = inputs, log or (lambda msg: None)
        self.cfg = cfg
        self._init_adjacency(inputs, cfg)
        self.is_train = np.zeros(inputs.n, dtype=bool)
        self._scratch = np.full(inputs.n, -1, dtype=np.int64)
        self.seed_probs = None
        self.setup()
        self.rank_of_node = self.rank_of_part = None
        self.target = target
        if (target is None) != (inputs.typed is None):
            raise ValueError("link prediction on a typed graph needs its target relation (edge_split.relation)")
        if target is None:  # every off-diagonal entry of the symmetric Â, each with its reverse
            self.seed_dst, reverse = seed_edge_reverse(self.adj.indptr, self.adj.indices)
            self.seed_eid, self.partners = np.arange(len(self.seed_dst), dtype=np.int64), reverse[:, None]
        else:
            self.seed_eid, self.seed_dst, self.partners = relation_seed_edges(self.adj, inputs.etypes, target)
        self.num_seed_edges = len(self.seed_dst)
        if self.num_seed_edges < cfg.world_size:
            raise ValueError(f"{self.num_seed_edges} seed edges cannot be split over world_size={cfg.world_size}")
        self.cfg = resolve_batch_size(cfg, self.num_seed_edges)
        self.negatives = negatives

    @property
    def shared_block(self) -> bool:
        return False

    def schedule(self, epoch: int) -> list[list[np.ndarray]]:
        """Epoch `epoch`'s seed-edge id batches, one list per rank."""
        return epoch_seed_batches(np.arange(self.num_seed_edges, dtype=np.int64), epoch, self.cfg)

    def minibatches_per_rank(self) -> int:
        return len(self.schedule(0)[0])

    def sample(self, eids: np.ndarray, seed: int) -> LinkMinibatch:
        """The minibatch of seed edges `eids` (seed numbers): pairs, negatives, blocks around their endpoints."""
        rng = np.random.default_rng(seed)
        eids = np.asarray(eids, np.int64)
        entries = self.seed_eid[eids]
        pos_src, pos_dst = self.adj.indices[entries].astype(np.int64), self.seed_dst[eids]
        neg_src, neg_dst = self.negatives.corrupt(pos_src, self.cfg.link.negatives, rng)
        nodes, inv = np.unique(np.concatenate([pos_src, pos_dst, neg_src, neg_dst]), return_inverse=True)
        p, q = len(eids), len(neg_src)
        exclude = None
        if self.cfg.link.exclude_seed_edges:
            partners = self.partners[eids].T.ravel()
            exclude = np.concatenate([entries, partners[partners >= 0]])
        mb = self.sample_neighbor(nodes, seed, exclude=exclude)
        return LinkMinibatch(
            input_nodes=mb.input_nodes,
            blocks=mb.blocks,
            seeds=mb.seeds,
            seed_pos=mb.seed_pos,
            labels=np.full(len(mb.seeds), -1, np.int64),
            pos_pairs=np.stack([inv[:p], inv[p : 2 * p]]).astype(np.int64),
            neg_pairs=np.stack([inv[2 * p : 2 * p + q], inv[2 * p + q :]]).astype(np.int64),
        )

    def counters(self) -> dict[str, float]:
        st = self.negatives.stats
        return {f.name: getattr(st, f.name) for f in fields(st)}

    def add_counters(self, delta: dict[str, float]) -> None:
        st = self.negatives.stats
        for key, value in delta.items():
            setattr(st, key, getattr(st, key) + value)

    def manifest_facts(self) -> dict:
        sampling = self.negatives.stats.as_dict()
        sampling.pop("seconds")  # a run statistic: the manifest stays the same for the same inputs
        return super().manifest_facts() | {  # the neighbour sampler's (adaptive draws)
            "task": LINK_PREDICTION,
            "link": {
                "seed_edges": int(self.num_seed_edges),
                "negatives_per_positive": self.cfg.link.negatives,
                "negative_filter": self.cfg.link.filter,
                "negative_distribution": self.cfg.link.distribution,
                "exclude_seed_edges": self.cfg.link.exclude_seed_edges,
                "relation": None if self.target is None else self.target.to_json(),
                "negative_sampling": sampling,
            },
        }


def write_link_shards(
    inputs: ShardInputs,
    out_dir: str | os.PathLike,
    cfg: ShardConfig,
    *,
    canonical_dir: str | os.PathLike | None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Link-prediction shards of the message-passing graph in `inputs` (loaded from the
    edge_split folder) into `out_dir`, through `graphs.sampling.write_minibatch_shards`.
    `canonical_dir` (the full graph) feeds ``link.filter="exact"``."""
    degree = np.diff(np.asarray(inputs.indptr)).astype(np.float64)
    relation = read_summary(inputs.canonical_dir).get("split", {}).get("relation")
    target = None if relation is None else TargetRelation.from_json(relation)
    negatives = negative_sampler_for(
        cfg,
        inputs.n,
        compressed_dir=inputs.compressed_dir,
        part_id=inputs.part_id,
        canonical_dir=canonical_dir,
        degree=degree,
        dst_range=None if target is None else target.dst_range,
    )
    sampler = LinkSampler(inputs, cfg, negatives, log, target)
    manifest = write_minibatch_shards(inputs, out_dir, sampler.cfg, log, sampler=sampler)
    manifest["negative_sampling_seconds"] = round(negatives.stats.seconds, 3)
    return manifest
