"""Dictionary codes of id columns for the canonical stage: every distinct id one code.

`dictionary_codes` is Arrow's hash dictionary encoding split over the machine's cores: the
chunks are cut into contiguous groups of similar row counts, each group is encoded in its own
thread (Arrow releases the GIL; one memo table per group), and the groups' dictionaries are
encoded once more to merge them (a pass over the distinct ids, not the rows).

`codes_by_hash` encodes string ids by their 64-bit hashes (computed by DuckDB in its parallel
scan): hashing 8-byte integers costs a fraction of hashing the strings. Exactness does not
rest on the hash: one string per code is taken as its representative and every row's string
is compared with its code's representative (chunks spread over threads), so a collision (two
strings, one code) is found and the caller encodes the strings themselves.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAX_THREADS = 4  # beyond a few groups the merge of their dictionaries outweighs the split


def _threads(chunks: list[pa.Array]) -> int:
    return max(1, min(len(chunks), os.cpu_count() or 1, MAX_THREADS))


def _split_by_rows(chunks: list[pa.Array], parts: int) -> list[list[pa.Array]]:
    """`chunks` cut into at most `parts` contiguous groups of similar row counts."""
    ends = np.cumsum([len(c) for c in chunks])
    total = int(ends[-1]) if len(ends) else 0
    groups: list[list[pa.Array]] = [[] for _ in range(parts)]
    for c, end in zip(chunks, ends):
        groups[min(parts - 1, int((end - len(c)) * parts // max(total, 1)))].append(c)
    return [g for g in groups if g]


def _encode_group(chunks: list[pa.Array]) -> tuple[list[pa.Array], pa.Array]:
    """(index chunks, dictionary) of one group, by one Arrow memo table."""
    if any(len(c) == 0 for c in chunks):  # Arrow's encoding drops empty chunks: put them back
        full = [c for c in chunks if len(c)]
        if not full:
            return [pa.array([], pa.int32()) for _ in chunks], pa.array([], chunks[0].type)
        indices, dictionary = _encode_group(full)
        filled = iter(indices)
        return [next(filled) if len(c) else pa.array([], pa.int32()) for c in chunks], dictionary
    column = pc.dictionary_encode(pa.chunked_array(chunks, chunks[0].type))
    # Arrow encodes a chunked array with one memo table: every chunk holds the same final
    # dictionary (the same buffers). Unifying would re-encode every chunk (~10x the encoding).
    shared = {tuple(b.address if b is not None else 0 for b in c.dictionary.buffers()) for c in column.chunks}
    if len(shared) > 1:
        column = pa.table({"code": column}).unify_dictionaries().column(0)
    return [c.indices for c in column.chunks], column.chunk(0).dictionary


def dictionary_codes(chunks: list[pa.Array], threads: int | None = None) -> tuple[list[pa.Array], pa.Array]:
    """(index chunks, dictionary): chunk i's codes (int32; null where the value is null) and
    the distinct non-null values, code = position in the dictionary. Empty chunks keep their
    place, so index chunk i always belongs to chunk i."""
    if not chunks:
        return [], pa.array([], pa.null())
    groups = _split_by_rows(chunks, threads or _threads(chunks))
    if len(groups) == 1:
        return _encode_group(groups[0])
    with ThreadPoolExecutor(len(groups)) as pool:
        encoded = list(pool.map(_encode_group, groups))
    dictionaries = [d for _, d in encoded]
    merged = pc.dictionary_encode(pa.concat_arrays(dictionaries))
    remap, at, out = merged.indices, 0, []
    for (indices, _), d in zip(encoded, dictionaries):
        part = remap.slice(at, len(d))
        out += [pc.take(part, idx) for idx in indices]  # null stays null
        at += len(d)
    return out, merged.dictionary


@numba.njit(cache=True, nogil=True)
def _rank_into(out, idx, rank):  # pragma: no cover - compiled
    """out[i] = rank[idx[i]] (idx < 0 stays -1), without the GIL."""
    for i in range(len(idx)):
        out[i] = rank[idx[i]] if idx[i] >= 0 else -1


def ranked_codes(index_chunks: list[pa.Array], rank: np.ndarray) -> np.ndarray:
    """One int64 array of rank[code] for every row of the index chunks, -1 where null
    (chunks spread over threads)."""
    starts = np.concatenate([[0], np.cumsum([len(c) for c in index_chunks], dtype=np.int64)])
    out = np.empty(int(starts[-1]), dtype=np.int64)

    def fill(k: int) -> None:
        idx = index_chunks[k]
        _rank_into(
            out[starts[k] : starts[k + 1]], idx.fill_null(-1).to_numpy() if idx.null_count else idx.to_numpy(), rank
        )

    with ThreadPoolExecutor(_threads(index_chunks)) as pool:
        list(pool.map(fill, range(len(index_chunks))))
    return out


def warm_kernels() -> None:
    """Load the kernel's cached machine code for the argument types it gets (Arrow's buffers
    are read-only)."""
    frozen = np.frombuffer(np.zeros(1, np.int32).tobytes(), np.int32)
    _rank_into(np.zeros(1, np.int64), frozen, np.zeros(1, np.int64))


def _representatives(values: list[pa.Array], position: np.ndarray) -> pa.Array:
    """values (chunks, read as one array) at `position`, one take per chunk (a take on a
    chunked array would first concatenate every chunk)."""
    starts = np.concatenate([[0], np.cumsum([len(v) for v in values])])
    order = np.argsort(position, kind="stable")
    sorted_pos = position[order]
    bounds = np.searchsorted(sorted_pos, starts)
    large = sum(v.nbytes for v in values) >= 2**31  # the gathered strings could pass 32-bit offsets
    parts = []
    for k, v in enumerate(values):
        a, b = bounds[k], bounds[k + 1]
        if b > a:
            part = v.take(pa.array(sorted_pos[a:b] - starts[k]))
            parts.append(part.cast(pa.large_string()) if large else part)
    gathered = pa.concat_arrays(parts)
    inverse = np.empty(len(order), dtype=np.int64)
    inverse[order] = np.arange(len(order), dtype=np.int64)
    return gathered.take(pa.array(inverse))


def codes_by_hash(values: list[pa.Array], hashes: list[pa.Array]) -> tuple[list[pa.Array], pa.Array] | None:
    """Dictionary codes of string `values` (chunks) found by encoding their 64-bit `hashes`
    (the same chunking): (index chunks, the string of each code), or None when two distinct
    strings share a hash."""
    if not values:
        return None
    index_chunks, dictionary = dictionary_codes(hashes)
    position = np.zeros(len(dictionary), dtype=np.int64)  # of some row holding each code (any one will do)
    at = 0
    for idx in index_chunks:
        if idx.null_count:
            valid = np.flatnonzero(np.asarray(idx.is_valid()))
            position[idx.filter(idx.is_valid()).to_numpy()] = at + valid
        else:
            position[idx.to_numpy()] = at + np.arange(len(idx), dtype=np.int64)
        at += len(idx)
    representative = _representatives(values, position)

    def same(k: int) -> bool:  # Arrow's take + compare: ~2.5x a byte-by-byte numba loop here
        return not pc.any(pc.not_equal(values[k], representative.take(index_chunks[k]))).as_py()

    with ThreadPoolExecutor(_threads(values)) as pool:
        if not all(pool.map(same, range(len(values)))):
            return None  # a hash collision: some row's string differs from its code's string
    return index_chunks, representative
