"""Negative edges for link prediction: candidates rejected by the compressed graph's Bloom
filters, or by an exact sorted-key lookup, and the measured difference between the two.

A negative is a pair (u, v) that is not an edge. `NegativeSampler.corrupt` keeps each
positive's source u and draws the destination v uniformly over the nodes (DGL's
``negative_sampler.Uniform``) or in proportion to ``degree ** degree_power`` (word2vec's
unigram^0.75 when 0.75), then rejects the candidates that are self pairs or that the filter
calls edges and redraws those, round by round (vectorised), until every slot holds an
accepted pair. Filters (``filter``):

``bloom``
    compressed_graph's per-part split-block Bloom filters (`graphs.kernels.bloom`), routed to the
    filter of u's METIS part (`graphs.stages.compress_bloom.might_be_edge`), ~1.2 bytes per key at a 1%
    target. They hold every edge of the graph in both directions, held-out edges included
    (`graphs.stages.edge_split`), and a Bloom filter has no false negatives, so **no accepted pair
    is ever an edge**. Their false positives reject a share of true non-edges (about the
    filter's false-positive rate), which costs one more draw for those slots and nothing
    else: the accepted pairs are still uniform over the non-edges.
``exact``
    `EdgeKeys`: every directed edge as one sorted int64 key ``u * n + v`` (8 bytes per
    directed edge) and a binary search per query. Rejects exactly the edges.
``none``
    rejects only self pairs (DGL's uniform sampler rejects nothing).

`compare_rejection` draws one set of uniform candidates and reports, for both filters, the
rejections, the true non-edges the Bloom filters wrongly rejected, the measured
false-positive rate, the query time and the bytes each structure holds; `sizes_at` gives
both sizes for any edge count from the formats (no graph built).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graphs.formats.canonical_files import edge_batches
from graphs.stages.compress_bloom import might_be_edge

__all__ = [
    "FILTERS",
    "DISTRIBUTIONS",
    "EdgeKeys",
    "NegativeSampler",
    "RejectionStats",
    "compare_rejection",
    "draw_non_edges",
    "sizes_at",
]

FILTERS = ("bloom", "exact", "none")
DISTRIBUTIONS = ("uniform", "degree")


class EdgeKeys:
    """Exact edge membership: the sorted int64 keys ``u * n + v`` of every directed edge
    (both directions of each canonical edge), answered by binary search."""

    def __init__(self, keys: np.ndarray, n: int):
        self.keys = np.asarray(keys, dtype=np.int64)
        self.n = int(n)

    @classmethod
    def from_pairs(cls, src, dst, n: int) -> "EdgeKeys":
        """Keys of the pairs (src, dst) and their reverses, sorted and deduplicated."""
        src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
        n64 = np.int64(n)
        return cls(np.unique(np.concatenate([src * n64 + dst, dst * n64 + src])), n)

    @classmethod
    def from_canonical(cls, canonical_dir: str | os.PathLike, n: int) -> "EdgeKeys":
        """Every edge of a canonical graph (`graphs.stages.canonical` layout), both directions."""
        parts = [(s, d) for s, d in edge_batches(Path(canonical_dir))]
        if not parts:
            return cls(np.empty(0, np.int64), n)
        return cls.from_pairs(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), n)

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes)

    def contains(self, u, v) -> np.ndarray:
        """bool array: is (u[i], v[i]) an edge (in either direction, as stored)."""
        q = np.asarray(u, np.int64) * np.int64(self.n) + np.asarray(v, np.int64)
        if len(self.keys) == 0:
            return np.zeros(q.shape, bool)
        pos = np.minimum(np.searchsorted(self.keys, q), len(self.keys) - 1)
        return self.keys[pos] == q


def draw_non_edges(
    exact: EdgeKeys,
    count: int,
    rng: np.random.Generator,
    src_range: tuple[int, int] | None = None,
    dst_range: tuple[int, int] | None = None,
) -> np.ndarray:
    """int64 [count, 2] uniform pairs (u, v), u != v, neither direction an edge (exact); u drawn
    from ids ``src_range`` [lo, hi) and v from ``dst_range`` (a typed relation's types), else all."""
    n, out, have = exact.n, [], 0
    (su, sv), (du, dv) = src_range or (0, n), dst_range or (0, n)
    if n < 2 or sv <= su or dv <= du:
        raise ValueError(f"cannot draw non-edges among {n} nodes (sources {su}..{sv - 1}, destinations {du}..{dv - 1})")
    for _ in range(1000):
        need = count - have
        if need <= 0:
            break
        size = need + need // 4 + 16
        if src_range is None and dst_range is None:
            u, v = rng.integers(0, n, size=(2, size))
        else:
            u, v = rng.integers(su, sv, size=size), rng.integers(du, dv, size=size)
        keep = (u != v) & ~exact.contains(u, v)
        pairs = np.stack([u[keep], v[keep]], axis=1)[:need]
        out.append(pairs)
        have += len(pairs)
    if have < count:
        raise ValueError(f"could draw only {have} of {count} non-edges among {n} nodes; is the graph complete?")
    return np.concatenate(out).astype(np.int64)


@dataclass
class RejectionStats:
    """Counts of one sampler: candidates drawn and candidates rejected (self pairs apart)."""

    candidates: int = 0
    rejected_as_edge: int = 0
    rejected_self: int = 0
    rounds: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {
            "candidates": self.candidates,
            "rejected_as_edge": self.rejected_as_edge,
            "rejected_self": self.rejected_self,
            "rejection_rate": self.rejected_as_edge / self.candidates if self.candidates else 0.0,
            "rounds": self.rounds,
            "seconds": round(self.seconds, 4),
        }


@dataclass
class NegativeSampler:
    """Draws negatives for positive pairs by corrupting their destination (module docstring).

    ``filters`` + ``part`` (the Bloom filters and the node -> part array of
    compressed_graph / metis_partitions) for ``filter="bloom"``; ``exact`` for "exact".
    ``degree`` (per node) for ``distribution="degree"``.
    """

    n: int
    filter: str = "bloom"
    distribution: str = "uniform"
    filters: list | None = None
    part: np.ndarray | None = None
    exact: EdgeKeys | None = None
    degree: np.ndarray | None = None
    degree_power: float = 0.75
    dst_range: tuple[int, int] | None = None  # destinations drawn from these ids [lo, hi) (a typed relation's)
    max_rounds: int = 1000
    stats: RejectionStats = field(default_factory=RejectionStats)

    def __post_init__(self) -> None:
        if self.filter not in FILTERS:
            raise ValueError(f"negative filter {self.filter!r} is not one of {FILTERS}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"negative distribution {self.distribution!r} is not one of {DISTRIBUTIONS}")
        if self.filter == "bloom" and (self.filters is None or self.part is None):
            raise ValueError("filter='bloom' needs compressed_graph's Bloom filters and metis_partitions' part_id")
        if self.filter == "exact" and self.exact is None:
            raise ValueError("filter='exact' needs the exact edge keys (EdgeKeys)")
        if self.n < 2:
            raise ValueError(f"negative sampling needs at least 2 nodes, got {self.n}")
        self._cdf = None
        lo, hi = self._range = self.dst_range or (0, self.n)
        if not 0 <= lo < hi <= self.n:
            raise ValueError(f"dst_range {self.dst_range} is not a range of ids below {self.n}")
        if self.distribution == "degree":
            if self.degree is None or len(self.degree) != self.n:
                raise ValueError("distribution='degree' needs one degree per node")
            w = np.power(np.asarray(self.degree[lo:hi], np.float64), self.degree_power)
            if not w.sum() > 0:
                raise ValueError("distribution='degree' needs at least one node with a positive degree")
            self._cdf = np.cumsum(w / w.sum())

    def _draw(self, size: int, rng: np.random.Generator) -> np.ndarray:
        lo, hi = self._range
        if self._cdf is None:
            return lo + rng.integers(0, hi - lo, size=size)
        return lo + np.minimum(np.searchsorted(self._cdf, rng.random(size), side="right"), hi - lo - 1)

    def is_edge(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """What the configured filter says: True = reject as a (possible) edge."""
        if self.filter == "bloom":
            return might_be_edge(self.filters, self.part, u, v)
        if self.filter == "exact":
            return self.exact.contains(u, v)
        return np.zeros(len(u), bool)

    def corrupt(self, src, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(neg_src, neg_dst): each source repeated `k` times, each with an accepted destination."""
        t0 = time.perf_counter()
        neg_src = np.repeat(np.asarray(src, np.int64), k)
        neg_dst = np.empty(len(neg_src), np.int64)
        todo = np.arange(len(neg_src))
        for _ in range(self.max_rounds):
            if len(todo) == 0:
                break
            cand = self._draw(len(todo), rng)
            u = neg_src[todo]
            self_pair = cand == u
            edge = np.zeros(len(todo), bool)
            edge[~self_pair] = self.is_edge(u[~self_pair], cand[~self_pair])
            ok = ~(self_pair | edge)
            neg_dst[todo[ok]] = cand[ok]
            st = self.stats
            st.candidates += len(todo)
            st.rejected_self += int(self_pair.sum())
            st.rejected_as_edge += int(edge.sum())
            st.rounds += 1
            todo = todo[~ok]
        if len(todo):
            raise ValueError(
                f"{len(todo)} negatives still rejected after {self.max_rounds} rounds; are their sources "
                "adjacent to (almost) every node?"
            )
        self.stats.seconds += time.perf_counter() - t0
        return neg_src, neg_dst


def compare_rejection(
    filters: list, part: np.ndarray, exact: EdgeKeys, count: int, rng: np.random.Generator, repeats: int = 3
) -> dict:
    """Bloom-filter rejection against exact rejection on `count` uniform candidate pairs.

    Returns the rejections of each, the true non-edges the filters wrongly rejected (exact says
    non-edge, filter says edge), edges the filters missed (must be 0), the measured
    false-positive rate (wrongly rejected / true non-edges), the best-of-`repeats` query time
    of each and the bytes each holds in memory.
    """
    n = exact.n
    u, v = rng.integers(0, n, size=(2, count))
    keep = u != v
    u, v = u[keep], v[keep]

    def timed(fn):
        best, out = float("inf"), None
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = fn()
            best = min(best, time.perf_counter() - t0)
        return out, best

    bloom, t_bloom = timed(lambda: might_be_edge(filters, part, u, v))
    truth, t_exact = timed(lambda: exact.contains(u, v))
    non_edges = int((~truth).sum())
    wrong = int((bloom & ~truth).sum())
    bloom_bytes = int(sum(bf.nbytes for bf in filters)) + int(np.asarray(part).nbytes)
    return {
        "candidates": int(len(u)),
        "true_edges": int(truth.sum()),
        "true_non_edges": non_edges,
        "bloom_rejected": int(bloom.sum()),
        "exact_rejected": int(truth.sum()),
        "bloom_wrongly_rejected": wrong,
        "bloom_missed_edges": int((truth & ~bloom).sum()),
        "measured_fpr": wrong / non_edges if non_edges else 0.0,
        "expected_fpr": [float(bf.expected_fpr) for bf in filters],
        "bloom_seconds": t_bloom,
        "exact_seconds": t_exact,
        "bloom_queries_per_second": len(u) / t_bloom if t_bloom > 0 else 0.0,
        "exact_queries_per_second": len(u) / t_exact if t_exact > 0 else 0.0,
        "bloom_bytes": bloom_bytes,
        "bloom_filter_bytes": int(sum(bf.nbytes for bf in filters)),
        "exact_bytes": exact.nbytes,
    }


def sizes_at(directed_edges: int, nodes: int, fpr: float, cut_share: float = 0.0, parts: int = 1) -> dict:
    """Bytes of both membership structures for a graph of `directed_edges` directed edges,
    computed from the formats: exact = 8 bytes per directed edge (`EdgeKeys`); Bloom = the
    split-block filter sized by `graphs.kernels.bloom.optimal_parameters` for the keys of each of
    `parts` equal parts (a cut edge is stored in both endpoints' parts: keys = E (1 + cut
    share)) plus the 64-byte header per file and the int32 node -> part array the router reads."""
    from graphs.kernels.bloom import HEADER_BYTES, optimal_parameters  # lazy: numba kernels, ~0.13 s

    keys = int(round(directed_edges * (1.0 + cut_share)))
    per_part = -(-keys // parts)
    bits, k = optimal_parameters(per_part, fpr)
    bloom = parts * (bits // 8 + HEADER_BYTES) + 4 * nodes
    exact = 8 * directed_edges
    return {
        "directed_edges": directed_edges,
        "nodes": nodes,
        "target_fpr": fpr,
        "parts": parts,
        "cut_share": cut_share,
        "bloom_keys": keys,
        "bloom_hashes": k,
        "bloom_bytes": bloom,
        "exact_bytes": exact,
        "bloom_bits_per_directed_edge": 8 * bloom / directed_edges if directed_edges else 0.0,
        "ratio_exact_to_bloom": exact / bloom if bloom else 0.0,
    }
