"""The canonical_graph stage's edges: keys spilled by source range, deduplicated, written to edges.parquet.

`graphs.stages.canonical` documents edges.parquet and how the keys scale ("How it scales") and
carry weights ("Weights"). Each kept row becomes an int64 key ``src << s | dst << 1 | flag`` in
the id space (`graphs.stages.canonical_ids.IdSpace`) and goes into a `KeySpill`
(`new_spill`, then `spill_codes` for factorized ids or `spill_rows` for streamed batches);
`write_edges` deduplicates each group with the kernels of `graphs.kernels.edge_keys`, combines
weights by a rule of `COMBINE_RULES`, and appends the group to edges.parquet in pieces of
`WRITE_PIECE` edges, encoded in a second thread.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from graphs.infra.storage import file_sha256, remember_sha256
from graphs.kernels.edge_keys import (
    BYTES_PER_KEY,
    BYTES_PER_WEIGHTED_KEY,
    NO_LUT,
    KeySpill,
    dedupe_rows,
    dedupe_rows_weighted,
    keys_of_rows,
    map_inplace,
    mirror,
    mirror_weighted,
    repeat_rows,
)
from graphs.stages.canonical_ids import IdSpace
from graphs.stages.canonical_inputs import KEPT_ROW_SQL, VALID_WEIGHT_SQL

COMBINE_RULES = ("sum", "max", "mean", "first")
WRITE_PIECE = 1 << 22  # edges per table handed to the Parquet writer: four row groups


def new_spill(n_space: int, valid_rows: int, weighted: bool, path: Path, *, budget: int, symmetrize: bool):
    """The key spill for `valid_rows` edges, and whether it keeps one orientation only (half)."""
    per_key = BYTES_PER_WEIGHTED_KEY if weighted else BYTES_PER_KEY
    half = symmetrize and valid_rows * 2 * per_key <= budget
    copies = 2 if symmetrize and not half else 1
    groups = 1 if half else math.ceil(valid_rows * copies * per_key / budget)
    return KeySpill(n_space, groups, budget, path, weighted), half


def spill_codes(spill: KeySpill, codes: tuple[np.ndarray, np.ndarray], shift: int, half: bool) -> None:
    """Add the keys of factorized rows with both ids and no self loop."""
    src_codes, dst_codes = codes
    keys = np.empty(len(src_codes), dtype=np.int64)
    spill.add(keys[: keys_of_rows(src_codes, dst_codes, shift, half, keys)], src=None)


def valid_edge_rows(con, weighted: bool, invalid_weights: int, batch_rows: int, *, every_row: bool = False):
    """A record-batch reader of the kept rows of `raw_edges`: (src, dst) and the weight when
    weighted; with `every_row` (unweighted), every row, nulls and self loops included."""
    if not weighted:
        where = "" if every_row else f" WHERE {KEPT_ROW_SQL}"
        return con.sql(f"SELECT src, dst FROM raw_edges{where}").to_arrow_reader(batch_rows)
    # rows in input order, so 'first' and the order of float sums are deterministic
    con.execute("SET preserve_insertion_order = true")
    keep = f"{KEPT_ROW_SQL} AND {VALID_WEIGHT_SQL}" if invalid_weights else KEPT_ROW_SQL
    return con.sql(f"SELECT src, dst, weight FROM raw_edges WHERE {keep}").to_arrow_reader(batch_rows)


def spill_rows(
    spill: KeySpill, reader, space: IdSpace, shift: int, half: bool, symmetrize: bool, *, every_row: bool = False
) -> tuple[int, int]:
    """Add the keys (and weights) of each batch of rows, its ids located in the id space. With
    `every_row` (a dense space read by `valid_edge_rows(every_row=True)`), the ids of rows with a
    null or a self loop are located too (they are nodes), and only the other rows are added.
    Returns the rows read with a null id and those with a self loop (0, 0 unless `every_row`)."""
    null_rows = self_loops = 0
    for batch in reader:
        s = space.locate(batch.column(0))
        d = space.locate(batch.column(1))
        if every_row:
            nulls = batch.column(0).null_count + batch.column(1).null_count
            null = ((s < 0) | (d < 0)) if nulls else None
            null_rows += int(np.count_nonzero(null)) if nulls else 0
            loop = s == d
            self_loops += int(np.count_nonzero(loop if not nulls else loop & ~null))
            if not half:  # half keys skip them in `keys_of_rows`
                keep = ~loop if not nulls else ~loop & ~null
                s, d = s[keep], d[keep]
        if spill.weighted:
            _add_weighted(spill, s, d, batch.column(2).to_numpy(), shift, half, symmetrize)
        else:
            _add_unweighted(spill, s, d, shift, half, symmetrize)
    return null_rows, self_loops


def _add_unweighted(spill: KeySpill, s, d, shift: int, half: bool, symmetrize: bool) -> None:
    """Keys of one batch of rows (see `graphs.stages.canonical`'s docstring)."""
    if half:  # flag = orientation, so distinct directed pairs stay countable; one group in memory
        keys = np.empty(len(s), dtype=np.int64)
        spill.add(keys[: keys_of_rows(s, d, shift, True, keys)], src=None)
    elif symmetrize:  # flag 1 = the reversed copy
        spill.add(np.concatenate([(s << shift) | (d << 1), (d << shift) | (s << 1) | 1]), np.concatenate([s, d]))
    else:
        spill.add((s << shift) | (d << 1), s)


def _add_weighted(spill: KeySpill, s, d, w, shift: int, half: bool, symmetrize: bool) -> None:
    """Keys and weights of one batch of rows, in row order (see `graphs.stages.canonical`'s docstring)."""
    if half:  # flag = orientation, so distinct directed pairs stay countable
        lo_, hi_ = np.minimum(s, d), np.maximum(s, d)
        spill.add((lo_ << shift) | (hi_ << 1) | (s > d), lo_, w)
    elif symmetrize:  # flag 1 = the reversed copy, interleaved so each row's copies stay in row order
        keys = np.empty(2 * len(s), dtype=np.int64)
        keys[0::2] = (s << shift) | (d << 1)
        keys[1::2] = (d << shift) | (s << 1) | 1
        src = np.empty(2 * len(s), dtype=np.int64)
        src[0::2], src[1::2] = s, d
        spill.add(keys, src, np.repeat(w, 2))
    else:
        spill.add((s << shift) | (d << 1), s, w)


def write_edges(
    spill: KeySpill, path: Path, *, shift: int, half: bool, directed: bool, lut, degree_ready, combine: str
) -> tuple:
    """Deduplicate each key group and append it to edges.parquet, sorted by (src, dst).

    Returns (degree per id-space slot, distinct input pairs, edges written, weight facts); the degrees
    are also handed to the `degree_ready` future as soon as the last group is deduplicated,
    before its Parquet encoding starts. The Parquet encoding runs in a second thread, piece by
    piece: it overlaps the source ids of the next piece and the deduplication of the next group.
    """
    n_space = spill.n
    out_deg = np.zeros(n_space, dtype=np.int64)
    in_deg = np.zeros(n_space, dtype=np.int64) if directed else None
    distinct_input_pairs = 0
    edges_written = 0
    weighted = spill.weighted
    rule = COMBINE_RULES.index(combine)
    w_min, w_max, w_sum = np.inf, -np.inf, 0.0
    with _EdgePieces(path, weighted, lut) as pieces:
        for keys, weights, lo, hi in spill.groups():
            if weighted:
                joined = np.concatenate(keys) if keys else np.empty(0, np.int64)
                keys.clear()  # the spill's list: its chunks are freed here, not at the next group
                counts, dst, weight, distinct = dedupe_rows_weighted(joined, weights, shift, lo, hi - lo, half, rule)
                del joined, weights
                if half:
                    counts, dst, weight = mirror_weighted(counts, dst, weight)
                if len(weight):
                    w_min, w_max = min(w_min, float(weight.min())), max(w_max, float(weight.max()))
                    w_sum += float(weight.sum())
            else:
                counts, dst, distinct = dedupe_rows(keys, shift, lo, hi - lo, half)
                keys.clear()  # the spill's list: its chunks are freed before the mirror's arrays are made
                weight = None
                if half:
                    counts, dst = mirror(counts, dst)
            distinct_input_pairs += distinct
            out_deg[lo:hi] = counts
            if in_deg is not None:
                in_deg += np.bincount(dst, minlength=n_space)
            if hi >= n_space:  # the last group: every degree is known before its edges are encoded
                degree_ready.set_result(out_deg if in_deg is None else out_deg + in_deg)
            edges_written += len(dst)
            pieces.write_group(lo, counts, dst, weight)
            del counts, dst, weight
        if not degree_ready.done():  # no group reached the last source (no edges)
            degree_ready.set_result(out_deg if in_deg is None else out_deg + in_deg)
        degree = degree_ready.result()
    remember_sha256(path, file_sha256(path))  # hashed for publishing here, beside the main thread's work
    weight_facts = (
        {"weight_min": w_min, "weight_max": w_max, "weight_mean": w_sum / edges_written}
        if weighted and edges_written
        else {}
    )
    return degree, distinct_input_pairs, edges_written, weight_facts


class _EdgePieces:
    """The edges.parquet writer: appends deduplicated groups piece by piece, encoding in a second thread."""

    def __init__(self, path: Path, weighted: bool, lut):
        fields = [("src", pa.int64()), ("dst", pa.int64())] + ([("weight", pa.float64())] if weighted else [])
        self.schema = pa.schema(fields)
        self.weighted = weighted
        self.lut = lut
        # Sorted int64 ids delta-encode to a few bits each: about half the bytes of snappy and
        # twice its speed, with no general-purpose compression on top.
        self.writer = pq.ParquetWriter(
            path,
            self.schema,
            compression="none",
            use_dictionary=False,
            column_encoding={"src": "DELTA_BINARY_PACKED", "dst": "DELTA_BINARY_PACKED"}
            | ({"weight": "PLAIN"} if weighted else {}),
        )
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending: list[Future] = []  # the pieces being written, oldest first
        # Source-id buffers, one per piece in flight (at most two wait on the writer) and one
        # being made: a fresh 32 MB array per piece was faulted in (and zeroed) every time.
        self.src_buffers: list[np.ndarray] = []
        self.pieces = 0

    def __enter__(self) -> "_EdgePieces":
        return self

    def write_group(self, lo: int, counts: np.ndarray, dst: np.ndarray, weight: np.ndarray | None) -> None:
        """Queue one group's edges (sources `lo`.. with `counts` edges each) in pieces of WRITE_PIECE edges."""
        # Piece k+1's source ids are made while piece k is encoded (one Parquet writer: its
        # encoding runs in one thread), and at most two pieces wait on the writer. Ids go from
        # id-space offsets to new ids (monotone, so the order is kept), without the GIL.
        ends = np.cumsum(counts)
        for e0 in range(0, len(dst), WRITE_PIECE):
            e1 = min(len(dst), e0 + WRITE_PIECE)
            src = self._src_buffer(e1 - e0)
            repeat_rows(lo, ends, e0, e1, self.lut if self.lut is not None else NO_LUT, src)
            self.pieces += 1
            if self.lut is not None:
                map_inplace(dst[e0:e1], self.lut)
            columns = {"src": src, "dst": dst[e0:e1]} | ({"weight": weight[e0:e1]} if self.weighted else {})
            if len(self.pending) == 2:
                self.pending.pop(0).result()
            table = pa.table(columns, schema=self.schema)
            self.pending.append(self.pool.submit(self.writer.write_table, table, row_group_size=1 << 20))
            del src, columns, table

    def _src_buffer(self, size: int) -> np.ndarray:
        """This piece's source-id buffer of `size` rows, reused from three pieces back."""
        k = self.pieces % 3  # this buffer's piece, three back, is written: at most two are pending
        if len(self.src_buffers) <= k:
            self.src_buffers.append(np.empty(size, np.int64))
        elif len(self.src_buffers[k]) < size:
            self.src_buffers[k] = np.empty(size, np.int64)
        return self.src_buffers[k][:size]

    def __exit__(self, kind, *_) -> None:
        try:
            if kind is None:
                for job in self.pending:
                    job.result()
        finally:
            self.pool.shutdown(wait=True)
            self.writer.close()


__all__ = ["COMBINE_RULES", "WRITE_PIECE", "new_spill", "spill_codes", "spill_rows", "valid_edge_rows", "write_edges"]
