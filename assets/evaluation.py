"""evaluation and promotion: test metrics of the newest model, and the gate that moves `promoted`.

`evaluation` scores `trained_model/predictions.parquet` (the newest model) on the canonical
graph's labelled test nodes with `training.metrics` (accuracy, macro precision/recall/F1,
per-class precision/recall/F1, the confusion matrix, and ROC-AUC / PR-AUC for two classes),
scores the promoted model (`<dataset>/promoted/`) the same way, and writes

    <GNNFLOW_HOME>/<dataset>/evaluation/metrics.json          {"candidate": {...}, "promoted": {...} | null}
    <GNNFLOW_HOME>/<dataset>/evaluation/confusion_matrix.png

`promotion` then applies `training.promotion.decide` (headline metric, margin; its run config
or the dataset's gnnflow.yaml) and, when the new model passes, points `<dataset>/promoted`
at its `model_versions/<version>/` folder. A retrain that is worse shows in the UI as a
failed (warning) `promotion` check with the reason, and the promoted model stays.

Link prediction (gnnflow.yaml ``task: link_prediction``): `evaluation` recomputes ROC-AUC,
MRR and Hits@10/50/100 of trained_model's model on edge_split's validation and test edges
against its fixed negatives (`training.link.evaluate_saved`) into metrics.json and the
metadata; `promotion` does not apply and says so.

Every file these assets read is first checked against the hashes.json its stage published
(`graphs.storage.verify_files`), and both record trained_model/ as a model version when it
is not yet kept (`GnnflowStorage.record_model_version`), so a run that died between
publishing trained_model/ and recording it is completed here, without retraining.
"""

import json
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow.parquet as pq

from assets.common import NEEDS_LABELS_TAG, GnnflowStorage, dataset_partitions, png_markdown, skip_without_labels
from assets.config import dagster_config
from assets.reporting import stage_result
from assets.settings import register_config
from graphs.canonical import read_summary
from graphs.edge_split import LINK_PREDICTION
from graphs.storage import CorruptFileError, verify_files
from training.metrics import node_classification_report
from training.outputs import LINK_MODEL
from training.promotion import PromotionConfig, decide

_EVALUATION = "evaluation"
_PROMOTION = "promotion"
NOT_WORSE = "not_worse_than_promoted"
HEADLINES = ("accuracy", "macro_f1", "macro_precision", "macro_recall", "roc_auc", "pr_auc")

PromotionRunConfig = dagster_config(PromotionConfig, "PromotionRunConfig")
register_config(_PROMOTION, PromotionRunConfig)


def _verified(folder: Path, names: list[str], stage: str) -> None:
    """Fail the run, naming the file and the stage to re-materialize, unless the files are as published."""
    try:
        verify_files(folder, names, stage=stage)
    except CorruptFileError as exc:
        raise dg.Failure(description=str(exc)) from None


def _promoted_report(context, canonical: Path, promoted: Path) -> dict | None:
    """The promoted model's report; None when nothing is promoted, or when its files are not as
    published (damaged, or kept by an older gnnflow without hashes.json): the candidate is then
    compared with nothing, so promotion can replace a model that can no longer be trusted."""
    if not (promoted / "predictions.parquet").is_file():
        return None
    try:
        verify_files(promoted, stage="trained_model")
    except CorruptFileError as exc:
        context.log.warning(f"the promoted model is left out of the comparison: {exc}")
        return None
    return _report(canonical, promoted)


def _report(canonical: Path, model: Path) -> dict:
    _verified(canonical, ["nodes.parquet"], "canonical_graph")
    _verified(model, ["predictions.parquet"], "trained_model")
    nodes = pq.read_table(canonical / "nodes.parquet", columns=["node_id", "label", "split"])
    predictions = pq.read_table(model / "predictions.parquet")
    try:
        return node_classification_report(nodes, predictions, "test")
    except ValueError as exc:
        raise dg.Failure(description=f"{model / 'predictions.parquet'}: {exc}") from exc


