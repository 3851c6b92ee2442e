"""graphs.id_codes: dictionary codes split over threads give every distinct id one code."""

import numpy as np
import pyarrow as pa
import pytest

from graphs.id_codes import codes_by_hash, dictionary_codes


def _decoded(index_chunks, dictionary):
    return [None if i is None else dictionary[i].as_py() for c in index_chunks for i in c.to_pylist()]


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
