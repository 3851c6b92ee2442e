"""A graph collection's landing files (many small graphs, e.g. molecules), checked and written as
the disjoint union of its graphs, which the canonical ingest then reads like any graph.

A dataset folder is a graph collection exactly when it holds ``graphs.parquet``. Its files
(Parquet only; ids of any type, one kind per column across the files):

    graphs.parquet   graph_id, optional label (an integer, string or boolean class, a float
                     target, or a list of binary labels, one per task: 0 / 1 or booleans, the
                     same length in every row; null = missing, per task too), optional split (words as for nodes, e.g. train /
                     valid / test); without a split, labelled graphs are split by the ingest's
                     seeded ``train_fraction`` / ``val_fraction``
    nodes.parquet    graph_id, node_id (local to its graph), optional ``feat`` (list of floats,
                     one width); every integer or boolean column is a categorical node feature
                     (e.g. ``atom_type``), coded 0..k-1 in sorted value order (null its own code)
    edges.parquet    graph_id, src, dst (node ids of that graph); or edges/*.parquet; other
    (or edges/)      columns are ignored (named in the summary); rows with a null id are dropped
                     and counted; self loops and duplicates are the canonical ingest's

Refused with the file, column and value named: a graph id missing from graphs.parquet or given
twice; a node given twice; a graph with no nodes; an edge whose endpoint is not a node of its
graph (naming the graph it is a node of, if any); labels of mixed kinds (numbers and words in
one column); list labels of different lengths, or with an item other than 0 and 1.

`prepare_collection` writes, into a scratch folder, the union in the ingest's layout: edges with
global ids (graph g's nodes are ``first_node[g] ..`` in the order of the user's graph ids, then
node ids), nodes with their graph's split, features. `write_collection_files` adds the graph
table and the categorical codes to the canonical folder (`graphs.formats.graph_table` documents
both) once the ingest has written it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.graph_table import SPLITS
from graphs.infra import duck
from graphs.infra.config_checks import bounded_repr
from graphs.stages.canonical_nodes import SPLIT_NAMES, seeded_split, split_codes
from graphs.stages.landing import EDGES_FILE, FEATURES_FILE, GRAPHS_FILE, NODES_FILE, DatasetFiles, InputError

__all__ = ["PreparedCollection", "is_collection_folder", "prepare_collection", "write_collection_files"]

FEAT = "feat"
MAX_GRAPH_CLASSES = 1 << 12
MAX_LABEL_TASKS = 1 << 12
SHOWN_VALUES = 20


def is_collection_folder(dataset_dir: str | os.PathLike) -> bool:
    """Whether a landing dataset folder is a graph collection (holds graphs.parquet)."""
    return os.path.lexists(Path(dataset_dir) / GRAPHS_FILE)


@dataclass
class PreparedCollection:
    """The union in the ingest's layout, and what `write_collection_files` adds afterwards."""

    files: DatasetFiles
    graphs: pa.Table  # graphs.parquet as written to the canonical folder
    categories: np.ndarray | None  # int64 [n, K]
    facts: dict = field(default_factory=dict)  # summary["collection"]


def _kind(t: pa.DataType) -> str:
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    return str(t)


def _require(schema: pa.Schema, path: Path, names: tuple[str, ...]) -> None:
    missing = [c for c in names if c not in schema.names]
    if missing:
        raise InputError(f"{path}: missing column(s) {missing}; a graph collection's file needs {list(names)}")


def _id_kinds(paths: dict[str, tuple[Path, pa.Schema]], column: str, files: list[str]) -> str:
    """The one id kind ('int' or 'string') of `column` over the named files; InputError otherwise."""
    kinds = {name: _kind(paths[name][1].field(column).type) for name in files}
    for name, kind in kinds.items():
        if kind not in ("int", "string"):
            raise InputError(f"{paths[name][0]}: column {column!r} is {kind}; ids must be integers or strings")
    if len(set(kinds.values())) > 1:
        shown = ", ".join(f"{paths[n][0].name}: {k}" for n, k in kinds.items())
        raise InputError(f"column {column!r} holds ids of different kinds in the collection's files ({shown})")
    return next(iter(kinds.values()))


