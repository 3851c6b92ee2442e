"""A typed graph's landing files (node types and relations), checked and written in the ingest's
layout over one homogeneous id space, as DGL stores a heterogeneous graph underneath.

A dataset folder is typed exactly when it has a ``nodes/`` folder (`graphs.stages.landing`). Its
files (Parquet only; ids of any kind per node type, integers or strings):

    nodes/<type>.parquet      node_id (one row per node of that type), optional label (on one node
                              type only: the target of node classification; integers, strings or
                              booleans, as nodes.parquet's), optional split (its words), optional
                              ``feat`` (list of floats, one width per type)
    features/<type>.parquet   node_id, feat: a type's features in a file of their own (not both)
    edges/<src_type>__<relation>__<dst_type>.parquet
                              src (ids of src_type), dst (ids of dst_type), optional weight;
                              every edge file follows this name pattern

Node type and relation names are 1-64 letters, digits, ``_`` or ``-`` without ``__``
(`graphs.formats.graph_schema`). With ``add_reverse`` every relation r = (s, name, d) gets its
reverse (d, ``rev-<name>``, s), as DGL's examples name them.

Refused with the file, column and value named: an edge file whose name is not a relation key or
names an unknown node type; an id column of another kind than its node type's node_id; an edge
endpoint, feature row or label absent from its node type's file; a node listed twice; labels on
two node types; a feature width that varies within a type; a weight that is not finite and > 0.
Rows with a null endpoint are dropped and counted.

Global ids: node types in name order, each type's nodes in sorted id order, so type t's nodes
are ``offset[t] .. offset[t] + count[t] - 1``. `prepare_typed` writes, into a scratch folder,
the union of the relations in the ingest's layout (edges over global ids, directed; the target
type's labels and splits; features padded with zeros to the widest type's width, featureless
types all zeros) and the relation multigraph, and `write_typed_files` adds to the canonical
folder (once the ingest has written it):

    types.json            the schema: node types in index order with ``count``, ``offset``,
                          ``feat_width`` (0 = none), ``id_kind``; relations in index order with
                          ``key``, ``edges``, ``reverse_of`` (a relation key or null); ``target``
                          (the labelled node type or null); `TypedSchema` reads it
    typed_edges.parquet   src int64, dst int64, etype int16 (the relation index)[, weight
                          float64]: every relation's edges, deduplicated per relation and
                          without self loops, sorted by (dst, src, etype); the edges.parquet
                          beside it is their homogeneous view (one edge per distinct pair)
    nodes.parquet         as for any graph, with ``original_id`` the user's id (strings when the
                          types' id kinds differ) and ``node_type`` (the type's name)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.graph_schema import REVERSE_PREFIX, GraphSchema, Relation, TypedSchema, check_type_name
from graphs.infra import duck
from graphs.infra.config_checks import bounded_repr
from graphs.stages.canonical_inputs import id_kind
from graphs.stages.landing import EDGES_FILE, FEATURES_FILE, NODES_FILE, DatasetFiles, InputError

__all__ = ["PreparedTyped", "TypedSchema", "prepare_typed", "write_typed_files"]

TYPES_FILE = CanonicalGraph.TYPES
TYPED_EDGES_FILE = CanonicalGraph.TYPED_EDGES
_AGGREGATES = {"sum": "sum(weight)", "max": "max(weight)", "mean": "avg(weight)", "first": "arg_min(weight, k)"}


@dataclass
class PreparedTyped:
    """The union in the ingest's layout, and what `write_typed_files` adds afterwards."""

    files: DatasetFiles
    typed: TypedSchema
    typed_edges: Path
    original_ids: pa.ChunkedArray  # the user's id of every global id, in global order
    type_names: pa.Array  # the node type of every global id (dictionary-encoded)
    facts: dict = field(default_factory=dict)  # summary["typed"]