def plot_confusion(cm: np.ndarray, path: Path) -> None:
    """A small confusion-matrix heat map (row-normalized colours, counts written for <= 12 classes)."""
    from graphs.plotting import headless_pyplot

    plt = headless_pyplot()
    c = cm.shape[0]
    side = min(2.5 + 0.25 * c, 6.0)
    fig, ax = plt.subplots(figsize=(side, side))
    rows = cm.sum(1, keepdims=True)
    ax.imshow(np.divide(cm, rows, out=np.zeros(cm.shape), where=rows > 0), cmap="Blues", vmin=0, vmax=1)
    if c <= 12:
        for i, j in zip(*np.nonzero(cm)):
            ax.text(j, i, str(cm[i, j]), ha="center", va="center", fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("test confusion matrix")
    fig.tight_layout()
    fig.savefig(path, dpi=60)
    plt.close(fig)


def _headlines(report: dict) -> dict:
    return {k: report[k] for k in HEADLINES if k in report}


@dg.asset(
    partitions_def=dataset_partitions,
    deps=["trained_model"],
    group_name="training",
    kinds={"numpy"},
    tags={NEEDS_LABELS_TAG: "labels"},
)
def evaluation(context: dg.AssetExecutionContext, storage: GnnflowStorage) -> dg.MaterializeResult:
    """Test metrics of the newest model and of the promoted one (training.metrics), confusion matrix."""
    dataset = storage.dataset(context)
    if storage.task(dataset) == LINK_PREDICTION:
        return _evaluate_link_prediction(context, storage, dataset)
    with storage.lock(dataset, context.log.info):
        canonical = storage.upstream_dir(dataset, "canonical_graph")
        skipped = skip_without_labels(context, read_summary(canonical), "evaluate", [])
        if skipped is not None:
            return skipped
        model = storage.upstream_dir(dataset, "trained_model")
        candidate = _report(canonical, model)
        storage.record_model_version(dataset, context.run.run_id)
        promoted_dir = storage.promoted_dir(dataset)
        promoted = _promoted_report(context, canonical, promoted_dir)
        record = {
            "candidate": {"version": storage.model_version(model), **candidate},
            "promoted": None if promoted is None else {"version": storage.model_version(promoted_dir), **promoted},
        }
        with storage.publishing(dataset, _EVALUATION) as out:
            out.mkdir()
            (out / "metrics.json").write_text(json.dumps(record, indent=1, allow_nan=True))
            plot_confusion(np.asarray(candidate["confusion_matrix"]), out / "confusion_matrix.png")
        out = storage.asset_dir(dataset, _EVALUATION)
    pc = candidate["per_class"]
    table = "| class | precision | recall | F1 | support |\n| --- | --- | --- | --- | --- |\n" + "\n".join(
        f"| {k} | {p:.3f} | {r:.3f} | {f:.3f} | {s} |"
        for k, (p, r, f, s) in enumerate(zip(pc["precision"], pc["recall"], pc["f1"], pc["support"]))
    )
    metadata: dict = {
        "path": dg.MetadataValue.path(str(out)),
        "version": record["candidate"]["version"] or "unversioned",
        "test_nodes": candidate["rows"],
        **_headlines(candidate),
        "per_class": dg.MetadataValue.md(table),
        "confusion_matrix": png_markdown(out / "confusion_matrix.png", "confusion matrix"),
    }
    if promoted is not None:
        metadata["promoted_version"] = record["promoted"]["version"] or "unversioned"
        metadata.update({f"promoted_{k}": v for k, v in _headlines(promoted).items()})
        metadata["accuracy_change_points"] = (candidate["accuracy"] - promoted["accuracy"]) * 100
    headline = ("accuracy", "macro_f1", "test_nodes", "promoted_accuracy")
    return stage_result(context, _EVALUATION, metadata, headline=headline)


def _evaluate_link_prediction(context, storage: GnnflowStorage, dataset: str) -> dg.MaterializeResult:
    """task: link_prediction: ROC-AUC, MRR and Hits@K of trained_model's model.safetensors on edge_split's
    validation and test edges against its fixed negatives, recomputed (`training.link.evaluate_saved`)."""
    from training.link import evaluate_saved

    with storage.lock(dataset, context.log.info):
        model = storage.upstream_dir(dataset, "trained_model")
        split = storage.upstream_dir(dataset, "edge_split")
        adjacency = storage.upstream_dir(dataset, "normalized_adjacency")
        shards = storage.asset_dir(dataset, "minibatch_shards")
        _verified(model, [LINK_MODEL, "summary.json"], "trained_model")
        try:
            reports = evaluate_saved(model, shards, split, adjacency)
        except (ValueError, FileNotFoundError, KeyError) as exc:
            raise dg.Failure(description=f"dataset '{dataset}': {exc}; re-materialize trained_model") from exc
        record = {"task": LINK_PREDICTION, "candidate": reports, "promoted": None}
        with storage.publishing(dataset, _EVALUATION) as out:
            out.mkdir()
            (out / "metrics.json").write_text(json.dumps(record, indent=1, allow_nan=True))
        out = storage.asset_dir(dataset, _EVALUATION)
    test = reports["test"]
    context.log.info(
        f"evaluation: test ROC-AUC {test['auc']:.4f}, MRR {test['mrr']:.4f}, Hits@50 {test['hits@50']:.4f} "
        f"({test['positives']} held-out edges against {test['negatives']} fixed negatives)"
    )
    metadata = {"path": dg.MetadataValue.path(str(out)), "task": LINK_PREDICTION}
    for which, r in reports.items():
        metadata.update({f"{which}_{k}": round(v, 4) for k, v in r.items() if isinstance(v, float)})
    metadata["test_edges"] = test["positives"]
    metadata["eval_negatives"] = test["negatives"]
    return dg.MaterializeResult(metadata=metadata)


@dg.asset(
    partitions_def=dataset_partitions,
    deps=[evaluation],
    group_name="training",
    tags={NEEDS_LABELS_TAG: "labels"},
    check_specs=[
        dg.AssetCheckSpec(
            NOT_WORSE,
            asset=_PROMOTION,
            description="The newest model's headline test metric did not drop by more than the margin "
            "below the promoted model's (a warning: the promoted model stays in place).",
        )
    ],
)
def promotion(
    context: dg.AssetExecutionContext, config: PromotionRunConfig, storage: GnnflowStorage
) -> dg.MaterializeResult:
    """Moves <dataset>/promoted to the newest model version unless its headline metric dropped by more than the margin."""
    dataset = storage.dataset(context)
    config, config_metadata = storage.settings(context, dataset, _PROMOTION, config)
    cfg = config.to_dataclass()
    if storage.task(dataset) == LINK_PREDICTION:
        why = "link prediction: promotion compares node-classification metrics; not applied"
        context.log.info(f"promotion: {why}")
        return dg.MaterializeResult(
            metadata={"promoted": False, "reason": why},
            check_results=[dg.AssetCheckResult(check_name=NOT_WORSE, passed=True, metadata={"skipped": why})],
        )
    with storage.lock(dataset, context.log.info):
        summary = read_summary(storage.upstream_dir(dataset, "canonical_graph"))
        skipped = skip_without_labels(context, summary, "promote", [NOT_WORSE])
        if skipped is not None:
            return skipped
        metrics_file = storage.asset_dir(dataset, _EVALUATION) / "metrics.json"
        if not metrics_file.is_file():
            raise dg.Failure(
                description=f"dataset '{dataset}': no evaluation at {metrics_file.parent}; materialize evaluation first"
            )
        _verified(metrics_file.parent, [metrics_file.name], _EVALUATION)
        if storage.asset_dir(dataset, "trained_model").is_dir():
            storage.record_model_version(dataset, context.run.run_id)
        record = json.loads(metrics_file.read_text())
        candidate, promoted = record["candidate"], record["promoted"]
        version = candidate["version"]
        if version is None:
            raise dg.Failure(
                description=f"dataset '{dataset}': the trained_model was written before model versions existed; "
                "re-materialize trained_model"
            )
        ok, why = decide(candidate[cfg.metric], None if promoted is None else promoted[cfg.metric], cfg)
        if ok:
            storage.promote(dataset, version)
        current = (
            storage.model_version(storage.promoted_dir(dataset)) if storage.promoted_dir(dataset).exists() else None
        )
    metadata = {
        "promoted": ok,
        "reason": why,
        "candidate_version": version,
        "promoted_version": current or "none",
        "metric": cfg.metric,
        "candidate_value": candidate[cfg.metric],
        **config_metadata,
    }
    if promoted is not None:
        metadata["previous_value"] = promoted[cfg.metric]
    check = dg.AssetCheckResult(
        check_name=NOT_WORSE,
        passed=ok,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"reason": why, "margin": cfg.margin},
    )
    line = f"{'promoted' if ok else 'kept the promoted model'} {version if ok else current}: {why}"
    return stage_result(context, _PROMOTION, metadata, line=line, check_results=[check])
