"""Dictionary codes of id columns for the canonical stage: every distinct id one code.

`dictionary_codes`: integer ids (and the hashes of string ids) are scattered into hash
partitions, each encoded by an open-addressing table in numba small enough to stay in cache
(`PartitionedInts`, faster than one table over every id); other values go through Arrow's
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

import math
import os

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from graphs.kernels.threads import kernel_threads, run_each

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


def _int_columns(chunks: list[pa.Array], threads: int | None) -> "PartitionedInts":
    """Integer chunks (uint64 read as int64 bits) as a `PartitionedInts`, values not copied
    unless nulls must be filled or the type widened."""
    columns, valid = [], []
    for chunk in chunks:
        values = chunk.fill_null(0).to_numpy() if chunk.null_count else chunk.to_numpy()
        columns.append(values.view(np.int64) if values.dtype == np.uint64 else values.astype(np.int64, copy=False))
        valid.append(np.asarray(chunk.is_valid()) if chunk.null_count else _ALL_VALID)
    return PartitionedInts(columns, valid, threads or _threads(chunks))


_ALL_VALID = np.empty(0, dtype=bool)  # no mask: every value valid
_NO_LOOKUP = np.empty(0, dtype=np.int64)  # `_number_parts`: the codes themselves, no lookup
MAX_PARTITION_BITS = 10  # up to 1024 partitions: ~1k distinct ids each at 1M ids, a table in L2
VALUES_PER_PARTITION = 16384  # fewer values get fewer partitions (a small graph: two)


class PartitionedInts:
    """Dictionary codes of int64 chunks by hash partitions, so every hash table stays in cache.

    One open-addressing table over 1M distinct ids spans 32 MB: each of 22M probes waits on
    memory. Here the values are first scattered into 2^b partitions by the top b bits of their
    Fibonacci hash (a counting sort: count per chunk, then scatter); each partition is then
    encoded by a table of its own (~1k distinct ids at 1M ids, in L2), and each row's code is
    read back in its chunk's order. Codes are numbered partition after partition; the
    dictionary lists the distinct values in code order. Every pass works on chunks, or on
    ranges of partitions, in threads (the kernels release the GIL).
    """

    def __init__(self, columns: list[np.ndarray], valid: list[np.ndarray], threads: int):
        self.columns, self.valid, self.threads = columns, valid, max(1, threads)
        total = sum(len(c) for c in columns)
        # at least 2 partitions: a shift by 64 bits is undefined in the compiled kernels
        self.bits = int(min(MAX_PARTITION_BITS, max(1, math.ceil(math.log2(max(1, total / VALUES_PER_PARTITION))))))
        self.shift = 64 - self.bits  # partition = the hash's top `bits` bits

    def _each(self, kernel, calls: list[tuple]) -> None:
        """kernel(*args) for every args in `calls`, spread over the threads."""
        run_each(kernel, calls, self.threads)

    def encode(self) -> np.ndarray:
        """Encode every partition; returns the distinct values in code order (int64)."""
        chunks, valid, shift, parts = self.columns, self.valid, self.shift, 1 << self.bits
        counts = np.zeros((len(chunks), parts), dtype=np.int64)
        self._each(_count_parts, [(c, v, shift, n) for c, v, n in zip(chunks, valid, counts)])
        starts = np.zeros(parts + 1, dtype=np.int64)
        np.cumsum(counts.sum(axis=0), out=starts[1:])
        self._cursors = starts[:-1] + np.cumsum(counts, axis=0) - counts  # chunk i's first slot per partition
        # one slot per row, nulls included: `sorted_int_codes` writes the codes into it afterwards
        self._grouped = grouped = np.empty(sum(len(c) for c in chunks), dtype=np.int64)
        self._each(
            _scatter_parts, [(c, v, shift, at.copy(), grouped) for c, v, at in zip(chunks, valid, self._cursors)]
        )
        self._local = np.empty(int(starts[-1]), dtype=np.int32)  # code within its partition
        distinct = np.zeros(parts, dtype=np.int64)
        # ranges of partitions holding similar numbers of values, one per thread
        cuts = np.searchsorted(starts, np.linspace(0, starts[-1], self.threads + 1)[1:-1]).tolist()
        ranges = zip([0] + cuts, cuts + [parts])
        self._each(_encode_parts, [(grouped, starts, self.bits, a, b, self._local, distinct) for a, b in ranges])
        self._starts = starts
        self._first = np.zeros(parts, dtype=np.int64)  # code of each partition's first distinct value
        np.cumsum(distinct[:-1], out=self._first[1:])
        dictionary = np.empty(int(distinct.sum()), dtype=np.int64)
        _compact(grouped, starts, distinct, self._first, dictionary)
        return dictionary

    def number(self, lookup: np.ndarray = _NO_LOOKUP) -> None:
        """Turn the partition codes into the final ones, in place: the code, or lookup[code]
        when `lookup` is given (a partition's codes are a small range: the lookups stay in
        cache). After `encode`, before `gather`."""
        parts = len(self._first)
        cuts = np.searchsorted(self._starts, np.linspace(0, self._starts[-1], self.threads + 1)[1:-1]).tolist()
        calls = [(self._local, self._starts, self._first, a, b, lookup) for a, b in zip([0] + cuts, cuts + [parts])]
        self._each(_number_parts, calls)

    def gather(self, outs: list[np.ndarray]) -> None:
        """outs[i][j] = the code of chunk i's row j (-1 where null), after `number`."""
        calls = zip(self.columns, self.valid, self._cursors, outs)
        self._each(_gather_codes, [(c, v, self.shift, at.copy(), self._local, o) for c, v, at, o in calls])

    def release_scratch(self) -> np.ndarray:
        """The int64 array of one slot per row that held the grouped values, free to reuse
        after `encode`."""
        scratch, self._grouped = self._grouped, None
        return scratch

    def codes(self) -> tuple[list[np.ndarray], np.ndarray]:
        """(int32 codes per chunk, the distinct values int64 in code order)."""
        dictionary = self.encode()
        self.release_scratch()
        codes = [np.empty(len(c), dtype=np.int32) for c in self.columns]
        self.number()
        self.gather(codes)
        return codes, dictionary