def _schema_of(path: Path, required: tuple[str, ...]) -> pa.Schema:
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
    missing = [c for c in required if c not in schema.names]
    if missing:
        raise InputError(f"{path}: missing column(s) {missing}; a typed graph's file needs {list(required)}")
    return schema


def _type_name(path: Path) -> str:
    try:
        return check_type_name("node type", path.name[: -len(".parquet")])
    except ValueError as exc:
        raise InputError(f"{path}: {exc}") from None


def _relations(files: DatasetFiles, node_types: tuple[str, ...]) -> list[tuple[Relation, Path]]:
    out = []
    for path in files.edge_files:
        if path.parent.name != "edges" or path.suffix != ".parquet":
            raise InputError(
                f"{path}: a typed graph's edges are edges/<src_type>__<relation>__<dst_type>.parquet, one file each"
            )
        try:
            rel = Relation.from_key(path.name[: -len(".parquet")])
        except ValueError as exc:
            raise InputError(f"{path}: {exc}") from None
        for t in (rel.src_type, rel.dst_type):
            if t not in node_types:
                raise InputError(f"{path}: names node type {t!r}, which has no file nodes/{t}.parquet")
        out.append((rel, path))
    if not out:
        raise InputError(f"{files.node_type_files[0].parent.parent}: a typed graph needs edges/<key>.parquet files")
    return sorted(out, key=lambda rp: rp[0].key)


