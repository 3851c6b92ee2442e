"""Input files as users have them, turned into the ingest's input layout.

The ingest (`graphs.stages.canonical`) reads Parquet files with the layout's column names
(edges: src, dst, weight; nodes: node_id, label, split; features: node_id, feat) and integer
class labels. `prepare_inputs` writes, into a scratch folder, one Parquet file in that layout
for each input that is not in it already, and leaves the others as they are:

- A column mapping, the top-level ``columns`` key of the dataset's gnnflow.yaml
  (`read_column_mapping`, `check_column_mapping`)::

      columns: {src: from_id, dst: to_id, node_id: customer_id, label: segment, weight: amount}

  Any subset of `COLUMN_KEYS`; the values are the user's column names (quoted as DuckDB
  identifiers, never pasted into SQL). A file missing a mapped column is refused naming the
  file, the column and the key. Mapped Parquet files are copied a batch at a time with their
  columns renamed, types kept.
- Text files, read by DuckDB out of core (`graphs.infra.duck.read_csv`) and written as Parquet in
  file order. ``.csv`` (comma-separated) and ``.tsv`` (tab-separated) edge and node files: a
  first row that names a column of the file (the layout's name or the mapped one) is the
  header; without one the columns are positional (`POSITIONAL`: edges src, dst[, weight];
  nodes node_id[, label[, split]]). Ids are read as text, spaces and tabs around them
  trimmed; the ids of all text files are integers when every one is in canonical decimal
  form (`CANONICAL_INT`: an optional minus, no '+', no leading zero, no decimal point, within
  int64), else strings, so ``007`` and ``7`` stay two nodes (`_typed_ids`, one DuckDB
  aggregate per file). The other columns' types are DuckDB's detection: numeric weights,
  labels as integers, floats (whole numbers only, as for Parquet) or categorical values.
  ``.txt`` edge files (SNAP style): whitespace-separated columns, no header, blank lines and
  lines starting with ``#`` or ``%`` skipped; src, dst and an optional weight, the same number
  of columns on every line. A line DuckDB cannot read is named by its number. The readers that
  know nothing of the mapping are `graphs.stages.text_inputs`.
- Categorical labels (strings, booleans, dictionary-encoded values): class index = the position
  of the value among the sorted distinct non-null values, null = unknown; the values are
  returned (`PreparedInputs.label_classes`) for `graphs.formats.label_classes` to store.

Errors name the user's file: `PreparedInputs.explain` turns an InputError the ingest raised
about a written file into one about the file it came from.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from graphs.infra import duck
from graphs.infra.config_checks import MAX_CLASSES, bounded_repr, bounded_text, read_yaml_file
from graphs.stages import landing
from graphs.stages.landing import SETTINGS_FILE, DatasetFiles, InputError, checked_dataset_file, find_dataset_files
from graphs.stages.text_inputs import (
    fetch_table,
    is_number,
    read_error,
    read_first_row,
    single_delimiter,
    strict_read_error,
    whitespace_edges,
    write_relation,
)

# the layout's columns of each kind of input file; a column mapping may rename any of them
KIND_KEYS = {"edges": ("src", "dst", "weight"), "nodes": ("node_id", "label", "split"), "features": ("node_id", "feat")}
COLUMN_KEYS = ("src", "dst", "weight", "node_id", "label", "split", "feat")
REQUIRED = {"edges": ("src", "dst"), "nodes": ("node_id",), "features": ("node_id", "feat")}
# the columns of a text file without a header, in order (the first `len(REQUIRED[kind])` required)
POSITIONAL = {"edges": ("src", "dst", "weight"), "nodes": ("node_id", "label", "split")}
DELIMITERS = {".csv": ",", ".tsv": "\t"}
ID_KEYS = ("src", "dst", "node_id")  # the id columns of the layout
# a text id read as an integer: the canonical decimal form (no '+', no leading zero, no "-0"), in int64
CANONICAL_INT = "0|-?[1-9][0-9]{0,18}"
MAX_COLUMN_NAME = 256
SHOWN_COLUMNS = 20  # columns named in an error message, each cut to MAX_REPR characters
COPY_BATCH_ROWS = 1 << 20  # rows per batch when a mapped Parquet file is copied


# ----------------------------------------------------------------------------- the mapping


def check_column_mapping(value: Any, where: str) -> dict[str, str]:
    """`value` as a column mapping ({layout key: the user's column name}); ValueError naming
    `where` and the key for an unknown key or a name that is no column name."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(
            f"{where}: key 'columns' must be a mapping such as {{src: from_id}}, got {type(value).__name__}"
        )
    mapping = {}
    for key, name in value.items():
        if key not in COLUMN_KEYS:
            raise ValueError(
                f"{where}: key 'columns.{bounded_text(str(key))}' is not a column of the layout; the keys are "
                f"{', '.join(COLUMN_KEYS)}"
            )
        if not isinstance(name, str) or not name or len(name) > MAX_COLUMN_NAME or not name.isprintable():
            raise ValueError(
                f"{where}: key 'columns.{key}': {bounded_repr(name)} is not a column name (printable text of "
                f"1..{MAX_COLUMN_NAME} characters)"
            )
        mapping[key] = name
    for kind, keys in KIND_KEYS.items():
        names = [mapping.get(k, k) for k in keys]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"{where}: key 'columns': {bounded_repr(twice[0])} is the column of two {kind} keys; map each to its own column"
            )
    return mapping


