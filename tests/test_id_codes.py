"""graphs.kernels.id_codes: dictionary codes split over threads give every distinct id one code."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from graphs.kernels import id_codes
from graphs.kernels.id_codes import IntIdLookup, StringIdLookup, codes_by_hash, dictionary_codes, sorted_int_codes


def _decoded(index_chunks, dictionary):
    return [None if i < 0 else dictionary[int(i)].as_py() for c in index_chunks for i in c]


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_codes_split_over_threads_decode_to_the_input(threads):
    rng = np.random.default_rng(0)
    values = rng.integers(0, 50, size=1000)
    cut = [0, 0, 10, 300, 301, 650, 1000]  # an empty chunk, tiny and large ones
    chunks = [pa.array(values[a:b]) for a, b in zip(cut, cut[1:])]
    chunks[2] = pa.array([None if i % 7 == 0 else int(v) for i, v in enumerate(values[10:300])], pa.int64())
    index_chunks, dictionary = dictionary_codes(chunks, threads)
    assert [len(c) for c in index_chunks] == [len(c) for c in chunks]  # chunk i's codes are index chunk i
    assert _decoded(index_chunks, dictionary) == [v for c in chunks for v in c.to_pylist()]
    assert len(dictionary) == len(set(dictionary.to_pylist())) == len(np.unique(values))  # one code per id


def test_string_codes_by_hash_across_threads_and_sliced_chunks():
    strings = pa.array([f"id{i % 37}" for i in range(500)])
    values = [strings.slice(0, 120), strings.slice(120, 0), strings.slice(120, 380)]  # sliced, one empty
    ids = [int(s[2:]) for s in strings.to_pylist()]
    hashes = [pa.array(ids[:120], pa.uint64()), pa.array([], pa.uint64()), pa.array(ids[120:], pa.uint64())]
    index_chunks, representative = codes_by_hash(values, hashes)
    assert _decoded(index_chunks, representative) == strings.to_pylist()
    assert sorted(representative.to_pylist()) == sorted({f"id{i}" for i in range(37)})
    # a collision far into a later chunk: one "id6" row (of 13) gets the hash of "id5"
    row = 120 + 300 + ids[420:].index(6)
    colliding = ids[120:row] + [5] + ids[row + 1 :]
    hashes[2] = pa.array(colliding, pa.uint64())
    assert codes_by_hash(values, hashes) is None


@pytest.mark.parametrize("kind", [pa.int64(), pa.uint64(), pa.int32()])
def test_integer_codes_match_arrow_through_table_growth(kind):
    """The numba hash table grows from 2^16 slots: 300k distinct values (uint64 above 2^63
    included, read as int64 bits) decode back exactly, with nulls."""
    rng = np.random.default_rng(4)
    top = np.iinfo(kind.to_pandas_dtype()).max
    distinct = np.unique(rng.integers(0, top, size=300_000, dtype=np.uint64 if kind == pa.uint64() else np.int64))
    rows = distinct[rng.integers(0, len(distinct), size=900_000)]
    chunks = [pa.array(rows[i : i + 100_000], kind) for i in range(0, len(rows), 100_000)]
    chunks[4] = pa.array([None if i % 11 == 0 else v for i, v in enumerate(chunks[4].to_pylist())], kind)
    index_chunks, dictionary = dictionary_codes(chunks, threads=2)
    given = [v for c in chunks for v in c.to_pylist()]
    assert dictionary.type == kind and len(dictionary) == len({v for v in given if v is not None})
    assert _decoded(index_chunks, dictionary) == given


@pytest.mark.parametrize("threads", [1, 2])
def test_integer_codes_of_skewed_partitions_and_null_chunks(threads):
    """One value filling most rows (one partition far larger than the rest), an all-null
    chunk and an empty one: every row decodes back, and the threads agree on the codes."""
    rng = np.random.default_rng(7)
    rows = np.where(rng.random(200_000) < 0.9, 123_456_789_012, rng.integers(-(2**62), 2**62, size=200_000))
    chunks = [pa.array(rows[:150_000]), pa.array([None] * 5, pa.int64()), pa.array([], pa.int64())]
    chunks.append(pa.array(rows[150_000:]))
    index_chunks, dictionary = dictionary_codes(chunks, threads)
    given = [v for c in chunks for v in c.to_pylist()]
    assert _decoded(index_chunks, dictionary) == given
    assert len(dictionary) == len({v for v in given if v is not None})
    assert [c.tolist() for c in index_chunks] == [c.tolist() for c in dictionary_codes(chunks, 1)[0]]


@pytest.mark.parametrize("threads", [1, 2])
def test_sorted_int_codes_are_ranks_of_the_sorted_distinct_ids(threads):
    """Each row gets the rank of its id among the sorted distinct ids (-1 for a null), in the
    chunks' order, as numpy's unique would number them."""
    rng = np.random.default_rng(11)
    ids = rng.integers(-(10**15), 10**15, size=40_000)
    rows = ids[rng.integers(0, len(ids), size=300_000)]
    chunks = [pa.array(rows[:100_000]), pa.array([], pa.int64()), pa.array(rows[100_000:])]
    chunks[0] = pa.array([None if i % 13 == 0 else int(v) for i, v in enumerate(rows[:100_000])], pa.int64())
    codes, dictionary = sorted_int_codes(chunks, threads)
    given = np.array([-(2**63) if v is None else v for c in chunks for v in c.to_pylist()], dtype=np.int64)
    valid = given != -(2**63)
    distinct, inverse = np.unique(given[valid], return_inverse=True)
    assert dictionary.to_pylist() == distinct.tolist() and dictionary.type == pa.int64()
    assert (codes[valid] == inverse).all() and (codes[~valid] == -1).all() and len(codes) == len(given)


@pytest.mark.parametrize("n", [1, 7, 5000, 400_000])  # 400k: 1.6M values, two pieces in two threads
def test_sorted_id_lookup_gives_pandas_positions(n):
    """Positions of present ids, -1 for absent ones (the int64 extremes included), in row order."""
    rng = np.random.default_rng(n)
    ids = np.unique(rng.integers(-(10**15), 10**15, size=n))
    absent = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0, 1, -1], dtype=np.int64)
    values = np.concatenate([rng.choice(ids, size=3 * n), rng.integers(-(10**15), 10**15, size=n), absent])
    rng.shuffle(values)
    want = pd.Index(ids).get_indexer(values)
    for threads in (1, 2):
        np.testing.assert_array_equal(IntIdLookup(ids, threads=threads)(values), want)
    assert len(IntIdLookup(ids)(np.empty(0, np.int64))) == 0


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_string_id_lookup_gives_arrow_positions(kind, monkeypatch):
    """Positions of present strings, -1 for absent ones and nulls, on sliced arrays too; where
    two ids share a hash the lookup is not used, and `Relabeler` gives Arrow's answer either way."""
    from graphs.stages.canonical_ids import Relabeler

    rng = np.random.default_rng(3)
    ids = pa.array(sorted({f"n{v}" for v in rng.integers(0, 10**9, 3000)} | {"", "é", "n"}), kind)
    picks = rng.integers(0, len(ids), 9000)
    values = pa.array([ids[int(i)].as_py() for i in picks] + ["absent", "n0x", None, "", "é"] * 3, kind).slice(
        2
    )  # a sliced array: its offsets start past 0
    want = np.asarray(pc.index_in(values, value_set=ids).fill_null(-1).to_numpy(), dtype=np.int64)
    lookup = StringIdLookup(ids)
    assert lookup.usable
    np.testing.assert_array_equal(lookup(values), want)
    np.testing.assert_array_equal(Relabeler(ids)(values), want)
    monkeypatch.setattr(id_codes, "string_hashes", lambda v: np.zeros(len(v), dtype=np.int64))  # every hash equal
    assert not StringIdLookup(ids).usable
    np.testing.assert_array_equal(Relabeler(ids)(values), want)
