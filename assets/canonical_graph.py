"""canonical_graph: the landing folder's edge lists as a clean, relabelled graph.

Calls `graphs.stages.canonical.build_canonical_graph` (DuckDB ingest, see that module for the
files written) with the column mapping of the dataset's gnnflow.yaml (`columns:`), and
reports counts, dropped rows by reason, degree statistics and a log-log degree plot. Bad input fails the run with the file and column named; the previous
materialization of the partition stays in place.
"""

from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow.parquet as pq

from assets.common import (
    LANDING_FINGERPRINT,
    GnnflowStorage,
    dataset_partitions,
    disk_metadata,
    png_markdown,
    refuse_failed_checks,
)
from assets.config import dagster_config
from assets.integrity import file_errors_as_failures
from assets.reporting import stage_result
from assets.settings import SETTINGS_FILE, SettingsError, read_columns, register_config
from graphs.formats.canonical_files import CanonicalGraph
from graphs.infra.config_checks import bounded_text
from graphs.stages.canonical import (
    CanonicalConfig,
    InputError,
    build_canonical_graph,
    landing_fingerprint,
    read_label_classes,
)

CanonicalGraphConfig = dagster_config(CanonicalConfig, "CanonicalGraphConfig")
_ASSET = CanonicalGraph.STAGE
register_config(_ASSET, CanonicalGraphConfig)

# Every row the ingest drops or value it fills instead of failing: summary key -> what happened.
# Each count is in the metadata; a non-zero one is also logged as a warning.
FILLS_AND_DROPS = {
    "dropped_null_id": "edge rows with a null src or dst dropped",
    "dropped_self_loop": "self-loop edge rows dropped (their node is kept)",
    "dropped_duplicate": "duplicate edge rows dropped",
    "nodes_without_node_row": "nodes with no nodes.parquet row: label -1 (unknown), split 'other'",
    "null_labels_as_unknown": "null labels in nodes.parquet read as -1 (unknown)",
    "null_splits_as_other": "null splits in nodes.parquet read as 'other' (in no split)",
    "unknown_splits_as_other": "nodes.parquet splits other than train/val/test (any case; training, "
    "validation, valid, dev, testing) read as 'other' (in no split)",
    "nodes_without_features": "nodes with no features.parquet row: a feature row of zeros",
    "dropped_invalid_weight": "edge rows with a NaN, infinite, negative, zero or null weight dropped "
    "(invalid_weights: drop)",
}

EDGES_VALID = "edges_valid"
SHOWN_LABEL_VALUES = 20  # label values (of categorical labels) shown in the metadata


@dg.asset(
    name=_ASSET,  # the asset key: the stage's constant (also the function's name)
    partitions_def=dataset_partitions,
    group_name="ingest",
    kinds={"duckdb", "parquet"},
    check_specs=[
        dg.AssetCheckSpec(
            EDGES_VALID,
            asset=CanonicalGraph.STAGE,
            description="edges.parquet is sorted by (src, dst), has no duplicates or self loops, "
            "and every id is in 0..n-1 (re-read from the written files before they are published).",
            blocking=True,
        )
    ],
)
def canonical_graph(
    context: dg.AssetExecutionContext, config: CanonicalGraphConfig, storage: GnnflowStorage
) -> dg.MaterializeResult:
    """Validated, deduplicated, relabelled (0..n-1) and symmetrized graph with labels, splits, features."""
    dataset = storage.dataset(context)
    config, config_metadata = storage.settings(context, dataset, _ASSET, config)
    landing = storage.landing_dir(dataset)
    with (
        storage.lock(dataset, context.log.info),
        file_errors_as_failures(dataset),
        storage.publishing(dataset, CanonicalGraph.STAGE) as out,
    ):
        fingerprint = landing_fingerprint(landing) if landing.is_dir() else ""  # of the files as read
        try:
            columns = read_columns(landing / SETTINGS_FILE)
            s = build_canonical_graph(landing, out, config.to_dataclass(), columns)
        except (InputError, SettingsError) as exc:
            raise dg.Failure(description=f"dataset '{dataset}': {exc}") from exc
        check = check_edges(out)
        refuse_failed_checks(dataset, CanonicalGraph.STAGE, [check])
        metadata = _metadata(s, out)
        metadata["path"] = dg.MetadataValue.path(str(storage.asset_dir(dataset, CanonicalGraph.STAGE)))
        metadata[LANDING_FINGERPRINT] = fingerprint
    for key, what in FILLS_AND_DROPS.items():
        if s.get(key):
            words = s.get("unknown_split_words") if key == "unknown_splits_as_other" else None
            context.log.warning(f"dataset '{dataset}': {s[key]} {what}" + (f", e.g. {words}" if words else ""))
    if s["split_generated"]:
        context.log.info("labels without a split column: made a seeded train/val/test split")
    metadata.update(config_metadata)
    return stage_result(
        context, _ASSET, metadata, headline=("nodes", "edges", "num_classes", "split", "seconds"), check_results=[check]
    )