def prepare_collection(
    files: DatasetFiles,
    scratch: Path,
    *,
    memory_limit: str,
    threads: int,
    split_seed: int,
    train_fraction: float,
    val_fraction: float,
) -> PreparedCollection:
    """The collection of `files` (module docstring) as the union in the ingest's layout, written
    into `scratch` (created), with the graph table and categorical codes for the output."""
    if files.nodes is None or files.nodes.suffix != ".parquet":
        raise InputError(
            f"{files.graphs}: a graph collection needs nodes.parquet (graph_id, node_id) beside it, "
            f"found {files.nodes.name if files.nodes else 'none'}"
        )
    if files.features is not None:
        raise InputError(f"{files.features}: a graph collection takes its features as nodes.parquet's 'feat' column")
    for path in files.edge_files:
        if path.suffix != ".parquet":
            raise InputError(f"{path}: a graph collection's edge files are Parquet (graph_id, src, dst)")
    scratch.mkdir(parents=True)
    schemas = {
        "graphs": (files.graphs, pq.read_schema(files.graphs)),
        "nodes": (files.nodes, pq.read_schema(files.nodes)),
    }
    schemas.update({f"edges{i}": (p, pq.read_schema(p)) for i, p in enumerate(files.edge_files)})
    _require(schemas["graphs"][1], files.graphs, ("graph_id",))
    _require(schemas["nodes"][1], files.nodes, ("graph_id", "node_id"))
    edge_names = [k for k in schemas if k.startswith("edges")]
    for name in edge_names:
        _require(schemas[name][1], schemas[name][0], ("graph_id", "src", "dst"))
    _id_kinds(schemas, "graph_id", list(schemas))
    _id_kinds(schemas, "node_id", ["nodes"])
    node_kind = _kind(schemas["nodes"][1].field("node_id").type)
    for name in edge_names:
        for col in ("src", "dst"):
            kind = _kind(schemas[name][1].field(col).type)
            if kind != node_kind:
                raise InputError(
                    f"{schemas[name][0]}: column {col!r} holds {kind} ids, {files.nodes.name}'s node_id {node_kind} ids"
                )
    con = duck.connect(memory_limit, threads=threads, temp_directory=scratch / "duckdb")
    try:
        graphs, facts = _graph_table(con, files.graphs, schemas["graphs"][1], split_seed, train_fraction, val_fraction)
        num_nodes, categories, cat_facts, feat = _nodes(con, files.nodes, schemas["nodes"][1], graphs)
        first = np.zeros(len(num_nodes), dtype=np.int64)
        np.cumsum(num_nodes[:-1], out=first[1:])
        edges_out, edge_facts = _edges(con, files.edge_files, schemas, edge_names, scratch)
        nodes_out, features_out = _node_files(con, graphs, feat, scratch)
    finally:
        con.close()
    table = pa.table(
        {
            "graph_id": graphs.column("graph_id"),
            "first_node": pa.array(first),
            "num_nodes": pa.array(num_nodes),
            "split": pa.array(np.array(SPLITS, dtype=object)[graphs.column("split_code").to_numpy()].tolist()),
            **{c: graphs.column(c) for c in ("label", "label_value") if c in graphs.column_names},
        }
    )
    facts.update(cat_facts, **edge_facts, graphs=len(num_nodes), nodes=int(num_nodes.sum()))
    facts["nodes_per_graph_max"] = int(num_nodes.max())
    facts["nodes_per_graph_mean"] = round(float(num_nodes.mean()), 3)
    return PreparedCollection(DatasetFiles([edges_out], nodes_out, features_out), table, categories, facts)


