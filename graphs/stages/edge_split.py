"""Edge split for link prediction: held-out positives, fixed evaluation negatives, and the
message-passing graph without the held-out edges (`build_edge_split`).

Link prediction hides some edges and asks the model to tell them from non-edges. The split
is made once per dataset (the edge_split stage), seeded, over the graph's *undirected*
edges: each canonical edge (u, v) counts once as the pair (min, max), whether the canonical
graph is symmetrized or directed. A fraction ``val_fraction`` / ``test_fraction`` of those
pairs is held out; the rest are the training edges. The message-passing graph is the
training edges in both directions, written in the canonical graph's own layout, so
normalized_adjacency, metis_partitions and the samplers read it exactly as they read a
canonical graph and never see a held-out edge. The Bloom filters of compressed_graph are
built from the canonical graph instead, so they hold **all** edges (held-out ones included)
and a held-out positive can never be drawn as a training negative.

A typed graph (canonical_graph's types.json) is split on one relation, ``relation``:
`graphs.stages.edge_split_typed` holds out that relation's directed edges (pairs (src, dst),
source type first) and writes the split folder as a typed graph of its own.

Evaluation negatives: ``eval_negatives`` pairs (u, v), u != v, drawn uniformly and kept
only when neither (u, v) nor (v, u) is an edge of the full graph (exact sorted-key lookup,
`graphs.stages.negatives.EdgeKeys`), one fixed set per split, so every model of the dataset is
ranked against the same negatives (`training.metrics.link_prediction_report`).

Files written into ``<out_dir>/`` (atomically, as one folder), format version 1:

==========================  ===============================================================
``edges.parquet``           the message-passing graph: src int64, dst int64, sorted by
                            (src, dst), every training edge in both directions (+ weight
                            float64 when the canonical graph is weighted), the canonical
                            layout (`graphs.stages.canonical`)
``nodes.parquet``           the canonical graph's, hard-linked (copied across file systems)
``features.npy``            the canonical graph's when present, hard-linked likewise
``train_edges.npy``         int64 [T, 2] training pairs (u < v)
``val_edges.npy``           int64 [V, 2] held-out validation pairs (u < v)
``test_edges.npy``          int64 [S, 2] held-out test pairs (u < v)
``val_negatives.npy``       int64 [eval_negatives, 2] fixed validation negatives
``test_negatives.npy``      int64 [eval_negatives, 2] fixed test negatives
``summary.json``            the canonical summary with ``edges`` = 2T (the message-passing
                            graph's directed edges) and ``symmetrized`` true, plus ``split``
                            (counts, fractions, seed, format version, ``full_edges``)
==========================  ===============================================================

How it scales: the undirected pairs are collected as one int64 key per pair (8 bytes per
undirected edge; 0.8 GB at 100M), permuted once, and the message-passing edges are written
in row blocks after one sort of the training keys in both directions.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph, edge_batches
from graphs.formats.graph_schema import TypedSchema
from graphs.infra.config_checks import MAX_SEED, bounded_repr, check_fields
from graphs.infra.folder_swap import is_staging_dir
from graphs.infra.storage import (
    atomic_output_dir,
    peak_rss_bytes,
    read_file_hashes,
    remember_sha256,
    verify_inputs,
    write_summary,
)
from graphs.stages.edge_split_typed import resolve_relation, split_relation, target_keys
from graphs.stages.negatives import EdgeKeys, draw_non_edges

__all__ = [
    "FORMAT_VERSION",
    "SPLIT_FILES",
    "EdgeSplitConfig",
    "EdgeSplit",
    "SplitPairs",
    "build_edge_split",
    "load_edge_split",
    "undirected_pairs",
]


class EdgeSplit(CanonicalGraph):
    """An edge_split folder: the message-passing graph in the canonical layout (`CanonicalGraph`'s
    files) plus the split's pairs (files in the module docstring). The summary's top-level
    ``format_version`` is the canonical layout's; the split's own is ``split.format_version``."""

    STAGE = "edge_split"
    FORMAT_VERSION = 1
    SPLIT_FILES = {
        "train": "train_edges.npy",
        "val": "val_edges.npy",
        "test": "test_edges.npy",
        "val_negatives": "val_negatives.npy",
        "test_negatives": "test_negatives.npy",
    }
    LINKED = (CanonicalGraph.NODES, CanonicalGraph.FEATURES)  # the canonical graph's, linked in

    @classmethod
    def format_version_of(cls, summary) -> object:
        split = summary.get("split") if isinstance(summary, dict) else None
        return split.get("format_version") if isinstance(split, dict) else None


FORMAT_VERSION = EdgeSplit.FORMAT_VERSION
SPLIT_FILES = EdgeSplit.SPLIT_FILES
_WRITE_ROWS = 1 << 22


@dataclass(kw_only=True)
class EdgeSplitConfig:
    """Settings of the edge_split stage (link prediction only)."""

    val_fraction: float = field(default=0.05, metadata={"help": "Share of undirected edges held out for validation."})
    test_fraction: float = field(default=0.1, metadata={"help": "Share of undirected edges held out for testing."})
    eval_negatives: int = field(
        default=10_000,
        metadata={
            "max": 1 << 24,
            "help": "Fixed evaluation negatives per split (uniform non-edges of the full graph, exact lookup); "
            "AUC, MRR and Hits@K rank each held-out edge against them.",
        },
    )
    seed: int = field(
        default=0, metadata={"max": MAX_SEED, "help": "Seed of the split and of the evaluation negatives."}
    )
    relation: str = field(
        default="",
        metadata={
            "help": "Typed graphs: the relation whose edges are held out and predicted, by key "
            "(user__buys__item) or by name when one relation has it; empty = the graph's only given relation.",
        },
    )

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("val_fraction", "test_fraction"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError(
                f"val_fraction + test_fraction = {self.val_fraction + self.test_fraction} leaves no training edge"
            )
        if self.eval_negatives < 1:
            raise ValueError(f"eval_negatives must be >= 1, got {self.eval_negatives}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


@dataclass
class SplitPairs:
    """A written split, read back: pairs int64 [m, 2] per split name of `SPLIT_FILES`."""

    n: int
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    val_negatives: np.ndarray
    test_negatives: np.ndarray
    summary: dict


def undirected_pairs(canonical_dir: str | os.PathLike, n: int, symmetrized: bool = False) -> np.ndarray:
    """Sorted unique int64 keys ``min(u, v) * n + max(u, v)`` of the canonical edges.

    Streams edges.parquet; a `symmetrized` graph (both directions stored) keeps the (u < v)
    orientation of each pair, a directed one folds every edge onto (min, max) and deduplicates.
    """
    keys = []
    for src, dst in edge_batches(canonical_dir):
        if symmetrized:
            keep = src < dst
            src, dst = src[keep], dst[keep]
        lo, hi = np.minimum(src, dst), np.maximum(src, dst)
        keys.append(lo * np.int64(n) + hi)
    if not keys:
        return np.empty(0, np.int64)
    return np.unique(np.concatenate(keys))


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _write_message_passing(tmp: Path, train_keys: np.ndarray, n: int, weights: np.ndarray | None) -> None:
    """edges.parquet of the training pairs in both directions, sorted by (src, dst)."""
    u, v = np.divmod(train_keys, np.int64(n))
    directed = np.concatenate([u * np.int64(n) + v, v * np.int64(n) + u])
    order = np.argsort(directed, kind="stable")
    directed = directed[order]
    w = None if weights is None else np.concatenate([weights, weights])[order]
    fields = [pa.field("src", pa.int64()), pa.field("dst", pa.int64())]
    if w is not None:
        fields.append(pa.field("weight", pa.float64()))
    schema = pa.schema(fields)
    with pq.ParquetWriter(tmp / EdgeSplit.EDGES, schema) as writer:
        for a in range(0, max(len(directed), 1), _WRITE_ROWS):
            s, d = np.divmod(directed[a : a + _WRITE_ROWS], np.int64(n))
            cols = [pa.array(s), pa.array(d)] + ([pa.array(w[a : a + _WRITE_ROWS])] if w is not None else [])
            writer.write_table(pa.Table.from_arrays(cols, schema=schema))


def _pair_weights(canonical: Path, keys: np.ndarray, n: int) -> np.ndarray:
    """The canonical weight of each undirected key (that of the (min, max) direction when present)."""
    out = np.zeros(len(keys), np.float64)
    for src, dst, w in edge_batches(canonical, with_weight=True):
        k = np.minimum(src, dst) * np.int64(n) + np.maximum(src, dst)
        pos = np.searchsorted(keys, k)
        first = src <= dst  # (min, max) direction wins; the reverse only fills a gap
        out[pos[first]] = w[first]
        gap = ~first & (out[pos] == 0)
        out[pos[gap]] = w[gap]
    return out


def _split_keys(graph: CanonicalGraph, cfg: EdgeSplitConfig) -> tuple[np.ndarray, object, object]:
    """(the keys the split permutes, the typed schema, the target relation): the undirected pairs
    of an untyped graph (schema and target None), or the target relation's edges of a typed one."""
    typed = TypedSchema.read(graph.root)
    if typed is not None:
        verify_inputs(graph.root, (EdgeSplit.TYPES, EdgeSplit.TYPED_EDGES))
        target = resolve_relation(typed, cfg.relation, f"{graph.root / EdgeSplit.TYPES}")
        return target_keys(graph, target), typed, target
    if cfg.relation:
        raise ValueError(
            f"edge_split.relation={bounded_repr(cfg.relation)} names a relation of a typed graph; "
            f"{graph.root} holds an untyped graph (leave it empty)"
        )
    return undirected_pairs(graph.root, graph.num_nodes, bool(graph.summary.get("symmetrized", False))), None, None