def _one(con, sql: str, params: list | None = None) -> tuple | None:
    """The first row of a query, the result consumed (DuckDB refuses new work on an unfinished one)."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0] if rows else None


class _Ingest:
    """One DuckDB connection over the typed files; tables are named by index, never by a user's name."""

    def __init__(self, files: DatasetFiles, scratch: Path, out_dir: Path, memory_limit: str, threads: int):
        self.files, self.scratch, self.out_dir = files, scratch, out_dir
        self.con = duck.connect(memory_limit, threads=threads, temp_directory=scratch / "duckdb")
        self.types: dict[str, Path] = {}
        for path in files.node_type_files:
            self.types[_type_name(path)] = path
        self.names = tuple(sorted(self.types))
        self.schemas = {t: _schema_of(p, ("node_id",)) for t, p in self.types.items()}
        self.kinds = tuple(id_kind(self.types[t], self.schemas[t], "node_id") for t in self.names)
        self.counts: list[int] = []

    def node_ids(self) -> None:
        """Table ids_i (id, gid) per node type i; InputError for a null or repeated id."""
        offset = 0
        for i, t in enumerate(self.names):
            path = self.types[t]
            duck.read_parquet(self.con, [path]).project("node_id").create_view(f"node_file_{i}")
            nulls, dup = _one(
                self.con,
                f"SELECT count(*) FILTER (WHERE node_id IS NULL), "
                f"(SELECT node_id FROM node_file_{i} GROUP BY node_id HAVING count(*) > 1 ORDER BY node_id LIMIT 1) "
                f"FROM node_file_{i}",
            )
            if nulls:
                raise InputError(f"{path}: column 'node_id' has {nulls} null values")
            if dup is not None:
                raise InputError(f"{path}: column 'node_id' repeats the id {bounded_repr(dup)}; one row per node")
            self.con.execute(
                f"CREATE TABLE ids_{i} AS SELECT node_id AS id, "
                f"CAST(row_number() OVER (ORDER BY node_id) - 1 + ? AS BIGINT) AS gid FROM node_file_{i}",
                [offset],
            )
            count = _one(self.con, f"SELECT count(*) FROM ids_{i}")[0]
            if count == 0:
                raise InputError(f"{path}: no nodes")
            self.counts.append(int(count))
            offset += int(count)

    def check_ids(self, view: str, path: Path, column: str, type_index: int, schema: pa.Schema) -> None:
        """InputError unless every non-null id of `view`.`column` is a node of type `type_index`."""
        kind = id_kind(path, schema, column)
        if kind != self.kinds[type_index]:
            t = self.names[type_index]
            raise InputError(
                f"{path}: column {column!r} holds {kind} ids, nodes/{t}.parquet's node_id {self.kinds[type_index]} ids"
            )
        missing = _one(
            self.con,
            f"SELECT v.{column} FROM {view} v ANTI JOIN ids_{type_index} i ON v.{column} = i.id "
            f"WHERE v.{column} IS NOT NULL ORDER BY v.{column} LIMIT 1",
        )
        if missing is not None:
            t = self.names[type_index]
            raise InputError(
                f"{path}: column {column!r} holds the id {bounded_repr(missing[0])}, which nodes/{t}.parquet does not list"
            )

    def relation(self, r: int, rel: Relation, path: Path, weighted: bool, drop_invalid: bool) -> dict:
        """Table rel_r (src, dst gids[, weight], k the row's place) of one relation file; its facts."""
        schema = _schema_of(path, ("src", "dst"))
        cols = "src, dst" + (", weight" if "weight" in schema.names else "")
        duck.read_parquet(self.con, [path], file_row_number=True).project(f"{cols}, file_row_number AS k").create_view(
            f"edge_file_{r}"
        )
        s, d = self.names.index(rel.src_type), self.names.index(rel.dst_type)
        self.check_ids(f"edge_file_{r}", path, "src", s, schema)
        self.check_ids(f"edge_file_{r}", path, "dst", d, schema)
        has_weight = "weight" in schema.names
        if (
            has_weight
            and not pa.types.is_integer(schema.field("weight").type)
            and not pa.types.is_floating(schema.field("weight").type)
        ):
            raise InputError(f"{path}: column 'weight' is {schema.field('weight').type}; weights are numbers")
        weight = "CAST(e.weight AS DOUBLE)" if has_weight else "1.0"
        valid = "w IS NOT NULL AND isfinite(w) AND w > 0"
        self.con.execute(
            f"CREATE TABLE rel_{r} AS SELECT s.gid AS src, d.gid AS dst, {weight} AS w, e.k AS k "
            f"FROM edge_file_{r} e JOIN ids_{s} s ON e.src = s.id JOIN ids_{d} d ON e.dst = d.id"
        )
        rows, kept, invalid = _one(
            self.con,
            f"SELECT (SELECT count(*) FROM edge_file_{r}), count(*), count(*) FILTER (WHERE NOT ({valid})) FROM rel_{r}",
        )
        if invalid and not drop_invalid:
            raise InputError(
                f"{path}: column 'weight' holds {invalid} values that are null, not finite or <= 0; "
                "weights must be finite and > 0 (or set invalid_weights: drop)"
            )
        if invalid:
            self.con.execute(f"DELETE FROM rel_{r} WHERE NOT ({valid})")
        return {"rows": int(rows), "dropped_null_id": int(rows - kept), "dropped_invalid_weight": int(invalid)}

    def close(self) -> None:
        self.con.close()


