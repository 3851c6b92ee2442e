"""evaluation and promotion: test metrics of the newest model, and the gate that moves `promoted`.

`evaluation` scores `trained_model/predictions.parquet` (the newest model) on the canonical
graph's labelled test nodes with `training.metrics` (accuracy, macro precision/recall/F1,
per-class precision/recall/F1, the confusion matrix, and ROC-AUC / PR-AUC for two classes),
and gathers what `training.promotion.decide_promotion` needs: the majority-class baseline, the
promoted model's predictions joined on the user's node ids, scored on the labelled test nodes
both models were evaluated on with the same label and on the current labels, and how the labels
changed since the promoted version was evaluated. It writes

    <GNNFLOW_HOME>/<dataset>/evaluation/metrics.json          {"candidate": {...}, "promoted": {...} | null,
                                                              "majority", "same_labels", "current_labels",
                                                              "label_change", "classes"}
    <GNNFLOW_HOME>/<dataset>/evaluation/test_labels.parquet   the labelled test nodes scored (`training.promotion`)
    <GNNFLOW_HOME>/<dataset>/evaluation/confusion_matrix.png

and the same record (metrics.json, test_labels.parquet) as `<dataset>/model_evaluations/<version>/`,
except for the promoted version, whose record stays the one it was promoted on.

`promotion` then applies `decide_promotion` (settings: `training.promotion.PromotionConfig`,
its run config or the dataset's gnnflow.yaml) and, when the new model passes, points
`<dataset>/promoted` at its `model_versions/<version>/` folder, then removes versions beyond
``keep_versions`` (`GnnflowStorage.apply_retention`). A refused promotion is a failed (warning)
`promotion` check and a warning line in the run's log, both with the reason; the promoted
model stays.

That is node classification's evaluation; `evaluation` runs the dataset task's own
(`assets.task_registry.Task.evaluate`: link prediction's is in `assets.tasks.link_prediction`),
and `promotion` does not apply to a task whose traits say why (``not_promoted``).

Every file these assets read is first checked against the hashes.json its stage published
(`graphs.infra.storage.verify_files`), and both record trained_model/ as a model version when it
is not yet kept (`GnnflowStorage.record_model_version`), so a run that died between
publishing trained_model/ and recording it is completed here, without retraining.
"""

import json
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from assets.common import NEEDS_LABELS_TAG, GnnflowStorage, dataset_partitions, png_markdown, skip_without_labels
from assets.config import dagster_config
from assets.reporting import stage_result
from assets.settings import register_config
from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.label_classes import read_label_classes
from graphs.infra.plotting import headless_pyplot
from graphs.infra.storage import CorruptFileError, staged_output, verified, verify_files
from graphs.stages.canonical import read_summary
from training.metrics import classification_report, node_classification_report
from training.outputs import PREDICTIONS
from training.outputs import STAGE as TRAINED_MODEL
from training.promotion import (
    LABELS_FILE,
    TEST_LABELS_FILE,
    Decision,
    Evidence,
    LabelRecord,
    PromotionConfig,
    class_values,
    decide_promotion,
    describe_change,
    label_change,
    majority_baseline,
    positions,
    read_canonical_labels,
    read_label_counts,
    remap_classes,
    same_label_mask,
)
from training.promotion import STAGE as PROMOTION

STAGE = "evaluation"  # this module also defines promotion (`training.promotion.STAGE`)
METRICS_FILE = "metrics.json"  # a model evaluation's figures (one per model version)
NOT_WORSE = "not_worse_than_promoted"
HEADLINES = ("accuracy", "macro_f1", "macro_precision", "macro_recall", "roc_auc", "pr_auc")
_PAIR_METRICS = ("accuracy", "macro_f1")

PromotionRunConfig = dagster_config(PromotionConfig, "PromotionRunConfig")
register_config(PROMOTION, PromotionRunConfig)


def promotion_config(context, storage: GnnflowStorage, dataset: str) -> PromotionConfig:
    """The dataset's effective promotion settings (run config > gnnflow.yaml > defaults), for any asset."""
    config, _ = storage.settings(context, dataset, PROMOTION, PromotionRunConfig())
    return config.to_dataclass()


