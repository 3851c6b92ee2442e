"""Dictionary codes of id columns for the canonical stage: every distinct id one code.

`dictionary_codes`: integer ids (and the hashes of string ids) go through one open-addressing
hash table in numba (`_encode_ints`, ~2.5x Arrow's memo table); other values through Arrow's
hash dictionary encoding split over the machine's cores: the chunks are cut into contiguous
groups of similar row counts, each group is encoded in its own thread (Arrow releases the GIL;
one memo table per group), and the groups' dictionaries are encoded once more to merge them
(a pass over the distinct ids, not the rows).

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


def _arrow_group(chunks: list[pa.Array]) -> tuple[list[np.ndarray], pa.Array]:
    """(codes per chunk, dictionary) of one group by one Arrow memo table (any value type)."""
    full = [c for c in chunks if len(c)]  # Arrow's encoding drops empty chunks: put them back
    if not full:
        return [np.empty(0, np.int32) for _ in chunks], pa.array([], chunks[0].type)
    column = pc.dictionary_encode(pa.chunked_array(full, full[0].type))
    # Arrow encodes a chunked array with one memo table: every chunk holds the same final
    # dictionary (the same buffers). Unifying would re-encode every chunk (~10x the encoding).
    shared = {tuple(b.address if b is not None else 0 for b in c.dictionary.buffers()) for c in column.chunks}
    if len(shared) > 1:
        column = pa.table({"code": column}).unify_dictionaries().column(0)
    filled = iter(c.indices.fill_null(-1).to_numpy() for c in column.chunks)
    return [next(filled) if len(c) else np.empty(0, np.int32) for c in chunks], column.chunk(0).dictionary


def _int_codes(chunks: list[pa.Array]) -> tuple[list[np.ndarray], np.ndarray]:
    """(codes per chunk, distinct values int64) of integer chunks by one `_encode_ints` table,
    chunk by chunk (no copy of the values). One thread: two tables over two halves of a hash's
    range measured only ~10 % faster (each probe waits on memory either way)."""
    table = _IntTable()
    codes = []
    for chunk in chunks:
        values = chunk.fill_null(0).to_numpy() if chunk.null_count else chunk.to_numpy()
        values = values.view(np.int64) if values.dtype == np.uint64 else values.astype(np.int64, copy=False)
        codes.append(table.encode(values, np.asarray(chunk.is_valid()) if chunk.null_count else _ALL_VALID))
    return codes, table.distinct[: table.m].copy()


class _IntTable:
    """The state of `_encode_ints` between chunks: the table, the distinct values, their count."""

    def __init__(self):
        self.bits, self.m = 16, 0
        self.table = np.full((1 << self.bits, 2), -1, np.int64)  # (value, code) per slot; code -1 = empty
        self.distinct = np.empty(1 << 15, np.int64)

    def encode(self, values: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Codes of int64 `values` (uint64 read as int64 bits); -1 where `valid` (unless empty) is False."""
        codes = np.empty(len(values), dtype=np.int32)
        self.table, self.distinct, self.m, self.bits = _encode_ints(
            values, valid, codes, self.table, self.distinct, self.m, self.bits
        )
        return codes


_ALL_VALID = np.empty(0, dtype=bool)  # `_encode_ints`: no mask, every value valid


@numba.njit(cache=True, nogil=True)
def _slot(value, shift, mask):  # pragma: no cover - compiled
    """Fibonacci hashing: the top bits of value * 2^64 / phi."""
    return np.int64((np.uint64(value) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift)) & mask


@numba.njit(cache=True, nogil=True)
def _encode_ints(values, valid, codes, table, distinct, m, bits):  # pragma: no cover - compiled
    """codes[i] = the code of values[i] (codes in order of first appearance; -1 where `valid`,
    when not empty, is False) by an open-addressing hash table of (value, code) slots (one
    cache line per probe) kept at most half full and carried from call to call: returns
    (table, distinct, m, bits). ~2.5x Arrow's memo table on 22M int64 with 1M distinct here."""
    check = len(valid) > 0
    mask = len(table) - 1
    for i in range(len(values)):
        if check and not valid[i]:
            codes[i] = -1
            continue
        v = values[i]
        j = _slot(v, 64 - bits, mask)
        while table[j, 1] >= 0 and table[j, 0] != v:
            j = (j + 1) & mask
        if table[j, 1] >= 0:
            codes[i] = table[j, 1]
            continue
        if m == len(distinct):
            grown = np.empty(2 * m, np.int64)
            grown[:m] = distinct
            distinct = grown
        distinct[m] = v
        table[j, 0], table[j, 1] = v, m
        codes[i] = m
        m += 1
        if 2 * m > len(table):  # rehash every distinct value into a table twice the size
            bits += 1
            table = np.full((1 << bits, 2), -1, np.int64)
            mask = len(table) - 1
            for c in range(m):
                k = _slot(distinct[c], 64 - bits, mask)
                while table[k, 1] >= 0:
                    k = (k + 1) & mask
                table[k, 0], table[k, 1] = distinct[c], c
    return table, distinct, m, bits