def prepare_typed(
    files: DatasetFiles,
    scratch: Path,
    *,
    memory_limit: str,
    threads: int,
    add_reverse: bool,
    weight_combine: str,
    out_dir: Path,
    drop_invalid_weights: bool = False,
) -> PreparedTyped:
    """The typed graph of `files` (module docstring) in the ingest's layout, written into
    `scratch` (created); typed_edges.parquet straight into the canonical folder `out_dir`."""
    if files.nodes is not None or files.features is not None or files.graphs is not None:
        extra = next(p for p in (files.nodes, files.features, files.graphs) if p is not None)
        raise InputError(f"{extra}: a typed graph keeps its node files in nodes/ and features/; remove it")
    scratch.mkdir(parents=True)
    ingest = _Ingest(files, scratch, out_dir, memory_limit, threads)
    try:
        ingest.node_ids()
        relations = _relations(files, ingest.names)
        given = [rel for rel, _ in relations]
        schemas = {path: _schema_of(path, ("src", "dst")) for _, path in relations}
        weighted = any("weight" in s.names for s in schemas.values())
        rel_facts = {
            rel.key: ingest.relation(r, rel, path, weighted, drop_invalid_weights)
            for r, (rel, path) in enumerate(relations)
        }
        reverse = _reverse_relations(given) if add_reverse else []
        schema = GraphSchema(ingest.names, tuple(given + reverse))
        target, label_facts = _labels(ingest)
        widths = _feature_widths(ingest, files)
        typed_edges, edges_out, per_relation = _write_edges(ingest, len(given), len(reverse), weighted, weight_combine)
        nodes_out = _write_nodes(ingest, target)
        features_out = _write_features(ingest, widths)
        original_ids, type_names = _original_ids(ingest)
    finally:
        ingest.close()
    typed = TypedSchema(schema, tuple(ingest.counts), tuple(widths), target, tuple(per_relation), ingest.kinds)
    facts = {
        "node_types": dict(zip(ingest.names, ingest.counts)),
        "relations": {r.key: int(e) for r, e in zip(schema.relations, per_relation)},
        "relation_files": rel_facts,
        "add_reverse": add_reverse,
        "target": target,
        "feat_widths": dict(zip(ingest.names, widths)),
        **label_facts,
    }
    out = DatasetFiles([edges_out], nodes_out, features_out)
    return PreparedTyped(out, typed, typed_edges, original_ids, type_names, facts)


def _reverse_relations(given: list[Relation]) -> list[Relation]:
    reverse = []
    for rel in given:
        name = f"{REVERSE_PREFIX}{rel.name}"
        try:
            rev = Relation(rel.dst_type, name, rel.src_type)
        except ValueError as exc:
            raise InputError(f"add_reverse: relation {rel.key!r} has no valid reverse ({exc})") from None
        if rev in given:
            raise InputError(
                f"add_reverse: edges/{rev.key}.parquet is given and would also be {rel.key!r}'s reverse; "
                "rename one of them or leave add_reverse off"
            )
        reverse.append(rev)
    return reverse


def _labels(ingest: _Ingest) -> tuple[str | None, dict]:
    labelled = [t for t in ingest.names if "label" in ingest.schemas[t].names]
    if len(labelled) > 1:
        shown = ", ".join(f"nodes/{t}.parquet" for t in labelled)
        raise InputError(
            f"{shown}: labels on {len(labelled)} node types; keep the label column of the target type only"
        )
    return (labelled[0] if labelled else None), {"labelled_type": labelled[0] if labelled else None}


def _feature_widths(ingest: _Ingest, files: DatasetFiles) -> list[int]:
    """Each type's feature width (0 = none); view feat_i (gid, feat) per featured type."""
    extra = {}
    for path in files.feature_type_files:
        t = _type_name(path)
        if t not in ingest.types:
            raise InputError(f"{path}: node type {t!r} has no file nodes/{t}.parquet")
        if "feat" in ingest.schemas[t].names:
            raise InputError(f"{path}: nodes/{t}.parquet has a 'feat' column too; give a type's features once")
        extra[t] = path
    widths = []
    for i, t in enumerate(ingest.names):
        path = extra.get(t, ingest.types[t] if "feat" in ingest.schemas[t].names else None)
        if path is None:
            widths.append(0)
            continue
        schema = _schema_of(path, ("node_id", "feat"))
        ft = schema.field("feat").type
        if not (pa.types.is_list(ft) or pa.types.is_large_list(ft) or pa.types.is_fixed_size_list(ft)) or not (
            pa.types.is_floating(ft.value_type) or pa.types.is_integer(ft.value_type)
        ):
            raise InputError(f"{path}: column 'feat' is {ft}; features are a list of numbers per node")
        duck.read_parquet(ingest.con, [path]).project("node_id, feat").create_view(f"feat_file_{i}")
        if path != ingest.types[t]:
            ingest.check_ids(f"feat_file_{i}", path, "node_id", i, schema)
        low, high, nulls, rows, distinct = _one(
            ingest.con,
            f"SELECT min(len(feat)), max(len(feat)), count(*) FILTER (WHERE feat IS NULL), count(*), "
            f"count(DISTINCT node_id) FROM feat_file_{i}",
        )
        if nulls:
            raise InputError(f"{path}: column 'feat' has {nulls} null rows; give every row its features")
        if low != high:
            raise InputError(f"{path}: column 'feat' has lists of {low} to {high} values; one width per node type")
        if distinct != rows:
            raise InputError(f"{path}: column 'node_id' repeats ids; one feature row per node")
        if not low:
            raise InputError(f"{path}: column 'feat' holds empty lists")
        ingest.con.execute(
            f"CREATE VIEW feat_{i} AS SELECT n.gid, f.feat FROM feat_file_{i} f JOIN ids_{i} n ON f.node_id = n.id"
        )
        widths.append(int(low))
    return widths


