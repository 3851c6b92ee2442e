"""Edge keys of the canonical stage: numba kernels that sort, deduplicate and mirror edges.

An edge (u, v) of a graph with n nodes is one int64 key ``(u << shift) | (v << 1) | flag``
(`key_shift`); `KeySpill` collects keys into source-range buckets (in memory or spilled
to files) and yields groups within a memory budget; `dedupe_rows` counting-sorts a group
into rows by source and deduplicates each row; `mirror` adds the reverse direction of a
half-kept symmetrized graph; `repeat_rows` / `map_inplace` expand and relabel ids without
the GIL. The ``_weighted`` variants carry a float64 weight per key and combine the weights
of one edge by a rule (see `graphs.stages.canonical`, "Weights"). Used by `graphs.stages.canonical` (see its docstring for how they fit together).
"""

from __future__ import annotations

import math
from pathlib import Path

import numba
import numpy as np

# ----------------------------------------------------------------------------- edge keys
#
# An edge (u, v) is one int64 key: (u << shift) | (v << 1) | flag, where shift leaves room
# for v and one flag bit (so n < 2^31). Decoding is shifts and masks, no division.

BYTES_PER_KEY = 40  # while deduplicating one group: key, row value, output src/dst, counts
BYTES_PER_WEIGHTED_KEY = 72  # + the weight, its row-ordered copy, the combined output weight
# Rows of at most this many keys are sorted by insertion (in place) in `dedupe_rows_weighted`;
# longer ones by a stable argsort, whose index arrays cost more than the sort for short rows.
SMALL_ROW = 32


def key_shift(n: int) -> int:
    """Bits below the source id in an edge key: room for a destination id and a flag."""
    return max(1, int(n - 1).bit_length()) + 1


