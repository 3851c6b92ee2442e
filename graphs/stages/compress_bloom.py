"""The compressed_graph stage's edge sets: one split-block Bloom filter per METIS part, and their checks.

`graphs.stages.compress` documents the files (``bloom/part-{p}.bloom``) and reads them
(`graphs.stages.compress.load_bloom_filters`); this module builds them from ``edges.parquet``,
streamed twice in record batches (count each part's keys, then insert), measures their
false-positive rate on random non-edges (`build_filters`), and asks them (`might_be_edge`: each
pair routed to the filter of its source's part, which holds every edge incident to that part).
`bloom_misses` checks sampled true edges for false negatives. The filters are those of
:mod:`graphs.kernels.bloom`, imported where built (numba), not by the readers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

from graphs.formats.canonical_files import edge_batches
from graphs.stages.normalize import load_csr

if TYPE_CHECKING:
    from graphs.kernels.bloom import BloomFilter

__all__ = ["bloom_misses", "build_filters", "csr_contains", "might_be_edge"]

_EDGE_BATCH = 1 << 22  # edge rows per streamed batch of edges.parquet


def _edge_batches(canonical: Path) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    return edge_batches(canonical, _EDGE_BATCH)


def _part_keys(src, dst, part, symmetrized: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(part, u, v) of every key one batch of edges contributes to the per-part filters."""
    ps, pd = part[src], part[dst]
    cut = ps != pd
    keys = [(ps, src, dst), (pd[cut], src[cut], dst[cut])]  # every edge in part[src], cut ones in part[dst] too
    if not symmetrized:  # the reversed pair goes to the same parts
        keys += [(ps, dst, src), (pd[cut], dst[cut], src[cut])]
    return tuple(np.concatenate(parts) for parts in zip(*keys))