def promoted_training_labels(storage: GnnflowStorage, dataset: str, log) -> tuple[dict | None, str | None]:
    """(training-label counts, version) of the promoted model; counts None when it records none or
    its record is damaged (said in the log: the label-shift check is then skipped)."""
    version = storage.promoted_version(dataset)
    folder = storage.promoted_dir(dataset)
    if version is None or not (folder / LABELS_FILE).is_file():
        if version is not None:
            log.info(f"the promoted version {version} records no training labels: the label shift is not checked")
        return None, version
    try:
        return read_label_counts(verified(folder, LABELS_FILE, stage=TRAINED_MODEL)), version
    except (CorruptFileError, ValueError) as exc:
        log.warning(f"the promoted model's training labels are left out of the label check: {exc}")
        return None, version


def publish_candidate_metrics(
    storage: GnnflowStorage, dataset: str, task: str, reports: dict, promoted: dict | None = None
) -> Path:
    """Publish evaluation's metrics.json of a task other than node classification: the reports of
    the candidate and, where the task compares one, of the promoted model; the published folder."""
    record = {"task": task, "candidate": reports, "promoted": promoted}
    with storage.publishing(dataset, STAGE) as out:
        out.mkdir()
        (out / METRICS_FILE).write_text(json.dumps(record, indent=1, allow_nan=True))
    return storage.asset_dir(dataset, STAGE)


def verified_or_failure(folder: Path, names: list[str], stage: str) -> None:
    """Fail the run, naming the file and the stage to re-materialize, unless the files are as published."""
    try:
        verify_files(folder, names, stage=stage)
    except CorruptFileError as exc:
        raise dg.Failure(description=str(exc)) from None


def _usable_promoted(context, promoted: Path) -> bool:
    """Whether a promoted model exists with its files as published; a damaged one (or one kept by an
    older gnnflow without hashes.json) is left out of the comparison, said in the log, so promotion
    can replace a model that can no longer be trusted."""
    if not (promoted / PREDICTIONS).is_file():
        return False
    try:
        verify_files(promoted, stage=TRAINED_MODEL)
    except CorruptFileError as exc:
        context.log.warning(f"the promoted model is left out of the comparison: {exc}")
        return False
    return True


def _report(canonical: Path, model: Path) -> dict:
    graph = CanonicalGraph.open(canonical)
    verified_or_failure(canonical, [graph.NODES], graph.STAGE)
    verified_or_failure(model, [PREDICTIONS], TRAINED_MODEL)
    nodes = pq.read_table(graph.nodes_path, columns=["node_id", "label", "split"])
    predictions = pq.read_table(model / PREDICTIONS)
    try:
        return node_classification_report(nodes, predictions, "test")
    except ValueError as exc:
        raise dg.Failure(description=f"{model / PREDICTIONS}: {exc}") from exc


def _test_labels(canonical: Path) -> tuple[LabelRecord, int, float]:
    """The labelled test nodes (by the user's id) and the majority-class baseline (class, accuracy)."""
    nodes = read_canonical_labels(canonical, ("original_id", "label", "split"))
    labels = np.asarray(nodes.column("label").fill_null(-1).to_numpy(), dtype=np.int64)
    split = np.asarray(nodes.column("split").to_numpy(zero_copy_only=False))
    test = (split == "test") & (labels >= 0)
    ids = nodes.column("original_id").combine_chunks().filter(pa.array(test))
    record = LabelRecord(ids, labels[test], read_label_classes(canonical))
    majority, share = majority_baseline(labels[split == "train"], record.labels)
    return record, majority, share