def sorted_int_codes(chunks: list[pa.Array], threads: int | None = None) -> tuple[np.ndarray, pa.Array]:
    """(codes, dictionary) of integer chunks numbered in sorted order of the values: one int64
    array of every chunk's rows back to back (-1 where null), and the distinct non-null values
    sorted (the chunks' type). Each row is written its rank in one pass, with no intermediate
    codes."""
    if not chunks:
        return np.empty(0, np.int64), pa.array([], pa.int64())
    parts = _int_columns(chunks, threads)
    dictionary = parts.encode()
    order = np.argsort(dictionary, kind="stable")  # ~25 % faster than the default sort on 1M int64 here
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    parts.number(rank)
    ends = np.cumsum([len(c) for c in chunks])
    out = parts.release_scratch()  # the grouped values are no longer read: 8 bytes a row not faulted in again
    parts.gather([out[e - len(c) : e] for c, e in zip(chunks, ends)])
    return out, _as_type(dictionary[order], chunks[0].type)


@numba.njit(cache=True, nogil=True)
def _hash(value):  # pragma: no cover - compiled
    """Fibonacci hashing: value * 2^64 / phi; partitions take its top bits, tables the next."""
    return np.uint64(value) * np.uint64(0x9E3779B97F4A7C15)


@numba.njit(cache=True, nogil=True)
def _count_parts(values, valid, shift, counts):  # pragma: no cover - compiled
    """counts[p] += the valid values of partition p (`valid` empty: all valid)."""
    check = len(valid) > 0
    for i in range(len(values)):
        if not check or valid[i]:
            counts[np.int64(_hash(values[i]) >> np.uint64(shift))] += 1