def _write_edges(ingest: _Ingest, given: int, reverse: int, weighted: bool, combine: str) -> tuple[Path, Path, list]:
    """typed_edges.parquet (module docstring) and the ingest's edges.parquet; edges per relation."""
    con = ingest.con
    agg = _AGGREGATES[combine]
    parts = []
    for r in range(given):
        con.execute(
            f"CREATE TABLE typed_{r} AS SELECT src, dst, {agg.replace('weight', 'w')} AS weight "
            f"FROM rel_{r} WHERE src <> dst GROUP BY src, dst"
        )
        parts.append(f"SELECT src, dst, CAST({r} AS SMALLINT) AS etype, weight FROM typed_{r}")
    for r in range(reverse):
        parts.append(f"SELECT dst AS src, src AS dst, CAST({given + r} AS SMALLINT) AS etype, weight FROM typed_{r}")
    counts = [_one(con, f"SELECT count(*) FROM typed_{r}")[0] for r in range(given)]
    counts = counts + counts[:reverse]
    cols = "src, dst, etype" + (", weight" if weighted else "")
    typed = ingest.out_dir / TYPED_EDGES_FILE
    con.sql(f"SELECT {cols} FROM ({' UNION ALL '.join(parts)}) ORDER BY dst, src, etype").write_parquet(str(typed))
    rows = " UNION ALL ".join(f"SELECT src, dst, w AS weight, k, {r} AS f FROM rel_{r}" for r in range(given))
    edges = ingest.scratch / EDGES_FILE
    con.sql(f"SELECT src, dst{', weight' if weighted else ''} FROM ({rows}) ORDER BY f, k").write_parquet(str(edges))
    return typed, edges, [int(c) for c in counts]


def _write_nodes(ingest: _Ingest, target: str | None) -> Path:
    """The ingest's nodes.parquet: every global id, with the target type's label and split."""
    con = ingest.con
    path = ingest.scratch / NODES_FILE
    parts = []
    has_split = target is not None and "split" in ingest.schemas[target].names
    for i, t in enumerate(ingest.names):
        if t == target:
            duck.read_parquet(con, [ingest.types[t]]).create_view("target_file")
            split = ", CAST(f.split AS VARCHAR) AS split" if has_split else ""
            parts.append(
                f"SELECT n.gid AS node_id, f.label AS label{split} FROM ids_{i} n JOIN target_file f ON f.node_id = n.id"
            )
        else:
            parts.append(f"SELECT gid AS node_id, NULL AS label{', NULL AS split' if has_split else ''} FROM ids_{i}")
    if target is None:
        con.sql(" UNION ALL ".join(f"SELECT gid AS node_id FROM ids_{i}" for i in range(len(ingest.names)))).order(
            "node_id"
        ).write_parquet(str(path))
        return path
    # the target first, so the union takes its label's type (NULL of the other types adapts)
    first = ingest.names.index(target)
    ordered = [parts[first]] + [p for i, p in enumerate(parts) if i != first]
    con.sql(f"SELECT * FROM ({' UNION ALL '.join(ordered)}) ORDER BY node_id").write_parquet(str(path))
    return path