def _metadata(s: dict, out: Path) -> dict:
    metadata = {
        "nodes": s["nodes"],
        "edges": s["edges"],
        "id_type": s["id_type"],
        "symmetrized": s["symmetrized"],
        "input_rows": s["input_rows"],
        "input_files": s["input_files"],
        **{key: s.get(key, 0) for key in FILLS_AND_DROPS},
        "combined_reverse_pairs": s["combined_reverse_pairs"],
        "weighted": s["weighted"],
        "isolated_nodes": s["isolated_nodes"],
        "degree_max": s["degree_max"],
        "degree_mean": s["degree_mean"],
        "degree_p99": s["degree_p99"],
        "labelled_nodes": s["labelled_nodes"],
        "num_classes": s["num_classes"],
        "split": f"train {s['train_nodes']} / val {s['val_nodes']} / test {s['test_nodes']}",
        "split_generated": s["split_generated"],
        "feature_dim": s.get("feature_dim", 0),
        "seconds": s["seconds"],
        "peak_rss_mb": s["peak_rss_bytes"] / 2**20,
        **disk_metadata(out),
        "degree_distribution": png_markdown(out / CanonicalGraph.DEGREE_PLOT, "degree distribution"),
    }
    if "collection" in s:  # a graph collection: its graphs' facts (graphs.stages.collection)
        c = s["collection"]
        metadata.update(
            graphs=c["graphs"],
            graph_label_kind=c["label_kind"],
            graph_classes=c["num_classes"],
            graph_split=f"train {c['train_graphs']} / val {c['val_graphs']} / test {c['test_graphs']}",
            nodes_per_graph_mean=c["nodes_per_graph_mean"],
            nodes_per_graph_max=c["nodes_per_graph_max"],
            categorical_node_columns=dg.MetadataValue.json(c["categorical"]),
            ignored_columns=dg.MetadataValue.json(
                {"nodes": c["ignored_node_columns"], "edges": c["ignored_edge_columns"]}
            ),
        )
        if c.get("label_values"):
            metadata["label_values"] = dg.MetadataValue.json(c["label_values"])
    classes = read_label_classes(out)
    if classes is not None:  # labels given as values (strings, booleans): class index -> value
        metadata["label_values"] = dg.MetadataValue.json(
            [bounded_text(str(v), 40) for v in classes[:SHOWN_LABEL_VALUES]]
        )
    if s["weighted"]:
        metadata.update(
            weight_combine=s["weight_combine"],
            weight_files=len(s["weight_files"]),
            weight_default_1_files=dg.MetadataValue.json(s["weight_default_1_files"]),
            dropped_invalid_weight=s["dropped_invalid_weight"],
            weight_min=s.get("weight_min", 0.0),
            weight_max=s.get("weight_max", 0.0),
            weight_mean=s.get("weight_mean", 0.0),
        )
    return metadata


def check_edges(out: Path, batch_rows: int = 1 << 22) -> dg.AssetCheckResult:
    """The edges_valid check, on the files in `out` (n counted from its nodes.parquet).

    Streams edges.parquet in file order, `batch_rows` rows at a time (memory ~16 bytes per row
    of a batch, whatever the graph's size), comparing each row with the one before it, across
    batch boundaries too."""
    n = pq.ParquetFile(out / CanonicalGraph.NODES).metadata.num_rows
    bad_order, self_loops, out_of_range = 0, 0, 0
    prev_src = prev_dst = None
    for batch in pq.ParquetFile(out / CanonicalGraph.EDGES).iter_batches(batch_size=batch_rows, columns=["src", "dst"]):
        src = batch.column(0).to_numpy(zero_copy_only=False)
        dst = batch.column(1).to_numpy(zero_copy_only=False)
        if prev_src is not None:  # the previous batch's last row before this batch's first
            src, dst = np.concatenate([prev_src, src]), np.concatenate([prev_dst, dst])
            self_loops -= int(src[0] == dst[0])  # counted with the previous batch
            out_of_range -= int(src[0] < 0 or dst[0] < 0 or src[0] >= n or dst[0] >= n)
        # (src, dst) must strictly increase: a row <= the row before it is unsorted or a duplicate
        bad_order += int(np.count_nonzero((src[1:] < src[:-1]) | ((src[1:] == src[:-1]) & (dst[1:] <= dst[:-1]))))
        self_loops += int(np.count_nonzero(src == dst))
        out_of_range += int(np.count_nonzero((src < 0) | (dst < 0) | (src >= n) | (dst >= n)))
        prev_src, prev_dst = src[-1:], dst[-1:]
    return dg.AssetCheckResult(
        check_name=EDGES_VALID,
        passed=bad_order == 0 and self_loops == 0 and out_of_range == 0,
        metadata={"unsorted_or_duplicate": bad_order, "self_loops": self_loops, "out_of_range": out_of_range},
    )
