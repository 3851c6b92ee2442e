"""Canonical graph: validate raw edge lists and turn them into a clean 0..n-1 graph.

Input (a dataset folder in the landing layout; which entries may be read, symlinks and
non-regular files included, is `graphs.stages.landing`'s rule):
    edges/*.parquet or edges.parquet   columns src, dst (all integer or all string ids; uint64
                                       ids at most 2^63-1), optional weight (any numeric type,
                                       per file)
    nodes.parquet      (optional)      node_id, optional label (int class index 0..C-1 with C at
                                       most MAX_CLASSES; -1/null = unknown), optional split
                                       (string: `SPLIT_WORDS`, any case, e.g. train / Validation /
                                       dev / TEST; other words and null read as 'other', counted)
    features.parquet   (optional)      node_id, feat (list of floats, one fixed width)

Files as users have them (CSV, TSV and SNAP-style .txt edge lists, CSV/TSV node files, other
column names given by the dataset's `columns:` mapping, labels as strings, booleans or other
categorical values) are first written in this layout into the staging folder by
`graphs.stages.user_files.prepare_inputs`; errors name the user's files.

Every file is read by DuckDB through `graphs.infra.duck.read_parquet` (literal paths: a file named
`*.parquet` or `[a-z].parquet` is that one file) or by pyarrow.

Output (written atomically into one folder, see `build_canonical_graph`):
    edges.parquet   src int64, dst int64; sorted by (src, dst); no self loops, no
                    duplicates; both directions present when symmetrized
                    (+ weight float64 > 0 when any edge file has a weight column)
    nodes.parquet   node_id int64 (0..n-1), original_id (int64 or string, as given),
                    label int32 (-1 = unknown), split string (train/val/test/other)
    features.npy    float32 [n, D], row = node_id (only when features.parquet exists)
    degree_distribution.png   log-log plot of the degree distribution
    summary.json    the counts returned by `build_canonical_graph`
    label_classes.json   the user's value of each class index (`graphs.formats.label_classes`), only
                    when the labels were categorical values rather than class indices

How it scales (the 100M-edge path): DuckDB reads every edge file out of core and
streams the rows as Arrow batches; it also computes the sorted set of distinct ids
(a hash aggregate, then an ORDER BY of n values, never of the edges). Each batch is
relabelled with a vectorised lookup (a dense table when the ids are dense integers, a
pandas hash index or, for strings, Arrow's hash set otherwise). Sparse integer and string
ids of edge rows that fit the sort budget skip the DISTINCT and the lookups: one scan,
and one hash encoding of every endpoint (`graphs.kernels.id_codes`) whose codes are renumbered in
sorted id order (`_IdSpace.factorize`; string ids are
encoded by their 64-bit DuckDB hash, every row then compared with its code's string, and
that scan also gives the row counts). The node and feature files' ids are encoded in the
same pass, so their rows need no lookup either. Relabelled rows are turned into int64 keys ``src << s | dst << 1 | flag``
(flag 1 marks the reversed copy added by symmetrization). When the keys of a symmetrized
graph fit the sort budget only the (min, max) orientation is kept and the reverse
direction is produced after deduplication (`mirror`), halving the work. Keys are spilled into fine
buckets by source-id range; buckets are then grouped up to `sort_budget_mb`, and each
group is counting-sorted into rows by source (a numba kernel: O(keys) plus a small sort
per row, about 5x faster than sorting all keys) and deduplicated row by row. Because
buckets are in source order, the output is globally sorted without a merge, and memory stays bounded by the sort budget
plus O(n) arrays whatever the edge count.

Weights (when any edge file has a ``weight`` column; files without one count as weight 1.0
and are named in the summary). Every weight must be finite and > 0: NaN, infinite,
negative, zero and null weights fail the stage naming each file and its count, or are
dropped and counted with ``invalid_weights="drop"`` (their ids still become nodes, as
for self loops). A float64 weight travels next to each key (``BYTES_PER_WEIGHTED_KEY``
sizes the groups, so the sort budget still bounds memory; spilled buckets get a second
file of weights). The rows reach the keys in input order (files in name order, rows in
file order), the bucket and row counting sorts are stable and a row's keys are put in
order of the neighbour alone, so each output edge sees its input rows in input order.
They combine by ``weight_combine`` (`COMBINE_RULES`): duplicates of one (src, dst) and,
when symmetrized, the rows of both directions u->v and v->u, which give one weight to
both output edges. The summary counts the rows combined into duplicates
(``dropped_duplicate``) and the undirected edges given in both directions
(``combined_reverse_pairs``).
"""

from __future__ import annotations

import math
import os
import shutil
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numba
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph, edge_batches, read_summary
from graphs.formats.label_classes import LABEL_CLASSES, read_label_classes, write_label_classes
from graphs.formats.npyrows import NpyRowWriter
from graphs.infra import duck
from graphs.infra.config_checks import MAX_CLASSES, MAX_ROWS, MAX_SEED, MAX_THREADS, bounded_repr, check_fields
from graphs.infra.host_memory import gc_paused
from graphs.infra.plotting import headless_pyplot
from graphs.infra.storage import atomic_output_dir, peak_rss_bytes, write_summary
from graphs.kernels.edge_keys import (
    BYTES_PER_KEY,
    BYTES_PER_WEIGHTED_KEY,
    NO_LUT,
    KeySpill,
    dedupe_rows,
    dedupe_rows_weighted,
    key_shift,
    keys_of_rows,
    map_inplace,
    mirror,
    mirror_weighted,
    repeat_rows,
    warm_kernels,
    warm_weighted_kernels,
)
from graphs.kernels.id_codes import codes_by_hash, dictionary_codes, ranked_codes, sorted_int_codes
from graphs.kernels.id_codes import warm_kernels as _warm_id_kernels
from graphs.stages.landing import (  # the landing folder's layout and rule, re-exported as part of the ingest's API
    READY_MARKER,
    DatasetFiles,
    InputError,
    find_dataset_files,
    is_dataset_folder,
    landing_fingerprint,
    landing_marked_ready,
)
from graphs.stages.user_files import prepare_inputs, read_column_mapping

FORMAT_VERSION = CanonicalGraph.FORMAT_VERSION
# The split words of nodes.parquet, matched case-insensitively after trimming spaces, and their
# code in SPLIT_NAMES (the output's split values); any other word is read as 'other', counted.
SPLIT_NAMES = ("train", "val", "test", "other")
SPLIT_WORDS = {
    "train": 0,
    "training": 0,
    "val": 1,
    "valid": 1,
    "validation": 1,
    "dev": 1,
    "test": 2,
    "testing": 2,
    "other": 3,
}
SHOWN_SPLIT_WORDS, SHOWN_WORD_CHARS = 10, 40  # unknown split words named in the summary, each cut to this
COMBINE_RULES = ("sum", "max", "mean", "first")
WRITE_PIECE = 1 << 22  # edges per table handed to the Parquet writer: four row groups
INVALID_WEIGHT_ACTIONS = ("error", "drop")