def build_edge_split(
    canonical_dir: str | os.PathLike, out_dir: str | os.PathLike, cfg: EdgeSplitConfig | None = None
) -> dict:
    """Write the split of the canonical graph in `canonical_dir` (files in the module
    docstring) into `out_dir`, atomically. Returns the summary (also summary.json)."""
    cfg = cfg or EdgeSplitConfig()
    t0 = time.perf_counter()
    canonical = Path(canonical_dir)
    # every canonical file read or linked, checked against its hashes.json before any work: a
    # damaged nodes.parquet or features.npy would otherwise be linked in and recorded as good
    verify_inputs(canonical, (EdgeSplit.SUMMARY, EdgeSplit.EDGES, *EdgeSplit.LINKED))
    recorded = {} if is_staging_dir(canonical) else read_file_hashes(canonical, stage=CanonicalGraph.STAGE)
    graph = CanonicalGraph.open(canonical)
    facts, n = graph.summary, graph.num_nodes
    keys, typed, target = _split_keys(graph, cfg)
    m = len(keys)
    n_val, n_test = int(round(cfg.val_fraction * m)), int(round(cfg.test_fraction * m))
    if m - n_val - n_test < 1:
        raise ValueError(f"{graph.edges_path}: {m} undirected edges leave no training edge after the split")
    rng = np.random.default_rng(cfg.seed)
    perm = rng.permutation(m)
    val_keys = np.sort(keys[perm[:n_val]])
    test_keys = np.sort(keys[perm[n_val : n_val + n_test]])
    train_keys = np.sort(keys[perm[n_val + n_test :]])

    exact = EdgeKeys.from_canonical(canonical, n)
    ranges = {} if target is None else {"src_range": target.src_range, "dst_range": target.dst_range}
    negatives = {
        name: draw_non_edges(exact, cfg.eval_negatives, np.random.default_rng([cfg.seed, i + 1]), **ranges)
        for i, name in enumerate(("val_negatives", "test_negatives"))
    }

    def pairs(k: np.ndarray) -> np.ndarray:
        return np.stack(np.divmod(k, np.int64(n)), axis=1).astype(np.int64)

    weighted = graph.weighted
    with atomic_output_dir(out_dir) as tmp:
        passing = train_keys
        if target is not None:  # the typed files, and the homogeneous view of what they keep
            passing = split_relation(graph, typed, target, np.union1d(val_keys, test_keys), tmp)
            keys = undirected_pairs(canonical, n, bool(facts.get("symmetrized", False))) if weighted else None
        train_w = _pair_weights(canonical, keys, n)[np.searchsorted(keys, passing)] if weighted else None
        _write_message_passing(tmp, passing, n, train_w)
        for name in EdgeSplit.LINKED:
            if (canonical / name).is_file():
                _link_or_copy(canonical / name, tmp / name)
                if name in recorded:  # checked above: publishing need not read it again
                    remember_sha256(tmp / name, recorded[name]["sha256"])
        for name, k in (("train", train_keys), ("val", val_keys), ("test", test_keys)):
            np.save(tmp / SPLIT_FILES[name], pairs(k))
        for name, arr in negatives.items():
            np.save(tmp / SPLIT_FILES[name], arr)
        split = {
            "format_version": FORMAT_VERSION,
            "undirected_edges": m,
            "full_edges": int(facts["edges"]),
            "train": len(train_keys),
            "val": n_val,
            "test": n_test,
            "eval_negatives": cfg.eval_negatives,
            "config": asdict(cfg),
            "relation": None if target is None else target.to_json(),
        }
        summary = {
            **facts,
            "edges": 2 * len(passing),
            "symmetrized": True,
            "split": split,
            "seconds": round(time.perf_counter() - t0, 3),
            "peak_rss_bytes": peak_rss_bytes(),
        }
        write_summary(tmp, summary)
    return summary


def load_edge_split(split_dir: str | os.PathLike) -> SplitPairs:
    """The pairs of a written split, each file checked against the folder's hashes.json first
    (`graphs.infra.storage.verified`); refuses another format version, naming the stage to re-run."""
    split = EdgeSplit.open(split_dir, verify=True)
    arrays = {name: np.load(split.verified(f), allow_pickle=False) for name, f in split.SPLIT_FILES.items()}
    return SplitPairs(n=split.num_nodes, summary=split.summary, **arrays)
