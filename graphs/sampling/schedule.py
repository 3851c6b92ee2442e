"""Seed schedule: which seeds or clusters each rank gets per epoch, and every random seed
(derived from the config's seed through SeedSequence; see `graphs.sampling`)."""

from __future__ import annotations

import math

import numpy as np

from graphs.sampling.config import ShardConfig, resolve_batch_size

# ----------------------------------------------------------------------------- seeds


def derive_seed(seed: int, *key: int) -> int:
    """A 31-bit seed for one random stream, from (seed, *key) through SeedSequence."""
    return int(np.random.SeedSequence([seed, *key]).generate_state(1)[0] & 0x7FFFFFFF)


# stream tags of derive_seed, so different uses never share a stream
_TAG_EPOCH, _TAG_MINIBATCH, _TAG_PRESAMPLE = 1, 2, 3


def minibatch_seed(seed: int, epoch: int, rank: int, index: int) -> int:
    """The seed of minibatch `index` of (`epoch`, `rank`)."""
    return derive_seed(seed, _TAG_MINIBATCH, epoch, rank, index)


def presample_seed(seed: int, index: int) -> int:
    """The seed of pre-sampled subgraph `index` (GraphSAINT's normalization counts)."""
    return derive_seed(seed, _TAG_PRESAMPLE, index)


def epoch_seed_batches(train_nodes: np.ndarray, epoch: int, cfg: ShardConfig) -> list[list[np.ndarray]]:
    """[rank][minibatch] seed arrays of one epoch (see the module docstring).

    Disjoint across ranks, covering every training node exactly once; every rank gets the
    same number of minibatches, sizes within one of each other and at most batch_size.
    """
    w, t = cfg.world_size, len(train_nodes)
    if t < w:
        raise ValueError(f"{t} training nodes cannot be split over world_size={w} ranks; lower world_size")
    cfg = resolve_batch_size(cfg, t)
    rng = np.random.default_rng(derive_seed(cfg.seed, _TAG_EPOCH, epoch))
    perm = rng.permutation(np.asarray(train_nodes, dtype=np.int64))
    parts = np.array_split(perm, w)
    batches = math.ceil(len(parts[0]) / cfg.batch_size)
    if len(parts[-1]) < batches:
        raise ValueError(
            f"batch_size={cfg.batch_size} leaves a rank with fewer seeds ({len(parts[-1])}) than minibatches "
            f"({batches}); raise batch_size"
        )
    return [np.array_split(p, batches) for p in parts]


def epoch_cluster_groups(cluster_ids: np.ndarray, epoch: int, cfg: ShardConfig) -> list[list[np.ndarray]]:
    """[rank][minibatch] arrays of cluster ids for cluster_gcn: each cluster once per epoch."""
    k = len(cluster_ids)
    if k < cfg.world_size:
        raise ValueError(f"{k} clusters cannot be split over world_size={cfg.world_size} ranks")
    batches = math.ceil(k / (cfg.cluster_batch * cfg.world_size))
    batches = min(batches, k // cfg.world_size)
    rng = np.random.default_rng(derive_seed(cfg.seed, _TAG_EPOCH, epoch))
    groups = np.array_split(rng.permutation(cluster_ids), cfg.world_size * batches)
    return [groups[r * batches : (r + 1) * batches] for r in range(cfg.world_size)]
