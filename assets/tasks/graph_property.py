"""task: graph_property, the task of a graph collection (a landing folder with graphs.parquet,
`graphs.stages.collection`): a class or a value per graph, learned from the labelled training
graphs. The shards' minibatches are whole graphs (sampler ``whole_graphs``), the model
(`training.graph_model.GraphModel`: the ``model`` block's layers, GIN by default, and the
``graph`` block's readout and encoding) is trained by the ``training`` block, at graph property's
defaults where it leaves a key unset (`training.graph_train.GRAPH_DEFAULTS`), in the asset's
process (`training.graph_train.train_graphs`) and evaluated on the test graphs:
ROC-AUC, PR-AUC and accuracy for classes, MAE and RMSE for values, beside a model that ignores
the graphs. trained_model writes a prediction for every graph (predictions.parquet, joined on the
user's graph_id); node predictions do not apply.

evaluation scores the newest model and the promoted one on the current test graphs; promotion
(`decide_graph_promotion`) compares them on the task's metric, the one that picked the best
epoch: ROC-AUC (accuracy where it is undefined) for classes and tasks, MAE for values."""

import dataclasses
import math

import dagster as dg

from assets.common import GnnflowStorage, disk_metadata
from assets.evaluation import publish_candidate_metrics, verified_or_failure
from assets.task_registry import Task, TaskTraits, register_task, task_settings
from assets.trained_model import BEATS_MAJORITY, shard_failure
from graphs.formats.shard_format import STAGE as MINIBATCH_SHARDS
from graphs.formats.shard_manifest import GRAPH_PROPERTY
from graphs.infra.storage import CorruptFileError, verify_files
from graphs.sampling import sampler_class, write_minibatch_shards
from training.data import ShardError
from training.graph_train import GRAPH_DEFAULTS, MODEL_SETTINGS, evaluate_graph_model, key_metric, train_graphs
from training.outputs import GRAPH_MODEL, METRICS, PREDICTIONS, SUMMARY
from training.outputs import STAGE as TRAINED_MODEL
from training.promotion import Decision, PromotionConfig
from training.task_settings import LOOP_SETTINGS

GRAPH_SAMPLER = "whole_graphs"


