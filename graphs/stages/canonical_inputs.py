"""The canonical_graph stage's inputs: each file's schema checked, and DuckDB's views over them.

`graphs.stages.canonical` documents the input layout (edge files, nodes.parquet, features.parquet)
and runs the stage. This module checks every file's schema before a row is read
(`validate_inputs`: the id kind, integer or string, one for the whole dataset; uint64 ids within
int64's range; numeric weights, string splits, list features), and creates the DuckDB views the
ingest scans: ``raw_edges(src, dst[, weight])`` over the edge files in name order
(`create_edge_views`; files without a weight column give 1.0) and the (id, row) queries of the node
and feature files (`create_id_file_views`). `KEPT_ROW_SQL` and `VALID_WEIGHT_SQL` say which rows
become edges; `refuse_invalid_weights` names each file's unusable weights. Every error is an
`InputError` naming the file, the column and the value. `RowCounts` are the edge rows kept and
dropped, counted by DuckDB (`sql_counts`) or from factorized ids (`code_counts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from graphs.infra import duck
from graphs.stages.landing import DatasetFiles, InputError

INT64_MAX = 2**63 - 1
# A row's weight is usable: not null, not NaN, not infinite, > 0 (NaN > 0 holds in DuckDB).
VALID_WEIGHT_SQL = "coalesce(weight > 0 AND isfinite(weight), false)"
KEPT_ROW_SQL = "src IS NOT NULL AND dst IS NOT NULL AND src <> dst"


# ----------------------------------------------------------------------------- validation


def parquet_schema(path: Path) -> pa.Schema:
    """The Arrow schema of a Parquet input file; InputError when it is empty or unreadable."""
    if path.stat().st_size == 0:
        raise InputError(f"{path}: file is empty (0 bytes); expected a Parquet file")
    try:
        return pq.read_schema(path)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise InputError(f"{path}: cannot be read as Parquet ({exc})") from exc


def id_kind(path: Path, schema: pa.Schema, column: str) -> str:
    """'int' or 'string': the kind of the ids in `column` of the Parquet file `path` (InputError otherwise)."""
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
        schema = parquet_schema(path)
        for col in ("src", "dst"):
            k = id_kind(path, schema, col)
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
        schema = parquet_schema(files.nodes)
        k = id_kind(files.nodes, schema, "node_id")
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
        schema = parquet_schema(files.features)
        k = id_kind(files.features, schema, "node_id")
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


def feature_only_id(path: Path, value) -> InputError:
    """The error for a feature row whose id no edge or nodes.parquet row names."""
    return InputError(f"{path}: column 'node_id' has id {value!r} that no edge or nodes.parquet row mentions")


# ----------------------------------------------------------------------------- DuckDB views


def parquet_rows(paths: list[Path]) -> int:
    """The rows of these Parquet files, from their footers."""
    return sum(pq.read_metadata(p).num_rows for p in paths)


def parquet_id_bounds(paths: list[Path]) -> tuple[int, int] | None:
    """(smallest, largest) src/dst of these Parquet files from their row-group statistics;
    None when a row group lacks them. They choose the path and bound a dense space, whose
    stream checks every id against them (`graphs.stages.canonical_ids.IdOutsideSpace`)."""
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


def create_edge_views(con, edge_files: list[Path], weighted_files: list[Path], sql_type: str) -> None:
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


def create_id_file_views(con, files: DatasetFiles, sql_type: str) -> tuple[str | None, dict[str, str]]:
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


def refuse_invalid_weights(con, weighted_files: list[Path]) -> None:
    """InputError naming every weighted file with unusable weights, and how many of each kind."""
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


# ----------------------------------------------------------------------------- row counts


@dataclass(frozen=True)
class RowCounts:
    """Rows of the edge files: all, and those dropped for a null id, a self loop or an invalid weight."""

    rows: int
    null_rows: int
    self_loops: int
    invalid_weights: int

    @property
    def valid(self) -> int:
        """Rows kept: neither null nor a self loop nor an invalid weight."""
        return self.rows - self.null_rows - self.self_loops - self.invalid_weights


def code_counts(codes: tuple[np.ndarray, np.ndarray]) -> RowCounts:
    """The row counts of factorized (src, dst) ids (-1 for a null id)."""
    src_codes, dst_codes = codes
    null_rows = int(np.count_nonzero((src_codes < 0) | (dst_codes < 0)))
    self_loops = int(np.count_nonzero((src_codes == dst_codes) & (src_codes >= 0)))
    return RowCounts(rows=len(src_codes), null_rows=null_rows, self_loops=self_loops, invalid_weights=0)


def sql_counts(con, weighted: bool) -> tuple[RowCounts, object, object]:
    """The row counts of `raw_edges`, and its smallest and largest id, in one scan."""
    invalid_weight_sql = f", count(*) FILTER (WHERE {KEPT_ROW_SQL} AND NOT {VALID_WEIGHT_SQL})" if weighted else ""
    rows, null_rows, self_loops, min_id, max_id, *invalid = con.sql(
        "SELECT count(*), count(*) FILTER (WHERE src IS NULL OR dst IS NULL), "
        "count(*) FILTER (WHERE src = dst), least(min(src), min(dst)), greatest(max(src), max(dst))"
        f"{invalid_weight_sql} FROM raw_edges"
    ).fetchall()[0]
    invalid_weights = int(invalid[0]) if invalid else 0
    counts = RowCounts(rows=rows, null_rows=null_rows, self_loops=self_loops, invalid_weights=invalid_weights)
    return counts, min_id, max_id


__all__ = [
    "INT64_MAX",
    "KEPT_ROW_SQL",
    "RowCounts",
    "VALID_WEIGHT_SQL",
    "code_counts",
    "create_edge_views",
    "create_id_file_views",
    "feature_only_id",
    "parquet_id_bounds",
    "parquet_rows",
    "parquet_schema",
    "refuse_invalid_weights",
    "sql_counts",
    "validate_inputs",
]
