"""Per-user ranking of a typed graph's target relation: the recommender's metrics (plain torch).

A recommender is judged by the list it shows each user, not by pairs against shared negatives.
For each user (a source node of the split's held-out edges; ``users`` of them drawn with a fixed
seed, 0 = all), every node of the relation's destination type is scored, the user's known
edges (the training edges, and for ``test`` the validation edges too) are set aside, and each
held-out destination's rank among the rest is read (ties share their mean rank, as
`training.metrics.positive_ranks` counts them):

=====================  ==========================================================================
``user_mrr``           mean over users of 1 / the rank of the user's best-ranked held-out item
``user_hits@k``        share of users with at least one held-out item in their top k
``recall@k``           mean over users of (held-out items in the top k) / (held-out items)
=====================  ==========================================================================

The same figures of training-free rankings are reported beside them: ``popularity_<metric>``
(each item scored by its training edges' count) and any ``baselines`` given (link prediction
gives Adamic-Adar on the message-passing graph, ``adamic_adar_<metric>``): a trained model that
does not beat them has learnt nothing a count could not give. Work: users x items scores, in chunks of
about ``chunk_pairs`` pairs.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

__all__ = ["RANK_AT", "cross_pairs", "ranking_report", "ranking_users"]

RANK_AT = (10, 20, 50)


def cross_pairs(users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """int64 [2, U * I]: every (user, item) pair, users major (row u's items are one run)."""
    return torch.stack([users.repeat_interleave(len(items)), items.repeat(len(users))])


def ranking_users(held: np.ndarray, users: int, seed: int) -> np.ndarray:
    """Sorted source ids of the held-out pairs `held` [P, 2], at most `users` of them (0 = all),
    drawn without replacement with `seed`."""
    all_users = np.unique(np.asarray(held)[:, 0]) if len(held) else np.empty(0, np.int64)
    if users and len(all_users) > users:
        all_users = np.sort(np.random.default_rng(seed).choice(all_users, users, replace=False))
    return all_users.astype(np.int64)


def _rows_of(users: np.ndarray, pairs: np.ndarray, lo: int) -> tuple[np.ndarray, np.ndarray]:
    """(row among `users`, destination column from `lo`) of the pairs whose source is a user."""
    if not len(pairs) or not len(users):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    pos = np.minimum(np.searchsorted(users, pairs[:, 0]), len(users) - 1)
    mine = users[pos] == pairs[:, 0]
    return pos[mine], pairs[mine, 1] - lo


def _ranks(scores: torch.Tensor, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Each (row, col) entry's rank in its row, ties at their mean rank (itself not counted)."""
    if not len(rows):
        return np.empty(0)
    r, c = torch.from_numpy(rows), torch.from_numpy(cols)
    s = scores[r, c].unsqueeze(1)
    greater = (scores[r] > s).sum(1).double()
    greater_equal = (scores[r] >= s).sum(1).double() - 1
    return (1.0 + 0.5 * (greater + greater_equal)).numpy()


def _metrics(ranks: np.ndarray, rows: np.ndarray, num_users: int, ks) -> dict:
    """user_mrr, user_hits@k and recall@k of the held-out items' `ranks` (their user in `rows`)."""
    held = np.bincount(rows, minlength=num_users)
    has = held > 0
    best = np.full(num_users, np.inf)
    np.minimum.at(best, rows, ranks)
    out = {"user_mrr": float(np.mean(1.0 / best[has])) if has.any() else float("nan")}
    for k in ks:
        hit = np.bincount(rows, weights=(ranks <= k).astype(np.float64), minlength=num_users)
        out[f"user_hits@{k}"] = float(np.mean(hit[has] > 0)) if has.any() else float("nan")
        out[f"recall@{k}"] = float(np.mean(hit[has] / held[has])) if has.any() else float("nan")
    return out


@torch.no_grad()
def ranking_report(
    score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    split,
    which: str,
    dst_range: tuple[int, int],
    *,
    users: int = 1000,
    seed: int = 0,
    ks=RANK_AT,
    chunk_pairs: int = 1 << 20,
    symmetric: bool = False,
    baselines: dict[str, Callable] | None = None,
) -> dict:
    """The module docstring's metrics of split `which` ("val" or "test") of a `SplitPairs` over a
    typed target relation whose destinations are the ids `dst_range`; ``score(users, items)`` ->
    float [U, I] scores of every (user, item). A `symmetric` relation (a type joined to itself,
    its pairs unordered) ranks from both ends of each pair. `baselines` (name -> a scorer like
    `score`) are ranked the same way, reported as ``<name>_<metric>``."""

    def pairs(name: str) -> np.ndarray:
        p = np.asarray(getattr(split, name))
        return np.concatenate([p, p[:, ::-1]]) if symmetric else p

    held = pairs(which)
    known = [pairs("train")] + ([pairs("val")] if which == "test" else [])
    lo, hi = dst_range
    chosen = ranking_users(held, users, seed)
    items = torch.arange(lo, hi, dtype=torch.int64)
    popularity = torch.from_numpy(np.bincount(known[0][:, 1] - lo, minlength=hi - lo).astype(np.float32))
    scorers = {"": score, "popularity_": lambda u, i: popularity.expand(len(u), -1)}
    scorers |= {f"{name}_": fn for name, fn in (baselines or {}).items()}
    step = max(1, chunk_pairs // max(hi - lo, 1))
    ranks: dict[str, list] = {prefix: [] for prefix in scorers}
    owner = []
    for a in range(0, len(chosen), step):
        chunk = chosen[a : a + step]
        known_at = [_rows_of(chunk, known_pairs, lo) for known_pairs in known]
        r, c = _rows_of(chunk, held, lo)
        for prefix, fn in scorers.items():
            scores = fn(torch.from_numpy(chunk), items).float().clone()  # its known pairs are set aside
            for kr, kc in known_at:
                scores[kr, kc] = -torch.inf
            ranks[prefix].append(_ranks(scores, r, c))
        owner.append(r + a)
    rows = np.concatenate(owner or [np.empty(0, np.int64)])
    out = {"ranked_users": int(len(chosen)), "ranked_items": int(hi - lo)}
    for prefix, got in ranks.items():
        metrics = _metrics(np.concatenate(got or [np.empty(0)]), rows, len(chosen), ks)
        out |= {f"{prefix}{k}": v for k, v in metrics.items()}
    return out