def read_column_mapping(dataset_dir: str | os.PathLike) -> dict[str, str]:
    """The column mapping of a landing folder's gnnflow.yaml ({} when it has none); the file
    passes `graphs.stages.landing`'s rule before it is read. InputError naming the file and key."""
    path = Path(dataset_dir) / SETTINGS_FILE
    if checked_dataset_file(path) is None:
        return {}
    try:
        doc = read_yaml_file(path)
        return check_column_mapping(doc.get("columns") if isinstance(doc, dict) else None, str(path))
    except (OSError, ValueError) as exc:
        raise InputError(str(exc) if isinstance(exc, ValueError) else f"{path}: unreadable: {exc}") from None


def _quoted(name: str) -> str:
    """`name` as a DuckDB identifier (in double quotes, each double quote doubled)."""
    return '"' + name.replace('"', '""') + '"'


def _shown(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN_COLUMNS} more" if len(names) > SHOWN_COLUMNS else ""
    return "[" + ", ".join(bounded_repr(n) for n in names[:SHOWN_COLUMNS]) + "]" + more


def _columns_of(path: Path, kind: str, columns: dict[str, str], present: list[str]) -> list[tuple[str, str]]:
    """(the file's column, the layout's name) of each layout column of a `kind` file that it has;
    InputError naming the file, the column and the key for a mapped or required one it lacks."""
    pairs = []
    for key in KIND_KEYS[kind]:
        name = columns.get(key, key)
        if name in present:
            pairs.append((name, key))
        elif key in columns:
            raise InputError(
                f"{path}: missing column {bounded_repr(name)} (gnnflow.yaml columns.{key}); columns present: "
                f"{_shown(present)}"
            )
        elif key in REQUIRED[kind]:
            raise InputError(
                f"{path}: missing column '{key}' (columns present: {_shown(present)}); name the column {key}, or map "
                f"it in gnnflow.yaml: columns: {{{key}: <your column>}}"
            )
    return pairs


def _is_mapped(kind: str, columns: dict[str, str]) -> bool:
    return any(columns.get(k, k) != k for k in KIND_KEYS[kind])


# ----------------------------------------------------------------------------- prepared inputs


@dataclass
class PreparedInputs:
    """The ingest's inputs in its layout, the user's file of each written one, the label classes."""

    files: DatasetFiles
    sources: dict[str, str] = field(default_factory=dict)  # written file -> the user's file
    label_classes: list | None = None

    def explain(self, exc: InputError) -> InputError:
        """`exc` with each written file's path replaced by the user's file it came from."""
        message = str(exc)
        for written, given in self.sources.items():
            message = message.replace(written, given)
        return exc if message == str(exc) else InputError(message)

    def given_name(self, name: str) -> str:
        """The user's file name of an input file named `name` (itself when it was not written)."""
        for written, given in self.sources.items():
            if Path(written).name == name:
                return Path(given).name
        return name


def prepare_inputs(
    files: DatasetFiles, columns: dict[str, str], scratch: Path, *, memory_limit: str = "4GB", threads: int = 0
) -> PreparedInputs:
    """The inputs of `files` in the ingest's layout (see the module docstring): files already in
    it are kept, the others written into `scratch` (created)."""
    out = _Converter(scratch, columns, memory_limit, threads)
    try:
        edges = [out.edges(p, i) for i, p in enumerate(files.edge_files)]
        nodes = out.nodes(files.nodes) if files.nodes is not None else None
        features = out.features(files.features) if files.features is not None else None
    finally:
        out.close()
    prepared = DatasetFiles(edges, nodes, features)
    _ids_as_strings_if_any(prepared, out.integer_ids, memory_limit, threads)
    return PreparedInputs(prepared, out.sources, out.label_classes)