def _predicted(model: Path, now: LabelRecord) -> tuple[np.ndarray, np.ndarray]:
    """(has a prediction, predicted class index over `now`'s classes, -1 for a class it lacks) per
    node of `now`, joined on the user's ids."""
    table = pq.read_table(model / PREDICTIONS)
    column = "predicted_index" if "predicted_index" in table.column_names else "predicted"
    row = positions(now.ids, table.column("node_id").combine_chunks())
    found = row >= 0
    index = np.asarray(table.column(column).to_numpy(), dtype=np.int64)[row[found]]
    values = class_values(read_label_classes(model), int(index.max()) + 1 if index.size else 0)
    predicted = np.full(row.size, -1, dtype=np.int64)
    predicted[found] = remap_classes(index, values, now.values())
    return found, predicted


def _pair(now: LabelRecord, mask: np.ndarray, candidate: np.ndarray, promoted: np.ndarray) -> dict:
    """Headline metrics of both models on the nodes of `mask` (a class a model lacks counts as wrong)."""
    c = len(now.values()) + 1
    y = now.labels[mask]

    def scores(pred: np.ndarray) -> dict:
        report = classification_report(y, np.where(pred[mask] < 0, c - 1, pred[mask]), c)
        return {k: report[k] for k in _PAIR_METRICS}

    return {"nodes": int(mask.sum()), "candidate": scores(candidate), "promoted": scores(promoted)}


def _read_record(folder: Path) -> LabelRecord | None:
    """The labelled test nodes a version was evaluated on (None when it has no record)."""
    if not (folder / TEST_LABELS_FILE).is_file():
        return None
    table = pq.read_table(verified(folder, TEST_LABELS_FILE, stage=STAGE))
    classes = json.loads(verified(folder, METRICS_FILE, stage=STAGE).read_text()).get("classes")
    ids = table.column("original_id").combine_chunks()
    return LabelRecord(ids, np.asarray(table.column("label").to_numpy(), dtype=np.int64), classes)


def _compare_with_promoted(storage: GnnflowStorage, dataset: str, now: LabelRecord, candidate: np.ndarray) -> dict:
    """The promoted model against the candidate on the same nodes: `same_labels`, `current_labels`,
    `label_change` and its headline metrics on the current labels (`promoted`)."""
    version = storage.promoted_version(dataset)
    found, promoted = _predicted(storage.promoted_dir(dataset), now)
    current = _pair(now, found, candidate, promoted)
    try:
        before = _read_record(storage.evaluations_dir(dataset) / version)
    except (CorruptFileError, ValueError, KeyError, OSError) as exc:
        raise dg.Failure(
            description=f"dataset '{dataset}': the evaluation record of the promoted version {version}: {exc}; remove "
            f"{storage.evaluations_dir(dataset) / version} to compare the models on the current labels only"
        ) from None
    same = None if before is None else _pair(now, found & same_label_mask(before, now), candidate, promoted)
    return {
        "promoted": {"version": version, **current["promoted"]},
        "current_labels": current,
        "same_labels": same,
        "label_change": None if before is None else label_change(before, now),
    }


def _write_record(out: Path, record: dict, now: LabelRecord) -> None:
    out.mkdir()
    (out / METRICS_FILE).write_text(json.dumps(record, indent=1, allow_nan=True, default=str))
    pq.write_table(
        pa.table({"original_id": now.ids, "label": pa.array(now.labels, pa.int32())}), out / TEST_LABELS_FILE
    )


def plot_confusion(cm: np.ndarray, path: Path) -> None:
    """A small confusion-matrix heat map (row-normalized colours, counts written for <= 12 classes)."""
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
    name=STAGE,  # the asset key: the stage's constant (also the function's name)
    partitions_def=dataset_partitions,
    deps=[TRAINED_MODEL],
    group_name="training",
    kinds={"numpy"},
    tags={NEEDS_LABELS_TAG: "labels"},
)
def evaluation(context: dg.AssetExecutionContext, storage: GnnflowStorage) -> dg.MaterializeResult:
    """Test metrics of the newest model and of the promoted one (training.metrics), confusion matrix."""
    dataset = storage.dataset(context)
    return storage.task(dataset).evaluate(context, storage, dataset)