@numba.njit(cache=True, nogil=True)
def _scatter_parts(values, valid, shift, cursor, out):  # pragma: no cover - compiled
    """out[cursor[p]++] = each valid value of partition p, in row order."""
    check = len(valid) > 0
    for i in range(len(values)):
        if not check or valid[i]:
            p = np.int64(_hash(values[i]) >> np.uint64(shift))
            out[cursor[p]] = values[i]
            cursor[p] += 1


@numba.njit(cache=True, nogil=True)
def _encode_parts(grouped, starts, bits, p_lo, p_hi, local, distinct):  # pragma: no cover - compiled
    """For partitions p_lo..p_hi-1: local[i] = the code within its partition of grouped[i]
    (in order of first appearance), and distinct[p] their count. Partition p's distinct
    values overwrite grouped[starts[p]:] in code order (the m-th new value is met at or after
    position m, so nothing unread is overwritten). One open-addressing table of (value, code)
    slots (one cache line per probe), kept at most half full and reused from partition to
    partition; slots come from the hash bits below the partition's."""
    size_bits = 10
    table = np.full((1 << size_bits, 2), -1, np.int64)
    above = np.uint64(bits)
    for p in range(p_lo, p_hi):
        a, b = starts[p], starts[p + 1]
        table[:, 1] = -1
        mask = len(table) - 1
        m = 0
        for i in range(a, b):
            v = grouped[i]
            j = np.int64((_hash(v) << above) >> np.uint64(64 - size_bits))
            while table[j, 1] >= 0 and table[j, 0] != v:
                j = (j + 1) & mask
            if table[j, 1] >= 0:
                local[i] = table[j, 1]
                continue
            grouped[a + m] = v
            table[j, 0], table[j, 1] = v, m
            local[i] = m
            m += 1
            if 2 * m > len(table):  # rehash this partition's values into a table twice the size
                size_bits += 1
                table = np.full((1 << size_bits, 2), -1, np.int64)
                mask = len(table) - 1
                for c in range(m):
                    k = np.int64((_hash(grouped[a + c]) << above) >> np.uint64(64 - size_bits))
                    while table[k, 1] >= 0:
                        k = (k + 1) & mask
                    table[k, 0], table[k, 1] = grouped[a + c], c
        distinct[p] = m


@numba.njit(cache=True, nogil=True)
def _number_parts(local, starts, first, p_lo, p_hi, lookup):  # pragma: no cover - compiled
    """For partitions p_lo..p_hi-1: local[i] = first[p] + local[i] (the code), or
    lookup[that code] when `lookup` is not empty."""
    mapped = len(lookup) > 0
    for p in range(p_lo, p_hi):
        for i in range(starts[p], starts[p + 1]):
            code = first[p] + local[i]
            local[i] = lookup[code] if mapped else code


@numba.njit(cache=True, nogil=True)
def _gather_codes(values, valid, shift, cursor, codes, out):  # pragma: no cover - compiled
    """out[i] = the code of values[i] (-1 where not valid), read from its partition's codes
    in the order `_scatter_parts` wrote the values."""
    check = len(valid) > 0
    for i in range(len(values)):
        if check and not valid[i]:
            out[i] = -1
            continue
        p = np.int64(_hash(values[i]) >> np.uint64(shift))
        out[i] = codes[cursor[p]]
        cursor[p] += 1


@numba.njit(cache=True, nogil=True)
def _compact(found, starts, distinct, first, out):  # pragma: no cover - compiled
    """The partitions' distinct values, back to back in code order."""
    for p in range(len(distinct)):
        out[first[p] : first[p] + distinct[p]] = found[starts[p] : starts[p] + distinct[p]]


