"""The canonical_graph stage's id space: original ids relabelled to 0..n-1 in sorted order.

`graphs.stages.canonical` runs the stage and describes how the paths fit together ("How it
scales"). `Relabeler` maps original ids to new ids, vectorised (a dense lookup table, else one
hash table built once: `IntIdLookup` for integers, `StringIdLookup` for strings by their
hashes). `IdSpace` is the integer space the edge keys live in before they get their final ids:
offsets from the smallest id for dense integers (a bitmap of the ids present, filled while
streaming), else 0..n-1 over DuckDB's sorted DISTINCT (`IdSpace.plan`)
or over one in-memory hash encoding of every endpoint and of the node and feature files' ids
(`IdSpace.factorize`, `factorize_ids`; string ids by their 64-bit DuckDB hash, `STRING_HASH_SQL`,
checked against each code's string by `graphs.kernels.id_codes`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from graphs.kernels.id_codes import (
    IntIdLookup,
    StringIdLookup,
    codes_by_hash,
    dictionary_codes,
    ranked_codes,
    sorted_int_codes,
)
from graphs.stages.canonical_inputs import feature_only_id
from graphs.stages.landing import InputError

# A string id's 64-bit hash, computed by DuckDB in the scan (in parallel); null stays null.
STRING_HASH_SQL = "CASE WHEN {c} IS NULL THEN NULL ELSE hash({c}) END"


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
            else:  # signed ids by a cache-friendly hash table in threads, others by pandas' index
                self._index = IntIdLookup(arr) if arr.dtype.kind == "i" else pd.Index(arr)
        # string ids: by a table of their hashes, built on the first lookup (`StringIdLookup`); by
        # Arrow's hash set where two ids share a hash or the ids are not strings
        self._strings: StringIdLookup | None = None

    def __call__(self, values: pa.Array | np.ndarray) -> np.ndarray:
        """New ids (int64) of `values`; -1 where a value is not a known id."""
        if self._lut is None and self._index is None:
            if not isinstance(values, (pa.Array, pa.ChunkedArray)):
                values = pa.array(values)
            values = values.cast(self.ids.type)
            kind = self.ids.type
            if self._strings is None and (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
                self._strings = StringIdLookup(self.ids)
            if self._strings is not None and self._strings.usable:
                if isinstance(values, pa.ChunkedArray):
                    values = values.combine_chunks()
                return self._strings(values)
            found = pc.index_in(values, value_set=self.ids).fill_null(-1)
            return np.asarray(found.to_numpy(), dtype=np.int64)
        null = None
        if isinstance(values, (pa.Array, pa.ChunkedArray)):
            if values.null_count and isinstance(self._index, IntIdLookup):  # nulls are no id: -1
                null, values = np.asarray(values.is_null()), values.fill_null(0)
            values = values.to_numpy(zero_copy_only=False)
        if self._lut is not None:
            off = values.astype(np.int64, copy=False) - self._lo
            if len(off) == 0 or (off.min() >= 0 and off.max() < len(self._lut)):
                return self._lut[off]
            ok = (off >= 0) & (off < len(self._lut))
            out = np.full(len(off), -1, dtype=np.int64)
            out[ok] = self._lut[off[ok]]
            return out
        if not isinstance(self._index, IntIdLookup):
            return self._index.get_indexer(values).astype(np.int64, copy=False)
        if np.asarray(values).dtype.kind != "i":  # not signed integers: compared as pandas compares them
            return pd.Index(self.ids.to_numpy()).get_indexer(values).astype(np.int64, copy=False)
        found = self._index(values)
        if null is not None:
            found[null] = -1
        return found


class IdOutsideSpace(Exception):
    """An edge id outside a dense space's bounds: bounds taken from Parquet statistics that
    understate a file's ids. The ingest then counts the ids itself (`graphs.stages.canonical`)."""


class IdSpace:
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
    def plan(cls, con, dense, nodes_sql, has_dropped_rows, where, dropped_weight_sql=None) -> "IdSpace":
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
    def factorize(cls, con, id_files: dict[str, str], where, kind: str = "int") -> tuple["IdSpace", dict]:
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
        """Positions of edge endpoints in this space (marking them present when dense); -1 for
        a null (dense only: the other spaces are read from rows without nulls)."""
        if self._relabel is not None:
            return self._relabel(values)
        valid = np.asarray(values.is_valid()) if values.null_count else None
        found = values.to_numpy() if valid is None else values.drop_null().to_numpy()
        if len(found) and (found.min() < self.lo or found.max() >= self.lo + self.size):  # no int64 wrap
            raise IdOutsideSpace(f"an edge id outside {self.lo}..{self.lo + self.size - 1}")
        if valid is None:
            off = found - self.lo
            self.present[off] = True
            return off
        off = np.full(len(values), -1, dtype=np.int64)
        off[valid] = found - self.lo
        self.present[off[valid]] = True
        return off

    def finish(self) -> tuple[Relabeler, np.ndarray | None]:
        """(the relabeller of the final ids, the offset -> new id table, or None when offsets
        are the new ids: a relabelled space, or a dense one with every offset present)."""
        if self._relabel is not None:
            return self._relabel, None
        offsets = np.flatnonzero(self.present)
        if len(offsets) == 0:
            raise InputError("every edge row has a null id; no nodes to build")
        relabel = Relabeler(pa.array(offsets + self.lo))
        if len(offsets) == self.size:
            return relabel, None
        return relabel, np.cumsum(self.present, dtype=np.int64) - 1


def factorize_ids(con, id_files: dict, where, kind: str, features: Path | None):
    """`IdSpace.factorize` as (space, (src, dst) new ids, new ids of the node / feature file
    rows), refusing a feature row whose id no edge or node row names, as
    `graphs.stages.canonical_features` does on the other paths (here the feature file's ids
    were encoded with the rest)."""
    space, new_ids = IdSpace.factorize(con, id_files, where, kind)
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
            raise feature_only_id(features, space.finish()[0].ids[int(known[~mentioned[known]][0])].as_py())
    return space, (new_ids.pop("src"), new_ids.pop("dst")), new_ids


__all__ = ["STRING_HASH_SQL", "IdSpace", "Relabeler", "factorize_ids"]
