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

from graphs.kernels.threads import kernel_threads, run_each

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
        """Yield (key chunks, weights or None, lo, hi): the keys of sources lo..hi-1 in a list
        of arrays, consecutive ranges within the budget; keys of one bucket stay in the order
        they were added (chunk after chunk)."""
        if self.in_memory:
            keys = self._chunks
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
            keys = [np.fromfile(self._paths[i], dtype=np.int64) for i in range(b, e)]
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


# ----------------------------------------------------------------------------- rows of a group
#
# `dedupe_rows` and `mirror` place tens of millions of values by row. Scattering each value
# straight to its row across a 100 MB array waits on memory for nearly every value; so both
# first scatter the values into buckets of consecutive rows (a few hundred output streams,
# which stay in cache) and then place each bucket's values by row, within a stretch of the
# output small enough to stay in cache. Chunks of input and ranges of buckets run in threads
# (the kernels release the GIL).

BUCKET_KEYS = 1 << 15  # the keys a bucket of rows aims at: its values and row starts stay in cache


def _bucket_bits(rows: int, values: int) -> int:
    """log2 of the rows per bucket, so that a bucket holds about `BUCKET_KEYS` values."""
    per_row = max(1.0, values / max(1, rows))
    return int(min(30, max(4, math.floor(math.log2(BUCKET_KEYS / per_row)))))


