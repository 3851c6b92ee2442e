"""Top-k recommendations of a typed graph's link model: for every node of the target relation's
source type, the k destinations it is not yet joined to that the model scores highest, by the
user's own ids of both types (plain torch, no DGL).

    from training.recommend import recommend
    table = recommend(saved, split, nodes_file, k=20)   # src, dst, score, rank

Every source is scored against every destination (full-graph embeddings, the model's scorer in
chunks of about ``chunk_pairs`` pairs, `torch.topk` per chunk), with the pairs the graph already
holds set aside: the relation's training, validation and test edges (a relation joining a type
to itself: both directions, and a node never recommends itself). Work: sources x destinations
scores; memory: one chunk. Columns of the table: ``src`` and ``dst`` (the user's ids as
nodes.parquet's ``original_id`` holds them), ``score`` float32 (the probability the model gives
the pair), ``rank`` int32 (1 = best), sorted by source then rank; a source with fewer than k
unknown destinations gets fewer rows.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from graphs.formats.canonical_files import CanonicalGraph
from graphs.infra.storage import atomic_output_dir
from graphs.stages.edge_split import load_edge_split
from training.link import candidate_logits, load_saved
from training.outputs import LINK_MODEL, RECOMMENDATIONS, SUMMARY, write_json

__all__ = ["recommend", "write_recommendations"]


def _known(split, symmetric: bool) -> np.ndarray:
    """int64 [m, 2]: every pair of the relation the split holds, both directions when symmetric."""
    pairs = np.concatenate([np.asarray(split.train), np.asarray(split.val), np.asarray(split.test)])
    return np.concatenate([pairs, pairs[:, ::-1]]) if symmetric else pairs


@torch.no_grad()
def recommend(saved, split, nodes_file: str | os.PathLike, k: int, chunk_pairs: int = 1 << 20) -> pa.Table:
    """The module docstring's table for the `training.link.SavedLinkModel` `saved` of a typed
    graph, its edge split `split` (`graphs.stages.edge_split.SplitPairs`) and the canonical
    nodes.parquet `nodes_file`."""
    target = saved.graph.target
    if target is None:
        raise ValueError("recommendations need a typed graph's target relation; this link model has none")
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    h = saved.embeddings()
    (su, sv), (lo, hi) = target.src_range, target.dst_range
    items = torch.arange(lo, hi, dtype=torch.int64)
    known = _known(split, target.symmetric)
    order = np.argsort(known[:, 0], kind="stable")
    known = known[order]
    step = max(1, chunk_pairs // max(hi - lo, 1))
    take = min(k, hi - lo)
    src, dst, prob = [], [], []
    for a in range(su, sv, step):
        users = torch.arange(a, min(a + step, sv), dtype=torch.int64)
        logits = candidate_logits(saved.model, h, users, items).float()
        rows = known[np.searchsorted(known[:, 0], a) : np.searchsorted(known[:, 0], a + len(users))]
        logits[torch.from_numpy(rows[:, 0] - a), torch.from_numpy(rows[:, 1] - lo)] = -torch.inf
        if target.symmetric:  # a node is not its own neighbour (sources and destinations are one type)
            logits[torch.arange(len(users)), users - lo] = -torch.inf
        best, at = torch.topk(logits, take, dim=1)
        keep = torch.isfinite(best)
        src.append(users.repeat_interleave(take).view(len(users), take)[keep])
        dst.append((at + lo)[keep])
        prob.append(torch.sigmoid(best[keep]))
    src_ids, dst_ids = (torch.cat(x).numpy() if x else np.empty(0, np.int64) for x in (src, dst))
    scores = torch.cat(prob).numpy().astype(np.float32) if prob else np.empty(0, np.float32)
    original = pq.read_table(nodes_file, columns=["original_id"]).column("original_id").combine_chunks()
    kinds = dict(zip(saved.graph.typed_schema.schema.node_types, saved.graph.typed_schema.id_kinds))
    src_type, _, dst_type = target.key.split("__")
    return pa.table(
        {
            "src": _user_ids(original.take(pa.array(src_ids)), kinds[src_type]),
            "dst": _user_ids(original.take(pa.array(dst_ids)), kinds[dst_type]),
            "score": pa.array(scores),
            "rank": pa.array(_ranks(src_ids), type=pa.int32()),
        }
    )


def _user_ids(values: pa.Array, kind: str) -> pa.Array:
    """A type's ids as the user gave them: nodes.parquet holds every type's as strings when the
    types' id kinds differ; an integer type's are read back as int64."""
    return values.cast(pa.int64()) if kind == "int" and not pa.types.is_integer(values.type) else values


def _ranks(src: np.ndarray) -> np.ndarray:
    """1, 2, ... within each run of equal sources (rows come grouped by source, best first)."""
    if not len(src):
        return np.empty(0, np.int32)
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])
    counts = np.diff(np.r_[starts, len(src)])
    return (np.arange(len(src)) - np.repeat(starts, counts) + 1).astype(np.int32)


def write_recommendations(model_dir, shards_dir, split_dir, adjacency_dir, canonical_dir, out_dir) -> dict:
    """`recommend` of the link model in `model_dir` (`training.link.load_saved` over the shards'
    features and the adjacency it was trained on; its ``link.recommend_k``) into
    ``<out_dir>/recommendations.parquet`` with a summary.json, atomically; the summary."""
    t0 = time.perf_counter()
    saved = load_saved(model_dir, shards_dir, adjacency_dir)
    k = saved.config.recommend_k
    table = recommend(saved, load_edge_split(split_dir), CanonicalGraph.open(canonical_dir).nodes_path, k)
    summary = {
        "model": str((Path(model_dir) / LINK_MODEL).resolve()),
        "relation": saved.graph.target.key,
        "k": k,
        "sources": int(pc.count_distinct(table.column("src")).as_py()) if len(table) else 0,
        "rows": len(table),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    with atomic_output_dir(out_dir) as tmp:
        pq.write_table(table, tmp / RECOMMENDATIONS)
        write_json(tmp / SUMMARY, summary)
    return summary
