"""Seed schedule: which seeds or clusters each rank gets per epoch, and every random seed
(derived from the config's seed through SeedSequence; see `graphs.sampling`)."""

from __future__ import annotations

import math

import numpy as np

from graphs.sampling.config import ShardConfig, resolve_batch_size
from graphs.sampling.rebalance import share_sizes

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


def _place_on_owners(perm: np.ndarray, owner: np.ndarray, world_size: int, quota: np.ndarray) -> list[np.ndarray]:
    """Rank shares of `perm` of sizes `quota` (int64 [W]): rank r keeps its own nodes (owner == r)
    in permuted order up to its quota; the surplus of every rank, in permuted order, fills the
    other ranks' gaps."""
    t = len(perm)
    order = np.argsort(owner, kind="stable")  # grouped by rank, permuted order kept within a rank
    grouped_owner = owner[order]
    own_counts = np.bincount(owner, minlength=world_size)
    starts = np.concatenate([[0], np.cumsum(own_counts)[:-1]])
    position = np.arange(t, dtype=np.int64) - starts[grouped_owner]
    keep = np.zeros(t, dtype=bool)
    keep[order] = position < quota[grouped_owner]
    surplus = perm[~keep]  # permuted order
    gaps = quota - np.minimum(own_counts, quota)
    fill = np.split(surplus, np.cumsum(gaps)[:-1])
    return [np.concatenate([perm[keep & (owner == r)], fill[r]]) for r in range(world_size)]


def epoch_seed_batches(
    train_nodes: np.ndarray,
    epoch: int,
    cfg: ShardConfig,
    rank_of_node: np.ndarray | None = None,
    seed_probs: np.ndarray | None = None,
    rank_shares: np.ndarray | None = None,
) -> list[list[np.ndarray]]:
    """[rank][minibatch] seed arrays of one epoch (see the module docstring).

    Disjoint across ranks, covering every training node exactly once; every rank gets the
    same number of minibatches, sizes within one of each other and at most batch_size.
    With `rank_of_node` (int [n], the rank owning each node's part; ``placement='partition'``), a rank
    takes its own training nodes first (`_place_on_owners`); the shares' sizes are unchanged.
    With `seed_probs` (float [T], summing to 1; ``seed_weighting='class_balanced'``) the epoch's
    T seeds are drawn with replacement by those probabilities instead of permuted (a node may
    repeat, across ranks too); sizes and step counts are those of the permutation.
    With `rank_shares` (float [W]; ``rebalance``) rank r gets about T s_r seeds, every rank as many
    minibatches as the largest share needs (`graphs.sampling.rebalance.share_sizes`).
    """
    w, t = cfg.world_size, len(train_nodes)
    if t < w:
        raise ValueError(f"{t} training nodes cannot be split over world_size={w} ranks; lower world_size")
    cfg = resolve_batch_size(cfg, t)
    rng = np.random.default_rng(derive_seed(cfg.seed, _TAG_EPOCH, epoch))
    if seed_probs is None:
        perm = rng.permutation(np.asarray(train_nodes, dtype=np.int64))
    else:
        perm = np.asarray(train_nodes, dtype=np.int64)[rng.choice(t, size=t, replace=True, p=seed_probs)]
    if rank_shares is None:  # the sizes of np.array_split(perm, w)
        sizes = np.full(w, t // w, dtype=np.int64)
        sizes[: t % w] += 1
        batches = math.ceil(int(sizes[0]) / cfg.batch_size)
    else:
        sizes, batches = share_sizes(t, rank_shares, cfg.batch_size)
    if rank_of_node is None:
        parts = np.split(perm, np.cumsum(sizes)[:-1])
    else:
        parts = [rng.permutation(p) for p in _place_on_owners(perm, np.asarray(rank_of_node)[perm], w, sizes)]
    if int(sizes.min()) < batches:
        raise ValueError(
            f"batch_size={cfg.batch_size} leaves a rank with fewer seeds ({int(sizes.min())}) than minibatches "
            f"({batches}); raise batch_size"
        )
    return [np.array_split(p, batches) for p in parts]


def remote_rows(
    input_nodes: np.ndarray, rank_of_node: np.ndarray, rank: int, replicated: np.ndarray | None = None
) -> int:
    """How many of a minibatch's gathered feature rows (`input_nodes`) live in another rank's parts
    and are not `replicated` (bool [n]: held by every rank; ``replicate``)."""
    remote = rank_of_node[input_nodes] != rank
    if replicated is not None:
        remote &= ~replicated[input_nodes]
    return int(np.count_nonzero(remote))


def epoch_cluster_groups(
    cluster_ids: np.ndarray, epoch: int, cfg: ShardConfig, per_batch: int
) -> list[list[np.ndarray]]:
    """[rank][minibatch] arrays of cluster ids for cluster_gcn, about `per_batch` clusters per
    minibatch: each cluster once per epoch."""
    k = len(cluster_ids)
    if k < cfg.world_size:
        raise ValueError(f"{k} clusters cannot be split over world_size={cfg.world_size} ranks")
    batches = math.ceil(k / (per_batch * cfg.world_size))
    batches = min(batches, k // cfg.world_size)
    rng = np.random.default_rng(derive_seed(cfg.seed, _TAG_EPOCH, epoch))
    groups = np.array_split(rng.permutation(cluster_ids), cfg.world_size * batches)
    return [groups[r * batches : (r + 1) * batches] for r in range(cfg.world_size)]


def epoch_graph_batches(
    graphs: np.ndarray, num_nodes: np.ndarray, epoch: int, cfg: ShardConfig, per_batch: int
) -> list[list[np.ndarray]]:
    """[rank][minibatch] arrays of graph indices for whole_graphs: each of `graphs` once per
    epoch in a seeded order, cut into ``world_size x B`` minibatches (B the same for every rank,
    about `per_batch` graphs each) at equal shares of the nodes (`num_nodes` per graph index), so
    a minibatch holds at most total/(W·B) nodes plus one graph."""
    g, w = len(graphs), cfg.world_size
    if g < w:
        raise ValueError(f"{g} training graphs cannot be split over world_size={w} ranks")
    batches = min(math.ceil(g / (per_batch * w)), g // w)
    k = w * batches
    rng = np.random.default_rng(derive_seed(cfg.seed, _TAG_EPOCH, epoch))
    order = rng.permutation(np.asarray(graphs, dtype=np.int64))
    cum = np.cumsum(num_nodes[order])
    cuts = np.searchsorted(cum, cum[-1] * np.arange(1, k) / k, side="left") + 1
    step = np.arange(1, k)  # every minibatch keeps at least one graph: cuts strictly inside 1..g-1
    cuts = np.minimum(np.maximum.accumulate(np.maximum(cuts, step) - step) + step, g - k + step)
    groups = np.split(order, cuts)
    return [groups[r * batches : (r + 1) * batches] for r in range(w)]
