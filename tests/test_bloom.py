"""Split-block Bloom filter over edge pairs: no false negatives, FPR near target, file layout."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphs.kernels.bloom import (
    FORMAT_VERSION,
    HEADER_BYTES,
    MAGIC,
    BloomFilter,
    blocked_fpr,
    measured_fpr,
    optimal_parameters,
)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pairs=st.lists(st.tuples(INT64, INT64), min_size=0, max_size=300),
    fpr=st.sampled_from([0.3, 0.05, 0.01, 1e-4]),
    seed=st.integers(min_value=0, max_value=2**64 - 1),
)
def test_never_a_false_negative(pairs, fpr, seed):
    src = np.array([p[0] for p in pairs], dtype=np.int64)
    dst = np.array([p[1] for p in pairs], dtype=np.int64)
    bf = BloomFilter.build(src, dst, fpr=fpr, seed=seed)
    assert bf.might_contain(src, dst).all()
    assert bf.count == len(pairs)
    # incremental inserts into an undersized filter: still no false negatives
    half = len(pairs) // 2
    inc = BloomFilter.empty(max(1, half // 4), fpr=fpr, seed=seed)
    inc.add(src[:half], dst[:half])
    inc.add(src[half:], dst[half:])
    assert inc.might_contain(src, dst).all()


def _random_edges(num_nodes: int, num_edges: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, num_nodes * num_nodes, size=int(num_edges * 1.05)))
    keys = rng.permutation(keys)[:num_edges]
    return keys // num_nodes, keys % num_nodes


@pytest.fixture(scope="module")
def edges_200k():
    return _random_edges(100_000, 200_000, seed=1)


def test_measured_fpr_within_1_5x_of_target_on_1m_queries(edges_200k):
    src, dst = edges_200k
    bf = BloomFilter.build(src, dst, fpr=0.01, seed=3)
    fpr = measured_fpr(bf, 1_000_000, 100_000, exclude=(src, dst), seed=4)
    assert 0.01 / 1.5 <= fpr <= 0.01 * 1.5
    # the sizing model agrees with the measurement to ~10%
    assert abs(fpr - bf.expected_fpr) < 0.1 * bf.expected_fpr
    assert bf.bits_per_item < 11.0  # not oversized: classic optimum is 9.59 bits at 1%


def test_measured_fpr_tighter_target(edges_200k):
    src, dst = edges_200k
    bf = BloomFilter.build(src, dst, fpr=0.001)
    fpr = measured_fpr(bf, 1_000_000, 100_000, exclude=(src, dst), seed=5)
    assert 0.001 / 1.5 <= fpr <= 0.001 * 1.5


def test_measured_fpr_excludes_true_edges_and_accepts_a_callable():
    # a complete bipartite block of edges: a filter holding exactly them plus a query set
    # dominated by them must still report only the non-edge acceptance rate
    u, v = np.meshgrid(np.arange(50), np.arange(50), indexing="ij")
    src, dst = u.ravel(), v.ravel()
    bf = BloomFilter.build(src, dst, fpr=0.01)
    by_pairs = measured_fpr(bf, 20_000, 60, exclude=(src, dst), seed=0)
    by_callable = measured_fpr(bf, 20_000, 60, exclude=lambda a, b: (a < 50) & (b < 50), seed=0)
    assert by_pairs == by_callable
    assert by_pairs < 0.05  # were edges counted, ~69% of draws would be accepted


def test_ids_beyond_32_bits_and_negative_ids():
    rng = np.random.default_rng(7)
    src = rng.integers(2**32, 2**62, size=50_000)
    dst = -rng.integers(2**40, 2**62, size=50_000)
    bf = BloomFilter.build(src, dst, fpr=0.01)
    assert bf.might_contain(src, dst).all()
    # the high bits matter: the same pairs shifted by 2**32 (equal low 32 bits) are non-edges
    # and must be rejected at about the target rate, not accepted wholesale
    shifted = bf.might_contain(src + 2**32, dst).mean()
    swapped = bf.might_contain(dst, src).mean()  # (v, u) is a different key from (u, v)
    assert shifted < 0.02 and swapped < 0.02


def test_query_broadcasts_and_checks_input():
    bf = BloomFilter.build(np.array([1, 1, 2]), np.array([2, 3, 3]))
    got = bf.might_contain(1, np.array([[2, 3]]))
    assert got.shape == (1, 2) and got.all()
    assert (1, 2) in bf
    with pytest.raises(TypeError, match="integers"):
        bf.might_contain(np.array([1.0]), np.array([2]))
    with pytest.raises(ValueError, match="broadcast"):
        bf.might_contain(np.arange(3), np.arange(4))


def test_sizing_matches_the_model_and_is_whole_blocks():
    m, k = optimal_parameters(1_000_000, 0.01)
    assert m % 512 == 0 and k == 8
    assert blocked_fpr(m / 1_000_000, k) <= 0.01
    # one block fewer would miss the target: m is the smallest
    assert blocked_fpr((m - 512) / 1_000_000, k) > 0.01 or m == 512
    assert optimal_parameters(0, 0.01)[0] == 512
    with pytest.raises(ValueError, match="false-positive rate"):
        optimal_parameters(10, 1.5)


def test_properties():
    bf = BloomFilter.build(np.arange(1000), np.arange(1000) + 1, fpr=0.01, seed=9)
    assert bf.count == 1000 and bf.seed == 9 and bf.num_hashes == 8
    assert bf.num_bits == bf.nbytes * 8 == bf.words.size * 64
    assert bf.bits_per_item == pytest.approx(bf.num_bits / 1000)
    other = BloomFilter.build(np.arange(1000), np.arange(1000) + 1, fpr=0.01, seed=10)
    assert not np.array_equal(bf.words, other.words)


# ---------------------------------------------------------------------------------------
# file layout
# ---------------------------------------------------------------------------------------


@pytest.fixture()
def saved(tmp_path):
    rng = np.random.default_rng(11)
    src, dst = rng.integers(0, 2**40, size=(2, 20_000))
    bf = BloomFilter.build(src, dst, fpr=0.02, seed=12345)
    path = bf.save(tmp_path / "part0.bloom")
    return bf, path, src, dst


@pytest.mark.parametrize("mmap", [True, False])
def test_round_trip(saved, mmap):
    bf, path, src, dst = saved
    back = BloomFilter.load(path, mmap=mmap)
    np.testing.assert_array_equal(back.words, bf.words)
    assert (back.num_bits, back.num_hashes, back.seed, back.count, back.target_fpr) == (
        bf.num_bits,
        bf.num_hashes,
        bf.seed,
        bf.count,
        bf.target_fpr,
    )
    rng = np.random.default_rng(13)
    qs, qd = rng.integers(0, 2**40, size=(2, 50_000))
    np.testing.assert_array_equal(back.might_contain(qs, qd), bf.might_contain(qs, qd))
    assert back.might_contain(src, dst).all()
    assert not list(path.parent.glob(".*tmp*"))  # no temporary sibling left behind


def test_header_layout_is_as_documented(saved):
    bf, path, *_ = saved
    raw = path.read_bytes()
    assert len(raw) == HEADER_BYTES + bf.num_bits // 8
    assert raw[:8] == MAGIC
    version, layout, num_bits, k, header = struct.unpack_from("<IIQII", raw, 8)
    seed, count, num_words = struct.unpack_from("<QQQ", raw, 32)
    (target,) = struct.unpack_from("<d", raw, 56)
    assert (version, layout, header) == (FORMAT_VERSION, 1, 64)
    assert (num_bits, k) == (bf.num_bits, bf.num_hashes)
    assert (seed, count, num_words, target) == (12345, 20_000, bf.num_bits // 64, 0.02)
    np.testing.assert_array_equal(np.frombuffer(raw, dtype="<u8", offset=64), bf.words)


def test_add_on_a_loaded_filter_leaves_the_file_alone(saved):
    bf, path, *_ = saved
    before = path.read_bytes()
    back = BloomFilter.load(path)
    back.add(np.array([2**50]), np.array([3]))
    assert back.might_contain(2**50, 3)
    assert path.read_bytes() == before
    back.save(path)
    assert BloomFilter.load(path).might_contain(2**50, 3)
    assert BloomFilter.load(path).count == bf.count + 1


def test_rejects_truncated_file(saved):
    _, path, *_ = saved
    raw = path.read_bytes()
    path.write_bytes(raw[:-8])
    with pytest.raises(ValueError, match=r"part0\.bloom.*truncated"):
        BloomFilter.load(path)
    path.write_bytes(raw[:40])
    with pytest.raises(ValueError, match=r"part0\.bloom.*truncated"):
        BloomFilter.load(path)
    path.write_bytes(raw + b"\0" * 8)
    with pytest.raises(ValueError, match=r"part0\.bloom.*trailing"):
        BloomFilter.load(path)


def test_rejects_wrong_version_and_magic(saved):
    _, path, *_ = saved
    raw = bytearray(path.read_bytes())
    raw[8:12] = struct.pack("<I", FORMAT_VERSION + 1)
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=rf"part0\.bloom.*version {FORMAT_VERSION + 1}"):
        BloomFilter.load(path)
    raw[8:12] = struct.pack("<I", FORMAT_VERSION)
    raw[:8] = b"PAR1\0\0\0\0"
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"part0\.bloom.*magic"):
        BloomFilter.load(path)
