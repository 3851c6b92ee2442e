"""A typed graph with planted communities, in the landing layout of `graphs.stages.typed_graph`:
users, items and categories, as a shop's recommender or fraud graph has them.

- ``nodes/user.parquet``: node_id (strings ``u<k>``), label (the user's segment, a string
  ``segment-<c>``, c one of `communities`), split (train / val / test, 60 / 20 / 20), ``feat``
  (`user_dim` floats: a weak copy of the segment plus Gaussian noise, so features alone leave
  much to learn from the graph);
- ``nodes/item.parquet``: node_id (sparse integers), ``feat`` (`item_dim` floats, weaker);
- ``nodes/category.parquet``: node_id (strings), no features (the model learns a vector each);
- ``edges/user__buys__item.parquet``: each user buys a power-law number of items (a Pareto draw,
  mean `buys`), most from its own segment's items (`affinity`), each item drawn in proportion to
  a power-law popularity;
- ``edges/user__follows__user.parquet``: a power-law number of follows, most within the segment;
- ``edges/item__in__category.parquet``: each item in one category, most often one of its
  segment's.

The folder's ``gnnflow.yaml`` sets canonical_graph's ``add_reverse``, so messages also flow from
items to the users who bought them and from categories to their items.

Every segment has its items and categories, so a user's segment shows in what it buys and whom
it follows; a relational model reads it from the neighbourhood, which the user's own features
give only weakly. Every draw is vectorised and seeded: the same arguments write the same files.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["generate_typed"]


def _pareto_counts(rng: np.random.Generator, n: int, mean: float, alpha: float = 2.2, cap: int = 1000) -> np.ndarray:
    """`n` power-law counts >= 1 with about this mean (Pareto tail exponent `alpha`)."""
    scale = max(mean * (alpha - 1) / alpha, 1.0)
    return np.minimum(np.floor(scale * (1 + rng.pareto(alpha, n))), cap).astype(np.int64)


def _draw_in_groups(
    rng: np.random.Generator, group_of: np.ndarray, weight: np.ndarray, groups: np.ndarray, k: int
) -> np.ndarray:
    """For each entry of `groups`, a member of that group (members: the indices i with
    group_of[i] == g) drawn in proportion to `weight`; every group of 0..k-1 must have members."""
    order = np.argsort(group_of, kind="stable")
    cum = np.cumsum(weight[order])
    ends = np.searchsorted(group_of[order], np.arange(k), side="right")
    starts = np.concatenate([[0], ends[:-1]])
    low = np.where(starts > 0, cum[np.maximum(starts - 1, 0)], 0.0)
    high = cum[ends - 1]
    r = low[groups] + rng.random(len(groups)) * (high[groups] - low[groups])
    return order[np.minimum(np.searchsorted(cum, r, side="right"), len(order) - 1)]


def _targets(rng, own: np.ndarray, affinity: float, k: int) -> np.ndarray:
    """Each edge's target community: the source's own with probability `affinity`, else any."""
    other = rng.integers(0, k, len(own))
    return np.where(rng.random(len(own)) < affinity, own, other)


def generate_typed(
    out_dir: str | os.PathLike,
    users: int = 20_000,
    *,
    items: int | None = None,
    categories: int | None = None,
    communities: int = 5,
    buys: float = 8.0,
    follows: float = 4.0,
    affinity: float = 0.35,
    user_dim: int = 16,
    item_dim: int = 8,
    signal: float = 0.5,
    seed: int = 0,
) -> dict:
    """Write the typed graph of the module docstring into `out_dir` (created; must be empty or
    absent). Returns the node and edge counts per type and relation."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; choose a new folder")
    k = communities
    items = items if items is not None else max(users // 4, k)
    categories = categories if categories is not None else max(users // 400, 2 * k)
    if min(users, items, categories) < k:
        raise ValueError(f"every type needs at least {k} nodes (one per community)")
    rng = np.random.default_rng(seed)
    user_c = rng.integers(0, k, users)
    item_c = np.arange(items) % k  # every community has items and categories
    rng.shuffle(item_c)
    cat_c = np.arange(categories) % k
    popularity = 1 + rng.pareto(1.5, items)

    src = np.repeat(np.arange(users), _pareto_counts(rng, users, buys))
    dst = _draw_in_groups(rng, item_c, popularity, _targets(rng, user_c[src], affinity, k), k)
    buys_edges = (src, dst)
    src = np.repeat(np.arange(users), _pareto_counts(rng, users, follows))
    activity = 1 + rng.pareto(1.5, users)
    dst = _draw_in_groups(rng, user_c, activity, _targets(rng, user_c[src], affinity + 0.2, k), k)
    follows_edges = (src, dst)
    in_cat = _draw_in_groups(rng, cat_c, np.ones(categories), _targets(rng, item_c, 0.9, k), k)

    ids = _write_nodes(out, rng, user_c, item_c, categories, (user_dim, item_dim), signal)
    relations = _write_edges(out, ids, buys_edges, follows_edges, in_cat)
    return {
        "nodes": {"user": users, "item": items, "category": categories},
        "edges": relations,
        "communities": k,
    }


def _feat(rng: np.random.Generator, c: np.ndarray, dim: int, strength: float) -> pa.Array:
    """Gaussian rows of `dim` floats, `strength` added at column ``c % dim`` (the community)."""
    x = rng.normal(size=(len(c), dim)).astype(np.float32)
    x[np.arange(len(c)), c % dim] += strength
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), dim)