class _Converter:
    """Writes inputs in the layout into a scratch folder; one DuckDB connection, opened when a
    text file needs it, rows kept in file order."""

    def __init__(self, scratch: Path, columns: dict[str, str], memory_limit: str, threads: int):
        self.scratch, self.columns = scratch, columns
        self.memory_limit, self.threads = memory_limit, threads
        self.sources: dict[str, str] = {}
        self.label_classes: list | None = None
        self.integer_ids: list[Path] = []  # written files whose text ids were all integers
        self._con = None

    def con(self):
        if self._con is None:
            self.scratch.mkdir(parents=True, exist_ok=True)
            self._con = duck.connect(self.memory_limit, threads=self.threads, temp_directory=self.scratch / "duckdb")
            self._con.execute("SET preserve_insertion_order = true")
        return self._con

    def close(self) -> None:
        if self._con is not None:
            self._con.close()

    def _target(self, path: Path, name: str) -> Path:
        self.scratch.mkdir(parents=True, exist_ok=True)
        target = self.scratch / name
        self.sources[str(target)] = str(path)
        return target

    def edges(self, path: Path, i: int) -> Path:
        if path.suffix == ".parquet":
            return self._renamed_parquet(path, "edges", f"edges_{i:06d}.parquet")
        target = self._target(path, f"edges_{i:06d}.parquet")
        if path.suffix == ".txt":
            self._whitespace(path, target)
        else:
            write_relation(self._typed_ids(self._text(path, "edges"), path, target), target, path)
        return target

    def _typed_ids(self, rel, path: Path, target: Path):
        """`rel` (a text file's layout columns, ids as trimmed text) with its ids cast to BIGINT
        when every one is in canonical integer form (`CANONICAL_INT`), else as they are; the
        written file is noted in `integer_ids`. One aggregate over the file."""
        ids = [c for c in rel.columns if c in ID_KEYS]
        bad = " OR ".join(_not_canonical_sql(c) for c in ids)
        try:
            (strings,) = rel.aggregate(f"count(*) FILTER (WHERE {bad})").fetchall()[0]
        except duckdb.Error as exc:
            raise read_error(path, exc) from None
        if strings:
            return rel
        self.integer_ids.append(target)
        return rel.project(", ".join(f"CAST({c} AS BIGINT) AS {c}" if c in ids else c for c in rel.columns))

    def _whitespace(self, path: Path, target: Path) -> None:
        """A .txt edge list as Parquet: by DuckDB's CSV reader when its first lines use one
        delimiter (a tab or a space) and one comment character, else (or when that read fails
        further on) by the general whitespace reader, whose errors name the line."""
        dialect = single_delimiter(path)
        if dialect is not None:
            delimiter, comment, types = dialect
            rel = duck.read_csv(
                self.con(),
                path,
                delimiter=delimiter,
                comment=comment,
                header=False,
                columns=dict(zip(POSITIONAL["edges"], types)),
                auto_detect=False,
                quotechar="",
                escapechar="",
            )
            try:
                write_relation(self._typed_ids(rel.project(_trimmed_ids(rel.columns)), path, target), target, path)
                return
            except InputError:
                self.integer_ids = [p for p in self.integer_ids if p != target]
                # the general reader below reads the whole file again, naming the line at fault
        write_relation(self._typed_ids(whitespace_edges(self.con(), path), path, target), target, path)

    def nodes(self, path: Path) -> Path:
        if path.suffix == ".parquet":
            schema = _schema_or_none(path)
            if schema is None or not (_is_mapped("nodes", self.columns) or _categorical_label(schema, self.columns)):
                return path  # in the layout (or unreadable: the ingest names it)
            pairs = _columns_of(path, "nodes", self.columns, schema.names)
            table = pq.read_table(path, columns=[c for c, _ in pairs]).rename_columns([k for _, k in pairs])
        else:
            table = fetch_table(
                self._typed_ids(self._text(path, "nodes"), path, self.scratch / landing.NODES_FILE), path
            )
        if "label" in table.column_names and _is_categorical(table.schema.field("label").type):
            indices, self.label_classes = class_indices(table.column("label"), path)
            table = table.set_column(table.column_names.index("label"), "label", indices)
        target = self._target(path, landing.NODES_FILE)
        pq.write_table(table, target)
        return target

    def features(self, path: Path) -> Path:
        return self._renamed_parquet(path, "features", landing.FEATURES_FILE)

    def _renamed_parquet(self, path: Path, kind: str, name: str) -> Path:
        """`path` itself when no mapped name applies to `kind`, else a copy with the columns renamed."""
        schema = _schema_or_none(path)
        if schema is None or not _is_mapped(kind, self.columns):
            return path
        pairs = _columns_of(path, kind, self.columns, schema.names)
        target = self._target(path, name)
        renamed = pa.schema([schema.field(c).with_name(k) for c, k in pairs])
        with pq.ParquetWriter(target, renamed) as writer:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=COPY_BATCH_ROWS, columns=[c for c, _ in pairs]):
                writer.write_batch(pa.RecordBatch.from_arrays(batch.columns, schema=renamed))
        return target

    def _text(self, path: Path, kind: str):
        """A relation of a .csv / .tsv file's layout columns (header or positional, see the module
        docstring), the ids as text with spaces and tabs around them trimmed (`_typed_ids` types them)."""
        if path.stat().st_size == 0:
            raise InputError(f"{path}: file is empty (0 bytes)")
        con, delimiter = self.con(), DELIMITERS[path.suffix]
        first_row = read_first_row(path, delimiter)
        header = bool(set(first_row) & {self.columns.get(k, k) for k in KIND_KEYS[kind]})
        try:
            if header:
                rel = duck.read_csv(con, path, delimiter=delimiter, header=True)
                pairs = _columns_of(path, kind, self.columns, rel.columns)
                ids_as_text = {c: "VARCHAR" for c, k in pairs if k in ID_KEYS}
                rel = duck.read_csv(con, path, delimiter=delimiter, header=True, dtype=ids_as_text)
            else:
                rel = self._positional(path, kind, delimiter, first_row)
                pairs = [(c, c) for c in rel.columns]
        except duckdb.Error as exc:  # DuckDB could not detect the dialect: a strict read names the line
            raise read_error(path, strict_read_error(con, path, delimiter, header, len(first_row)) or exc) from None
        return rel.project(", ".join(f"{_quoted(c)} AS {k}" for c, k in pairs)).project(
            _trimmed_ids([k for _, k in pairs])
        )

    def _positional(self, path: Path, kind: str, delimiter: str, first_row: list[str]):
        """A header-less text file's relation with its columns named by position; InputError when
        its first row looks like a header (named columns of other types, not all numbers, such
        as 007 or 0x7, that DuckDB's sniffer may take for names) or the count is wrong."""
        mapped = [k for k in KIND_KEYS[kind] if k in self.columns]
        if mapped:
            key = mapped[0]
            raise InputError(
                f"{path}: missing column {bounded_repr(self.columns[key])} (gnnflow.yaml columns.{key}); the first "
                f"row, {_shown(first_row)}, names no mapped column"
            )
        names, width = POSITIONAL[kind], len(first_row)
        if not len(REQUIRED[kind]) <= width <= len(names):
            raise InputError(
                f"{path}: {width} columns and no header row; a {kind} file without a header has the columns "
                f"{', '.join(names[: len(REQUIRED[kind])])} (and optionally {', '.join(names[len(REQUIRED[kind]) :])}) "
                "in this order, or a header row naming them"
            )
        con = self.con()
        sniffed = duck.read_csv(con, path, delimiter=delimiter)
        if (
            sniffed.columns != [f"column{i}" for i in range(len(sniffed.columns))]
            and any(str(t) != "VARCHAR" for t in sniffed.types)
            and not all(map(is_number, first_row))
        ):
            raise InputError(
                f"{path}: the first row {_shown(first_row)} looks like a header but names none of the columns "
                f"{', '.join(KIND_KEYS[kind])}; rename them, or map them in gnnflow.yaml, e.g. columns: "
                f"{{{KIND_KEYS[kind][0]}: <your column>}}"
            )
        ids_as_text = {k: "VARCHAR" for k in names[:width] if k in ID_KEYS}
        return duck.read_csv(con, path, delimiter=delimiter, header=False, names=list(names[:width]), dtype=ids_as_text)