def _write_features(ingest: _Ingest, widths: list[int]) -> Path | None:
    """The ingest's features.parquet: every featured type's rows, zero-padded to the widest width;
    featureless types get zero rows too, so features.npy has one row per node."""
    width = max(widths)
    if width == 0:
        return None
    path = ingest.scratch / FEATURES_FILE
    list_type = pa.list_(pa.float32(), width)
    schema = pa.schema([("node_id", pa.int64()), ("feat", list_type)])
    with pq.ParquetWriter(path, schema) as writer:
        for i, w in enumerate(widths):
            if w == 0:
                gid = ingest.con.sql(f"SELECT gid FROM ids_{i} ORDER BY gid").fetchnumpy()["gid"]
                rows = np.zeros((len(gid), width), dtype=np.float32)
                writer.write_table(_feature_table(gid, rows, list_type))
                continue
            reader = ingest.con.sql(f"SELECT gid, feat FROM feat_{i} ORDER BY gid").to_arrow_reader(1 << 16)
            for batch in reader:
                gid = batch.column(0).to_numpy()
                values = batch.column(1).flatten().to_numpy(zero_copy_only=False).astype(np.float32)
                rows = np.zeros((len(gid), width), dtype=np.float32)
                rows[:, :w] = values.reshape(len(gid), w)
                writer.write_table(_feature_table(gid, rows, list_type))
    return path


def _feature_table(gid: np.ndarray, rows: np.ndarray, list_type: pa.DataType) -> pa.Table:
    feat = pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), list_type.list_size)
    return pa.table({"node_id": pa.array(np.asarray(gid, dtype=np.int64)), "feat": feat})


def _original_ids(ingest: _Ingest) -> tuple[pa.ChunkedArray, pa.Array]:
    """The user's id of every global id (strings when the types' id kinds differ) and its type."""
    as_text = len(set(ingest.kinds)) > 1
    parts = []
    for i in range(len(ingest.names)):
        ids = ingest.con.sql(f"SELECT id FROM ids_{i} ORDER BY gid").arrow().read_all().column(0)
        parts.append(
            ids.cast(pa.string()) if as_text else ids.cast(pa.int64() if ingest.kinds[i] == "int" else pa.string())
        )
    types = np.repeat(np.arange(len(ingest.names), dtype=np.int32), ingest.counts)
    names = pa.DictionaryArray.from_arrays(pa.array(types), pa.array(list(ingest.names)))
    return pa.chunked_array([c for p in parts for c in p.chunks], type=parts[0].type), names


def write_typed_files(tmp: Path, prepared: PreparedTyped, summary: dict) -> None:
    """types.json into the canonical folder `tmp` (typed_edges.parquet is there already), the user's ids and the
    node types into its nodes.parquet, and the typed facts into `summary`."""
    typed = prepared.typed
    total = int(sum(typed.counts))
    if int(summary["nodes"]) != total:
        raise AssertionError(f"the ingest kept {summary['nodes']} nodes of the typed graph's {total}")
    (tmp / TYPES_FILE).write_text(json.dumps(typed.to_json(), indent=1) + "\n")
    nodes = pq.read_table(tmp / NODES_FILE)
    nodes = nodes.set_column(nodes.column_names.index("original_id"), "original_id", prepared.original_ids)
    nodes = nodes.append_column("node_type", prepared.type_names)
    pq.write_table(nodes, tmp / NODES_FILE)
    if typed.target is not None:  # the other types' rows carry no label or split: not the user's nulls
        others = total - typed.counts[typed.schema.node_types.index(typed.target)]
        for key in ("null_labels_as_unknown", "null_splits_as_other"):
            if summary.get(key):
                summary[key] = max(int(summary[key]) - others, 0)
    summary["typed"] = prepared.facts
    summary["typed_edges"] = int(sum(typed.relation_edges))
