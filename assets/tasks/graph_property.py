"""task: graph_property, the task of a graph collection (a landing folder with graphs.parquet,
`graphs.stages.collection`): a class or a value per graph, learned from the labelled training
graphs. The shards' minibatches are whole graphs (sampler ``whole_graphs``), the model
(`training.graph_model.GraphModel`, GIN by default, the run config's ``graph`` block) is trained
in the asset's process (`training.graph_train.train_graphs`) and evaluated on the test graphs:
ROC-AUC, PR-AUC and accuracy for classes, MAE and RMSE for values, beside a model that ignores
the graphs. trained_model writes a prediction for every graph (predictions.parquet, joined on the
user's graph_id). Node predictions and promotion do not apply yet."""

import dataclasses

import dagster as dg

from assets.common import GnnflowStorage, disk_metadata
from assets.evaluation import publish_candidate_metrics, verified_or_failure
from assets.task_registry import Task, TaskTraits, register_task
from assets.trained_model import BEATS_MAJORITY, shard_failure
from graphs.formats.shard_format import STAGE as MINIBATCH_SHARDS
from graphs.formats.shard_manifest import GRAPH_PROPERTY
from graphs.sampling import sampler_class, write_minibatch_shards
from training.data import ShardError
from training.graph_train import evaluate_graph_model, train_graphs
from training.outputs import GRAPH_MODEL, METRICS, PREDICTIONS, SUMMARY
from training.outputs import STAGE as TRAINED_MODEL

GRAPH_SAMPLER = "whole_graphs"


@register_task
class GraphProperty(Task):
    name = GRAPH_PROPERTY
    traits = TaskTraits(
        holds_out_edges=False,
        needs_labels=False,  # its labels are the graphs' (graphs.parquet), not the nodes'
        seeds="graphs",
        graph_level=True,
        not_promoted="graph_property: promotion compares node-classification metrics; not applied",
        no_node_predictions="graph_property: trained_model writes one prediction per graph "
        "(predictions.parquet, by graph_id); node predictions do not apply",
    )

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
            cfg = config.graph.to_dataclass()
            with storage.publishing(dataset, TRAINED_MODEL) as out:
                s = train_graphs(shards, out, cfg, log=context.log.info)
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
        """The saved model's validation and test metrics on the collection, recomputed."""
        with storage.lock(dataset, context.log.info):
            model = storage.upstream_dir(dataset, TRAINED_MODEL)
            shards = storage.asset_dir(dataset, MINIBATCH_SHARDS)
            verified_or_failure(model, [GRAPH_MODEL, SUMMARY], TRAINED_MODEL)
            try:
                reports = evaluate_graph_model(model, shards)
            except (ValueError, FileNotFoundError, KeyError) as exc:
                raise dg.Failure(description=f"dataset '{dataset}': {exc}; re-materialize trained_model") from exc
            out = publish_candidate_metrics(storage, dataset, cls.name, reports)
        test = reports["test"]
        shown = ", ".join(f"{k} {v:.4f}" for k, v in test.items() if isinstance(v, float))
        context.log.info(
            f"evaluation: test {shown} on {test['graphs']} graphs (ignoring the graphs: {reports['baseline']})"
        )
        metadata = {"path": dg.MetadataValue.path(str(out)), "task": cls.name}
        for which, r in reports.items():
            metadata.update({f"{which}_{k}": round(v, 4) for k, v in r.items() if isinstance(v, float)})
        metadata["test_graphs"] = test["graphs"]
        return dg.MaterializeResult(metadata=metadata)