def _trimmed_ids(columns: list[str]) -> str:
    """A projection of these layout columns with each id's spaces and tabs around it trimmed
    (an id of only those is null, as an empty field is)."""
    return ", ".join(f"nullif(trim({c}, ' \t'), '') AS {c}" if c in ID_KEYS else c for c in columns)


def _not_canonical_sql(column: str) -> str:
    """SQL true for a text id in `column` that is not a canonical int64 (`CANONICAL_INT`)."""
    canonical = f"regexp_full_match({column}, '{CANONICAL_INT}') AND TRY_CAST({column} AS BIGINT) IS NOT NULL"
    return f"({column} IS NOT NULL AND NOT ({canonical}))"


def _ids_as_strings_if_any(files: DatasetFiles, integer_ids: list[Path], memory_limit: str, threads: int) -> None:
    """When any input holds string ids, rewrite the written files whose text ids were all
    integers with those ids as strings (their text, unchanged: it was canonical), so a dataset's
    text files never mix integer and string ids."""
    paths = [p for p in files.edge_files + [files.nodes, files.features] if p is not None]
    if not integer_ids or all(p in integer_ids or not _has_string_ids(p) for p in paths):
        return
    con = duck.connect(memory_limit, threads=threads, temp_directory=integer_ids[0].parent / "duckdb")
    try:
        con.execute("SET preserve_insertion_order = true")
        for path in integer_ids:
            rel = duck.read_parquet(con, [path])
            cast = ", ".join(f"CAST({c} AS VARCHAR) AS {c}" if c in ID_KEYS else c for c in rel.columns)
            rel.project(cast).write_parquet(str(path.with_suffix(".strings")))
            path.with_suffix(".strings").replace(path)
    finally:
        con.close()