@register_task
class GraphProperty(Task):
    name = GRAPH_PROPERTY
    traits = TaskTraits(
        holds_out_edges=False,
        needs_labels=False,  # its labels are the graphs' (graphs.parquet), not the nodes'
        seeds="graphs",
        graph_level=True,
        no_node_predictions="graph_property: trained_model writes one prediction per graph "
        "(predictions.parquet, by graph_id); node predictions do not apply",
    )
    defaults = GRAPH_DEFAULTS
    reads = ("graph", *(f"model.{k}" for k in MODEL_SETTINGS), *LOOP_SETTINGS)

    @classmethod
    def write_shards(cls, inputs, out, cfg, *, canonical, log):
        if not sampler_class(cfg.sampler).traits.whole_graphs:
            log(f"graph_property: sampler {cfg.sampler!r} draws from one graph; minibatches of whole graphs instead")
            cfg = dataclasses.replace(cfg, sampler=GRAPH_SAMPLER)
        return write_minibatch_shards(inputs, out, cfg, log=log)

    @classmethod
    def train(cls, context, config, storage: GnnflowStorage, dataset: str, config_metadata: dict):
        """The model trained in this process from the whole-graph shards; the check is then the
        test metric beyond a model that ignores the graphs."""
        shards = storage.asset_dir(dataset, MINIBATCH_SHARDS)
        try:
            blocks = task_settings(cls, config).blocks
            settings = blocks["graph"], blocks["model"], blocks["training"]
            with storage.publishing(dataset, TRAINED_MODEL) as out:
                beside = storage.asset_dir(dataset, TRAINED_MODEL)
                s = train_graphs(shards, out, *settings, log=context.log.info, checkpoint_beside=beside)
        except (ValueError, ShardError) as exc:
            raise shard_failure(dataset, exc) from exc
        out = storage.asset_dir(dataset, TRAINED_MODEL)
        test, base = s["test"], s["baseline"]
        metadata = {
            "task": cls.name,
            "label_kind": s["label_kind"],
            "path": dg.MetadataValue.path(str(out)),
            "epochs": s["epochs"],
            "best_epoch": s["best_epoch"],
            "epoch_seconds_median": round(sorted(s["epoch_seconds"])[len(s["epoch_seconds"]) // 2], 3),
            **{f"test_{k}": round(v, 4) for k, v in test.items() if isinstance(v, float)},
            **{f"val_{k}": round(v, 4) for k, v in s["val"].items() if isinstance(v, float)},
            **{f"baseline_test_{k}": round(v, 4) for k, v in base.items()},
            "test_graphs": test["graphs"],
            "metrics": dg.MetadataValue.path(str(out / METRICS)),
            "graph_predictions": dg.MetadataValue.path(str(out / PREDICTIONS)),
            **disk_metadata(out),
            **config_metadata,
        }
        if "mae" in test:
            passed, facts = test["mae"] < base["mae"], {"test_mae": test["mae"], "mean_value_mae": base["mae"]}
        else:
            passed, facts = test["roc_auc"] > 0.5, {"test_roc_auc": test["roc_auc"], "ignoring_the_graphs": 0.5}
        check = dg.AssetCheckResult(
            check_name=BEATS_MAJORITY,
            passed=bool(passed),
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"task": cls.name, **facts},
        )
        return dg.MaterializeResult(metadata=metadata, check_results=[check])

    @classmethod
    def evaluate(cls, context, storage: GnnflowStorage, dataset: str):
        """The newest and the promoted model's metrics on the collection's graphs, recomputed."""
        with storage.lock(dataset, context.log.info):
            model = storage.upstream_dir(dataset, TRAINED_MODEL)
            shards = storage.asset_dir(dataset, MINIBATCH_SHARDS)
            verified_or_failure(model, [GRAPH_MODEL, SUMMARY], TRAINED_MODEL)
            version = storage.record_model_version(dataset, context.run.run_id)
            try:
                reports = evaluate_graph_model(model, shards)
            except (ValueError, FileNotFoundError, KeyError) as exc:
                raise dg.Failure(description=f"dataset '{dataset}': {exc}; re-materialize trained_model") from exc
            promoted = _score_promoted(storage, dataset, shards, context.log)
            out = publish_candidate_metrics(storage, dataset, cls.name, {"version": version, **reports}, promoted)
        test = reports["test"]
        shown = ", ".join(f"{k} {v:.4f}" for k, v in test.items() if isinstance(v, float))
        context.log.info(
            f"evaluation: test {shown} on {test['graphs']} graphs (ignoring the graphs: {reports['baseline']})"
        )
        metadata = {"path": dg.MetadataValue.path(str(out)), "task": cls.name, "version": version}
        for which, r in reports.items():
            metadata.update({f"{which}_{k}": round(v, 4) for k, v in r.items() if isinstance(v, float)})
        metadata["test_graphs"] = test["graphs"]
        if promoted is not None and "test" in promoted:
            metric = key_metric(test)[0]
            metadata[f"promoted_test_{metric}"] = round(promoted["test"][metric], 4)
        return dg.MaterializeResult(metadata=metadata)

    @classmethod
    def decide_promotion(cls, storage, dataset, record, cfg):
        promoted = record["promoted"]
        pinned = promoted is not None and promoted["version"] in storage.pinned_versions(dataset)
        return decide_graph_promotion(record, pinned, cfg)


def _score_promoted(storage: GnnflowStorage, dataset: str, shards, log) -> dict | None:
    """The promoted model's reports on the current graphs ({"version", "val", "test", "baseline"}),
    {"version", "problem"} when it cannot score them, None without a promoted model."""
    version = storage.promoted_version(dataset)
    if version is None:
        return None
    folder = storage.promoted_dir(dataset)
    try:
        verify_files(folder, [GRAPH_MODEL], stage=TRAINED_MODEL)
        return {"version": version, **evaluate_graph_model(folder, shards)}
    except (CorruptFileError, ValueError, FileNotFoundError, KeyError) as exc:
        log.warning(f"the promoted version {version} cannot score the current graphs: {exc}")
        return {"version": version, "problem": str(exc)}


def decide_graph_promotion(record: dict, pinned: bool, cfg: PromotionConfig) -> Decision:
    """Whether evaluation's candidate replaces the promoted model (`pinned`: whether the promoted
    version is pinned). Promoted when, in this order: its test metric beats a model that ignores
    the graphs; there is no promoted model; the promoted version is not pinned; the promoted one
    cannot score the current graphs, or the candidate's metric is not worse than the promoted
    one's on the same test graphs by more than ``cfg.margin`` (absolute for ROC-AUC and accuracy,
    relative for MAE: at most ``(1 + margin)`` times the promoted model's)."""
    test, base, promoted = record["candidate"]["test"], record["candidate"]["baseline"], record["promoted"]
    metric = key_metric(test)[0]
    value = float(test[metric])
    previous = None
    if promoted is not None and "test" in promoted:
        previous = float(promoted["test"].get(metric, math.nan))

    def verdict(ok: bool, why: str) -> Decision:
        return Decision(ok, why, metric, value, previous)

    if not math.isfinite(value):
        return verdict(False, f"the new model's test {metric} is undefined (no labelled test graph of both classes)")
    floor = {"mae": base.get("mae"), "roc_auc": 0.5}.get(metric, base.get("accuracy"))
    beats = value < floor if metric == "mae" else value > floor
    if not beats:
        return verdict(False, f"test {metric} {value:.4f} does not beat a model that ignores the graphs ({floor:.4f})")
    if promoted is None:
        return verdict(True, "no promoted model yet")
    if pinned:
        return verdict(False, f"the promoted version {promoted['version']} is pinned; run `gnnflow models unpin "
                       f"{promoted['version']} --dataset NAME` to let promotion replace it")  # fmt: skip
    if previous is None or not math.isfinite(previous):
        why = promoted.get("problem", f"it has no test {metric} on the current graphs")
        return verdict(True, f"the promoted version {promoted['version']} cannot be compared: {why}")
    if metric == "mae":
        worse = value > previous * (1 + cfg.margin)
        limit = f"at most {1 + cfg.margin:.2f}x the promoted model's"
    else:
        worse = previous - value > cfg.margin
        limit = f"margin {cfg.margin * 100:.2f} points"
    compared = f"test {metric} {value:.4f} vs promoted {previous:.4f} on {test['graphs']} test graphs ({limit})"
    return verdict(not worse, compared)