def _graph_table(con, path: Path, schema: pa.Schema, seed: int, train: float, val: float) -> tuple[pa.Table, dict]:
    """graphs.parquet ordered by graph_id, with ``gi`` (the graph index), ``split_code`` and the
    label as class index or value; the label and split facts."""
    t = duck.read_parquet(con, [path]).order("graph_id").arrow().read_all()
    ids = t.column("graph_id")
    if ids.null_count:
        raise InputError(f"{path}: column 'graph_id' has {ids.null_count} null values")
    con.register("graphs_t", t)
    dup = con.execute(
        "SELECT graph_id FROM graphs_t GROUP BY graph_id HAVING count(*) > 1 ORDER BY graph_id LIMIT 1"
    ).fetchone()
    if dup is not None:
        raise InputError(f"{path}: column 'graph_id' repeats the id {bounded_repr(dup[0])}; one row per graph")
    g = len(t)
    if g == 0:
        raise InputError(f"{path}: no graphs")
    facts: dict = {"label_kind": "none", "num_classes": 0}
    cols = {"graph_id": ids, "gi": pa.array(np.arange(g, dtype=np.int64))}
    labelled = np.ones(g, dtype=bool)
    if "label" in schema.names:
        label, facts = _labels(t.column("label"), t.column("graph_id"), path)
        cols["label"] = label
        if facts["label_kind"] == "class":
            cols["label_value"] = _plain(t.column("label"))
            labelled = label.to_numpy(zero_copy_only=False) >= 0
        elif facts["label_kind"] == "multi_label":
            flat = label.flatten().to_numpy(zero_copy_only=False).reshape(g, facts["num_tasks"])
            labelled = ~np.isnan(flat).all(axis=1)
        else:
            labelled = ~np.isnan(label.to_numpy(zero_copy_only=False))
    split = np.full(g, SPLIT_NAMES.index("other"), dtype=np.int8)
    facts["split_generated"] = False
    if "split" in schema.names:
        split, facts["unknown_splits_as_other"], facts["unknown_split_words"] = split_codes(t.column("split"))
    elif facts["label_kind"] != "none":
        seeded_split(split, np.flatnonzero(labelled), seed, train, val)
        facts["split_generated"] = True
    cols["split_code"] = pa.array(split)
    for code, name in enumerate(SPLITS[:3]):
        facts[f"{name}_graphs"] = int(np.count_nonzero((split == code) & labelled))
    facts["labelled_graphs"] = int(labelled.sum()) if facts["label_kind"] != "none" else 0
    return pa.table(cols), facts