def _has_string_ids(path: Path) -> bool:
    schema = _schema_or_none(path)
    return schema is not None and any(
        pa.types.is_string(f.type) or pa.types.is_large_string(f.type) for f in schema if f.name in ID_KEYS
    )


def _schema_or_none(path: Path) -> pa.Schema | None:
    try:
        return pq.read_schema(path)
    except Exception:  # an empty or corrupt file: the ingest refuses it by name
        return None


# ----------------------------------------------------------------------------- labels


def _is_categorical(t: pa.DataType) -> bool:
    return (
        pa.types.is_dictionary(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_string_view(t)
    )


def _categorical_label(schema: pa.Schema, columns: dict[str, str]) -> bool:
    name = columns.get("label", "label")
    return name in schema.names and _is_categorical(schema.field(name).type)


def class_indices(labels: pa.ChunkedArray, path: Path) -> tuple[pa.ChunkedArray, list]:
    """(int32 class index of each categorical label, null where the label is null; the class
    values): class i is the i-th of the sorted distinct non-null values."""
    if pa.types.is_dictionary(labels.type):
        labels = labels.cast(labels.type.value_type)
    classes = pc.unique(labels).drop_null()
    classes = classes.take(pc.sort_indices(classes))
    if len(classes) > MAX_CLASSES:
        raise InputError(
            f"{path}: column 'label' holds {len(classes)} distinct values; at most {MAX_CLASSES} classes are "
            "supported (is this the label column? map another in gnnflow.yaml columns: {label: <column>})"
        )
    return pc.index_in(labels, value_set=classes).cast(pa.int32()), classes.to_pylist()


# ----------------------------------------------------------------------------- the sensor's question


def landing_has_labels(dataset_dir: str | os.PathLike) -> bool:
    """Whether a landing folder's node file holds at least one known label (non-null and, for
    integer labels, >= 0), honouring its gnnflow.yaml column mapping and any node file format.
    True when the files or the mapping cannot be read (the ingest then fails naming them)."""
    try:
        files = find_dataset_files(dataset_dir)
        if files.typed:  # the target type's file, by name (a typed graph maps no columns)
            with tempfile.TemporaryDirectory(prefix="gnnflow-labels-") as scratch:
                nodes = _Converter(Path(scratch), {}, "1GB", 1)
                try:
                    return any(_known_label(nodes, path) for path in files.node_type_files)
                finally:
                    nodes.close()
        if files.nodes is None:
            return False
        columns = read_column_mapping(dataset_dir)
        with tempfile.TemporaryDirectory(prefix="gnnflow-labels-") as scratch:
            nodes = _Converter(Path(scratch), columns, "1GB", 1)
            try:
                return _known_label(nodes, files.nodes)
            finally:
                nodes.close()
    except Exception:  # unreadable: let the run fail with the ingest stage's clear message
        return True


def _known_label(converter: _Converter, path: Path) -> bool:
    name = converter.columns.get("label", "label")
    if path.suffix == ".parquet":
        schema = pq.read_schema(path)
        if name not in schema.names:
            return False
        labels = pq.read_table(path, columns=[name]).column(0)
    else:
        table = fetch_table(converter._text(path, "nodes"), path)
        if "label" not in table.column_names:
            return False
        labels = table.column("label")
    if _is_categorical(labels.type):
        return labels.null_count < len(labels)
    if pa.types.is_floating(labels.type):
        labels = pc.if_else(pc.is_nan(labels), None, labels)
    top = pc.max(labels).as_py()
    return top is not None and top >= 0


__all__ = [
    "COLUMN_KEYS",
    "PreparedInputs",
    "check_column_mapping",
    "class_indices",
    "landing_has_labels",
    "prepare_inputs",
    "read_column_mapping",
]