class IntIdLookup:
    """Positions of int64 values among `ids` (distinct), -1 where absent: a vectorised
    `pd.Index(ids).get_indexer(values)` for tens of millions of ids.

    One open-addressing table of (id, position) slots, at most ~60 % full, whose slot is the
    top bits of the id's Fibonacci hash. Probing values in arbitrary order waits on memory for
    nearly every one (a 10M-id table spans 256 MB); so each call first scatters its values by
    their partition (the hash's top `bits` bits, as `PartitionedInts` does), which makes the
    probes of one partition fall in one small stretch of the table, and reads the positions
    back in row order. The chunks of values run in threads (the kernels release the GIL).
    """

    def __init__(self, ids: np.ndarray, threads: int | None = None):
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        self.table_bits = max(4, math.ceil(math.log2(max(1, len(ids)) / 0.6)))
        self.keys = np.empty(1 << self.table_bits, dtype=np.int64)
        self.slots = np.full(1 << self.table_bits, -1, dtype=np.int64)
        _insert_sorted(ids, self.table_bits, self.keys, self.slots)
        self.threads = max(1, threads or kernel_threads())

    def __call__(self, values: np.ndarray) -> np.ndarray:
        values = np.ascontiguousarray(values, dtype=np.int64)
        out = np.empty(len(values), dtype=np.int64)
        bits = int(min(MAX_PARTITION_BITS, self.table_bits))
        step = max(1 << 20, -(-len(values) // self.threads))
        calls = [(values[a : a + step], out[a : a + step]) for a in range(0, len(values), step)]

        def run(piece: np.ndarray, dest: np.ndarray) -> None:
            counts = np.zeros(1 << bits, dtype=np.int64)
            _count_parts(piece, _ALL_VALID, 64 - bits, counts)
            cursor = np.zeros(1 << bits, dtype=np.int64)
            np.cumsum(counts[:-1], out=cursor[1:])
            grouped = np.empty(len(piece), dtype=np.int64)
            _scatter_parts(piece, _ALL_VALID, 64 - bits, cursor.copy(), grouped)
            _probe(grouped, self.table_bits, self.keys, self.slots)  # in place: position per value
            _gather_codes(piece, _ALL_VALID, 64 - bits, cursor, grouped, dest)

        run_each(run, calls, self.threads)
        return out


class StringIdLookup:
    """Positions of strings among `ids` (distinct strings), -1 where absent, with the table
    built once: Arrow's `index_in` builds its hash set of the ids again on every call.

    Each string is hashed to 64 bits (FNV-1a over its bytes, `_string_hashes`) and the hashes
    are looked up in an `IntIdLookup` of the ids' hashes. Exactness does not rest on the hash:
    each found position's id is compared with the string (Arrow `take` + `equal`), and a string
    that differs is absent (the ids' hashes are distinct, so no other id has that hash). When
    two ids share a hash, `usable` is False and the caller looks the strings up itself.
    """

    def __init__(self, ids: pa.Array, threads: int | None = None):
        self.ids = ids
        hashes = string_hashes(ids)
        self.usable = len(np.unique(hashes)) == len(hashes)
        self._table = IntIdLookup(hashes, threads) if self.usable else None

    def __call__(self, values: pa.Array) -> np.ndarray:
        found = self._table(string_hashes(values))
        hit = found >= 0
        same = pc.equal(self.ids.take(pa.array(np.where(hit, found, 0))), values).fill_null(False)
        found[~(hit & np.asarray(same))] = -1
        return found


def string_hashes(values: pa.Array) -> np.ndarray:
    """int64 FNV-1a hash of each string's UTF-8 bytes (string or large_string; nulls hash as
    the empty string)."""
    offset_type = np.int64 if pa.types.is_large_string(values.type) else np.int32
    buffers = values.buffers()
    offsets = np.frombuffer(buffers[1], dtype=offset_type)[values.offset : values.offset + len(values) + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.empty(0, np.uint8)
    out = np.empty(len(values), dtype=np.int64)
    _string_hashes(offsets, data, out)
    return out


@numba.njit(cache=True, nogil=True)
def _string_hashes(offsets, data, out):  # pragma: no cover - compiled
    for i in range(len(out)):
        h = np.uint64(0xCBF29CE484222325)
        for k in range(offsets[i], offsets[i + 1]):
            h = (h ^ np.uint64(data[k])) * np.uint64(0x100000001B3)
        out[i] = np.int64(h)


@numba.njit(cache=True, nogil=True)
def _insert_sorted(ids, table_bits, keys, slots):  # pragma: no cover - compiled
    """slots[j] = i for ids[i] at its slot j (linear probing from the hash's top bits)."""
    mask = (1 << table_bits) - 1
    shift = np.uint64(64 - table_bits)
    for i in range(len(ids)):
        j = np.int64(_hash(ids[i]) >> shift)
        while slots[j] >= 0:
            j = (j + 1) & mask
        keys[j], slots[j] = ids[i], i


@numba.njit(cache=True, nogil=True)
def _probe(values, table_bits, keys, slots):  # pragma: no cover - compiled
    """values[i] = the position of values[i] among the table's ids, -1 where absent."""
    mask = (1 << table_bits) - 1
    shift = np.uint64(64 - table_bits)
    for i in range(len(values)):
        v = values[i]
        j = np.int64(_hash(v) >> shift)
        found = -1
        while slots[j] >= 0:
            if keys[j] == v:
                found = slots[j]
                break
            j = (j + 1) & mask
        values[i] = found


def _as_type(distinct: np.ndarray, kind: pa.DataType) -> pa.Array:
    """int64 distinct values back as the chunks' integer type."""
    dtype = np.dtype(kind.to_pandas_dtype())
    return pa.array(distinct.view(dtype) if dtype == np.uint64 else distinct.astype(dtype), kind)


def dictionary_codes(chunks: list[pa.Array], threads: int | None = None) -> tuple[list[np.ndarray], pa.Array]:
    """(codes, dictionary): chunk i's codes (int32 numpy; -1 where the value is null) and the
    distinct non-null values, code = position in the dictionary. Empty chunks keep their place,
    so codes[i] always belongs to chunk i.

    Integer chunks go through hash partitions (`PartitionedInts`); other types through
    Arrow's memo table, split over `threads` groups then merged."""
    if not chunks:
        return [], pa.array([], pa.null())
    if pa.types.is_integer(chunks[0].type):
        codes, distinct = _int_columns(chunks, threads).codes()
        return codes, _as_type(distinct, chunks[0].type)
    groups = _split_by_rows(chunks, threads or _threads(chunks))
    if len(groups) == 1:
        return _arrow_group(groups[0])
    encoded = run_each(_arrow_group, [(g,) for g in groups], len(groups))
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
    calls = [(out[starts[k] : starts[k + 1]], c, rank) for k, c in enumerate(index_chunks)]
    run_each(_rank_into, calls, _threads(index_chunks))
    return out


def warm_kernels() -> None:
    """Load the kernels' cached machine code for the argument types they get."""
    _rank_into(np.zeros(1, np.int64), np.zeros(1, np.int32), np.zeros(1, np.int64))
    frozen = np.frombuffer(np.zeros(1, np.int64).tobytes(), np.int64)  # Arrow's buffers are read-only
    for values, valid in ((frozen, _ALL_VALID), (np.zeros(1, np.int64), np.ones(1, dtype=bool))):
        PartitionedInts([values], [valid], 1).codes()
    for chunk in (pa.array([3, 1]), pa.array([3, None, 1])):  # Arrow's read-only values; nulls filled
        sorted_int_codes([chunk], 1)


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

    if not all(run_each(same, [(k,) for k in range(len(values))], _threads(values))):
        return None  # a hash collision: some row's string differs from its code's string
    return index_chunks, representative
