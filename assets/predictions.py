"""predictions: score a dataset as it is now with its promoted (else latest) trained model.

For nodes that arrived since training, without retraining: the model file of
`GnnflowStorage.inference_model_dir` (`promoted/` when a model was promoted, else
`trained_model/`) is loaded with its stored preprocessing (feature normalization statistics,
the feature input) and runs full-graph inference (`training.predict`), after checking the
model, node, feature and adjacency files against their stages' hashes.json.

Which graph it scores: when the landing files are the ones the published canonical_graph
ingested (the `landing_fingerprint` of its latest materialization), the published
canonical_graph and normalized_adjacency; otherwise the landing files as they are now,
ingested and normalized into a scratch folder of this step (the dataset's gnnflow.yaml
settings, the published adjacency's normalization) that is removed afterwards. So scoring new
data never replaces the published canonical_graph, and the shards, the trained model and the
next `train` run stay consistent with it.

The asset depends on `promotion`, so a run that also trains (`--select '*'`, the `retrain`
job, the landing sensor's runs) scores with the model promotion has just decided on; the
`predict` job selects it alone and scores with the model already there. Files:
`<GNNFLOW_HOME>/<dataset>/predictions/predictions.parquet` (`node_id` = the user's id,
`predicted`, `probabilities`, `index` = internal node index) and `summary.json` (with
`model_version`, the model version that scored).
"""

import contextlib
import dataclasses
import tempfile
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq

from assets.canonical_graph import CanonicalGraphConfig
from assets.common import GnnflowStorage, dataset_partitions, disk_metadata, ingested_fingerprint
from assets.normalized_adjacency import NormalizedAdjacencyConfig
from assets.reporting import stage_result
from assets.settings import SettingsError, read_settings_file, registered_configs, resolve
from graphs.formats.canonical_files import CanonicalGraph
from graphs.infra.storage import CorruptFileError, staged_output
from graphs.stages.canonical import (
    InputError,
    build_canonical_graph,
    has_training_labels,
    landing_fingerprint,
    read_summary,
)
from graphs.stages.normalize import Adjacency, build_normalized_adjacency
from training.outputs import MODEL_BEST, PREDICTIONS
from training.outputs import STAGE as TRAINED_MODEL
from training.predict import predict
from training.promotion import STAGE as PROMOTION

STAGE = "predictions"


@dg.asset(
    name=STAGE,  # the asset key: the stage's constant (also the function's name)
    partitions_def=dataset_partitions,
    # promotion (after trained_model and evaluation): in a run with both, score with the model promotion picked
    deps=[Adjacency.STAGE, TRAINED_MODEL, PROMOTION],
    group_name="inference",
    kinds={"pytorch", "parquet"},
)
def predictions(context: dg.AssetExecutionContext, storage: GnnflowStorage) -> dg.MaterializeResult:
    """Predicted class and class probabilities of every node, from the promoted (else latest) model."""
    dataset = storage.dataset(context)
    with storage.lock(dataset, context.log.info):
        return _score(context, storage, dataset)


def _score(context: dg.AssetExecutionContext, storage: GnnflowStorage, dataset: str) -> dg.MaterializeResult:
    own = storage.task(dataset).predictions(context, storage, dataset)
    if own is not None:  # a task that writes no node predictions: its own result
        return own
    if not any((storage.asset_dir(dataset, name) / MODEL_BEST).is_file() for name in ("promoted", TRAINED_MODEL)):
        canonical = storage.asset_dir(dataset, CanonicalGraph.STAGE)
        if not (canonical / Adjacency.SUMMARY).is_file() or not has_training_labels(read_summary(canonical)):
            context.log.info(f"dataset '{dataset}' has no labels and no model: nothing to score with, skipped")
            return dg.MaterializeResult(metadata={"skipped": "no labels and no trained model"})
    model_dir = storage.inference_model_dir(dataset)
    out = storage.asset_dir(dataset, STAGE)
    with _scoring_graph(context, storage, dataset) as (canonical, adjacency, graph):
        summary = read_summary(canonical)
        with storage.publishing(dataset, STAGE) as staged:
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
        "graph": graph,
        "nodes": summary["nodes"],
        "nodes_since_training": new_nodes if new_nodes is not None else "unknown",
        "predicted_per_class": dg.MetadataValue.json(s["predicted_per_class"]),
        "feature_input": s["feature_input"],
        "feature_norm": s["feature_norm"],
        "seconds": s["seconds"],
        **disk,
        "preview": dg.MetadataValue.md(_preview(out / PREDICTIONS)),
    }
    line = (
        f"{s['nodes']} nodes of the {graph} scored with {model_dir / MODEL_BEST} (version "
        f"{s['model_version'] or 'unversioned'}, epoch {s['model_epoch']}) in {s['seconds']:.3g} s"
    )
    return stage_result(context, STAGE, metadata, line=line)