class KeySpill:
    """Edge keys (and, when weighted, a float64 weight per key) collected into fine
    source-range buckets, in memory or in files."""

    def __init__(self, n: int, groups: int, budget_bytes: int, spill_dir: Path, weighted: bool = False):
        self.n = n
        self.weighted = weighted
        self.num_buckets = 1 if groups <= 1 else min(n, 8 * groups)
        self.width = max(1, math.ceil(n / self.num_buckets))
        self.budget_keys = max(1, budget_bytes // (BYTES_PER_WEIGHTED_KEY if weighted else BYTES_PER_KEY))
        self.in_memory = self.num_buckets == 1
        self.sizes = np.zeros(self.num_buckets, dtype=np.int64)
        self._chunks: list[np.ndarray] = []
        self._weight_chunks: list[np.ndarray] = []
        self._files = []
        self._weight_files = []
        if not self.in_memory:
            spill_dir.mkdir(parents=True, exist_ok=True)
            self._paths = [spill_dir / f"bucket-{b:06d}.bin" for b in range(self.num_buckets)]
            self._files = [open(p, "wb") for p in self._paths]
            if weighted:
                self._weight_paths = [spill_dir / f"bucket-{b:06d}.weight" for b in range(self.num_buckets)]
                self._weight_files = [open(p, "wb") for p in self._weight_paths]

    def add(self, keys: np.ndarray, src: np.ndarray, weights: np.ndarray | None = None) -> None:
        if self.in_memory:
            self._chunks.append(keys)
            if self.weighted:
                self._weight_chunks.append(weights)
            self.sizes[0] += len(keys)
            return
        if self.weighted:
            keys, weights, counts = _group_by_bucket_weighted(keys, weights, src, self.width, self.num_buckets)
        else:
            keys, counts = _group_by_bucket(keys, src, self.width, self.num_buckets)
        ends = np.cumsum(counts)
        starts = ends - counts
        for b in np.flatnonzero(counts):
            keys[starts[b] : ends[b]].tofile(self._files[b])
            if self.weighted:
                weights[starts[b] : ends[b]].tofile(self._weight_files[b])
        self.sizes += counts

    def groups(self):
        """Yield (keys, weights or None, lo, hi): the keys of sources lo..hi-1, consecutive
        ranges within the budget; keys of one bucket stay in the order they were added."""
        if self.in_memory:
            keys = (
                self._chunks[0] if len(self._chunks) == 1 else np.concatenate(self._chunks or [np.empty(0, np.int64)])
            )
            weights = None
            if self.weighted:
                weights = np.concatenate(self._weight_chunks) if self._weight_chunks else np.empty(0, np.float64)
            self._chunks, self._weight_chunks = [], []
            yield keys, weights, 0, self.n
            return
        for f in self._files + self._weight_files:
            f.close()
        b = 0
        while b < self.num_buckets:
            e, total = b, 0
            while e < self.num_buckets and (e == b or total + self.sizes[e] <= self.budget_keys):
                total += self.sizes[e]
                e += 1
            keys = np.concatenate([np.fromfile(self._paths[i], dtype=np.int64) for i in range(b, e)])
            weights = None
            if self.weighted:
                weights = np.concatenate([np.fromfile(self._weight_paths[i], dtype=np.float64) for i in range(b, e)])
            for i in range(b, e):
                self._paths[i].unlink()
                if self.weighted:
                    self._weight_paths[i].unlink()
            yield keys, weights, b * self.width, min(self.n, e * self.width)
            b = e


@numba.njit(cache=True, nogil=True)
def keys_of_rows(src, dst, shift, half, out):  # pragma: no cover - compiled
    """The keys of the rows with both ids (>= 0) and no self loop into out[:k]; returns k.
    `half`: the (min, max) orientation with the flag = the row's orientation, else
    src -> dst, flag 0. One pass, no temporaries."""
    k = 0
    for i in range(len(src)):
        s, d = src[i], dst[i]
        if s < 0 or d < 0 or s == d:
            continue
        if half:
            out[k] = (min(s, d) << shift) | (max(s, d) << 1) | (1 if s > d else 0)
        else:
            out[k] = (s << shift) | (d << 1)
        k += 1
    return k


@numba.njit(cache=True, nogil=True)
def _group_by_bucket(keys, src, width, num_buckets):  # pragma: no cover - compiled
    """Keys reordered so that bucket src // width is contiguous (a counting sort), and counts."""
    counts = np.zeros(num_buckets, np.int64)
    for i in range(len(src)):
        counts[src[i] // width] += 1
    pos = np.zeros(num_buckets, np.int64)
    for b in range(1, num_buckets):
        pos[b] = pos[b - 1] + counts[b - 1]
    out = np.empty_like(keys)
    for i in range(len(src)):
        b = src[i] // width
        out[pos[b]] = keys[i]
        pos[b] += 1
    return out, counts


@numba.njit(cache=True, nogil=True)
def _group_by_bucket_weighted(keys, weights, src, width, num_buckets):  # pragma: no cover - compiled
    """`_group_by_bucket` carrying a weight per key (stable: keys keep their order per bucket)."""
    counts = np.zeros(num_buckets, np.int64)
    for i in range(len(src)):
        counts[src[i] // width] += 1
    pos = np.zeros(num_buckets, np.int64)
    for b in range(1, num_buckets):
        pos[b] = pos[b - 1] + counts[b - 1]
    out = np.empty_like(keys)
    out_w = np.empty_like(weights)
    for i in range(len(src)):
        b = src[i] // width
        out[pos[b]] = keys[i]
        out_w[pos[b]] = weights[i]
        pos[b] += 1
    return out, out_w, counts


@numba.njit(cache=True, nogil=True)
def dedupe_rows(keys, shift, lo, rows, count_both_flags):  # pragma: no cover - compiled
    """Counting-sort the keys of sources lo..lo+rows-1 into rows; sort and dedupe each row.

    Returns (unique neighbours per row, the neighbours row after row, the number of
    distinct keys counting the flag: with count_both_flags only flag-0 keys count).
    O(keys) plus a small sort per row, instead of one global sort of every key.
    """
    start = np.zeros(rows + 1, np.int64)
    for i in range(len(keys)):
        start[(keys[i] >> shift) - lo + 1] += 1
    for r in range(rows):
        start[r + 1] += start[r]
    pos = start[:-1].copy()
    mask = (np.int64(1) << shift) - 1
    vals = np.empty(len(keys), np.int64)
    for i in range(len(keys)):
        r = (keys[i] >> shift) - lo
        vals[pos[r]] = keys[i] & mask
        pos[r] += 1
    counts = np.zeros(rows, np.int64)
    distinct = 0
    w = 0
    for r in range(rows):
        a, b = start[r], start[r + 1]
        if b - a > 1:
            vals[a:b].sort()
        last, last_flagged = -1, -1
        for j in range(a, b):
            v = vals[j]
            c = v >> 1
            if c != last:
                vals[w] = c
                w += 1
                counts[r] += 1
                last = c
            if (count_both_flags or (v & 1) == 0) and v != last_flagged:
                distinct += 1
                last_flagged = v
    return counts, vals[:w].copy(), distinct


@numba.njit(cache=True, nogil=True)
def dedupe_rows_weighted(keys, weights, shift, lo, rows, count_both_flags, rule):  # pragma: no cover - compiled
    """`dedupe_rows` with a weight per key, combined per (src, dst) by `rule`.

    `rule` indexes `graphs.stages.canonical_edges.COMBINE_RULES`: 0 sum, 1 max, 2 mean, 3 first. The counting sort into
    rows is stable and each row is sorted stably by neighbour alone (not the flag), so the
    weights of one output edge are met in the order the keys were added: the order of the
    input rows. Returns (counts, neighbours, combined float64 weights, distinct keys).
    """
    start = np.zeros(rows + 1, np.int64)
    for i in range(len(keys)):
        start[(keys[i] >> shift) - lo + 1] += 1
    for r in range(rows):
        start[r + 1] += start[r]
    pos = start[:-1].copy()
    mask = (np.int64(1) << shift) - 1
    vals = np.empty(len(keys), np.int64)
    ws = np.empty(len(keys), np.float64)
    for i in range(len(keys)):
        r = (keys[i] >> shift) - lo
        vals[pos[r]] = keys[i] & mask
        ws[pos[r]] = weights[i]
        pos[r] += 1
    counts = np.zeros(rows, np.int64)
    out_w = np.empty(len(keys), np.float64)
    distinct = 0
    w = 0
    for r in range(rows):
        a, b = start[r], start[r + 1]
        if b - a > SMALL_ROW:
            order = np.argsort(vals[a:b] >> 1, kind="mergesort") + a
            vals[a:b] = vals[order]
            ws[a:b] = ws[order]
        else:  # stable insertion sort in place: no arrays made for the many short rows
            for i in range(a + 1, b):
                v, x = vals[i], ws[i]
                c = v >> 1
                j = i - 1
                while j >= a and (vals[j] >> 1) > c:
                    vals[j + 1] = vals[j]
                    ws[j + 1] = ws[j]
                    j -= 1
                vals[j + 1] = v
                ws[j + 1] = x
        j = a
        while j < b:
            c = vals[j] >> 1
            acc = ws[j]
            seen0 = (vals[j] & 1) == 0
            seen1 = not seen0
            k = j + 1
            while k < b and (vals[k] >> 1) == c:
                if rule == 0 or rule == 2:
                    acc += ws[k]
                elif rule == 1:
                    acc = max(acc, ws[k])
                if vals[k] & 1:
                    seen1 = True
                else:
                    seen0 = True
                k += 1
            if rule == 2:
                acc /= k - j
            vals[w] = c
            out_w[w] = acc
            w += 1
            counts[r] += 1
            distinct += int(seen0) + (int(seen1) if count_both_flags else 0)
            j = k
    return counts, vals[:w].copy(), out_w[:w].copy(), distinct


@numba.njit(cache=True, nogil=True)
def mirror_weighted(upper_counts, upper, upper_w):  # pragma: no cover - compiled
    """`mirror` carrying each upper-triangle edge's weight to both of its directions."""
    n = len(upper_counts)
    deg = upper_counts.copy()
    for j in range(len(upper)):
        deg[upper[j]] += 1
    pos = np.zeros(n, np.int64)
    for x in range(1, n):
        pos[x] = pos[x - 1] + deg[x - 1]
    dst = np.empty(len(upper) * 2, np.int64)
    out_w = np.empty(len(upper) * 2, np.float64)
    j = 0
    for u in range(n):
        for _ in range(upper_counts[u]):
            v = upper[j]
            dst[pos[v]] = u
            out_w[pos[v]] = upper_w[j]
            pos[v] += 1
            j += 1
    j = 0
    for u in range(n):
        c = upper_counts[u]
        dst[pos[u] : pos[u] + c] = upper[j : j + c]
        out_w[pos[u] : pos[u] + c] = upper_w[j : j + c]
        j += c
    return deg, dst, out_w


@numba.njit(cache=True, nogil=True)
def mirror(upper_counts, upper):  # pragma: no cover - compiled
    """Both directions, sorted, from the sorted upper triangle (u < v) of a symmetric graph.

    Row x's neighbours are its lower ones (u < x, met in increasing u while walking the
    rows in order) followed by its upper ones, so no sort is needed.
    """
    n = len(upper_counts)
    deg = upper_counts.copy()
    for j in range(len(upper)):
        deg[upper[j]] += 1
    pos = np.zeros(n, np.int64)
    for x in range(1, n):
        pos[x] = pos[x - 1] + deg[x - 1]
    dst = np.empty(len(upper) * 2, np.int64)
    j = 0
    for u in range(n):
        for _ in range(upper_counts[u]):
            v = upper[j]
            dst[pos[v]] = u
            pos[v] += 1
            j += 1
    j = 0
    for u in range(n):
        c = upper_counts[u]
        dst[pos[u] : pos[u] + c] = upper[j : j + c]
        j += c
    return deg, dst


NO_LUT = np.empty(0, np.int64)  # the `lut` argument of `repeat_rows` that maps no ids


def warm_kernels() -> None:
    """Call every kernel once on tiny inputs so their cached machine code is loaded."""
    keys = np.array([(0 << 2) | (1 << 1), (1 << 2) | (0 << 1) | 1], dtype=np.int64)
    counts, dst, _ = dedupe_rows(keys, 2, 0, 2, True)
    mirror(counts, dst)
    repeat_rows(0, np.cumsum(counts), 0, 1, NO_LUT, np.empty(1, np.int64))
    map_inplace(dst.copy(), np.arange(2, dtype=np.int64))
    _group_by_bucket(keys, np.array([0, 1], dtype=np.int64), 1, 2)
    keys_of_rows(np.zeros(1, np.int64), np.ones(1, np.int64), 2, True, np.empty(1, np.int64))


def warm_weighted_kernels() -> None:
    """`warm_kernels` plus the weighted kernels."""
    warm_kernels()  # the shared ones (repeat_rows, map_inplace)
    keys = np.array([(0 << 2) | (1 << 1), (1 << 2) | (0 << 1) | 1], dtype=np.int64)
    weights = np.ones(2, dtype=np.float64)
    counts, dst, w, _ = dedupe_rows_weighted(keys, weights, 2, 0, 2, True, 0)
    mirror_weighted(counts, dst, w)
    _group_by_bucket_weighted(keys, weights, np.array([0, 1], dtype=np.int64), 1, 2)


@numba.njit(cache=True, nogil=True)
def repeat_rows(lo, ends, e0, e1, lut, out):  # pragma: no cover - compiled
    """The source ids of edges e0..e1-1 of rows whose edges end at `ends` (the running sum of
    the row counts) into out[: e1 - e0]: row r's id lo + r (mapped through lut unless it is
    empty) once per edge, np.repeat of a slice without the GIL."""
    r = np.searchsorted(ends, e0, side="right")  # the row holding edge e0
    for e in range(e0, e1):
        while ends[r] <= e:
            r += 1
        out[e - e0] = lut[lo + r] if len(lut) else lo + r


@numba.njit(cache=True, nogil=True)
def map_inplace(values, lut):  # pragma: no cover - compiled
    """values[i] = lut[values[i]], without the GIL."""
    for i in range(len(values)):
        values[i] = lut[values[i]]
