"""Tiered feature storage (training/feature_cache.py): LRU mechanics, hit counting, INT8 rows,
hot-tier selection by degree."""

import numpy as np
import pytest
import torch

from graphs.kernels.quantize import EncodedFeatures, encode_features
from training.feature_cache import TieredFeatures, hot_nodes


def _fp32(n=10, d=3, tmp_path=None):
    x = (np.arange(n * d, dtype=np.float32).reshape(n, d) + 0.5) * np.float32(1.25)
    if tmp_path is not None:  # the cold tier as in training: a memory-mapped .npy
        np.save(tmp_path / "features.npy", x)
        x = np.load(tmp_path / "features.npy", mmap_mode="r")
    return EncodedFeatures("fp32", x.shape[0], x.shape[1], {"x": x}), np.asarray(x)


def test_lru_evicts_the_least_recently_gathered_row(tmp_path):
    enc, _ = _fp32(tmp_path=tmp_path)
    cache = TieredFeatures(enc, warm_rows=2)
    cache.gather(np.array([1]))
    cache.gather(np.array([2]))
    cache.gather(np.array([1]))  # hit: 1 is now more recent than 2
    cache.gather(np.array([3]))  # evicts 2
    assert cache.cached_nodes().tolist() == [1, 3]
    cache.gather(np.array([4]))  # evicts 1
    assert cache.cached_nodes().tolist() == [3, 4]
    s = cache.stats
    assert (s.requested, s.warm_hits, s.cold_reads, s.hot_hits) == (5, 1, 4, 0)
    assert s.hit_rate == pytest.approx(0.2)


def test_a_gather_never_evicts_its_own_hits():
    enc, x = _fp32()
    cache = TieredFeatures(enc, warm_rows=3)
    cache.gather(np.array([0, 1, 2]))
    rows = cache.gather(np.array([0, 1, 5, 6]))  # 2 hits; only one free slot (2's) for 5 and 6
    assert cache.cached_nodes().tolist() == [0, 1, 5]
    np.testing.assert_array_equal(rows.numpy(), x[[0, 1, 5, 6]])


def test_hits_count_unique_rows_and_rows_come_back_in_request_order(tmp_path):
    enc, x = _fp32(tmp_path=tmp_path)
    cache = TieredFeatures(enc, warm_rows=4)
    nodes = np.array([7, 3, 7, 0, 3])
    first = cache.gather(nodes)
    second = cache.gather(nodes)
    np.testing.assert_array_equal(first.numpy(), x[nodes])
    np.testing.assert_array_equal(second.numpy(), x[nodes])
    assert (cache.stats.requested, cache.stats.warm_hits, cache.stats.cold_reads) == (6, 3, 3)
    np.testing.assert_array_equal(cache.gather_codes(nodes), x[nodes])


def test_hot_tier_holds_the_highest_degree_nodes():
    assert hot_nodes(np.array([1, 5, 3, 5, 0]), 2).tolist() == [1, 3]
    assert hot_nodes(np.array([2, 2, 2, 9]), 2).tolist() == [0, 3]  # ties: lower id first
    assert hot_nodes(np.array([4, 1]), 5).tolist() == [0, 1]
    enc, x = _fp32(n=6)
    degree = np.array([0, 9, 1, 8, 2, 3])
    cache = TieredFeatures(enc, warm_rows=1, hot_rows=2, degree=degree, device="cpu")
    assert cache.hot_nodes.tolist() == [1, 3]
    nodes = np.array([3, 0, 1, 5])
    np.testing.assert_array_equal(cache.gather(nodes).numpy(), x[nodes])
    assert (cache.stats.hot_hits, cache.stats.warm_hits, cache.stats.cold_reads) == (2, 0, 2)
    assert cache.cached_nodes().tolist() == [0]  # hot rows never enter the warm tier


def test_int8_rows_equal_the_dequantized_originals_in_every_tier():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 8)).astype(np.float32)
    enc = encode_features(x, "int8")
    degree = rng.integers(0, 100, 50)
    cache = TieredFeatures(enc, warm_rows=10, hot_rows=5, degree=degree)
    assert cache._rows.dtype == np.int8 and cache._hot.dtype == torch.int8  # compact codes in the tiers
    expected_all = enc.decode()
    for nodes in (rng.integers(0, 50, 30), np.arange(50), rng.integers(0, 50, 30)):
        got = cache.gather(nodes).numpy()
        np.testing.assert_array_equal(got, expected_all[nodes])
    assert cache.stats.hot_hits > 0 and cache.stats.warm_hits > 0 and cache.stats.cold_reads > 0
    # quantized, not the originals themselves
    assert not np.array_equal(expected_all, x)


def test_bad_settings_are_refused():
    enc, _ = _fp32()
    with pytest.raises(ValueError, match="degree"):
        TieredFeatures(enc, hot_rows=2)
    with pytest.raises(ValueError, match=">= 0"):
        TieredFeatures(enc, warm_rows=-1)


def test_degree_policy_keeps_the_highest_degree_rows_after_the_hot_ones():
    enc, x = _fp32(n=8)
    degree = np.array([5, 1, 9, 7, 2, 8, 0, 3])
    cache = TieredFeatures(enc, warm_rows=2, hot_rows=1, degree=degree, warm_policy="degree")
    assert cache.hot_nodes.tolist() == [2]
    assert cache.cached_nodes().tolist() == [3, 5]  # next highest degrees, filled up front
    nodes = np.array([0, 1, 2, 3, 5, 6])
    np.testing.assert_array_equal(cache.gather(nodes).numpy(), x[nodes])
    assert cache.cached_nodes().tolist() == [3, 5]  # misses are never inserted
    assert (cache.stats.hot_hits, cache.stats.warm_hits, cache.stats.cold_reads) == (1, 2, 3)
    with pytest.raises(ValueError, match="warm_policy"):
        TieredFeatures(enc, warm_rows=2, warm_policy="fifo")
    with pytest.raises(ValueError, match="degree"):
        TieredFeatures(enc, warm_rows=2, warm_policy="degree")