PUBLISHED = "published canonical_graph"
SCRATCH = "landing files as they are now"


@contextlib.contextmanager
def _scoring_graph(context, storage: GnnflowStorage, dataset: str):
    """(canonical, adjacency, which) to score: the published stages when they ingested the
    landing files as they are now (or the landing folder is gone), else the landing files
    ingested and normalized into a scratch folder that is removed when the block ends."""
    landing = storage.landing_dir(dataset)
    canonical = storage.asset_dir(dataset, CanonicalGraph.STAGE)
    adjacency = storage.asset_dir(dataset, Adjacency.STAGE)
    published = (canonical / Adjacency.SUMMARY).is_file() and (adjacency / Adjacency.SUMMARY).is_file()
    if not landing.is_dir() or (
        published and ingested_fingerprint(context.instance, dataset) == landing_fingerprint(landing)
    ):
        yield (
            storage.upstream_dir(dataset, CanonicalGraph.STAGE),
            storage.upstream_dir(dataset, Adjacency.STAGE),
            PUBLISHED,
        )
        return
    canonical_cfg, adjacency_cfg = _scratch_settings(storage, dataset, adjacency if published else None)
    context.log.info(
        f"dataset '{dataset}': its landing files differ from the ones the published canonical_graph ingested; "
        "scoring them as they are now from a scratch ingest (the published stages stay as they are)"
    )
    with tempfile.TemporaryDirectory(prefix=".scoring-", dir=storage.dataset_dir(dataset)) as scratch:
        root = Path(scratch)
        try:
            with staged_output(root / CanonicalGraph.STAGE) as tmp:
                build_canonical_graph(landing, tmp, canonical_cfg)
            with staged_output(root / Adjacency.STAGE) as tmp:
                build_normalized_adjacency(root / CanonicalGraph.STAGE, tmp, adjacency_cfg)
        except InputError as exc:
            raise dg.Failure(description=f"dataset '{dataset}': {exc}") from exc
        yield root / CanonicalGraph.STAGE, root / Adjacency.STAGE, SCRATCH


# the settings of the published adjacency that decide the values a model was trained over
_ADJACENCY_VALUES = ("add_self_loops", "degree_norm", "self_loop_weight")


def _scratch_settings(storage: GnnflowStorage, dataset: str, published_adjacency: Path | None):
    """The canonical and adjacency dataclass configs of a scratch ingest: the dataset's
    gnnflow.yaml settings, and the published adjacency's normalization where there is one."""
    path = storage.settings_file(dataset)
    try:
        blocks = read_settings_file(path, registered_configs())
        canonical, _ = resolve(
            CanonicalGraphConfig, CanonicalGraph.STAGE, {}, blocks.get(CanonicalGraph.STAGE, {}), path
        )
        adjacency, _ = resolve(NormalizedAdjacencyConfig, Adjacency.STAGE, {}, blocks.get(Adjacency.STAGE, {}), path)
    except SettingsError as exc:
        raise dg.Failure(description=f"dataset '{dataset}': {exc}") from exc
    adjacency_cfg = adjacency.to_dataclass()
    if published_adjacency is not None:
        recorded = Adjacency.open(published_adjacency).summary
        kept = {k: recorded[k] for k in _ADJACENCY_VALUES if k in recorded}
        adjacency_cfg = dataclasses.replace(adjacency_cfg, **kept)
    return canonical.to_dataclass(), adjacency_cfg


def _nodes_at_training(model_dir) -> int | None:
    """Node count of the dataset the model was trained on (its predictions.parquet), if present."""
    path = model_dir / PREDICTIONS
    return pq.ParquetFile(path).metadata.num_rows if path.is_file() else None


def _preview(path, rows: int = 5) -> str:
    """The first rows of predictions.parquet as a Markdown table (node_id, predicted)."""
    t = pq.read_table(path, columns=["node_id", "predicted"]).slice(0, rows).to_pylist()
    lines = ["| node_id | predicted |", "| --- | --- |"] + [f"| {r['node_id']} | {r['predicted']} |" for r in t]
    return "\n".join(lines)