@dataclass(kw_only=True)
class CanonicalConfig:
    """Settings of the canonical_graph stage."""

    symmetrize: bool = field(default=True, metadata={"help": "Add the reverse of every edge (undirected graph)."})
    memory_limit: str = field(
        default="4GB", metadata={"help": "DuckDB memory_limit, e.g. '4GB'; DuckDB spills beyond it."}
    )
    threads: int = field(
        default=0, metadata={"max": MAX_THREADS, "help": "DuckDB worker threads; 0 = DuckDB's default (all cores)."}
    )
    sort_budget_mb: int = field(
        default=1024,
        metadata={
            "max": 1 << 22,
            "help": "Memory for one in-RAM sort of edge keys; more edges are spilled to disk in buckets.",
        },
    )
    batch_rows: int = field(
        default=2_000_000, metadata={"max": MAX_ROWS, "help": "Edge rows per streamed Arrow batch."}
    )
    split_seed: int = field(
        default=0,
        metadata={
            "max": MAX_SEED,
            "help": "Seed of the train/val/test split made when labels exist but no split does.",
        },
    )
    train_fraction: float = field(
        default=0.6, metadata={"help": "Share of labelled nodes put in 'train' by a generated split."}
    )
    val_fraction: float = field(
        default=0.2,
        metadata={"help": "Share of labelled nodes put in 'val' by a generated split (the rest is 'test')."},
    )

    weight_combine: str = field(
        default="sum",
        metadata={
            "help": "How the weights of duplicate rows and of the two directions of a symmetrized edge "
            f"combine: one of {COMBINE_RULES} ('first' = first in file-name, then row order)."
        },
    )
    invalid_weights: str = field(
        default="error",
        metadata={
            "help": "NaN, infinite, negative, zero or null weights: 'error' fails naming each file and "
            "count; 'drop' drops those rows and counts them."
        },
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.weight_combine not in COMBINE_RULES:
            raise ValueError(f"weight_combine={bounded_repr(self.weight_combine)} is not one of {COMBINE_RULES}")
        if self.invalid_weights not in INVALID_WEIGHT_ACTIONS:
            raise ValueError(
                f"invalid_weights={bounded_repr(self.invalid_weights)} is not one of {INVALID_WEIGHT_ACTIONS}"
            )
        if self.sort_budget_mb < 1:
            raise ValueError(f"sort_budget_mb must be >= 1, got {self.sort_budget_mb}")
        if self.batch_rows < 1:
            raise ValueError(f"batch_rows must be >= 1, got {self.batch_rows}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        self.memory_limit = duck.check_memory_size(self.memory_limit)
        if not (0 < self.train_fraction and 0 <= self.val_fraction and self.train_fraction + self.val_fraction <= 1):
            raise ValueError(
                f"train_fraction={self.train_fraction} and val_fraction={self.val_fraction} must be "
                "positive and sum to at most 1"
            )


def has_training_labels(summary: dict) -> bool:
    """Whether a canonical graph (its summary.json) has labels and training nodes to learn from."""
    return bool(summary.get("has_labels") and summary.get("train_nodes"))


# ----------------------------------------------------------------------------- validation


def _schema(path: Path) -> pa.Schema:
    if path.stat().st_size == 0:
        raise InputError(f"{path}: file is empty (0 bytes); expected a Parquet file")
    try:
        return pq.read_schema(path)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise InputError(f"{path}: cannot be read as Parquet ({exc})") from exc


def _id_kind(path: Path, schema: pa.Schema, column: str) -> str:
    if column not in schema.names:
        raise InputError(f"{path}: missing column '{column}' (columns present: {schema.names})")
    t = schema.field(column).type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t):
        if t == pa.uint64():
            _refuse_uint64_beyond_int64(path, column)
        return "int"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    raise InputError(f"{path}: column '{column}' has type {t}; ids must be integers or strings")


INT64_MAX = 2**63 - 1


def _refuse_uint64_beyond_int64(path: Path, column: str) -> None:
    """InputError when a uint64 id column holds a value above int64's range (ids become int64).
    Reads that one column, a batch at a time (row-group statistics are not trusted for it)."""
    try:
        tops = [
            pc.max(b.column(0).dictionary_decode() if pa.types.is_dictionary(b.column(0).type) else b.column(0))
            for b in pq.ParquetFile(path).iter_batches(batch_size=1 << 20, columns=[column])
        ]
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: column '{column}' cannot be read ({str(exc)[:200]})") from exc
    top = max((t.as_py() for t in tops if t.is_valid), default=None)
    if top is not None and top > INT64_MAX:
        raise InputError(
            f"{path}: column '{column}' holds the uint64 id {top}; uint64 ids above {INT64_MAX} "
            "(the largest int64) are not supported: cast the ids to strings, or renumber them"
        )


def validate_inputs(files: DatasetFiles) -> str:
    """Check every file's schema; return the dataset's id kind, 'int' or 'string'."""
    for path in files.edge_files + [p for p in (files.nodes, files.features) if p is not None]:
        try:
            duck.literal_path(path)
        except ValueError as exc:  # a name DuckDB cannot read
            raise InputError(str(exc)) from None
    kind, kind_file = None, None
    for path in files.edge_files:
        schema = _schema(path)
        for col in ("src", "dst"):
            k = _id_kind(path, schema, col)
            if kind is None:
                kind, kind_file = k, path
            elif k != kind:
                raise InputError(
                    f"ids mix integers and strings: {kind_file} has {kind} ids but {path} column "
                    f"'{col}' has {k} ids; use one id type for the whole dataset"
                )
        if "weight" in schema.names:
            wt = schema.field("weight").type
            if not (pa.types.is_floating(wt) or pa.types.is_integer(wt) or pa.types.is_decimal(wt)):
                raise InputError(f"{path}: column 'weight' has type {wt}; expected a number")
    if files.nodes is not None:
        schema = _schema(files.nodes)
        k = _id_kind(files.nodes, schema, "node_id")
        if k != kind:
            raise InputError(
                f"ids mix integers and strings: {kind_file} has {kind} ids but {files.nodes} "
                f"column 'node_id' has {k} ids"
            )
        label_type = schema.field("label").type if "label" in schema.names else pa.int64()
        if not (pa.types.is_integer(label_type) or pa.types.is_floating(label_type)):
            raise InputError(
                f"{files.nodes}: column 'label' has type {label_type}; expected integer class indices, floats "
                "holding whole numbers, or categorical values (strings, booleans)"
            )
        if "split" in schema.names:
            st = schema.field("split").type
            if pa.types.is_dictionary(st):
                st = st.value_type
            if not (pa.types.is_string(st) or pa.types.is_large_string(st)):
                raise InputError(f"{files.nodes}: column 'split' has type {st}; expected strings")
    if files.features is not None:
        schema = _schema(files.features)
        k = _id_kind(files.features, schema, "node_id")
        if k != kind:
            raise InputError(
                f"ids mix integers and strings: {kind_file} has {kind} ids but {files.features} "
                f"column 'node_id' has {k} ids"
            )
        if "feat" not in schema.names:
            raise InputError(f"{files.features}: missing column 'feat' (columns present: {schema.names})")
        ft = schema.field("feat").type
        if not (pa.types.is_list(ft) or pa.types.is_large_list(ft) or pa.types.is_fixed_size_list(ft)) or not (
            pa.types.is_floating(ft.value_type) or pa.types.is_integer(ft.value_type)
        ):
            raise InputError(f"{files.features}: column 'feat' has type {ft}; expected a list of floats")
    assert kind is not None
    return kind


# ----------------------------------------------------------------------------- relabelling


class Relabeler:
    """Maps original ids to 0..n-1 in sorted order of the originals, vectorised."""

    def __init__(self, sorted_ids: pa.Array):
        self.ids = sorted_ids
        self.n = len(sorted_ids)
        self._lut = None
        self._index = None
        if pa.types.is_integer(sorted_ids.type):
            arr = sorted_ids.to_numpy()
            self._lo = int(arr[0]) if self.n else 0
            span = int(arr[-1]) - self._lo + 1 if self.n else 0
            if span <= max(4 * self.n, 1 << 20):  # dense enough for a direct lookup table
                self._lut = np.full(span, -1, dtype=np.int64)
                self._lut[arr - self._lo] = np.arange(self.n, dtype=np.int64)
            else:
                self._index = pd.Index(arr)
        # string ids are looked up by Arrow's hash set (no Python object per value)

    def __call__(self, values: pa.Array | np.ndarray) -> np.ndarray:
        """New ids (int64) of `values`; -1 where a value is not a known id."""
        if self._lut is None and self._index is None:
            if not isinstance(values, (pa.Array, pa.ChunkedArray)):
                values = pa.array(values)
            found = pc.index_in(values.cast(self.ids.type), value_set=self.ids).fill_null(-1)
            return np.asarray(found.to_numpy(), dtype=np.int64)
        if isinstance(values, (pa.Array, pa.ChunkedArray)):
            values = values.to_numpy(zero_copy_only=False)
        if self._lut is not None:
            off = values.astype(np.int64, copy=False) - self._lo
            if len(off) == 0 or (off.min() >= 0 and off.max() < len(self._lut)):
                return self._lut[off]
            ok = (off >= 0) & (off < len(self._lut))
            out = np.full(len(off), -1, dtype=np.int64)
            out[ok] = self._lut[off[ok]]
            return out
        return self._index.get_indexer(values).astype(np.int64, copy=False)


class _IdSpace:
    """The integer space edge keys live in before they get their final ids.

    Dense integer ids (their range at most a few times the row count) use offsets from
    the smallest id: the set of ids is then a bitmap filled while streaming, and no
    DISTINCT/ORDER BY over every endpoint is needed; since offset -> new id is monotone,
    relabelling after deduplication keeps the sort order. Other ids (sparse integers,
    strings) are relabelled up front from DuckDB's sorted DISTINCT, and the space is 0..n-1.
    """

    MAX_DENSE_SPAN = 1 << 28  # bitmap + int64 lookup table: 9 bytes per slot at most

    def __init__(self, size: int, relabel: Relabeler | None, lo: int = 0):
        self.size = size
        self.lo = lo
        self._relabel = relabel
        self.present = None if relabel is not None else np.zeros(size, dtype=bool)

    @classmethod
    def dense_bounds(cls, con, kind, rows, min_id, max_id, nodes_sql) -> tuple[int, int] | None:
        """(smallest id, span) when the ids are integers dense enough for a bitmap, else None."""
        node_lo = node_hi = None
        node_rows = 0
        if nodes_sql is not None and kind == "int":
            node_lo, node_hi, node_rows = con.sql(f"SELECT min(id), max(id), count(*) FROM ({nodes_sql})").fetchall()[0]
        ends = [v for v in (min_id, max_id, node_lo, node_hi) if v is not None]
        if kind == "int" and ends:
            lo, hi = min(ends), max(ends)
            span = hi - lo + 1
            # at most 2 ids per edge row and 1 per node row: a span within a small multiple
            # of that is dense enough for a bitmap
            if span <= max(1 << 20, min(2 * (2 * rows + node_rows), cls.MAX_DENSE_SPAN)):
                return lo, span
        return None

    @classmethod
    def plan(cls, con, dense, nodes_sql, has_dropped_rows, where, dropped_weight_sql=None) -> "_IdSpace":
        """The dense space of `dense_bounds` (ids met only in dropped rows and nodes.parquet
        marked present), else 0..n-1 over DuckDB's sorted DISTINCT of every id."""
        if dense is not None:
            lo, span = dense
            space = cls(span, None, lo)
            if has_dropped_rows:  # ids met only in null-partner, self-loop (or invalid-weight) rows are nodes too
                dropped_weight = (
                    f" UNION ALL SELECT src FROM raw_edges WHERE {dropped_weight_sql}"
                    f" UNION ALL SELECT dst FROM raw_edges WHERE {dropped_weight_sql}"
                    if dropped_weight_sql
                    else ""
                )
                extra = con.sql(
                    "SELECT src FROM raw_edges WHERE src IS NOT NULL AND (dst IS NULL OR src = dst) "
                    "UNION ALL SELECT dst FROM raw_edges WHERE dst IS NOT NULL AND src IS NULL" + dropped_weight
                ).fetchnumpy()["src"]
                space.present[np.asarray(extra, dtype=np.int64) - lo] = True
            if nodes_sql is not None:
                node_ids = con.sql(f"SELECT id FROM ({nodes_sql}) WHERE id IS NOT NULL").fetchnumpy()["id"]
                space.present[np.asarray(node_ids, dtype=np.int64) - lo] = True
            return space
        union = f" UNION {nodes_sql}" if nodes_sql else ""
        ids = con.sql(
            f"SELECT id FROM (SELECT src AS id FROM raw_edges UNION SELECT dst FROM raw_edges{union}) "
            "WHERE id IS NOT NULL ORDER BY id"
        ).to_arrow_table()
        if ids.num_rows == 0:
            raise InputError(f"{where}: every edge row has a null id; no nodes to build")
        ids = ids.column(0).combine_chunks()
        if len(ids) > 2**31 - 1:
            raise InputError(f"{where}: {len(ids)} nodes exceed the 2^31-1 supported by the int64 edge keys")
        return cls(len(ids), Relabeler(ids))

    @classmethod
    def factorize(cls, con, id_files: dict[str, str], where, kind: str = "int") -> tuple["_IdSpace", dict]:
        """Sparse or string ids of edge files that fit in memory: one scan, one hash pass.

        Every row's (src, dst) is read once, and one hash encoding gives each distinct id a
        code numbered in sorted order of the ids (`graphs.kernels.id_codes.sorted_int_codes`; string
        ids: `dictionary_codes`, then renumbered). This replaces a DISTINCT +
        ORDER BY over every endpoint and a second scan looked up id by id (string ids no
        longer become Python objects per row). String ids are encoded by their 64-bit hash
        (`graphs.kernels.id_codes.codes_by_hash`). `id_files` names queries of (id, row) over the node
        and feature files (row = the row's number in its file): their ids are encoded in the
        same pass, so those files need no lookup later. Returns the space (0..n-1, sorted ids)
        and the new ids: "src" and "dst" of every edge row, and of each named file's rows in
        file order (-1 where the id is null).
        """
        if kind == "string":
            h = STRING_HASH_SQL
            edges_sql = f"SELECT src, dst, {h.format(c='src')} AS hs, {h.format(c='dst')} AS hd FROM raw_edges"
        else:
            edges_sql = "SELECT src, dst FROM raw_edges"
        table = con.sql(edges_sql).to_arrow_table()
        rows = table.num_rows
        values = table.column(0).chunks + table.column(1).chunks
        hashes = table.column(2).chunks + table.column(3).chunks if kind == "string" else None
        del table
        file_rows = {}  # name -> (its first position among the encoded values, its rows' numbers)
        for name, sql in id_files.items():
            hash_column = f", {STRING_HASH_SQL.format(c='id')} AS h" if kind == "string" else ""
            t = con.sql(f"SELECT id, row{hash_column} FROM ({sql})").to_arrow_table()
            file_rows[name] = (sum(len(v) for v in values), t.column(1).to_numpy())
            values += t.column(0).chunks
            if hashes is not None:
                hashes += t.column(2).chunks
            del t
        if hashes is None:  # integer ids: numbered in sorted order as they are encoded
            codes, ids = sorted_int_codes(values)
        else:
            encoded = codes_by_hash(values, hashes)
            # two strings share a hash: encode the strings themselves
            index_chunks, dictionary = dictionary_codes(values) if encoded is None else encoded
            order = pc.sort_indices(dictionary).to_numpy()
            rank = np.empty(len(order), dtype=np.int64)
            rank[order] = np.arange(len(order), dtype=np.int64)
            codes = ranked_codes(index_chunks, rank)
            ids = dictionary.take(pa.array(order))
            del index_chunks, dictionary, order, rank
        del values, hashes
        if len(ids) == 0:
            raise InputError(f"{where}: every edge row has a null id; no nodes to build")
        if len(ids) > 2**31 - 1:
            raise InputError(f"{where}: {len(ids)} nodes exceed the 2^31-1 supported by the int64 edge keys")
        new_ids = {"src": codes[:rows], "dst": codes[rows : 2 * rows]}
        for name, (start, row_numbers) in file_rows.items():
            in_file_order = np.empty(len(row_numbers), dtype=np.int64)
            in_file_order[row_numbers] = codes[start : start + len(row_numbers)]
            new_ids[name] = in_file_order
        return cls(len(ids), Relabeler(ids)), new_ids

    def locate(self, values: pa.Array) -> np.ndarray:
        """Positions of edge endpoints in this space (marking them present when dense)."""
        if self._relabel is not None:
            return self._relabel(values)
        off = values.to_numpy() - self.lo
        self.present[off] = True
        return off

    def finish(self) -> tuple[Relabeler, np.ndarray | None]:
        """(the relabeller of the final ids, the offset -> new id table or None)."""
        if self._relabel is not None:
            return self._relabel, None
        offsets = np.flatnonzero(self.present)
        if len(offsets) == 0:
            raise InputError("every edge row has a null id; no nodes to build")
        lut = np.cumsum(self.present, dtype=np.int64) - 1
        return Relabeler(pa.array(offsets + self.lo)), lut


# A string id's 64-bit hash, computed by DuckDB in the scan (in parallel); null stays null.
STRING_HASH_SQL = "CASE WHEN {c} IS NULL THEN NULL ELSE hash({c}) END"


# ----------------------------------------------------------------------------- main entry


def _parquet_rows(paths: list[Path]) -> int:
    """The rows of these Parquet files, from their footers."""
    return sum(pq.read_metadata(p).num_rows for p in paths)


def _parquet_id_bounds(paths: list[Path]) -> tuple[int, int] | None:
    """(smallest, largest) src/dst of these Parquet files from their row-group statistics;
    None when a row group lacks them. Only chooses a path: the dense path counts again."""
    lo = hi = None
    for p in paths:
        md = pq.read_metadata(p)
        columns = [md.schema.column(i).path for i in range(md.num_columns)]
        for rg in range(md.num_row_groups):
            group = md.row_group(rg)
            for name in ("src", "dst"):
                if name not in columns:
                    return None
                stats = group.column(columns.index(name)).statistics
                if group.num_rows and (stats is None or not stats.has_min_max):
                    return None
                if group.num_rows and not (isinstance(stats.min, int) and isinstance(stats.max, int)):
                    return None
                if group.num_rows:
                    lo = stats.min if lo is None else min(lo, stats.min)
                    hi = stats.max if hi is None else max(hi, stats.max)
    return None if lo is None else (lo, hi)


def _connect(cfg: CanonicalConfig, temp_dir: Path) -> duckdb.DuckDBPyConnection:
    return duck.connect(cfg.memory_limit, threads=cfg.threads, temp_directory=temp_dir)


# A row's weight is usable: not null, not NaN, not infinite, > 0 (NaN > 0 holds in DuckDB).
VALID_WEIGHT_SQL = "coalesce(weight > 0 AND isfinite(weight), false)"
KEPT_ROW_SQL = "src IS NOT NULL AND dst IS NOT NULL AND src <> dst"


def _create_weighted_view(con, edge_files: list[Path], weighted: set[Path], sql_type: str) -> None:
    """View raw_edges(src, dst, weight DOUBLE) over every edge file, in name order.

    Files without a weight column give 1.0. Consecutive files of one kind are one
    `duck.read_parquet` relation (literal paths through DuckDB's relation API, never SQL text);
    the views are joined with UNION ALL, which keeps file order under
    preserve_insertion_order.
    """
    runs: list[tuple[bool, list[Path]]] = []
    for path in edge_files:
        has = path in weighted
        if runs and runs[-1][0] == has:
            runs[-1][1].append(path)
        else:
            runs.append((has, [path]))
    parts = []
    for i, (has, paths) in enumerate(runs):
        duck.read_parquet(con, paths, union_by_name=True).create_view(f"edge_files_{i}")
        weight = "CAST(weight AS DOUBLE)" if has else "CAST(1.0 AS DOUBLE)"
        parts.append(
            f"SELECT CAST(src AS {sql_type}) AS src, CAST(dst AS {sql_type}) AS dst, {weight} AS weight "
            f"FROM edge_files_{i}"
        )
    con.execute("CREATE VIEW raw_edges AS " + " UNION ALL ".join(parts))


def _invalid_weight_counts(con, path: Path) -> dict[str, int]:
    """Per kind, the rows of one file that would be edges but whose weight is unusable."""
    duck.read_parquet(con, [path]).create_view("one_edge_file")
    counts = con.sql(
        "SELECT count(*) FILTER (WHERE isnan(w)), count(*) FILTER (WHERE isinf(w)), "
        "count(*) FILTER (WHERE w < 0 AND isfinite(w)), count(*) FILTER (WHERE w = 0), "
        "count(*) FILTER (WHERE w IS NULL) "
        f"FROM (SELECT CAST(weight AS DOUBLE) AS w FROM one_edge_file WHERE {KEPT_ROW_SQL})"
    ).fetchall()[0]
    return dict(zip(("NaN", "infinite", "negative", "zero", "null"), (int(c) for c in counts)))


def _refuse_invalid_weights(con, weighted_files: list[Path]) -> None:
    problems = []
    for path in weighted_files:
        counts = _invalid_weight_counts(con, path)
        if sum(counts.values()):
            kinds = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
            problems.append(f"{path}: column 'weight' has {sum(counts.values())} invalid values ({kinds})")
    raise InputError(
        "; ".join(problems) + ". Weights must be finite and > 0: fix the files, or set "
        "invalid_weights='drop' to drop those rows (counted in the summary)"
    )


def build_canonical_graph(
    dataset_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    cfg: CanonicalConfig | None = None,
    columns: dict[str, str] | None = None,
) -> dict:
    """Validate a landing folder and write its canonical graph to `out_dir` atomically.

    `columns` is the dataset's column mapping (`graphs.stages.user_files`; None: the one of the
    folder's gnnflow.yaml, `read_column_mapping`); text files, mapped
    columns and categorical labels are first written in the Parquet layout into the staging
    folder (`graphs.stages.user_files.prepare_inputs`), errors still naming the user's files. With
    categorical labels, label_classes.json (`graphs.formats.label_classes`) holds the value of each class.
    Returns a summary dict (also written as summary.json): node and edge counts, dropped
    rows by reason, isolated nodes, degree statistics, label/split/feature facts.
    On any error `out_dir` keeps whatever it held before.
    """
    cfg = cfg or CanonicalConfig()
    t0 = time.perf_counter()
    given = find_dataset_files(dataset_dir)
    columns = read_column_mapping(dataset_dir) if columns is None else columns
    with gc_paused(), atomic_output_dir(out_dir) as tmp:
        work = tmp / "_work"
        work.mkdir()
        inputs = prepare_inputs(given, columns, work / "inputs", memory_limit=cfg.memory_limit, threads=cfg.threads)
        try:
            summary = _ingest(dataset_dir, inputs.files, tmp, work, cfg)
        except InputError as exc:
            explained = inputs.explain(exc)
            if explained is exc:
                raise
            raise explained from None
        for key in ("weight_files", "weight_default_1_files"):
            if key in summary:
                summary[key] = [inputs.given_name(name) for name in summary[key]]
        if inputs.label_classes:
            write_label_classes(tmp, inputs.label_classes)
        summary["seconds"] = round(time.perf_counter() - t0, 3)
        summary["peak_rss_bytes"] = peak_rss_bytes()
        write_summary(tmp, summary)
    return summary


@dataclass(frozen=True)
class _RowCounts:
    """Rows of the edge files: all, and those dropped for a null id, a self loop or an invalid weight."""

    rows: int
    null_rows: int
    self_loops: int
    invalid_weights: int

    @property
    def valid(self) -> int:
        """Rows kept: neither null nor a self loop nor an invalid weight."""
        return self.rows - self.null_rows - self.self_loops - self.invalid_weights


def _ingest(dataset_dir, files: DatasetFiles, tmp: Path, work: Path, cfg: CanonicalConfig) -> dict:
    """The canonical graph of input files in the Parquet layout, written into `tmp`; its summary."""
    kind = validate_inputs(files)
    sql_type = "BIGINT" if kind == "int" else "VARCHAR"
    weighted_files = [p for p in files.edge_files if "weight" in _schema(p).names]
    weighted = bool(weighted_files)
    con = _connect(cfg, work / "duckdb")
    _create_edge_views(con, files.edge_files, weighted_files, sql_type)
    nodes_sql, id_files = _create_id_file_views(con, files, sql_type)
    budget = cfg.sort_budget_mb << 20
    factorize_now = _factorizes_first(con, files.edge_files, kind, weighted, budget, nodes_sql)
    warmup = _start_kernel_warmup(factorize_now, weighted, files.features is not None)
    codes = None  # (src, dst) of every row in the final id space, when factorized in memory
    file_ids = {}  # new ids of the node / feature file rows, when factorized
    if factorize_now:
        space, codes, file_ids = _factorize(con, id_files, dataset_dir, kind, files.features)
        counts, min_id, max_id = _code_counts(codes), None, None
    else:
        counts, min_id, max_id = _sql_counts(con, weighted)
    if counts.rows == 0:
        raise InputError(f"{dataset_dir}: the edge files hold no rows ({[str(p) for p in files.edge_files]})")
    if counts.invalid_weights and cfg.invalid_weights == "error":
        _refuse_invalid_weights(con, weighted_files)
    dense = None if codes is not None else _IdSpace.dense_bounds(con, kind, counts.rows, min_id, max_id, nodes_sql)
    if codes is None and dense is None and not weighted and counts.rows * 2 * BYTES_PER_KEY <= budget:
        space, codes, file_ids = _factorize(con, id_files, dataset_dir, kind, files.features)
    elif codes is None:
        has_dropped = counts.rows > counts.valid
        dropped_weight_sql = f"{KEPT_ROW_SQL} AND NOT {VALID_WEIGHT_SQL}" if counts.invalid_weights else None
        space = _IdSpace.plan(con, dense, nodes_sql, has_dropped, dataset_dir, dropped_weight_sql)

    # Stream valid edges into id space, spill keys by source range. A symmetrized graph
    # whose keys fit the budget keeps only the (min, max) orientation and mirrors after dedupe.
    spill, half = _new_spill(space.size, counts.valid, weighted, cfg, work / "spill")
    shift = key_shift(space.size)
    if codes is not None:  # ids already final: keep rows with both ids and no self loop
        # factorized only when both directions' keys fit the budget: one group in memory, half kept
        assert spill.in_memory and (half or not cfg.symmetrize)
        _spill_codes(spill, codes, shift, half)
        del codes
    else:
        _spill_rows(spill, _valid_edge_rows(con, weighted, counts.invalid_weights, cfg), space, shift, half, cfg)
    con.close()
    relabel, lut = space.finish()
    warmup.join()

    edges, node_facts, feat_facts = _write_tables(tmp, files, spill, space, relabel, lut, shift, half, cfg, file_ids)
    shutil.rmtree(work, ignore_errors=True)
    return _summary(kind, relabel.n, counts, edges, files, weighted_files, cfg) | node_facts | feat_facts


def _create_edge_views(con, edge_files: list[Path], weighted_files: list[Path], sql_type: str) -> None:
    """View `raw_edges` over the edge files: src and dst cast to `sql_type`, and the weight when any file has one."""
    if weighted_files:
        _create_weighted_view(con, edge_files, set(weighted_files), sql_type)
        return
    # file paths enter as literals through the relation API, never as SQL text
    duck.read_parquet(con, edge_files, union_by_name=True).create_view("edge_files")
    con.execute(
        f"CREATE VIEW raw_edges AS SELECT CAST(src AS {sql_type}) AS src, CAST(dst AS {sql_type}) AS dst "
        "FROM edge_files"
    )


def _create_id_file_views(con, files: DatasetFiles, sql_type: str) -> tuple[str | None, dict[str, str]]:
    """Views over the node and feature files; the node ids' SQL and the (id, row) SQL of each file."""
    nodes_sql = None
    id_files = {}  # (id, row number in the file) of the node and feature files, for factorize
    if files.nodes:
        duck.read_parquet(con, [files.nodes], file_row_number=True).create_view("node_file")
        nodes_sql = f"SELECT CAST(node_id AS {sql_type}) AS id FROM node_file"
        id_files["nodes"] = f"SELECT CAST(node_id AS {sql_type}) AS id, file_row_number AS row FROM node_file"
    if files.features is not None:
        duck.read_parquet(con, [files.features], file_row_number=True).select("node_id, file_row_number").create_view(
            "feature_file"
        )
        id_files["features"] = f"SELECT CAST(node_id AS {sql_type}) AS id, file_row_number AS row FROM feature_file"
    return nodes_sql, id_files


def _factorizes_first(con, edge_files: list[Path], kind: str, weighted: bool, budget: int, nodes_sql) -> bool:
    """Whether the ids are factorized in memory before any count of the rows.

    Unweighted string ids, and integer ids too sparse for a bitmap (by the files' min/max
    statistics), whose rows fit the sort budget are factorized in memory, and that one
    scan gives the counts too (no count/min/max pass over every row).
    """
    meta_rows = _parquet_rows(edge_files)
    factorize_now = not weighted and 0 < meta_rows * 2 * BYTES_PER_KEY <= budget
    if factorize_now and kind == "int":
        bounds = _parquet_id_bounds(edge_files)
        factorize_now = bounds is not None and _IdSpace.dense_bounds(con, kind, meta_rows, *bounds, nodes_sql) is None
    return factorize_now


def _start_kernel_warmup(factorize_now: bool, weighted: bool, features: bool) -> threading.Thread:
    """A started thread that loads the numba kernels the ingest will run."""
    # Loading the cached numba kernels costs ~0.3 s; do it while DuckDB scans the files
    # (the id encoder's only when it will run: ~0.1 s of CPU the dense path would not use).
    # (the id encoder's first: it runs first, and numba loads one kernel at a time)
    warm = ([_warm_id_kernels] if factorize_now else []) + [warm_weighted_kernels if weighted else warm_kernels]
    warm += [_warm_feature_kernels] if features else []
    warmup = threading.Thread(target=_call_each, args=(warm,), daemon=True)
    warmup.start()
    return warmup


def _code_counts(codes: tuple[np.ndarray, np.ndarray]) -> _RowCounts:
    """The row counts of factorized (src, dst) ids (-1 for a null id)."""
    src_codes, dst_codes = codes
    null_rows = int(np.count_nonzero((src_codes < 0) | (dst_codes < 0)))
    self_loops = int(np.count_nonzero((src_codes == dst_codes) & (src_codes >= 0)))
    return _RowCounts(rows=len(src_codes), null_rows=null_rows, self_loops=self_loops, invalid_weights=0)


def _sql_counts(con, weighted: bool) -> tuple[_RowCounts, object, object]:
    """The row counts of `raw_edges`, and its smallest and largest id, in one scan."""
    invalid_weight_sql = f", count(*) FILTER (WHERE {KEPT_ROW_SQL} AND NOT {VALID_WEIGHT_SQL})" if weighted else ""
    rows, null_rows, self_loops, min_id, max_id, *invalid = con.sql(
        "SELECT count(*), count(*) FILTER (WHERE src IS NULL OR dst IS NULL), "
        "count(*) FILTER (WHERE src = dst), least(min(src), min(dst)), greatest(max(src), max(dst))"
        f"{invalid_weight_sql} FROM raw_edges"
    ).fetchall()[0]
    invalid_weights = int(invalid[0]) if invalid else 0
    counts = _RowCounts(rows=rows, null_rows=null_rows, self_loops=self_loops, invalid_weights=invalid_weights)
    return counts, min_id, max_id


def _new_spill(n_space: int, valid_rows: int, weighted: bool, cfg: CanonicalConfig, path: Path):
    """The key spill for `valid_rows` edges, and whether it keeps one orientation only (half)."""
    budget = cfg.sort_budget_mb << 20
    per_key = BYTES_PER_WEIGHTED_KEY if weighted else BYTES_PER_KEY
    half = cfg.symmetrize and valid_rows * 2 * per_key <= budget
    copies = 2 if cfg.symmetrize and not half else 1
    groups = 1 if half else math.ceil(valid_rows * copies * per_key / budget)
    return KeySpill(n_space, groups, budget, path, weighted), half


def _spill_codes(spill: KeySpill, codes: tuple[np.ndarray, np.ndarray], shift: int, half: bool) -> None:
    """Add the keys of factorized rows with both ids and no self loop."""
    src_codes, dst_codes = codes
    keys = np.empty(len(src_codes), dtype=np.int64)
    spill.add(keys[: keys_of_rows(src_codes, dst_codes, shift, half, keys)], src=None)


def _valid_edge_rows(con, weighted: bool, invalid_weights: int, cfg: CanonicalConfig):
    """A record-batch reader of the kept rows of `raw_edges`: (src, dst) and the weight when weighted."""
    if not weighted:
        return con.sql(f"SELECT src, dst FROM raw_edges WHERE {KEPT_ROW_SQL}").to_arrow_reader(cfg.batch_rows)
    # rows in input order, so 'first' and the order of float sums are deterministic
    con.execute("SET preserve_insertion_order = true")
    keep = f"{KEPT_ROW_SQL} AND {VALID_WEIGHT_SQL}" if invalid_weights else KEPT_ROW_SQL
    return con.sql(f"SELECT src, dst, weight FROM raw_edges WHERE {keep}").to_arrow_reader(cfg.batch_rows)


def _spill_rows(spill: KeySpill, reader, space: _IdSpace, shift: int, half: bool, cfg: CanonicalConfig) -> None:
    """Add the keys (and weights) of each batch of rows, its ids located in the id space."""
    for batch in reader:
        s = space.locate(batch.column(0))
        d = space.locate(batch.column(1))
        if spill.weighted:
            _add_weighted(spill, s, d, batch.column(2).to_numpy(), shift, half, cfg.symmetrize)
        else:
            _add_unweighted(spill, s, d, shift, half, cfg.symmetrize)


def _write_tables(tmp: Path, files, spill, space, relabel, lut, shift: int, half: bool, cfg, file_ids: dict):
    """Write edges.parquet, the node table, the features and the degree plot into `tmp`.

    Returns ((degree, distinct input pairs, edges written, weight facts), node facts, feature facts).
    """
    # Edges are deduplicated and written in a worker thread (numba and Parquet encoding
    # release the GIL) while this thread writes the node table and the features.
    degree_ready: Future = Future()
    with ThreadPoolExecutor(max_workers=1) as pool:
        edges_job = pool.submit(
            _write_edges,
            spill,
            tmp / CanonicalGraph.EDGES,
            shift=shift,
            half=half,
            directed=not cfg.symmetrize,
            lut=lut,
            degree_ready=degree_ready,
            combine=cfg.weight_combine,
        )
        try:
            node_facts = _write_nodes(tmp, files, relabel, cfg, file_ids.get("nodes"))
            feat_facts = (
                _write_features(tmp, files, relabel, cfg, file_ids.get("features"))
                if files.features is not None
                else {}
            )
            headless_pyplot()  # ~0.5 s, done while the edge thread is still busy
            wait([degree_ready, edges_job], return_when=FIRST_COMPLETED)
            if degree_ready.done():  # plot while the last edges are still being encoded
                degree = degree_ready.result()
                degree = degree[space.present] if lut is not None else degree
                _plot_degrees(degree, tmp / CanonicalGraph.DEGREE_PLOT)
        finally:
            _, distinct_input_pairs, edges_written, weight_facts = edges_job.result()
    return (degree, distinct_input_pairs, edges_written, weight_facts), node_facts, feat_facts


def _summary(kind: str, n: int, counts: _RowCounts, edges: tuple, files, weighted_files, cfg) -> dict:
    """The summary's id, edge, dropped-row, weight and degree facts."""
    degree, distinct_input_pairs, edges_written, weight_facts = edges
    weighted = bool(weighted_files)
    return {
        "format_version": FORMAT_VERSION,
        "id_type": kind,
        "nodes": int(n),
        "edges": int(edges_written),
        "symmetrized": cfg.symmetrize,
        "input_rows": int(counts.rows),
        "input_files": len(files.edge_files),
        "dropped_null_id": int(counts.null_rows),
        "dropped_self_loop": int(counts.self_loops),
        "dropped_duplicate": int(counts.valid - distinct_input_pairs),
        "combined_reverse_pairs": int(distinct_input_pairs - edges_written // 2) if cfg.symmetrize else 0,
        "weighted": weighted,
        **(
            {
                "weight_combine": cfg.weight_combine,
                "weight_files": [p.name for p in weighted_files],
                "weight_default_1_files": [p.name for p in files.edge_files if p not in weighted_files],
                "dropped_invalid_weight": counts.invalid_weights,
                **weight_facts,
            }
            if weighted
            else {}
        ),
        "isolated_nodes": int(np.count_nonzero(degree == 0)),
        "degree_max": int(degree.max()),
        "degree_mean": float(degree.mean()),
        "degree_p99": float(np.percentile(degree, 99)),
    }


def _call_each(functions) -> None:
    for f in functions:
        f()


def _add_unweighted(spill: KeySpill, s, d, shift: int, half: bool, symmetrize: bool) -> None:
    """Keys of one batch of rows (see the module docstring)."""
    if half:  # flag = orientation, so distinct directed pairs stay countable; one group in memory
        keys = np.empty(len(s), dtype=np.int64)
        spill.add(keys[: keys_of_rows(s, d, shift, True, keys)], src=None)
    elif symmetrize:  # flag 1 = the reversed copy
        spill.add(np.concatenate([(s << shift) | (d << 1), (d << shift) | (s << 1) | 1]), np.concatenate([s, d]))
    else:
        spill.add((s << shift) | (d << 1), s)


def _add_weighted(spill: KeySpill, s, d, w, shift: int, half: bool, symmetrize: bool) -> None:
    """Keys and weights of one batch of rows, in row order (see the module docstring)."""
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


def _write_edges(
    spill: KeySpill, path: Path, *, shift: int, half: bool, directed: bool, lut, degree_ready, combine: str
) -> tuple:
    """Deduplicate each key group and append it to edges.parquet, sorted by (src, dst).

    Returns (degree per id-space slot, distinct input pairs, edges written, weight facts); the degrees
    are also handed to the `degree_ready` future as soon as the last group is deduplicated,
    before its Parquet encoding ends. The Parquet encoding runs in a second thread, piece by
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
                counts, dst, weight, distinct = dedupe_rows_weighted(keys, weights, shift, lo, hi - lo, half, rule)
                del weights
                if half:
                    counts, dst, weight = mirror_weighted(counts, dst, weight)
                if len(weight):
                    w_min, w_max = min(w_min, float(weight.min())), max(w_max, float(weight.max()))
                    w_sum += float(weight.sum())
            else:
                counts, dst, distinct = dedupe_rows(keys, shift, lo, hi - lo, half)
                weight = None
                if half:
                    counts, dst = mirror(counts, dst)
            del keys
            distinct_input_pairs += distinct
            out_deg[lo:hi] = counts
            if in_deg is not None:
                in_deg += np.bincount(dst, minlength=n_space)
            edges_written += len(dst)
            pieces.write_group(lo, counts, dst, weight)
            del counts, dst, weight
        degree = out_deg if in_deg is None else out_deg + in_deg
        degree_ready.set_result(degree)
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


def _factorize(con, id_files: dict, where, kind: str, features: Path | None):
    """`_IdSpace.factorize` as (space, (src, dst) new ids, new ids of the node / feature file
    rows), refusing a feature row whose id no edge or node row names, as `_copy_features`
    does on the other paths (here the feature file's ids were encoded with the rest)."""
    space, new_ids = _IdSpace.factorize(con, id_files, where, kind)
    if "features" in new_ids:
        known = new_ids["features"][new_ids["features"] >= 0]
        mentioned = np.zeros(space.size + 1, dtype=bool)  # the last slot takes the nulls (-1)
        # the node file's ids first: feature rows usually name those, and the edges' ids
        # (twice the edge rows) are only scattered when some feature id is not among them
        for names in (["nodes"], ["src", "dst"]):
            for name in names:
                mentioned[new_ids.get(name, [])] = True
            if mentioned[known].all():
                break
        else:
            raise _feature_only_id(features, space.finish()[0].ids[int(known[~mentioned[known]][0])].as_py())
    return space, (new_ids.pop("src"), new_ids.pop("dst")), new_ids


def _feature_only_id(path: Path, value) -> InputError:
    return InputError(f"{path}: column 'node_id' has id {value!r} that no edge or nodes.parquet row mentions")


def _write_nodes(
    tmp: Path, files: DatasetFiles, relabel: Relabeler, cfg: CanonicalConfig, new_ids: np.ndarray | None = None
) -> dict:
    """nodes.parquet and its facts; `new_ids` of the node file's rows when already known."""
    n = relabel.n
    label = np.full(n, -1, dtype=np.int32)
    split = np.full(n, SPLIT_NAMES.index("other"), dtype=np.int8)
    facts = {
        "has_labels": False,
        "split_generated": False,
        "nodes_without_node_row": 0,
        "null_labels_as_unknown": 0,
        "null_splits_as_other": 0,
        "unknown_splits_as_other": 0,
        "unknown_split_words": [],
    }
    if files.nodes is not None:
        t = pq.read_table(files.nodes)
        idx = new_ids if new_ids is not None else relabel(t.column("node_id"))
        # filled, not failed: nodes met only in edges get label -1 and split 'other'
        facts["nodes_without_node_row"] = int(n - t.num_rows)
        if t.column("node_id").null_count:
            raise InputError(f"{files.nodes}: column 'node_id' has {t.column('node_id').null_count} null values")
        counts = np.bincount(idx, minlength=n)
        if (counts > 1).any():
            dup = relabel.ids[int(np.flatnonzero(counts > 1)[0])].as_py()
            raise InputError(f"{files.nodes}: column 'node_id' repeats the id {dup!r}; one row per node")
        if "label" in t.column_names:
            label[idx], facts["null_labels_as_unknown"] = _class_labels(t.column("label"), files.nodes)
            facts["has_labels"] = bool((label >= 0).any())
        if "split" in t.column_names:
            facts["null_splits_as_other"] = int(t.column("split").null_count)
            split[idx], unknown_rows, unknown_words = _split_codes(t.column("split"))
            facts["unknown_splits_as_other"], facts["unknown_split_words"] = unknown_rows, unknown_words
        elif facts["has_labels"]:
            labelled = np.flatnonzero(label >= 0)
            order = np.random.default_rng(cfg.split_seed).permutation(labelled)
            n_train = int(round(cfg.train_fraction * len(order)))
            n_val = int(round(cfg.val_fraction * len(order)))
            split[order[:n_train]] = 0
            split[order[n_train : n_train + n_val]] = 1
            split[order[n_train + n_val :]] = 2
            facts["split_generated"] = True
    facts["labelled_nodes"] = int(np.count_nonzero(label >= 0))
    facts["num_classes"] = int(label.max()) + 1 if facts["labelled_nodes"] else 0
    per_split = np.bincount(split, minlength=len(SPLIT_NAMES))
    for code, name in enumerate(("train", "val", "test")):
        facts[f"{name}_nodes"] = int(per_split[code])
    table = pa.table(
        {
            "node_id": pa.array(np.arange(n, dtype=np.int64)),
            "original_id": relabel.ids,
            "label": pa.array(label),
            "split": pa.array(SPLIT_NAMES, type=pa.string()).take(pa.array(split)),
        }
    )
    # ids delta-encoded (sorted: a few bits each; sorted strings share prefixes), label and
    # split by dictionary: smaller than zstd over plain values, and about twice as fast
    original = "DELTA_BINARY_PACKED" if pa.types.is_integer(relabel.ids.type) else "DELTA_BYTE_ARRAY"
    pq.write_table(
        table,
        tmp / CanonicalGraph.NODES,
        compression="none",
        use_dictionary=["label", "split"],
        column_encoding={"node_id": "DELTA_BINARY_PACKED", "original_id": original},
    )
    return facts


def _class_labels(labels: pa.ChunkedArray, path: Path) -> tuple[np.ndarray, int]:
    """(a nodes.parquet `label` column as int32 class indices, the rows read as -1 (unknown):
    null, and NaN in a float column). Floats must hold whole numbers (a pandas column of
    integers with gaps becomes float64); InputError naming the value for any other, or for a
    value outside -1..MAX_CLASSES-1."""
    if pa.types.is_floating(labels.type):
        values = labels.to_numpy()  # nulls read as NaN
        nan = np.isnan(values)
        given = values[~nan]
        whole = np.isfinite(given) & (given == np.floor(given))
        if not whole.all():
            raise InputError(
                f"{path}: column 'label' has the value {given[~whole][0]!r}, not a whole number; labels are class "
                "indices 0..C-1 (or -1/null/NaN for unknown)"
            )
        _check_label_range(given.min(initial=0), given.max(initial=0), path)
        return np.where(nan, -1, values).astype(np.int32), int(nan.sum())
    _check_label_range(pc.min(labels).as_py(), pc.max(labels).as_py(), path)
    # cast first: -1 fits no unsigned type
    return labels.cast(pa.int32()).fill_null(-1).to_numpy(), int(labels.null_count)


def _check_label_range(low, high, path: Path) -> None:
    for value in (low, high):
        if value is not None and not -1 <= value < MAX_CLASSES:
            raise InputError(
                f"{path}: column 'label' has value {int(value)}; labels are class indices 0..C-1 (at most "
                f"{MAX_CLASSES} classes: the model has one output per class up to the largest label), "
                "or -1/null for unknown: number the classes 0..C-1"
            )


def _split_codes(column: pa.ChunkedArray) -> tuple[np.ndarray, int, list[str]]:
    """(the code in `SPLIT_NAMES` of each row of a nodes.parquet `split` column, the rows whose
    word is none of `SPLIT_WORDS`, up to `SHOWN_SPLIT_WORDS` of those words). Words match
    case-insensitively, surrounding spaces ignored; null and unknown words read as 'other'."""
    words = column.cast(pa.string()).combine_chunks().dictionary_encode()
    normal = pc.utf8_lower(pc.utf8_trim_whitespace(words.dictionary))
    found = pc.index_in(normal, value_set=pa.array(list(SPLIT_WORDS))).to_numpy(zero_copy_only=False)
    known = ~np.isnan(found)
    word_code = np.full(len(found), SPLIT_NAMES.index("other"), dtype=np.int8)
    word_code[known] = np.array(list(SPLIT_WORDS.values()), dtype=np.int8)[found[known].astype(np.int64)]
    codes = np.full(len(words), SPLIT_NAMES.index("other"), dtype=np.int8)
    valid = words.indices.is_valid().to_numpy(zero_copy_only=False)
    row_word = words.indices.to_numpy(zero_copy_only=False)[valid].astype(np.int64)
    codes[valid] = word_code[row_word]
    unknown_rows = int(np.count_nonzero(~known[row_word]))
    unknown = np.flatnonzero(~known)[:SHOWN_SPLIT_WORDS]
    shown = [w[:SHOWN_WORD_CHARS] for w in words.dictionary.take(pa.array(unknown, pa.int64())).to_pylist()]
    return codes, unknown_rows, shown


FEATURE_BATCH_BYTES = 8 << 20  # of float32 values per feature batch read
FEATURE_READ_BUFFER = 4 << 20  # bytes of the feature file read at a time


def _write_features(
    tmp: Path, files: DatasetFiles, relabel: Relabeler, cfg: CanonicalConfig, new_ids: np.ndarray | None = None
) -> dict:
    """features.npy and its facts; `new_ids` of the feature file's rows when already known."""
    path = files.features
    n = relabel.n
    # Read in ~8 MB batches through a 4 MB buffer, not a whole column chunk at once: the
    # batches' memory is then reused, where 64 MB batches took ~600 MB of fresh memory whose
    # first touch (the kernel zeroing huge pages) cost more than decoding the file.
    pf = pq.ParquetFile(path, buffer_size=FEATURE_READ_BUFFER, pre_buffer=False)
    seen = np.zeros(n, dtype=bool)
    width_guess = max(
        1,
        pf.schema_arrow.field("feat").type.list_size
        if pa.types.is_fixed_size_list(pf.schema_arrow.field("feat").type)
        else 64,
    )
    # FEATURE_BATCH_BYTES of floats at most, and no more than a row group: batches that
    # straddle row groups cost a concatenation each
    largest_group = max((pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)), default=1)
    rows_per_batch = max(1024, min(cfg.batch_rows, FEATURE_BATCH_BYTES // (4 * width_guess), largest_group))
    if new_ids is None:  # one call: a string relabeller builds its hash set once, not per batch
        new_ids = relabel(pf.read(columns=["node_id"]).column(0))
    with _FeatureWriter(tmp / CanonicalGraph.FEATURES, n, new_ids, cfg.sort_budget_mb << 20) as out:
        _copy_features(pf, path, rows_per_batch, new_ids, seen, out)
    if out.dim is None:
        raise InputError(f"{path}: holds no rows")
    return {"feature_dim": int(out.dim), "nodes_without_features": int(n - seen.sum())}


class _FeatureWriter:
    """features.npy [n, dim] float32, written row block by row block.

    Rows in node order go through pwrite (`NpyRowWriter`), not a mapping: the page cache
    holds them either way, but dirty mapped pages would count in this process's RSS (5 GB at
    10M x 128). Rows in another order (ids that do not follow the file's rows) are scattered
    into a buffer in RAM when the whole matrix fits `budget_bytes`, then written at once: each
    first touch of a page of a file mapping is a page fault (about 1.3 s for 128 MB of
    scattered 128-byte rows here). Larger ones are scattered into a mapping of the file.
    """

    def __init__(self, path: Path, n: int, new_ids: np.ndarray, budget_bytes: int):
        self.path, self.n, self.budget = path, n, budget_bytes
        self.in_order = bool((np.diff(new_ids) == 1).all()) if len(new_ids) else True
        self.dim = None
        self._rows = self._map = self._buffer = None

    def __enter__(self) -> "_FeatureWriter":
        return self

    def start(self, dim: int) -> None:
        self.dim = dim
        self._rows = NpyRowWriter(self.path, np.float32, (self.n, dim))
        if self.in_order:
            return
        if self.n * dim * 4 <= self.budget:
            self._buffer = np.zeros((self.n, dim), dtype=np.float32)
        else:
            self._map = np.load(self.path, mmap_mode="r+")

    def write(self, idx: np.ndarray, rows: np.ndarray, contiguous: bool) -> None:
        """Rows of nodes `idx` (`contiguous`: idx is idx[0], idx[0] + 1, ...)."""
        if contiguous and self._buffer is None:
            self._rows.write(int(idx[0]), rows)
        else:
            _scatter_rows(self._buffer if self._buffer is not None else np.asarray(self._map), idx, rows)

    def __exit__(self, kind, *_) -> None:
        if self._buffer is not None and kind is None:
            self._rows.write(0, self._buffer)
        if self._rows is not None:
            self._rows.close()
        self._map = self._buffer = None  # no msync: the rename publishes the file; the page cache serves readers


@numba.njit(cache=True, nogil=True)
def _scatter_rows(out, idx, rows):  # pragma: no cover - compiled
    """out[idx[i]] = rows[i]: numpy's fancy assignment of 2-d rows costs ~3x this."""
    for i in range(len(idx)):
        r = idx[i]
        for j in range(rows.shape[1]):
            out[r, j] = rows[i, j]


def _warm_feature_kernels() -> None:
    """Load the kernels' cached machine code for the argument types `_copy_features` passes
    (rows read-only, as zero-copy from Arrow)."""
    rows = np.frombuffer(np.zeros(1, np.float32).tobytes(), np.float32).reshape(1, 1)
    _scatter_rows(np.zeros((1, 1), np.float32), np.zeros(1, np.int64), rows)
    _mark_new(np.zeros(1, bool), np.zeros(1, np.int64))


@numba.njit(cache=True, nogil=True)
def _mark_new(seen, idx):  # pragma: no cover - compiled
    """Mark ids `idx` seen; False when one was seen before (or repeats within idx)."""
    new = True
    for i in range(len(idx)):
        if seen[idx[i]]:
            new = False
        seen[idx[i]] = True
    return new


def _copy_features(pf, path: Path, rows_per_batch: int, new_ids, seen, out: _FeatureWriter) -> None:
    """Every feature row into `out` at row `new_ids` (of the file's rows, -1 = unknown)."""
    at = 0
    for batch in pf.iter_batches(batch_size=rows_per_batch, columns=["node_id", "feat"]):
        ids, feat = batch.column(0), batch.column(1)
        if ids.null_count or feat.null_count:
            raise InputError(f"{path}: columns 'node_id'/'feat' must not hold nulls")
        if pa.types.is_fixed_size_list(feat.type):
            width = feat.type.list_size
            values = feat.flatten()
        else:
            lengths = np.diff(feat.offsets.to_numpy())
            width = int(lengths[0]) if len(lengths) else (out.dim or 0)
            if len(lengths) and (lengths != width).any():
                row = int(np.flatnonzero(lengths != width)[0])
                raise InputError(
                    f"{path}: column 'feat' varies in width: node_id {ids[row].as_py()!r} has "
                    f"{lengths[row]} values, node_id {ids[0].as_py()!r} has {width}"
                )
            values = feat.flatten()
        if out.dim is None:
            out.start(width)
        elif width != out.dim and len(batch):
            raise InputError(
                f"{path}: column 'feat' varies in width: {width} values in a later row group, {out.dim} before"
            )
        idx = new_ids[at : at + len(ids)]
        at += len(ids)
        if (idx < 0).any():
            raise _feature_only_id(path, ids[int(np.flatnonzero(idx < 0)[0])].as_py())
        if not _mark_new(seen, idx):
            raise InputError(f"{path}: column 'node_id' repeats an id; one feature row per node")
        rows = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(idx), out.dim)
        finite = np.isfinite(rows).all(axis=1)
        if not finite.all():
            row = int(np.flatnonzero(~finite)[0])
            raise InputError(
                f"{path}: column 'feat' of node_id {ids[row].as_py()!r} holds a NaN or infinite value "
                "(or one beyond float32's range); features must be finite"
            )
        if len(idx):
            out.write(idx, rows, contiguous=idx[-1] - idx[0] + 1 == len(idx) and bool((np.diff(idx) == 1).all()))


def _plot_degrees(degree: np.ndarray, path: Path) -> None:
    plt = headless_pyplot()

    per_degree = np.bincount(degree)
    values = np.flatnonzero(per_degree[1:]) + 1
    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=100)
    if len(values):
        ax.loglog(values, per_degree[values], ".", markersize=3)
    ax.minorticks_off()  # the log axes' minor ticks cost ~60 % of the drawing
    ax.set_xlabel("degree")
    ax.set_ylabel("number of nodes")
    # a given title height skips the automatic placement (a bounding box of every tick label)
    ax.set_title(f"degree distribution ({len(degree)} nodes, {int(per_degree[0])} isolated)", y=1.0)
    fig.subplots_adjust(left=0.16, bottom=0.14, right=0.97, top=0.9)  # fixed margins: tight_layout costs ~0.4 s
    fig.savefig(path)
    plt.close(fig)


__all__ = [
    "READY_MARKER",
    "CanonicalConfig",
    "CanonicalGraph",
    "DatasetFiles",
    "InputError",
    "LABEL_CLASSES",
    "Relabeler",
    "build_canonical_graph",
    "has_training_labels",
    "is_dataset_folder",
    "landing_fingerprint",
    "landing_marked_ready",
    "edge_batches",
    "find_dataset_files",
    "read_label_classes",
    "read_summary",
    "validate_inputs",
]