def _labels(column: pa.ChunkedArray, ids: pa.ChunkedArray, path: Path) -> tuple[pa.Array, dict]:
    """(the labels as int64 class indices, -1 missing, float64 values, NaN missing, or lists of
    0.0 / 1.0 per task, NaN missing; the facts)."""
    column = _plain(column)
    t = column.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _task_labels(column, ids, path)
    if pa.types.is_floating(t):
        values = pc.fill_null(column, float("nan")).cast(pa.float64())
        return values, {"label_kind": "value", "num_classes": 0}
    if not (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise InputError(
            f"{path}: column 'label' is {t}; labels are integer, string or boolean classes or float values"
        )
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        _refuse_mixed_kinds(column, path)
    classes = pc.unique(column).drop_null()
    classes = classes.take(pc.sort_indices(classes))
    if len(classes) > MAX_GRAPH_CLASSES:
        raise InputError(
            f"{path}: column 'label' holds {len(classes)} distinct values; at most {MAX_GRAPH_CLASSES} classes "
            "(a float column is read as a value to regress)"
        )
    index = pc.fill_null(pc.index_in(column, value_set=classes), -1).cast(pa.int64())
    shown = [bounded_repr(v) for v in classes.to_pylist()[:SHOWN_VALUES]]
    return index, {"label_kind": "class", "num_classes": len(classes), "label_values": shown}


def _plain(column: pa.ChunkedArray) -> pa.Array:
    """`column` decoded from a dictionary type, one chunk."""
    t = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    return column.cast(t).combine_chunks()


def _task_labels(column: pa.Array, ids: pa.ChunkedArray, path: Path) -> tuple[pa.Array, dict]:
    """Binary labels per task (a list column): a fixed-size list of float64 0.0 / 1.0 per graph,
    NaN missing (a null list misses every task)."""
    item = column.type.value_type
    if not (pa.types.is_integer(item) or pa.types.is_boolean(item) or pa.types.is_floating(item)):
        raise InputError(
            f"{path}: column 'label' holds lists of {item}; a list label holds one binary label per task "
            "(0 / 1 or booleans)"
        )
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    present = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if not present.any():
        raise InputError(f"{path}: column 'label' holds no list with a label")
    rows = np.flatnonzero(present)
    tasks = int(lengths[rows[0]])
    odd = rows[lengths[rows] != tasks]
    if len(odd) or not 1 <= tasks <= MAX_LABEL_TASKS:
        at = int(odd[0]) if len(odd) else int(rows[0])
        raise InputError(
            f"{path}: column 'label' holds lists of different lengths or sizes outside 1..{MAX_LABEL_TASKS}: graph "
            f"{bounded_repr(ids[int(rows[0])].as_py())} has {tasks} items, graph {bounded_repr(ids[at].as_py())} "
            f"{int(lengths[at])}; one binary label per task, the same tasks in every row"
        )
    values = pc.list_flatten(column)  # the present rows' items, row after row
    items = pc.fill_null(values.cast(pa.float64()), float("nan")).to_numpy(zero_copy_only=False)
    bad = ~np.isnan(items) & (items != 0.0) & (items != 1.0)
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        graph = ids[int(np.flatnonzero(present)[at // tasks])].as_py()
        raise InputError(
            f"{path}: column 'label' holds {bounded_repr(values[at].as_py())} for task {at % tasks} of graph "
            f"{bounded_repr(graph)}; a list label holds binary labels (0 / 1 or booleans)"
        )
    flat = np.full((len(column), tasks), np.nan)
    flat[present] = items.reshape(-1, tasks)
    label = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel(), type=pa.float64()), tasks)
    return label, {"label_kind": "multi_label", "num_classes": 2, "num_tasks": tasks}


def _refuse_mixed_kinds(column: pa.Array, path: Path) -> None:
    """InputError when a string label column holds both numbers and words."""
    values = pc.unique(column).drop_null()
    numeric = pc.match_substring_regex(pc.utf8_trim_whitespace(values), r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
    numeric = np.asarray(numeric.to_numpy(zero_copy_only=False), dtype=bool)
    if numeric.any() and not numeric.all():
        number = values[int(np.flatnonzero(numeric)[0])].as_py()
        word = values[int(np.flatnonzero(~numeric)[0])].as_py()
        raise InputError(
            f"{path}: column 'label' holds labels of mixed kinds: {bounded_repr(number)} is a number and "
            f"{bounded_repr(word)} is not; give classes as words (or integers) or values as floats"
        )


def _nodes(con, path: Path, schema: pa.Schema, graphs: pa.Table):
    """Per graph its node count; the categorical codes [n, K] in union order and their facts; the
    name of the feature column (None without one). Creates the table ``nd`` (gi, node_id, nid)."""
    con.register("g_ids", graphs.select(["graph_id", "gi", "split_code"]))
    duck.read_parquet(con, [path], file_row_number=True).create_view("nodes_v")
    con.execute(
        "CREATE TABLE nd AS SELECT g.gi, n.graph_id, n.node_id, n.file_row_number AS row_ FROM nodes_v n "
        "LEFT JOIN g_ids g ON n.graph_id = g.graph_id"
    )
    nulls = con.execute(
        "SELECT count(*) FILTER (graph_id IS NULL), count(*) FILTER (node_id IS NULL) FROM nd"
    ).fetchone()
    for column, count in zip(("graph_id", "node_id"), nulls):
        if count:
            raise InputError(f"{path}: column {column!r} has {count} null values")
    stray = con.execute("SELECT graph_id FROM nd WHERE gi IS NULL LIMIT 1").fetchone()
    if stray is not None:
        raise InputError(
            f"{path}: column 'graph_id' holds {bounded_repr(stray[0])}, which is not a graph_id of {GRAPHS_FILE}"
        )
    dup = con.execute(
        "SELECT graph_id, node_id FROM nd GROUP BY graph_id, node_id HAVING count(*) > 1 LIMIT 1"
    ).fetchone()
    if dup is not None:
        raise InputError(
            f"{path}: graph {bounded_repr(dup[0])} lists node_id {bounded_repr(dup[1])} twice; one row per node"
        )
    g = graphs.num_rows
    gi, counts = (np.asarray(a) for a in zip(*con.execute("SELECT gi, count(*) FROM nd GROUP BY gi").fetchall()))
    num_nodes = np.zeros(g, dtype=np.int64)
    num_nodes[gi.astype(np.int64)] = counts
    if (num_nodes == 0).any():
        empty = graphs.column("graph_id")[int(np.flatnonzero(num_nodes == 0)[0])].as_py()
        raise InputError(
            f"{path}: graph {bounded_repr(empty)} of {GRAPHS_FILE} has no nodes ({int((num_nodes == 0).sum())} "
            "such graphs); every graph needs at least one node row"
        )
    con.execute(
        "CREATE TABLE nid AS SELECT gi, node_id, row_, row_number() OVER (ORDER BY gi, node_id) - 1 AS nid FROM nd"
    )
    cat_cols = [
        f.name
        for f in schema
        if f.name not in ("graph_id", "node_id", FEAT) and (pa.types.is_integer(f.type) or pa.types.is_boolean(f.type))
    ]
    ignored = [f.name for f in schema if f.name not in ("graph_id", "node_id", FEAT, *cat_cols)]
    feat = FEAT if FEAT in schema.names else None
    categories, cards = None, {}
    if cat_cols:
        order = con.execute("SELECT row_ FROM nid ORDER BY nid").fetchnumpy()["row_"].astype(np.int64)
        table = pq.read_table(path, columns=cat_cols)
        categories = np.empty((len(order), len(cat_cols)), dtype=np.int64)
        for k, name in enumerate(cat_cols):
            column = table.column(name).combine_chunks().take(pa.array(order))
            values = pc.unique(column).drop_null()
            values = values.take(pc.sort_indices(values))
            code = pc.index_in(column, value_set=values).to_numpy(zero_copy_only=False)
            missing = np.isnan(code) if code.dtype.kind == "f" else np.zeros(len(code), dtype=bool)
            code = np.where(missing, len(values), np.nan_to_num(code)).astype(np.int64)
            categories[:, k] = code
            cards[name] = len(values) + int(missing.any())
    facts = {"categorical": cards, "ignored_node_columns": ignored}
    return num_nodes, categories, facts, feat


def _edges(con, edge_files: list[Path], schemas: dict, names: list[str], scratch: Path) -> tuple[Path, dict]:
    """edges.parquet of the union (src, dst global ids) in `scratch`; the edge facts."""
    views = []
    for i, p in enumerate(edge_files):
        duck.read_parquet(con, [p]).create_view(f"edges_v{i}")
        views.append(f"edges_v{i}")
    union = " UNION ALL ".join(f"SELECT graph_id, src, dst, '{i}' AS file_ FROM {v}" for i, v in enumerate(views))
    con.execute(f"CREATE TABLE e AS {union}")
    dropped = con.execute("SELECT count(*) FROM e WHERE graph_id IS NULL OR src IS NULL OR dst IS NULL").fetchone()[0]
    con.execute("DELETE FROM e WHERE graph_id IS NULL OR src IS NULL OR dst IS NULL")
    stray = con.execute(
        "SELECT e.file_, e.graph_id FROM e LEFT JOIN g_ids g ON e.graph_id = g.graph_id WHERE g.gi IS NULL LIMIT 1"
    ).fetchone()
    if stray is not None:
        raise InputError(
            f"{edge_files[int(stray[0])]}: column 'graph_id' holds {bounded_repr(stray[1])}, which is not a "
            f"graph_id of {GRAPHS_FILE}"
        )
    con.execute(
        "CREATE TABLE eg AS SELECT e.file_, e.graph_id, e.src, e.dst, s.nid AS s, d.nid AS d FROM e "
        "JOIN g_ids g ON e.graph_id = g.graph_id "
        "LEFT JOIN nid s ON s.gi = g.gi AND s.node_id = e.src LEFT JOIN nid d ON d.gi = g.gi AND d.node_id = e.dst"
    )
    bad = con.execute(
        "SELECT file_, graph_id, src, dst, s IS NULL FROM eg WHERE s IS NULL OR d IS NULL LIMIT 1"
    ).fetchone()
    if bad is not None:
        file_, graph, src, dst, src_missing = bad
        column, node = ("src", src) if src_missing else ("dst", dst)
        other = con.execute(
            "SELECT g.graph_id FROM nid JOIN g_ids g USING (gi) WHERE nid.node_id = ? ORDER BY gi LIMIT 1", [node]
        ).fetchone()
        where = f"it is a node of graph {bounded_repr(other[0])}" if other else "it is a node of no graph"
        raise InputError(
            f"{edge_files[int(file_)]}: column {column!r}: the edge ({bounded_repr(src)}, {bounded_repr(dst)}) of graph "
            f"{bounded_repr(graph)} names node {bounded_repr(node)}, which is not a node of that graph in "
            f"nodes.parquet ({where}); an edge joins two nodes of its own graph"
        )
    out = scratch / EDGES_FILE
    con.sql("SELECT s AS src, d AS dst FROM eg ORDER BY s, d").write_parquet(str(out))
    edges = con.execute("SELECT count(*) FROM eg").fetchone()[0]
    if edges == 0:
        raise InputError(f"{edge_files[0]}: the collection's edge files hold no edges (with both ids)")
    ignored = sorted({c for n in names for c in schemas[n][1].names} - {"graph_id", "src", "dst"})
    return out, {"edge_rows": int(edges), "dropped_null_id": int(dropped), "ignored_edge_columns": ignored}


def _node_files(con, graphs: pa.Table, feat: str | None, scratch: Path) -> tuple[Path, Path | None]:
    """nodes.parquet (node_id, split of its graph) and, with features, features.parquet (node_id, feat)."""
    codes = graphs.column("split_code").to_numpy()
    nid = con.execute("SELECT gi FROM nid ORDER BY nid").fetchnumpy()["gi"].astype(np.int64)
    words = np.array(SPLIT_NAMES, dtype=object)[codes[nid]]
    nodes = scratch / NODES_FILE
    pq.write_table(pa.table({"node_id": pa.array(np.arange(len(nid), dtype=np.int64)), "split": words.tolist()}), nodes)
    if feat is None:
        return nodes, None
    features = scratch / FEATURES_FILE
    con.sql(
        f"SELECT nid.nid AS node_id, n.{FEAT} AS feat FROM nid JOIN nodes_v n ON n.file_row_number = nid.row_ "
        "ORDER BY nid.nid"
    ).write_parquet(str(features))
    return nodes, features


def write_collection_files(tmp: Path, prepared: PreparedCollection, summary: dict) -> None:
    """graphs.parquet and categories.npy into the canonical folder `tmp` the ingest wrote from
    `prepared.files`; ``summary["collection"]`` set. ValueError when the ingest did not keep the
    union's node ids (it relabels sorted distinct ids, and every node has a node row)."""
    n = prepared.facts["nodes"]
    if summary["nodes"] != n:
        raise ValueError(f"the canonical ingest found {summary['nodes']} nodes in a collection of {n}")
    pq.write_table(prepared.graphs, tmp / CanonicalGraph.GRAPHS, compression="zstd")
    if prepared.categories is not None:
        np.save(tmp / CanonicalGraph.CATEGORIES, prepared.categories, allow_pickle=False)
    summary["collection"] = prepared.facts
