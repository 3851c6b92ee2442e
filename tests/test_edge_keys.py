"""The canonical stage's row kernels (`graphs.kernels.edge_keys`) against numpy references."""

from __future__ import annotations

import numpy as np
import pytest

from graphs.kernels import edge_keys, threads
from graphs.kernels.edge_keys import dedupe_rows, key_shift, mirror


def _use_threads(monkeypatch, count: int) -> None:
    """Pieces cut for `count` threads and run in that many, whatever the machine's cores."""
    monkeypatch.setattr(edge_keys, "kernel_threads", lambda: count)
    monkeypatch.setattr(threads, "kernel_threads", lambda: count)


def _keys(rng, rows: int, lo: int, size: int, n: int, hub: int) -> np.ndarray:
    """Keys of sources lo..lo+rows-1 (flag bits random, duplicates common), with one hub row
    and every 7th row empty."""
    src = rng.integers(lo, lo + rows, size)
    src = np.concatenate([src[(src - lo) % 7 != 0], np.full(hub, lo + rows // 2)])
    dst = rng.integers(0, n, len(src))
    flag = rng.integers(0, 2, len(src))
    return (src << key_shift(n)) | (dst << 1) | flag


def _dedupe_reference(keys: np.ndarray, shift: int, lo: int, rows: int, count_both_flags: bool):
    src = (keys >> shift) - lo
    val = keys & ((1 << shift) - 1)
    pairs = np.unique(np.stack([src, val >> 1], axis=1), axis=0)
    counts = np.bincount(pairs[:, 0], minlength=rows)
    flagged = np.unique(keys if count_both_flags else keys[(keys & 1) == 0])
    return counts, pairs[:, 1], len(flagged)


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("count_both_flags", [True, False])
def test_dedupe_rows_matches_a_sort_of_every_key(monkeypatch, workers, count_both_flags):
    _use_threads(monkeypatch, workers)
    rng = np.random.default_rng(7)
    n, lo, rows = 50_000, 1_000, 20_000
    keys = _keys(rng, rows, lo, 300_000, n, hub=500)  # the hub row is longer than SMALL_ROW
    shift = key_shift(n)
    chunks = [keys[:1], keys[1:100_000], keys[100_000:100_000], keys[100_000:]]  # an empty chunk too
    counts, dst, distinct = dedupe_rows(chunks, shift, lo, rows, count_both_flags)
    ref_counts, ref_dst, ref_distinct = _dedupe_reference(keys, shift, lo, rows, count_both_flags)
    assert counts.tolist() == ref_counts.tolist()
    assert np.array_equal(dst, ref_dst)
    assert distinct == ref_distinct
    assert (counts == 0).any() and counts.max() > edge_keys.SMALL_ROW  # empty rows and the hub were met


def test_dedupe_rows_of_no_keys():
    counts, dst, distinct = dedupe_rows([], 4, 0, 3, True)
    assert counts.tolist() == [0, 0, 0] and len(dst) == 0 and distinct == 0
    counts, dst, distinct = dedupe_rows([np.empty(0, np.int64)], 4, 0, 0, True)
    assert len(counts) == 0 and len(dst) == 0 and distinct == 0


@pytest.mark.parametrize("workers", [1, 3])
def test_mirror_gives_both_directions_in_order(monkeypatch, workers):
    _use_threads(monkeypatch, workers)
    rng = np.random.default_rng(11)
    n = 30_000
    u, v = rng.integers(0, n, (2, 200_000))
    u, v = np.concatenate([u, np.zeros(300, np.int64)]), np.concatenate([v, np.arange(1, 301)])  # a hub
    keep = u != v
    lo_, hi_ = np.minimum(u[keep], v[keep]), np.maximum(u[keep], v[keep])
    upper = np.unique(np.stack([lo_, hi_], axis=1), axis=0)  # sorted (u, v) with u < v
    upper_counts = np.bincount(upper[:, 0], minlength=n)
    degree, dst = mirror(upper_counts, upper[:, 1].copy())
    both = np.concatenate([upper, upper[:, ::-1]])
    both = both[np.lexsort((both[:, 1], both[:, 0]))]
    assert degree.tolist() == np.bincount(both[:, 0], minlength=n).tolist()
    assert np.array_equal(dst, both[:, 1])


def test_mirror_of_no_edges():
    degree, dst = mirror(np.zeros(4, np.int64), np.empty(0, np.int64))
    assert degree.tolist() == [0, 0, 0, 0] and len(dst) == 0