def evaluate_node_classification(context, storage: GnnflowStorage, dataset: str) -> dg.MaterializeResult:
    """Node classification's evaluation (the module docstring): the newest model's test metrics,
    compared with the promoted model's."""
    with storage.lock(dataset, context.log.info):
        canonical = storage.upstream_dir(dataset, CanonicalGraph.STAGE)
        skipped = skip_without_labels(context, read_summary(canonical), "evaluate", [])
        if skipped is not None:
            return skipped
        record, candidate = _evaluate(context, storage, dataset, canonical)
        out = storage.asset_dir(dataset, STAGE)
    return stage_result(context, STAGE, _evaluation_metadata(out, record, candidate), headline=_EVAL_HEADLINE)


_EVAL_HEADLINE = ("accuracy", "macro_f1", "test_nodes", "majority_class_accuracy", "promoted_accuracy")


def _evaluate(context, storage: GnnflowStorage, dataset: str, canonical: Path) -> tuple[dict, dict]:
    """Score the candidate (and the promoted model), publish evaluation/ and the version's record."""
    model = storage.upstream_dir(dataset, TRAINED_MODEL)
    candidate = _report(canonical, model)
    version = storage.record_model_version(dataset, context.run.run_id)
    now, majority, majority_accuracy = _test_labels(canonical)
    _, predicted = _predicted(model, now)
    record = {
        "candidate": {"version": version, **candidate},
        "promoted": None,
        "majority": {
            "class": class_values(now.classes, majority + 1)[majority] if majority >= 0 else None,
            "accuracy": majority_accuracy,
        },
        "classes": now.classes,
    }
    if _usable_promoted(context, storage.promoted_dir(dataset)):
        record.update(_compare_with_promoted(storage, dataset, now, predicted))
    with storage.publishing(dataset, STAGE) as out:
        _write_record(out, record, now)
        plot_confusion(np.asarray(candidate["confusion_matrix"]), out / "confusion_matrix.png")
    if version != storage.promoted_version(dataset):  # the promoted version keeps the record it was promoted on
        with staged_output(storage.evaluations_dir(dataset) / version) as out:
            _write_record(
                out,
                {**record, "candidate": {"version": version, "test_nodes": candidate["rows"], **_headlines(candidate)}},
                now,
            )
    return record, candidate


def _evaluation_metadata(out: Path, record: dict, candidate: dict) -> dict:
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
        "majority_class_accuracy": record["majority"]["accuracy"],
        "per_class": dg.MetadataValue.md(table),
        "confusion_matrix": png_markdown(out / "confusion_matrix.png", "confusion matrix"),
    }
    promoted = record["promoted"]
    if promoted is not None:
        metadata["promoted_version"] = promoted["version"]
        metadata.update({f"promoted_{k}": promoted[k] for k in _PAIR_METRICS})
        metadata["accuracy_change_points"] = (candidate["accuracy"] - promoted["accuracy"]) * 100
        if record["same_labels"] is not None:
            metadata["same_label_nodes"] = record["same_labels"]["nodes"]
        change = describe_change(record["label_change"])
        if change is not None:
            metadata["label_change"] = change
    return metadata


