"""Rebalancing between retrains: each rank's share of an epoch's seeds follows its speed in the last run.

Training records, per epoch and rank, the seconds the rank spent reading its minibatches and in
their forward passes (metrics.parquet's ``data_seconds`` and ``forward_seconds``; backward is
left out, because DDP's all-reduce makes every rank wait there for the slowest) and the seeds it
processed. A rank's speed is its seeds per busy second over the run's epochs after the first,
which holds the one-off costs of first calls (`training.outputs.rank_seeds_per_second`). With ``rebalance: true``, minibatch_shards gives
rank r the share ``s_r = speed_r / Σ speed`` of every epoch's seeds, and every rank keeps the
same number of minibatches (the largest share's, at most ``batch_size`` seeds each; a slower
rank gets smaller ones), so the ranks reach each step's all-reduce together instead of the
faster ones idling. Training weights a minibatch's loss by ``W s_r`` (`ShardManifest.loss_scales`), so the
averaged gradient stays the mean over all the step's seeds. When the slowest rank is within
``rebalance_tolerance`` of the fastest, the shares stay equal and the shards are exactly those
of ``rebalance: false``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["rank_shares", "share_sizes"]


def rank_shares(seeds_per_second: Sequence[float], tolerance: float) -> np.ndarray | None:
    """float64 [W] summing to 1, in proportion to each rank's speed; None (equal shares) when the
    slowest rank is within `tolerance` (a fraction) of the fastest."""
    speeds = np.asarray(seeds_per_second, dtype=np.float64)
    if speeds.ndim != 1 or len(speeds) == 0 or not np.all(np.isfinite(speeds)) or np.any(speeds <= 0):
        raise ValueError(f"rank speeds must be positive and finite, one per rank: {speeds.tolist()}")
    if speeds.min() >= speeds.max() * (1.0 - tolerance):
        return None
    return speeds / speeds.sum()


def share_sizes(total: int, shares: np.ndarray, batch_size: int) -> tuple[np.ndarray, int]:
    """(int64 [W] seeds per rank summing to `total`, minibatches per rank): `total` apportioned by
    `shares` (largest remainders), the minibatch count that of the largest share at `batch_size`
    seeds at most, and every rank raised to at least that many seeds (one per minibatch), taken
    from the largest shares."""
    w = len(shares)
    exact = np.asarray(shares, dtype=np.float64) * total
    sizes = np.floor(exact).astype(np.int64)
    short = total - int(sizes.sum())
    sizes[np.argsort(-(exact - sizes), kind="stable")[:short]] += 1
    batches = -(-int(sizes.max()) // batch_size)
    if total < w * batches:
        raise ValueError(f"{total} seeds cannot fill {batches} minibatches on each of {w} ranks; raise batch_size")
    for _ in range(w):  # a loop over ranks: each pass lifts every short rank, taking from the largest
        deficit = np.maximum(batches - sizes, 0)
        if not deficit.any():
            break
        sizes += deficit
        order = np.argsort(-sizes, kind="stable")
        spare = np.maximum(sizes[order] - batches, 0)
        take = np.minimum(spare, np.maximum(int(deficit.sum()) - np.concatenate([[0], np.cumsum(spare)[:-1]]), 0))
        sizes[order] -= take
    return sizes, batches
