"""Canonical graph: validate raw edge lists and turn them into a clean 0..n-1 graph.

Input (a dataset folder in the landing layout; which entries may be read, symlinks and
non-regular files included, is `graphs.stages.landing`'s rule):
    edges/*.parquet or edges.parquet   columns src, dst (all integer or all string ids; uint64
                                       ids at most 2^63-1), optional weight (any numeric type,
                                       per file)
    nodes.parquet      (optional)      node_id, optional label (int class index 0..C-1 with C at
                                       most MAX_CLASSES; -1/null = unknown), optional split
                                       (string: `graphs.stages.canonical_nodes.SPLIT_WORDS`, any
                                       case, e.g. train / Validation / dev / TEST; other words
                                       and null read as 'other', counted)
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
    types.json, typed_edges.parquet   a typed graph's schema and relations (only for a landing folder
                    with nodes/: `graphs.stages.typed_graph` checks the per-type files and writes them
                    in the layout above over one id space before this ingest runs, and documents both)
    graphs.parquet, categories.npy   a graph collection's graph table and categorical node codes
                    (only for a landing folder with graphs.parquet: `graphs.stages.collection` checks
                    and writes its files as the disjoint union of its graphs, in the layout above,
                    before this ingest runs; `graphs.formats.graph_table` documents both files)

How it scales (the 100M-edge path): DuckDB reads every edge file out of core and
streams the rows as Arrow batches. Integer ids dense enough for a bitmap (by the files'
Parquet statistics) are streamed once, every row: an id's offset from the smallest is its
place, the ids of null-partner and self-loop rows are marked as nodes and those rows counted
on the way (an id outside the statistics restarts the ingest with DuckDB's own counts). For
other ids DuckDB computes the sorted set of distinct ids (a hash aggregate, then an ORDER BY
of n values, never of the edges) and each batch is located in it by one hash table built
once (`graphs.kernels.id_codes.IntIdLookup`; strings by their hashes, `StringIdLookup`). Sparse integer and string
ids of edge rows that fit the sort budget skip the DISTINCT and the lookups: one scan,
and one hash encoding of every endpoint (`graphs.kernels.id_codes`) whose codes are renumbered in
sorted id order (`graphs.stages.canonical_ids.IdSpace.factorize`; string ids are
encoded by their 64-bit DuckDB hash, every row then compared with its code's string, and
that scan also gives the row counts). The node and feature files' ids are encoded in the
same pass, so their rows need no lookup either. Relabelled rows are turned into int64 keys ``src << s | dst << 1 | flag``
(flag 1 marks the reversed copy added by symmetrization). When the keys of a symmetrized
graph fit the sort budget only the (min, max) orientation is kept and the reverse
direction is produced after deduplication (`graphs.kernels.edge_keys.mirror`), halving the work. Keys are spilled into fine
buckets by source-id range; buckets are then grouped up to `sort_budget_mb`, and each
group is counting-sorted into rows by source and deduplicated row by row
(`graphs.kernels.edge_keys.dedupe_rows`: O(keys) plus a small sort per row, cheaper than
sorting all keys; the keys go to cache-sized buckets of rows first, buckets in threads). Because
buckets are in source order, the output is globally sorted without a merge, and memory stays bounded by the sort budget
plus O(n) arrays whatever the edge count.

Weights (when any edge file has a ``weight`` column; files without one count as weight 1.0
and are named in the summary). Every weight must be finite and > 0: NaN, infinite,
negative, zero and null weights fail the stage naming each file and its count, or are
dropped and counted with ``invalid_weights="drop"`` (their ids still become nodes, as
for self loops). A float64 weight travels next to each key (`graphs.kernels.edge_keys.BYTES_PER_WEIGHTED_KEY`
sizes the groups, so the sort budget still bounds memory; spilled buckets get a second
file of weights). The rows reach the keys in input order (files in name order, rows in
file order), the bucket and row counting sorts are stable and a row's keys are put in
order of the neighbour alone, so each output edge sees its input rows in input order.
They combine by ``weight_combine`` (`COMBINE_RULES`): duplicates of one (src, dst) and,
when symmetrized, the rows of both directions u->v and v->u, which give one weight to
both output edges. The summary counts the rows combined into duplicates
(``dropped_duplicate``) and the undirected edges given in both directions
(``combined_reverse_pairs``).

The stage's parts, each in its own module: the input checks and DuckDB views
(`graphs.stages.canonical_inputs`), the id space and relabelling (`graphs.stages.canonical_ids`),
the edge keys and edges.parquet (`graphs.stages.canonical_edges`), nodes.parquet with labels and
splits (`graphs.stages.canonical_nodes`) and features.npy (`graphs.stages.canonical_features`);
this module holds the stage's config and runs the parts in order (`build_canonical_graph`).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path

import duckdb
import numpy as np

from graphs.formats.canonical_files import CanonicalGraph, edge_batches, read_summary
from graphs.formats.label_classes import LABEL_CLASSES, read_label_classes, write_label_classes
from graphs.infra import duck
from graphs.infra.config_checks import MAX_ROWS, MAX_SEED, MAX_THREADS, bounded_repr, check_fields
from graphs.infra.host_memory import gc_paused
from graphs.infra.plotting import headless_pyplot
from graphs.infra.storage import atomic_output_dir, file_sha256, peak_rss_bytes, remember_sha256, write_summary
from graphs.kernels.edge_keys import BYTES_PER_KEY, key_shift, warm_kernels, warm_weighted_kernels
from graphs.kernels.id_codes import warm_kernels as _warm_id_kernels
from graphs.stages.canonical_edges import (
    COMBINE_RULES,
    new_spill,
    spill_codes,
    spill_rows,
    valid_edge_rows,
    write_edges,
)
from graphs.stages.canonical_features import warm_feature_kernels, write_features
from graphs.stages.canonical_ids import IdOutsideSpace, IdSpace, factorize_ids
from graphs.stages.canonical_inputs import (
    KEPT_ROW_SQL,
    VALID_WEIGHT_SQL,
    RowCounts,
    code_counts,
    create_edge_views,
    create_id_file_views,
    parquet_id_bounds,
    parquet_rows,
    parquet_schema,
    refuse_invalid_weights,
    sql_counts,
    validate_inputs,
)
from graphs.stages.canonical_nodes import write_nodes
from graphs.stages.collection import prepare_collection, write_collection_files
from graphs.stages.landing import (  # the landing folder's layout and rule, re-exported as part of the ingest's API
    READY_MARKER,
    DatasetFiles,
    InputError,
    find_dataset_files,
    is_dataset_folder,
    landing_fingerprint,
    landing_marked_ready,
)
from graphs.stages.typed_graph import prepare_typed, write_typed_files
from graphs.stages.user_files import PreparedInputs, prepare_inputs, read_column_mapping

FORMAT_VERSION = CanonicalGraph.FORMAT_VERSION
INVALID_WEIGHT_ACTIONS = ("error", "drop")


@dataclass(kw_only=True)
class CanonicalConfig:
    """Settings of the canonical_graph stage."""

    symmetrize: bool = field(default=True, metadata={"help": "Add the reverse of every edge (undirected graph)."})
    add_reverse: bool = field(
        default=False,
        metadata={
            "help": "Typed graphs (a nodes/ folder): add each relation's reverse, named rev-<relation>, so "
            "messages also flow from its destination type to its source type (graphs.stages.typed_graph)."
        },
    )
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


# ----------------------------------------------------------------------------- main entry


def _connect(cfg: CanonicalConfig, temp_dir: Path) -> duckdb.DuckDBPyConnection:
    return duck.connect(cfg.memory_limit, threads=cfg.threads, temp_directory=temp_dir)


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
        collection = _prepare_collection(given, columns, work, cfg)
        typed = _prepare_typed(given, columns, work, tmp, cfg)
        if collection is not None:
            inputs = PreparedInputs(collection.files)
        elif typed is not None:  # labels as values are written as class indices by prepare_inputs
            inputs = prepare_inputs(
                typed.files, {}, work / "inputs", memory_limit=cfg.memory_limit, threads=cfg.threads
            )
        else:
            inputs = prepare_inputs(given, columns, work / "inputs", memory_limit=cfg.memory_limit, threads=cfg.threads)
        try:
            summary = _ingest_checked(dataset_dir, inputs.files, tmp, work, cfg)
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
        if collection is not None:
            write_collection_files(tmp, collection, summary)
        if typed is not None:
            write_typed_files(tmp, typed, summary)
        summary["seconds"] = round(time.perf_counter() - t0, 3)
        summary["peak_rss_bytes"] = peak_rss_bytes()
        write_summary(tmp, summary)
    return summary


def _prepare_collection(given: DatasetFiles, columns: dict, work: Path, cfg: CanonicalConfig):
    """A graph collection's union in the ingest's layout (`graphs.stages.collection`), None when the
    folder is no collection."""
    if given.graphs is None:
        return None
    if columns:
        raise InputError(f"{given.graphs}: a graph collection reads its columns by name; remove `columns:`")
    return prepare_collection(
        given,
        work / "collection",
        memory_limit=cfg.memory_limit,
        threads=cfg.threads,
        split_seed=cfg.split_seed,
        train_fraction=cfg.train_fraction,
        val_fraction=cfg.val_fraction,
    )


def _prepare_typed(given: DatasetFiles, columns: dict, work: Path, tmp: Path, cfg: CanonicalConfig):
    """A typed graph's union in the ingest's layout (`graphs.stages.typed_graph`), None when the
    folder is not typed."""
    if not given.typed:
        return None
    if columns:
        raise InputError(
            f"{given.node_type_files[0].parent}: a typed graph reads its columns by name; remove `columns:`"
        )
    return prepare_typed(
        given,
        work / "typed",
        memory_limit=cfg.memory_limit,
        threads=cfg.threads,
        add_reverse=cfg.add_reverse,
        weight_combine=cfg.weight_combine,
        out_dir=tmp,
        drop_invalid_weights=cfg.invalid_weights == "drop",
    )


def _ingest_checked(dataset_dir, files: DatasetFiles, tmp: Path, work: Path, cfg: CanonicalConfig) -> dict:
    """`_ingest`, trusting the edge files' id statistics; if a row holds an id outside them
    (statistics that understate a file's ids), again with the ids counted by DuckDB."""
    try:
        return _ingest(dataset_dir, files, tmp, work, cfg)
    except IdOutsideSpace:
        shutil.rmtree(work / "spill", ignore_errors=True)
        return _ingest(dataset_dir, files, tmp, work, cfg, statistics=False)


def _ingest(dataset_dir, files: DatasetFiles, tmp: Path, work: Path, cfg: CanonicalConfig, statistics=True) -> dict:
    """The canonical graph of input files in the Parquet layout, written into `tmp`; its summary.
    With `statistics`, ids dense by the edge files' Parquet statistics are not counted first."""
    kind = validate_inputs(files)
    sql_type = "BIGINT" if kind == "int" else "VARCHAR"
    weighted_files = [p for p in files.edge_files if "weight" in parquet_schema(p).names]
    weighted = bool(weighted_files)
    con = _connect(cfg, work / "duckdb")
    create_edge_views(con, files.edge_files, weighted_files, sql_type)
    nodes_sql, id_files = create_id_file_views(con, files, sql_type)
    budget = cfg.sort_budget_mb << 20
    factorize_now, footer_dense = _path_by_footers(con, files.edge_files, kind, weighted, budget, nodes_sql)
    footer_dense = footer_dense if statistics else None
    warmup = _start_kernel_warmup(factorize_now, weighted, files.features is not None)
    codes = None  # (src, dst) of every row in the final id space, when factorized in memory
    file_ids = {}  # new ids of the node / feature file rows, when factorized
    if factorize_now:
        space, codes, file_ids = factorize_ids(con, id_files, dataset_dir, kind, files.features)
        counts, min_id, max_id = code_counts(codes), None, None
    elif footer_dense is not None:  # the dropped rows are counted while streaming
        counts, min_id, max_id = RowCounts(parquet_rows(files.edge_files), 0, 0, 0), None, None
    else:
        counts, min_id, max_id = sql_counts(con, weighted)
    if counts.rows == 0:
        raise InputError(f"{dataset_dir}: the edge files hold no rows ({[str(p) for p in files.edge_files]})")
    if counts.invalid_weights and cfg.invalid_weights == "error":
        refuse_invalid_weights(con, weighted_files)
    dense = footer_dense
    if codes is None and dense is None:
        dense = IdSpace.dense_bounds(con, kind, counts.rows, min_id, max_id, nodes_sql)
    every_row = False  # whether the edge rows are streamed with their nulls and self loops
    if codes is None and dense is None and not weighted and counts.rows * 2 * BYTES_PER_KEY <= budget:
        space, codes, file_ids = factorize_ids(con, id_files, dataset_dir, kind, files.features)
    elif codes is None:
        # a dense space reads every row once (unweighted): the ids of dropped rows are marked
        # while streaming, not by a scan of their own
        every_row = dense is not None and not weighted and (footer_dense is not None or counts.rows > counts.valid)
        has_dropped = counts.rows > counts.valid and not every_row
        dropped_weight_sql = f"{KEPT_ROW_SQL} AND NOT {VALID_WEIGHT_SQL}" if counts.invalid_weights else None
        space = IdSpace.plan(con, dense, nodes_sql, has_dropped, dataset_dir, dropped_weight_sql)

    # Stream valid edges into id space, spill keys by source range. A symmetrized graph
    # whose keys fit the budget keeps only the (min, max) orientation and mirrors after dedupe.
    spill, half = new_spill(
        space.size, counts.valid, weighted, work / "spill", budget=budget, symmetrize=cfg.symmetrize
    )
    shift = key_shift(space.size)
    try:
        if codes is not None:  # ids already final: keep rows with both ids and no self loop
            # factorized only when both directions' keys fit the budget: one group in memory, half kept
            assert spill.in_memory and (half or not cfg.symmetrize)
            spill_codes(spill, codes, shift, half)
            del codes
        else:
            rows = valid_edge_rows(con, weighted, counts.invalid_weights, cfg.batch_rows, every_row=every_row)
            dropped = spill_rows(spill, rows, space, shift, half, cfg.symmetrize, every_row=every_row)
            if every_row:
                counts = replace(counts, null_rows=dropped[0], self_loops=dropped[1])
    finally:
        con.close()
    relabel, lut = space.finish()
    warmup.join()

    edges, node_facts, feat_facts = _write_tables(tmp, files, spill, space, relabel, lut, shift, half, cfg, file_ids)
    shutil.rmtree(work, ignore_errors=True)
    return _summary(kind, relabel.n, counts, edges, files, weighted_files, cfg) | node_facts | feat_facts


def _path_by_footers(con, edge_files: list[Path], kind: str, weighted: bool, budget: int, nodes_sql):
    """(whether the ids are factorized in memory before any count of the rows, the dense space
    of integer ids that are streamed before any count), from the edge files' footers.

    Unweighted string ids, and integer ids too sparse for a bitmap (by the files' min/max
    statistics), whose rows fit the sort budget are factorized in memory, and that one
    scan gives the counts too (no count/min/max pass over every row). Unweighted integer ids
    dense by the statistics are streamed once, every row, counting the dropped ones on the way
    (`spill_rows`; an id outside the statistics raises `IdOutsideSpace`).
    """
    meta_rows = parquet_rows(edge_files)
    if weighted or meta_rows == 0:
        return False, None
    fits = meta_rows * 2 * BYTES_PER_KEY <= budget
    if kind != "int":
        return fits, None
    bounds = parquet_id_bounds(edge_files)
    if bounds is None:
        return False, None
    dense = IdSpace.dense_bounds(con, kind, meta_rows, *bounds, nodes_sql)
    return (False, dense) if dense is not None else (fits, None)


def _start_kernel_warmup(factorize_now: bool, weighted: bool, features: bool) -> threading.Thread:
    """A started thread that loads the numba kernels the ingest will run."""
    # Loading the cached numba kernels costs ~0.3 s; do it while DuckDB scans the files
    # (the id encoder's only when it will run: ~0.1 s of CPU the dense path would not use).
    # (the id encoder's first: it runs first, and numba loads one kernel at a time)
    warm = ([_warm_id_kernels] if factorize_now else []) + [warm_weighted_kernels if weighted else warm_kernels]
    warm += [warm_feature_kernels] if features else []
    warmup = threading.Thread(target=_call_each, args=(warm,), daemon=True)
    warmup.start()
    return warmup


def _write_tables(tmp: Path, files, spill, space, relabel, lut, shift: int, half: bool, cfg, file_ids: dict):
    """Write edges.parquet, the node table, the features and the degree plot into `tmp`.

    Returns ((degree, distinct input pairs, edges written, weight facts), node facts, feature facts).
    """
    # Edges are deduplicated and written in a worker thread (numba and Parquet encoding
    # release the GIL) while this thread writes the node table and the features.
    degree_ready: Future = Future()
    with ThreadPoolExecutor(max_workers=1) as pool:
        edges_job = pool.submit(
            write_edges,
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
            node_facts = write_nodes(
                tmp,
                files,
                relabel,
                file_ids.get("nodes"),
                split_seed=cfg.split_seed,
                train_fraction=cfg.train_fraction,
                val_fraction=cfg.val_fraction,
            )
            feat_facts = (
                write_features(
                    tmp,
                    files,
                    relabel,
                    file_ids.get("features"),
                    batch_rows=cfg.batch_rows,
                    budget_bytes=cfg.sort_budget_mb << 20,
                )
                if files.features is not None
                else {}
            )
            if files.features is not None:  # hashed for publishing now, while the edges are still being written
                remember_sha256(tmp / CanonicalGraph.FEATURES, file_sha256(tmp / CanonicalGraph.FEATURES))
            headless_pyplot()  # ~0.5 s, done while the edge thread is still busy
            wait([degree_ready, edges_job], return_when=FIRST_COMPLETED)
            if degree_ready.done():  # plot while the last edges are still being encoded
                degree = degree_ready.result()
                degree = degree[space.present] if lut is not None else degree
                _plot_degrees(degree, tmp / CanonicalGraph.DEGREE_PLOT)
        finally:
            _, distinct_input_pairs, edges_written, weight_facts = edges_job.result()
    return (degree, distinct_input_pairs, edges_written, weight_facts), node_facts, feat_facts


def _summary(kind: str, n: int, counts: RowCounts, edges: tuple, files, weighted_files, cfg) -> dict:
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
    "build_canonical_graph",
    "has_training_labels",
    "is_dataset_folder",
    "landing_fingerprint",
    "landing_marked_ready",
    "edge_batches",
    "find_dataset_files",
    "read_label_classes",
    "read_summary",
]
