"""predictions: score a dataset as it is now with its promoted (else latest) trained model.

For nodes that arrived since training, without retraining: the `predict` job re-ingests the
updated landing files (canonical_graph, normalized_adjacency), then this asset loads the
model file of `GnnflowStorage.inference_model_dir` (`promoted/` when a model was promoted,
else `trained_model/`) with its stored preprocessing (feature normalization statistics, the
feature input) and runs full-graph inference (`training.predict`), after checking the model,
node, feature and adjacency files against their stages' hashes.json. The asset depends on
`promotion`, so a run that also trains (`--select '*'`) scores with the model promotion has
just decided on; the `predict` job selects it without the training stages and scores with the
model already there. Files: `<GNNFLOW_HOME>/<dataset>/predictions/predictions.parquet`
(`node_id` = the user's id, `predicted`, `probabilities`, `index` = internal node index) and
`summary.json` (with `model_version`, the model version that scored).
"""

import dagster as dg
import pyarrow.parquet as pq

from assets.common import GnnflowStorage, dataset_partitions, disk_metadata
from assets.reporting import stage_result
from graphs.canonical import has_training_labels, read_summary
from graphs.storage import CorruptFileError
from training.outputs import MODEL_BEST
from training.predict import predict

_ASSET = "predictions"


@dg.asset(
    partitions_def=dataset_partitions,
    # promotion (after trained_model and evaluation): in a run with both, score with the model promotion picked
    deps=["normalized_adjacency", "trained_model", "promotion"],
    group_name="inference",
    kinds={"pytorch", "parquet"},
)
def predictions(context: dg.AssetExecutionContext, storage: GnnflowStorage) -> dg.MaterializeResult:
    """Predicted class and class probabilities of every node, from the promoted (else latest) model."""
    dataset = storage.dataset(context)
    with storage.lock(dataset, context.log.info):
        return _score(context, storage, dataset)


def _score(context: dg.AssetExecutionContext, storage: GnnflowStorage, dataset: str) -> dg.MaterializeResult:
    canonical = storage.upstream_dir(dataset, "canonical_graph")
    adjacency = storage.upstream_dir(dataset, "normalized_adjacency")
    summary = read_summary(canonical)
    if not has_training_labels(summary) and not any(
        (storage.asset_dir(dataset, name) / MODEL_BEST).is_file() for name in ("promoted", "trained_model")
    ):
        context.log.info(f"dataset '{dataset}' has no labels and no model: nothing to score with, skipped")
        return dg.MaterializeResult(metadata={"skipped": "no labels and no trained model"})
    model_dir = storage.inference_model_dir(dataset)
    out = storage.asset_dir(dataset, _ASSET)
    with storage.publishing(dataset, _ASSET) as staged:
        try:
            s = predict(model_dir / MODEL_BEST, canonical, adjacency, staged)
        except (ValueError, CorruptFileError) as exc:
            raise dg.Failure(description=f"dataset '{dataset}': {exc}") from None
        disk = disk_metadata(staged)
    trained_nodes = _nodes_at_training(model_dir)
    new_nodes = s["nodes"] - trained_nodes if trained_nodes is not None else None
    metadata = {
        "path": dg.MetadataValue.path(str(out)),
        "model": dg.MetadataValue.path(s["model"]),
        "model_version": s["model_version"] or "unversioned",
        "model_epoch": s["model_epoch"],
        "nodes": summary["nodes"],
        "nodes_since_training": new_nodes if new_nodes is not None else "unknown",
        "predicted_per_class": dg.MetadataValue.json(s["predicted_per_class"]),
        "feature_input": s["feature_input"],
        "feature_norm": s["feature_norm"],
        "seconds": s["seconds"],
        **disk,
        "preview": dg.MetadataValue.md(_preview(out / "predictions.parquet")),
    }
    line = (
        f"{s['nodes']} nodes scored with {model_dir / MODEL_BEST} (version {s['model_version'] or 'unversioned'}, "
        f"epoch {s['model_epoch']}) in {s['seconds']:.3g} s"
    )
    return stage_result(context, _ASSET, metadata, line=line)


def _nodes_at_training(model_dir) -> int | None:
    """Node count of the dataset the model was trained on (its predictions.parquet), if present."""
    path = model_dir / "predictions.parquet"
    return pq.ParquetFile(path).metadata.num_rows if path.is_file() else None


def _preview(path, rows: int = 5) -> str:
    """The first rows of predictions.parquet as a Markdown table (node_id, predicted)."""
    t = pq.read_table(path, columns=["node_id", "predicted"]).slice(0, rows).to_pylist()
    lines = ["| node_id | predicted |", "| --- | --- |"] + [f"| {r['node_id']} | {r['predicted']} |" for r in t]
    return "\n".join(lines)