@dg.asset(
    name=PROMOTION,  # the asset key: the stage's constant (also the function's name)
    partitions_def=dataset_partitions,
    deps=[evaluation],
    group_name="training",
    tags={NEEDS_LABELS_TAG: "labels"},
    check_specs=[
        dg.AssetCheckSpec(
            NOT_WORSE,
            asset=PROMOTION,
            description="The newest model was promoted: it beats the majority class, the promoted version is "
            "not pinned, the labels did not change since the promoted version was evaluated (unless "
            "accept_label_change), and its headline test metric did not drop by more than the margin below the "
            "promoted model's on the same labelled test nodes (a warning: the promoted model stays in place).",
        )
    ],
)
def promotion(
    context: dg.AssetExecutionContext, config: PromotionRunConfig, storage: GnnflowStorage
) -> dg.MaterializeResult:
    """Moves <dataset>/promoted to the newest model version when `training.promotion.decide_promotion` allows it."""
    dataset = storage.dataset(context)
    config, config_metadata = storage.settings(context, dataset, PROMOTION, config)
    cfg = config.to_dataclass()
    task = storage.task(dataset)
    why = task.traits.not_promoted
    if why is not None:
        context.log.info(f"promotion: {why}")
        return dg.MaterializeResult(
            metadata={"promoted": False, "reason": why},
            check_results=[dg.AssetCheckResult(check_name=NOT_WORSE, passed=True, metadata={"skipped": why})],
        )
    with storage.lock(dataset, context.log.info):
        if task.traits.needs_labels:
            summary = read_summary(storage.upstream_dir(dataset, CanonicalGraph.STAGE))
            skipped = skip_without_labels(context, summary, "promote", [NOT_WORSE])
            if skipped is not None:
                return skipped
        record = _evaluation_record(storage, dataset, context.run.run_id)
        candidate, promoted = record["candidate"], record["promoted"]
        version = candidate["version"]
        if version is None:
            raise dg.Failure(
                description=f"dataset '{dataset}': the trained_model was written before model versions existed; "
                "re-materialize trained_model"
            )
        decision = task.decide_promotion(storage, dataset, record, cfg)
        ok, why = decision.ok, decision.why
        if promoted is not None and promoted["version"] == version:
            ok, why = True, f"{version} is the promoted version already"
        if ok:
            storage.promote(dataset, version)
        storage.apply_retention(dataset, cfg.keep_versions)
        current = storage.promoted_version(dataset)
    metadata = {
        "promoted": ok,
        "reason": why,
        "candidate_version": version,
        "promoted_version": current or "none",
        "metric": decision.metric,
        "candidate_value": decision.candidate,
        **config_metadata,
    }
    if decision.previous is not None:
        metadata["previous_value"] = decision.previous
    check = dg.AssetCheckResult(
        check_name=NOT_WORSE,
        passed=ok,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"reason": why, "margin": cfg.margin},
    )
    line = f"promoted {version}: {why}" if ok else f"did not promote {version} (promoted: {current or 'none'}): {why}"
    if not ok:
        context.log.warning(f"promotion refused: {line}")
    return stage_result(context, PROMOTION, metadata, line=line, check_results=[check])


def _evaluation_record(storage: GnnflowStorage, dataset: str, run_id: str) -> dict:
    """evaluation/metrics.json, checked as published (recording trained_model/ as a version if it is not yet)."""
    metrics_file = storage.asset_dir(dataset, STAGE) / METRICS_FILE
    if not metrics_file.is_file():
        raise dg.Failure(
            description=f"dataset '{dataset}': no evaluation at {metrics_file.parent}; materialize evaluation first"
        )
    verified_or_failure(metrics_file.parent, [metrics_file.name], STAGE)
    record = json.loads(metrics_file.read_text())
    if storage.asset_dir(dataset, TRAINED_MODEL).is_dir():
        storage.record_model_version(dataset, run_id)
    return record


def decide_node_promotion(storage: GnnflowStorage, dataset: str, record: dict, cfg: PromotionConfig) -> Decision:
    """node_classification's promotion decision (`training.promotion.decide_promotion`) on `record`."""
    ok, why = decide_promotion(_evidence(storage, dataset, record), cfg)
    promoted = record["promoted"]
    return Decision(
        ok, why, cfg.metric, record["candidate"][cfg.metric], None if promoted is None else promoted[cfg.metric]
    )


def _evidence(storage: GnnflowStorage, dataset: str, record: dict) -> Evidence:
    promoted = record["promoted"]
    version = None if promoted is None else promoted["version"]
    majority = record.get("majority") or {"class": None, "accuracy": 0.0}
    return Evidence(
        candidate_accuracy=record["candidate"]["accuracy"],
        majority_accuracy=majority["accuracy"],
        majority_class=majority["class"],
        promoted_version=version,
        pinned=version in storage.pinned_versions(dataset),
        label_change=describe_change(record.get("label_change")),
        same_labels=record.get("same_labels"),
        current_labels=record.get("current_labels"),
    )
