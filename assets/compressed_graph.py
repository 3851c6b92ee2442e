"""compressed_graph: INT8 / 4-bit / bit-packed features, INT8 edge weights, Bloom-filter edge sets.

Calls `graphs.stages.compress.build_compressed_graph` (see that module for the files, dtypes and
shapes) on the canonical graph, the normalized adjacency and the METIS parts, and reports
bytes before / after and reconstruction errors per tensor, the trade-off of every feature
encoding, the Bloom filters' bits per edge and measured false-positive rate, and the
compression ratio of the whole asset. Two blocking asset checks re-read the written files
before they are published: no Bloom
filter rejects a sampled true edge, and every dequantized value is within half a
quantization step of the original. A dataset without features still gets compressed
weights and edge sets. Accuracy loss is measured in benchmarks/compression.py, not here.
"""

import dagster as dg

from assets.canonical_graph import canonical_graph
from assets.common import GnnflowStorage, dataset_partitions, disk_metadata, refuse_failed_checks
from assets.config import dagster_config
from assets.integrity import file_errors_as_failures
from assets.reporting import stage_result
from assets.settings import register_config
from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.compress_files import CompressedGraph
from graphs.formats.partition_files import Partitions
from graphs.stages.compress import CompressConfig, build_compressed_graph, verify_compressed_graph
from graphs.stages.normalize import Adjacency

CompressedGraphConfig = dagster_config(CompressConfig, "CompressedGraphConfig")

NO_FALSE_NEGATIVES = "bloom_no_false_negatives"
WITHIN_BOUND = "dequantization_within_bound"

_ASSET = CompressedGraph.STAGE
register_config(_ASSET, CompressedGraphConfig)
_INPUTS = (CanonicalGraph.STAGE, Adjacency.STAGE, Partitions.STAGE)


@dg.asset(
    name=_ASSET,  # the asset key: the stage's constant (also the function's name)
    partitions_def=dataset_partitions,
    deps=[canonical_graph, Adjacency.STAGE, Partitions.STAGE],
    group_name="preprocess",
    kinds={"numpy"},
    check_specs=[
        dg.AssetCheckSpec(
            NO_FALSE_NEGATIVES,
            asset=_ASSET,
            description="Sampled true edges (check_edges, all "
            "when fewer) are accepted, in both directions, by the filters of both endpoints' parts.",
            blocking=True,
        ),
        dg.AssetCheckSpec(
            WITHIN_BOUND,
            asset=_ASSET,
            description="Dequantized features (per column) and edge "
            "weights (per row) are within scale / 2 (+ float32 rounding) of the originals; "
            "bit-packed features decode exactly.",
            blocking=True,
        ),
    ],
)
def compressed_graph(
    context: dg.AssetExecutionContext, config: CompressedGraphConfig, storage: GnnflowStorage
) -> dg.MaterializeResult:
    """Quantized node features and edge weights plus one Bloom filter of incident edges per METIS part."""
    dataset = storage.dataset(context)
    config, config_metadata = storage.settings(context, dataset, _ASSET, config)
    cfg = config.to_dataclass()
    with (
        storage.lock(dataset, context.log.info),
        file_errors_as_failures(dataset),
        storage.publishing(dataset, _ASSET) as out,
    ):
        inputs = {name: storage.upstream_dir(dataset, name) for name in _INPUTS}
        try:
            s = build_compressed_graph(*inputs.values(), out, cfg)
        except ValueError as exc:  # e.g. feature_encoding='binary' on continuous features
            raise dg.Failure(description=f"dataset '{dataset}': {exc}") from exc
        checks = check_compressed_graph(out, inputs, cfg)
        refuse_failed_checks(dataset, _ASSET, checks)
        metadata = _metadata(out, s)
    metadata["path"] = dg.MetadataValue.path(str(storage.asset_dir(dataset, _ASSET)))
    metadata.update(config_metadata)
    headline = ("feature_encoding", "compression_ratio", "bloom_measured_fpr", "seconds")
    return stage_result(context, _ASSET, metadata, headline=headline, check_results=checks)