def csr_contains(indptr: np.ndarray, indices: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """bool array: is (u[i], v[i]) an entry of the CSR? Columns must ascend within each row.

    All queries binary-search their row in lockstep (one vectorised step per halving), so
    the cost is O(q log max_degree) gathers and no O(nnz) memory; memmaps are fine.
    """
    u = np.asarray(u, dtype=np.int64)
    v = np.asarray(v, dtype=np.int64)
    lo = np.asarray(indptr[u], dtype=np.int64)
    hi = np.asarray(indptr[u + 1], dtype=np.int64)
    while True:
        active = lo < hi
        if not active.any():
            break
        mid = (lo + hi) >> 1
        col = np.asarray(indices[np.where(active, mid, 0)], dtype=np.int64) if len(indices) else mid
        go_right = active & (col < v)
        lo = np.where(go_right, mid + 1, lo)
        hi = np.where(active & ~go_right, mid, hi)
    found = lo < np.asarray(indptr[u + 1], dtype=np.int64)
    found[found] = np.asarray(indices[lo[found]], dtype=np.int64) == v[found]
    return found


def _random_non_edges(n: int, count: int, indptr, indices, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` uniform pairs (u, v) in [0, n)^2 such that neither (u, v) nor (v, u) is in the CSR."""
    rng = np.random.default_rng(seed)
    us, vs, have = [], [], 0
    for _ in range(1000):
        need = count - have
        if need <= 0:
            break
        u, v = rng.integers(0, n, size=(2, need + need // 8 + 64))
        keep = ~(csr_contains(indptr, indices, u, v) | csr_contains(indptr, indices, v, u))
        us.append(u[keep][:need])
        vs.append(v[keep][:need])
        have += len(us[-1])
    if have < count:
        raise ValueError(f"could draw only {have} of {count} non-edges among {n} nodes; is the graph complete?")
    return np.concatenate(us), np.concatenate(vs)


def build_filters(
    canonical: Path,
    adjacency: Path,
    part: np.ndarray,
    k: int,
    tmp: Path,
    cfg,
    symmetrized: bool,
    num_edges: int,
) -> dict:
    """Write the `k` parts' filters over the edges of `canonical` into ``tmp/bloom``; return their
    summary (keys, bits per key, false-positive rates measured against normalized_adjacency's CSR
    in `adjacency`, bytes). `cfg` is the stage's `graphs.stages.compress.CompressConfig` (its
    bloom_fpr, seed and fpr_queries)."""
    t0 = time.perf_counter()
    counts = np.zeros(k, dtype=np.int64)
    for src, dst in _edge_batches(canonical):
        kp, _, _ = _part_keys(src, dst, part, symmetrized)
        counts += np.bincount(kp, minlength=k)
    from graphs.kernels.bloom import BloomFilter  # lazy: numba, ~0.14 s; for builders, not readers

    filters = [BloomFilter.empty(int(c), fpr=cfg.bloom_fpr, seed=cfg.seed) for c in counts]
    for src, dst in _edge_batches(canonical):
        kp, u, v = _part_keys(src, dst, part, symmetrized)
        order = np.argsort(kp, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(kp, minlength=k))])
        u, v = u[order], v[order]
        for p in range(k):
            if bounds[p + 1] > bounds[p]:
                filters[p].add(u[bounds[p] : bounds[p + 1]], v[bounds[p] : bounds[p + 1]])
    build_seconds = time.perf_counter() - t0
    (tmp / "bloom").mkdir()
    for p, bf in enumerate(filters):
        bf.save(tmp / "bloom" / f"part-{p}.bloom")

    # False-positive rate on random non-edges: per filter, and routed (pair -> part[u]'s filter).
    n = len(part)
    indptr, indices, _ = load_csr(adjacency)
    per_part, routed = [0.0] * k, 0.0
    if n > 0:
        qu, qv = _random_non_edges(n, cfg.fpr_queries, indptr, indices, cfg.seed + 1)
        per_part = [float(np.count_nonzero(bf.might_contain(qu, qv))) / len(qu) for bf in filters]
        routed = float(np.count_nonzero(might_be_edge(filters, part, qu, qv))) / len(qu)
    keys = int(counts.sum())
    nbytes = sum(bf.nbytes for bf in filters)
    file_bytes = sum((tmp / "bloom" / f"part-{p}.bloom").stat().st_size for p in range(k))
    raw = 16 * num_edges
    return {
        "parts": k,
        "target_fpr": cfg.bloom_fpr,
        "num_hashes": filters[0].num_hashes if filters else 0,
        "keys": keys,
        "keys_per_part": counts.tolist(),
        "edges": num_edges,
        "bits_per_key": 8 * nbytes / keys if keys else 0.0,
        "bits_per_edge": 8 * file_bytes / num_edges if num_edges else 0.0,
        "fpr_queries": cfg.fpr_queries,
        "measured_fpr": routed,
        "measured_fpr_per_part": per_part,
        "measured_fpr_max": max(per_part, default=0.0),
        "expected_fpr_per_part": [bf.expected_fpr for bf in filters],
        "bytes_before": raw,
        "bytes_after": file_bytes,
        "saving": 1 - file_bytes / raw if raw else 0.0,
        "seconds": round(build_seconds, 3),
        "keys_per_second": round(keys / build_seconds) if build_seconds > 0 else 0,
    }


def might_be_edge(filters: list[BloomFilter], part: np.ndarray, u, v) -> np.ndarray:
    """bool array: False means (u[i], v[i]) is certainly not an edge; each pair asks the filter
    of u's part (which holds every edge incident to that part)."""
    u = np.asarray(u, dtype=np.int64)
    v = np.asarray(v, dtype=np.int64)
    u, v = np.broadcast_arrays(u, v)
    pu = np.asarray(part)[u.ravel()]
    out = np.zeros(u.size, dtype=bool)
    order = np.argsort(pu, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(pu, minlength=len(filters)))])
    uf, vf = u.ravel()[order], v.ravel()[order]
    for p, bf in enumerate(filters):
        a, b = bounds[p], bounds[p + 1]
        if b > a:
            out[order[a:b]] = bf.might_contain(uf[a:b], vf[a:b])
    return out.reshape(u.shape)


def _sample_edges(canonical: Path, num_edges: int, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` edges of edges.parquet drawn without replacement (all when fewer), one streamed pass."""
    if num_edges <= count:
        picks = np.arange(num_edges, dtype=np.int64)
    else:
        picks = np.sort(np.random.default_rng(seed).choice(num_edges, size=count, replace=False))
    us, vs, start = [], [], 0
    for src, dst in _edge_batches(canonical):
        lo, hi = np.searchsorted(picks, [start, start + len(src)])
        local = picks[lo:hi] - start
        us.append(src[local])
        vs.append(dst[local])
        start += len(src)
    if not us:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(us), np.concatenate(vs)


def bloom_misses(
    filters: list[BloomFilter], canonical: Path, part: np.ndarray, edges: int, sample_edges: int, seed: int
) -> dict:
    """Sampled true edges asked of `filters` (`graphs.stages.compress.load_bloom_filters`) of both
    endpoints' parts, both directions; the misses."""
    u, v = _sample_edges(canonical, edges, sample_edges, seed)
    misses = np.zeros(len(u), dtype=bool)
    for a, b in ((u, v), (v, u)):
        for owner in (a, b):
            po = part[owner]
            for p, bf in enumerate(filters):
                sel = po == p
                if sel.any():
                    misses[sel] |= ~bf.might_contain(a[sel], b[sel])
    return {"bloom_edges_checked": int(len(u)), "bloom_false_negatives": int(np.count_nonzero(misses))}