def _as_type(distinct: np.ndarray, kind: pa.DataType) -> pa.Array:
    """int64 distinct values back as the chunks' integer type."""
    dtype = np.dtype(kind.to_pandas_dtype())
    return pa.array(distinct.view(dtype) if dtype == np.uint64 else distinct.astype(dtype), kind)


def dictionary_codes(chunks: list[pa.Array], threads: int | None = None) -> tuple[list[np.ndarray], pa.Array]:
    """(codes, dictionary): chunk i's codes (int32 numpy; -1 where the value is null) and the
    distinct non-null values, code = position in the dictionary. Empty chunks keep their place,
    so codes[i] always belongs to chunk i.

    Integer chunks go through `_encode_ints` tables (`_int_codes`); other types through
    Arrow's memo table, split over `threads` groups then merged."""
    if not chunks:
        return [], pa.array([], pa.null())
    if pa.types.is_integer(chunks[0].type):
        codes, distinct = _int_codes(chunks)
        return codes, _as_type(distinct, chunks[0].type)
    groups = _split_by_rows(chunks, threads or _threads(chunks))
    if len(groups) == 1:
        return _arrow_group(groups[0])
    with ThreadPoolExecutor(len(groups)) as pool:
        encoded = list(pool.map(_arrow_group, groups))
    together = pc.dictionary_encode(pa.concat_arrays([d for _, d in encoded]))
    remap, out, at = together.indices.to_numpy(), [], 0
    for codes, d in encoded:
        part = np.append(remap[at : at + len(d)], np.int32(-1))  # code -1 (null) maps to part[-1] = -1
        out += [part[c] for c in codes]
        at += len(d)
    return out, together.dictionary


@numba.njit(cache=True, nogil=True)
def _rank_into(out, idx, rank):  # pragma: no cover - compiled
    """out[i] = rank[idx[i]] (idx < 0 stays -1), without the GIL."""
    for i in range(len(idx)):
        out[i] = rank[idx[i]] if idx[i] >= 0 else -1


def ranked_codes(index_chunks: list[np.ndarray], rank: np.ndarray) -> np.ndarray:
    """One int64 array of rank[code] for every row of the code chunks, -1 where the code is
    -1 (chunks spread over threads)."""
    starts = np.concatenate([[0], np.cumsum([len(c) for c in index_chunks], dtype=np.int64)])
    out = np.empty(int(starts[-1]), dtype=np.int64)

    def fill(k: int) -> None:
        _rank_into(out[starts[k] : starts[k + 1]], index_chunks[k], rank)

    with ThreadPoolExecutor(_threads(index_chunks)) as pool:
        list(pool.map(fill, range(len(index_chunks))))
    return out


def warm_kernels() -> None:
    """Load the kernels' cached machine code for the argument types they get."""
    _rank_into(np.zeros(1, np.int64), np.zeros(1, np.int32), np.zeros(1, np.int64))
    frozen = np.frombuffer(np.zeros(1, np.int64).tobytes(), np.int64)  # Arrow's buffers are read-only
    for values, valid in ((frozen, _ALL_VALID), (np.zeros(1, np.int64), np.ones(1, dtype=bool))):
        _IntTable().encode(values, valid)


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


def codes_by_hash(values: list[pa.Array], hashes: list[pa.Array]) -> tuple[list[np.ndarray], pa.Array] | None:
    """Dictionary codes of string `values` (chunks) found by encoding their 64-bit `hashes`
    (the same chunking): (index chunks, the string of each code), or None when two distinct
    strings share a hash."""
    if not values:
        return None
    index_chunks, dictionary = dictionary_codes(hashes)
    position = np.zeros(len(dictionary), dtype=np.int64)  # of some row holding each code (any one will do)
    at = 0
    for idx in index_chunks:
        rows = np.flatnonzero(idx >= 0)
        position[idx[rows]] = at + rows
        at += len(idx)
    if len(dictionary) == 0:  # every row null
        return index_chunks, values[0][:0]
    representative = _representatives(values, position)

    def same(k: int) -> bool:  # Arrow's take + compare: ~2.5x a byte-by-byte numba loop here
        # a null row (code -1) compares as null, which pc.any skips
        taken = representative.take(pa.array(np.maximum(index_chunks[k], 0)))
        return not pc.any(pc.not_equal(values[k], taken)).as_py()

    with ThreadPoolExecutor(_threads(values)) as pool:
        if not all(pool.map(same, range(len(values)))):
            return None  # a hash collision: some row's string differs from its code's string
    return index_chunks, representative