def _metadata(out, s: dict) -> dict:
    f, w, b, total = s["features"], s["weights"], s["bloom"], s["total"]
    rows = []
    if f:
        enc = f["encoding"] + (" of asinh(x)" if f["transform"] == "asinh" else "")
        rows.append(("features", enc, f["bytes_before"], f["bytes_after"], f["max_abs_error"], f["rel_rms_error"]))
        for name, e in f.get("node_types", {}).items():  # a typed graph: each type on its own columns
            rows.append((f"features of {name}", enc, None, None, e["max_abs"], e["rel_rms"]))
    rows.append(
        ("edge weights", "int8 per row", w["bytes_before"], w["bytes_after"], w["max_abs_error"], w["rel_rms_error"])
    )
    rows.append(
        ("edge sets", f"bloom {b['bits_per_key']:.1f} bits/key", b["bytes_before"], b["bytes_after"], None, None)
    )
    table = "| tensor | encoding | bytes before | bytes after | saving | max abs err | rel RMS err |\n|---|---|---|---|---|---|---|\n"
    for name, enc, before, after, max_abs, rel in rows:
        err = (
            f"{max_abs:.3g} | {rel:.3g}"
            if max_abs is not None
            else f"FPR {b['measured_fpr']:.4f} | (target {b['target_fpr']:g})"
        )
        if before is None:  # one node type's part of the features
            table += f"| {name} | {enc} | | | | {err} |\n"
        elif before:
            table += f"| {name} | {enc} | {before:,} | {after:,} | {1 - after / before:.1%} | {err} |\n"
    metadata = {
        "nodes": s["nodes"],
        "edges": s["edges"],
        "feature_encoding": s["feature_encoding"] or "none (no features)",
        "feature_transform": f["transform"] if f else "none",
        "compression_ratio": total["ratio"],
        "saving_pct": 100 * total["saving"],
        "bytes_before": total["bytes_before"],
        "bytes_after": total["bytes_after"],
        "tensors": dg.MetadataValue.md(table),
        "weights_max_abs_error": w["max_abs_error"],
        "weights_rel_rms_error": w["rel_rms_error"],
        "bloom_parts": b["parts"],
        "bloom_bits_per_edge": b["bits_per_edge"],
        "bloom_bits_per_key": b["bits_per_key"],
        "bloom_target_fpr": b["target_fpr"],
        "bloom_measured_fpr": b["measured_fpr"],
        "bloom_measured_fpr_max_part": b["measured_fpr_max"],
        "bloom_bytes_vs_int64_pairs": b["bytes_after"] / b["bytes_before"] if b["bytes_before"] else 0.0,
        "seconds": s["seconds"],
        "peak_rss_mb": s["peak_rss_bytes"] / 2**20,
        **disk_metadata(out),
    }
    if f:
        trade = (
            f"Measured with feature_transform='{f['transform']}'.\n\n"
            "| feature encoding | feature bytes | feature saving | rel RMS err | max abs err | whole-asset ratio |\n"
            "|---|---|---|---|---|---|\n"
        )
        for enc, row in f["encodings"].items():
            err = (
                f"{row['rel_rms_error']:.3g} | {row['max_abs_error']:.3g}"
                if "rel_rms_error" in row
                else "not measured | "
            )
            mark = " (stored)" if enc == f["encoding"] else ""
            trade += f"| {enc}{mark} | {row['bytes']:,} | {row['saving']:.1%} | {err} | {row['asset_ratio']:.2f}x |\n"
        metadata.update(
            features_max_abs_error=f["max_abs_error"],
            features_rel_rms_error=f["rel_rms_error"],
            feature_encodings=dg.MetadataValue.md(trade),
            **{f"ratio_if_{enc}": row["asset_ratio"] for enc, row in f["encodings"].items()},
        )
    return metadata


def check_compressed_graph(out, inputs: dict, cfg: CompressConfig) -> list[dg.AssetCheckResult]:
    """The two asset checks, evaluated on the files in `out` against the stage's inputs."""
    v = verify_compressed_graph(
        out,
        inputs[CanonicalGraph.STAGE],
        inputs[Adjacency.STAGE],
        inputs[Partitions.STAGE],
        sample_edges=cfg.check_edges,
        seed=cfg.seed,
    )
    bloom = dg.AssetCheckResult(
        check_name=NO_FALSE_NEGATIVES,
        passed=v["bloom_false_negatives"] == 0,
        metadata={"edges_checked": v["bloom_edges_checked"], "false_negatives": v["bloom_false_negatives"]},
    )
    bound = dg.AssetCheckResult(
        check_name=WITHIN_BOUND,
        passed=v["feature_columns_over_bound"] == 0 and v["weight_rows_over_bound"] == 0,
        metadata={
            "feature_encoding": v["feature_encoding"] or "none",
            "feature_columns_over_bound": v["feature_columns_over_bound"],
            "feature_bound_excess": v["feature_bound_excess"],
            "weight_rows_over_bound": v["weight_rows_over_bound"],
            "weight_bound_excess": v["weight_bound_excess"],
        },
    )
    return [bloom, bound]