def _write_nodes(out: Path, rng, user_c, item_c, categories: int, dims: tuple[int, int], signal: float) -> tuple:
    """nodes/<type>.parquet of the three types; their ids (users, items, categories)."""
    users, items = len(user_c), len(item_c)
    user_ids = np.char.add("u", np.arange(users).astype(str)).astype(object)
    item_ids = 100_000 + 7 * np.arange(items, dtype=np.int64)
    cat_ids = np.char.add("cat-", np.arange(categories).astype(str)).astype(object)
    split = np.array(["train", "val", "test"], dtype=object)[
        np.searchsorted([0.6, 0.8], rng.random(users), side="right")
    ]
    (out / "nodes").mkdir(parents=True, exist_ok=True)
    user = {
        "node_id": pa.array(user_ids, pa.string()),
        "label": pa.array(np.char.add("segment-", user_c.astype(str)).astype(object), pa.string()),
        "split": pa.array(split, pa.string()),
        "feat": _feat(rng, user_c, dims[0], signal * 2),
    }
    pq.write_table(pa.table(user), out / "nodes" / "user.parquet")
    item = {"node_id": pa.array(item_ids), "feat": _feat(rng, item_c, dims[1], signal)}
    pq.write_table(pa.table(item), out / "nodes" / "item.parquet")
    pq.write_table(pa.table({"node_id": pa.array(cat_ids, pa.string())}), out / "nodes" / "category.parquet")
    return user_ids, item_ids, cat_ids


def _write_edges(out: Path, ids: tuple, buys: tuple, follows: tuple, in_cat: np.ndarray) -> dict[str, int]:
    """edges/<key>.parquet of the three relations and the settings file; the edges per relation."""
    user_ids, item_ids, cat_ids = ids
    relations = {
        "user__buys__item": (user_ids[buys[0]], item_ids[buys[1]], pa.string(), pa.int64()),
        "user__follows__user": (user_ids[follows[0]], user_ids[follows[1]], pa.string(), pa.string()),
        "item__in__category": (item_ids, cat_ids[in_cat], pa.int64(), pa.string()),
    }
    (out / "edges").mkdir(exist_ok=True)
    (out / "gnnflow.yaml").write_text("ops: {canonical_graph: {config: {add_reverse: true}}}\n")
    for key, (s, d, st, dt) in relations.items():
        pq.write_table(pa.table({"src": pa.array(s, st), "dst": pa.array(d, dt)}), out / "edges" / f"{key}.parquet")
    return {key: len(v[0]) for key, v in relations.items()}