def _slots(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bucket starts, each input piece's first slot per bucket) of per-piece bucket counts
    (pieces x buckets): a piece's values go after the earlier pieces' in each bucket."""
    total = counts.sum(axis=0)
    starts = np.zeros(len(total) + 1, np.int64)
    np.cumsum(total, out=starts[1:])
    firsts = starts[:-1] + np.cumsum(counts, axis=0) - counts
    return starts, firsts


def _bucket_ranges(starts: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive ranges of buckets holding similar numbers of values, one per thread."""
    cuts = np.searchsorted(starts, np.linspace(0, starts[-1], kernel_threads() + 1)[1:-1]).tolist()
    edges = [0, *cuts, len(starts) - 1]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def dedupe_rows(chunks: list[np.ndarray], shift: int, lo: int, rows: int, count_both_flags: bool):
    """Sort the keys (in `chunks`) of sources lo..lo+rows-1 into rows; sort and dedupe each row.

    Returns (unique neighbours per row, the neighbours row after row, the number of
    distinct keys counting the flag: keys of both flags with count_both_flags, else flag-0
    keys only). O(keys) plus a small sort per row, instead of one global sort of every key.
    """
    chunks = [c for c in chunks if len(c)]
    bits = _bucket_bits(rows, sum(len(c) for c in chunks))
    buckets = ((rows - 1) >> bits) + 1 if rows else 0
    counts = np.stack(
        run_each(_bucket_counts, [(c, shift, lo, bits, buckets) for c in chunks]) or [np.zeros(buckets, np.int64)]
    )
    starts, firsts = _slots(counts)
    grouped = np.empty(int(starts[-1]), np.int64)
    run_each(_bucket_scatter, [(c, shift, lo, bits, firsts[i].copy(), grouped) for i, c in enumerate(chunks)])
    per_row = np.zeros(rows, np.int64)
    kept = np.zeros(buckets, np.int64)
    distinct = np.zeros(buckets, np.int64)
    ranges = _bucket_ranges(starts)
    run_each(
        _dedupe_buckets,
        [(grouped, starts, shift, lo, rows, bits, count_both_flags, per_row, kept, distinct, a, b) for a, b in ranges],
    )
    out_starts = np.zeros(buckets + 1, np.int64)
    np.cumsum(kept, out=out_starts[1:])
    out = np.empty(int(out_starts[-1]), np.int64)
    run_each(_compact_buckets, [(grouped, starts, kept, out_starts, out, a, b) for a, b in ranges])
    return per_row, out, int(distinct.sum())


def mirror(upper_counts: np.ndarray, upper: np.ndarray):
    """Both directions, sorted, from the sorted upper triangle (u < v) of a symmetric graph.

    Row x's neighbours are its lower ones (u < x, in increasing u) followed by its upper ones,
    so no sort is needed: the (x, u) pairs are scattered into buckets of rows x in order of
    u (stable), and each bucket's rows are then filled from its pairs and the upper lists.
    """
    n = len(upper_counts)
    ends = np.cumsum(upper_counts)
    bits = _bucket_bits(n, len(upper))
    buckets = ((n - 1) >> bits) + 1 if n else 0
    shift = max(1, int(n - 1).bit_length())
    cuts = np.linspace(0, len(upper), kernel_threads() + 1).astype(np.int64)
    pieces = [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    counts = np.stack(
        run_each(_lower_counts, [(upper[a:b], bits, buckets) for a, b in pieces]) or [np.zeros(buckets, np.int64)]
    )
    starts, firsts = _slots(counts)
    pairs = np.empty(len(upper), np.int64)
    run_each(
        _lower_scatter, [(upper, ends, a, b, bits, shift, firsts[i].copy(), pairs) for i, (a, b) in enumerate(pieces)]
    )
    degree = upper_counts + np.bincount(upper, minlength=n)
    row_starts = np.zeros(n + 1, np.int64)
    np.cumsum(degree, out=row_starts[1:])
    dst = np.empty(2 * len(upper), np.int64)
    run_each(
        _place_rows,
        [
            (pairs, starts, row_starts, upper_counts, ends, upper, shift, bits, dst, a, b)
            for a, b in _bucket_ranges(starts)
        ],
    )
    return degree, dst


@numba.njit(cache=True, nogil=True)
def _bucket_counts(keys, shift, lo, bits, buckets):  # pragma: no cover - compiled
    """Keys per bucket of rows ((source - lo) >> bits)."""
    counts = np.zeros(buckets, np.int64)
    for i in range(len(keys)):
        counts[((keys[i] >> shift) - lo) >> bits] += 1
    return counts


@numba.njit(cache=True, nogil=True)
def _bucket_scatter(keys, shift, lo, bits, cursor, out):  # pragma: no cover - compiled
    """Each key to its bucket's next slot in `out` (cursor: this chunk's slot per bucket)."""
    for i in range(len(keys)):
        b = ((keys[i] >> shift) - lo) >> bits
        out[cursor[b]] = keys[i]
        cursor[b] += 1


@numba.njit(cache=True, nogil=True)
def _sort_short(vals, a, b):  # pragma: no cover - compiled
    """vals[a:b] sorted in place: by insertion when short (most rows), else numpy's sort."""
    if b - a > SMALL_ROW:
        vals[a:b].sort()
        return
    for i in range(a + 1, b):
        v = vals[i]
        j = i - 1
        while j >= a and vals[j] > v:
            vals[j + 1] = vals[j]
            j -= 1
        vals[j + 1] = v


@numba.njit(cache=True, nogil=True)
def _dedupe_buckets(
    grouped, starts, shift, lo, rows, bits, count_both_flags, per_row, kept, distinct, b0, b1
):  # pragma: no cover - compiled
    """Buckets b0..b1-1: counting-sort each bucket's keys into rows, sort and dedupe each row,
    and write its neighbours back to the front of the bucket's slots (kept[b] of them)."""
    mask = (np.int64(1) << shift) - 1
    for bucket in range(b0, b1):
        a, b = starts[bucket], starts[bucket + 1]
        r0 = bucket << bits
        width = min(rows, r0 + (1 << bits)) - r0
        row_start = np.zeros(width + 1, np.int64)
        for i in range(a, b):
            row_start[(grouped[i] >> shift) - lo - r0 + 1] += 1
        for r in range(width):
            row_start[r + 1] += row_start[r]
        cursor = row_start[:-1].copy()
        vals = np.empty(b - a, np.int64)
        for i in range(a, b):
            r = (grouped[i] >> shift) - lo - r0
            vals[cursor[r]] = grouped[i] & mask
            cursor[r] += 1
        w = a
        found = 0
        for r in range(width):
            x, y = row_start[r], row_start[r + 1]
            _sort_short(vals, x, y)
            last, last_flagged, c = -1, -1, 0
            for j in range(x, y):
                v = vals[j]
                if v >> 1 != last:
                    last = v >> 1
                    grouped[w] = last
                    w += 1
                    c += 1
                if (count_both_flags or (v & 1) == 0) and v != last_flagged:
                    found += 1
                    last_flagged = v
            per_row[r0 + r] = c
        kept[bucket] = w - a
        distinct[bucket] = found


@numba.njit(cache=True, nogil=True)
def _compact_buckets(grouped, starts, kept, out_starts, out, b0, b1):  # pragma: no cover - compiled
    for bucket in range(b0, b1):
        a, o = starts[bucket], out_starts[bucket]
        out[o : o + kept[bucket]] = grouped[a : a + kept[bucket]]


@numba.njit(cache=True, nogil=True)
def _lower_counts(upper, bits, buckets):  # pragma: no cover - compiled
    counts = np.zeros(buckets, np.int64)
    for j in range(len(upper)):
        counts[upper[j] >> bits] += 1
    return counts


@numba.njit(cache=True, nogil=True)
def _lower_scatter(upper, ends, a, b, bits, shift, cursor, pairs):  # pragma: no cover - compiled
    """The pairs (v << shift | u) of upper edges a..b-1 (u the row holding each, from `ends`)
    into the buckets of v, in order of u."""
    u = np.searchsorted(ends, a, side="right")
    for j in range(a, b):
        while ends[u] <= j:
            u += 1
        v = upper[j]
        bucket = v >> bits
        pairs[cursor[bucket]] = (v << shift) | u
        cursor[bucket] += 1


@numba.njit(cache=True, nogil=True)
def _place_rows(
    pairs, starts, row_starts, upper_counts, ends, upper, shift, bits, dst, b0, b1
):  # pragma: no cover - compiled
    """Rows of buckets b0..b1-1: each row's lower neighbours from its bucket's pairs (already
    in increasing u), then its upper neighbours."""
    mask = (np.int64(1) << shift) - 1
    n = len(upper_counts)
    for bucket in range(b0, b1):
        r0 = bucket << bits
        r1 = min(n, r0 + (1 << bits))
        fill = row_starts[r0:r1].copy()
        for i in range(starts[bucket], starts[bucket + 1]):
            x = (pairs[i] >> shift) - r0
            dst[fill[x]] = pairs[i] & mask
            fill[x] += 1
        for r in range(r0, r1):
            c = upper_counts[r]
            dst[fill[r - r0] : fill[r - r0] + c] = upper[ends[r] - c : ends[r]]


NO_LUT = np.empty(0, np.int64)  # the `lut` argument of `repeat_rows` that maps no ids


def warm_kernels() -> None:
    """Call every kernel once on tiny inputs so their cached machine code is loaded."""
    keys = np.array([(0 << 2) | (1 << 1), (1 << 2) | (0 << 1) | 1], dtype=np.int64)
    counts, dst, _ = dedupe_rows([keys], 2, 0, 2, True)
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