def test_readahead_reads_the_same_rows_and_defaults_off_for_a_small_file(tmp_path):
    enc, x = _fp32(n=2000, d=5, tmp_path=tmp_path)
    assert TieredFeatures(enc, warm_rows=10).readahead is False  # a 40 KB file stays in the page cache
    ids = np.array([1999, 7, 7, 500, 0, 1200])
    for warm in (0, 3):  # the uncached path and the LRU's misses
        cache = TieredFeatures(enc, warm_rows=warm, readahead=True)
        assert cache.readahead is True
        for _ in range(2):
            np.testing.assert_array_equal(cache.gather_codes(ids), x[ids])


def test_cold_reads_count_the_runs_of_file_pages_they_touch(tmp_path):
    """128 float32 features: 8 rows per 4 KiB page. Rows 0, 2 and 9 lie on pages 0 and 1 (one run),
    row 40 on page 5; with rows 0..7 in the warm tier only 9 and 40 are read: pages 1 and 5. Counted
    when the cold tier reads ahead (a file larger than half the memory)."""
    enc, _ = _fp32(n=64, d=128, tmp_path=tmp_path)
    cache = TieredFeatures(enc, readahead=True)
    cache.gather(np.array([40, 9, 2, 0, 9]))
    assert (cache.stats.cold_reads, cache.stats.cold_runs, cache.stats.cold_pages) == (4, 2, 3)
    warm = TieredFeatures(enc, warm_rows=8, degree=np.arange(64, 0, -1), warm_policy="degree", readahead=True)
    warm.gather(np.array([40, 9, 2, 0, 9]))
    assert (warm.stats.cold_reads, warm.stats.cold_runs, warm.stats.cold_pages) == (2, 2, 2)
    resident = TieredFeatures(enc, readahead=False)  # a file that stays cached: no disk reads to count
    resident.gather(np.array([40, 9]))
    assert (resident.stats.cold_reads, resident.stats.cold_runs) == (2, 0)


def test_the_degree_tier_filled_in_chunks_holds_the_rows_of_the_file(tmp_path, monkeypatch):
    enc, x = _fp32(n=500, d=16, tmp_path=tmp_path)
    monkeypatch.setattr(TieredFeatures, "FILL_CHUNK_BYTES", 7 * 64)  # 7 rows of 64 bytes per chunk
    degree = (np.arange(500) * 7919) % 503
    cache = TieredFeatures(enc, warm_rows=100, degree=degree, warm_policy="degree")
    kept = cache.cached_nodes()
    assert kept.tolist() == sorted(np.argsort(-degree, kind="stable")[:100].tolist())
    np.testing.assert_array_equal(cache.gather(kept).numpy(), x[kept])
    assert cache.stats.warm_hits == 100 and cache.stats.cold_reads == 0


def test_gathered_rows_are_never_overwritten_while_held_and_their_memory_is_reused_after():
    """The warm tier gathers into recycled arrays: rows a caller still holds (as an array or as
    a tensor made from it) keep their values through later gathers; once dropped, the next
    gather writes into the same memory."""
    enc, x = _fp32(n=40, d=3)
    cache = TieredFeatures(enc, warm_rows=40)
    cache.gather_codes(np.arange(40))  # every row warm
    held = [cache.gather_codes(np.array([i, i + 1])) for i in range(0, 12, 2)]  # more than the kept arrays
    as_tensor = torch.from_numpy(cache.gather_codes(np.array([30, 31, 32])))
    for _ in range(3):
        cache.gather_codes(np.array([20, 21, 22, 23]))
    for k, rows in enumerate(held):
        np.testing.assert_array_equal(rows, x[[2 * k, 2 * k + 1]])
    np.testing.assert_array_equal(as_tensor.numpy(), x[[30, 31, 32]])
    del held, as_tensor
    first = cache.gather_codes(np.array([5, 6]))
    address = first.__array_interface__["data"][0]
    np.testing.assert_array_equal(first, x[[5, 6]])
    del first
    again = cache.gather_codes(np.array([7, 8]))
    np.testing.assert_array_equal(again, x[[7, 8]])
    assert again.__array_interface__["data"][0] == address  # the released array, written again


def test_a_gather_split_in_two_halves_equals_the_whole_gather():
    """`gather_split` on the host, then `assemble` on the device (the split moved there, as CUDA
    training moves it) gives `gather`'s rows: the hot ones from the device tier, the rest as the
    host read them, in the order asked, duplicates included."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(50, 8)).astype(np.float32)
    degree = rng.integers(1, 100, 50)
    for enc in (EncodedFeatures("fp32", 50, 8, {"x": x}), encode_features(x, "int8")):
        expected = enc.decode()
        halves = TieredFeatures(enc, warm_rows=5, hot_rows=5, degree=degree)
        hot = halves.hot_nodes
        for nodes in (np.array([7, 3, 3, 49, 0, 7]), np.arange(50), hot[::-1].copy(), np.setdiff1d(np.arange(50), hot)):
            split = halves.gather_split(nodes)
            unique = np.unique(nodes)
            assert split.num_unique == len(unique) and len(split.hot_pos) == np.isin(unique, hot).sum()
            assert len(split.host_rows) == len(unique) - len(split.hot_pos)  # the host reads no hot row
            np.testing.assert_array_equal(halves.assemble(split.to("cpu")).numpy(), expected[nodes])
        assert halves.stats.hot_hits > 0 and halves.stats.warm_hits > 0 and halves.stats.cold_reads > 0
