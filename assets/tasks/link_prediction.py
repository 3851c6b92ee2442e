"""task: link_prediction: edge_split holds out edges, the shards' minibatches grow around seed
edges with negatives rejected by compressed_graph's Bloom filters, the model is trained in the
asset's process by `training.link_train.train_link` (the ``model`` block is the encoder, the
``training`` block how it is trained, at link prediction's defaults where it leaves a key unset
(`training.link.LINK_DEFAULTS`), the ``link`` block the scorer and hard negatives) and evaluated
on edge_split's held-out edges against its fixed negatives: ROC-AUC, MRR and Hits@K. Node labels
are not needed; promotion and node predictions do not apply (pairs are scored with
``gnnflow score-pairs``)."""

import dagster as dg
import pyarrow.parquet as pq

from assets.common import GnnflowStorage, disk_metadata
from assets.evaluation import publish_candidate_metrics, verified_or_failure
from assets.predictions import STAGE as PREDICTIONS_STAGE
from assets.task_registry import Task, TaskTraits, register_task, task_settings
from assets.trained_model import BEATS_MAJORITY, shard_failure
from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.shard_format import STAGE as MINIBATCH_SHARDS
from graphs.formats.shard_manifest import LINK_PREDICTION, ShardManifest
from graphs.sampling.link import write_link_shards
from graphs.stages.edge_split import EdgeSplit
from graphs.stages.normalize import Adjacency
from training.data import ShardError
from training.link import LINK_DEFAULTS, evaluate_saved
from training.link_train import train_link
from training.outputs import LINK_MODEL, METRICS, RECOMMENDATIONS, SUMMARY
from training.outputs import STAGE as TRAINED_MODEL
from training.recommend import write_recommendations
from training.task_settings import LOOP_SETTINGS


@register_task
class LinkPrediction(Task):
    name = LINK_PREDICTION
    traits = TaskTraits(
        holds_out_edges=True,
        needs_labels=False,
        seeds="edges",
        not_promoted="link prediction: promotion compares node-classification metrics; not applied",
        no_node_predictions="link prediction on an untyped graph: node predictions do not apply; score candidate "
        "pairs with `gnnflow score-pairs`",
    )
    defaults = LINK_DEFAULTS
    typed_defaults = {"model.conv": "rgcn"}  # a typed graph's encoder: R-GCN over its relations
    reads = ("model", "link", *LOOP_SETTINGS, "training.eval_batch_size", "training.degree_buckets")

    @classmethod
    def write_shards(cls, inputs, out, cfg, *, canonical, log):
        return write_link_shards(inputs, out, cfg, canonical_dir=canonical, log=log)

    @classmethod
    def train(cls, context, config, storage: GnnflowStorage, dataset: str, config_metadata: dict):
        """The model trained in this process from the edge-seed shards; the check is then test
        ROC-AUC above 0.5 (random scoring)."""
        split = storage.upstream_dir(dataset, EdgeSplit.STAGE)
        adjacency = storage.upstream_dir(dataset, Adjacency.STAGE)
        shards = storage.asset_dir(dataset, MINIBATCH_SHARDS)
        try:
            blocks = task_settings(cls, config).blocks
            with storage.publishing(dataset, TRAINED_MODEL) as out:
                s = train_link(
                    shards,
                    split,
                    adjacency,
                    out,
                    blocks["link"],
                    blocks["model"],
                    blocks["training"],
                    log=context.log.info,
                    checkpoint_beside=storage.asset_dir(dataset, TRAINED_MODEL),
                )
        except (ValueError, ShardError) as exc:
            raise shard_failure(dataset, exc) from exc
        out = storage.asset_dir(dataset, TRAINED_MODEL)
        test, val = s["test"], s["val"]
        metadata = {
            "task": cls.name,
            "path": dg.MetadataValue.path(str(out)),
            "epochs": s["epochs"],
            "best_epoch": s["best_epoch"],
            "epoch_seconds_median": round(sorted(s["epoch_seconds"])[len(s["epoch_seconds"]) // 2], 3),
            **{f"test_{k}": round(v, 4) for k, v in test.items() if isinstance(v, float)},
            **{f"val_{k}": round(v, 4) for k, v in val.items() if isinstance(v, float) and k != "loss"},
            "metrics": dg.MetadataValue.path(str(out / METRICS)),
            **disk_metadata(out),
            **config_metadata,
        }
        check = dg.AssetCheckResult(
            check_name=BEATS_MAJORITY,
            passed=bool(test["auc"] > 0.5),
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"task": cls.name, "test_auc": test["auc"], "random_scoring_auc": 0.5},
        )
        return dg.MaterializeResult(metadata=metadata, check_results=[check])

    @classmethod
    def predictions(cls, context, storage: GnnflowStorage, dataset: str):
        """On a typed graph, the top ``link.recommend_k`` destinations of every source node of the
        target relation (`training.recommend`), by the user's ids; skipped on an untyped graph."""
        model_dir = storage.asset_dir(dataset, TRAINED_MODEL)
        shards = storage.asset_dir(dataset, MINIBATCH_SHARDS)
        if not (model_dir / LINK_MODEL).is_file() or not ShardManifest.open(shards).doc.get("typed"):
            return super().predictions(context, storage, dataset)
        verified_or_failure(model_dir, [LINK_MODEL, SUMMARY], TRAINED_MODEL)
        split = storage.upstream_dir(dataset, EdgeSplit.STAGE)
        adjacency = storage.upstream_dir(dataset, Adjacency.STAGE)
        canonical = storage.upstream_dir(dataset, CanonicalGraph.STAGE)
        with storage.publishing(dataset, PREDICTIONS_STAGE) as staged:
            try:
                s = write_recommendations(model_dir, shards, split, adjacency, canonical, staged)
            except (ValueError, FileNotFoundError, KeyError) as exc:
                raise dg.Failure(description=f"dataset '{dataset}': {exc}; re-materialize trained_model") from exc
        out = storage.asset_dir(dataset, PREDICTIONS_STAGE)
        rows = pq.read_table(out / RECOMMENDATIONS).slice(0, 10).to_pylist()
        preview = "\n".join(
            ["| src | dst | score | rank |", "| --- | --- | --- | --- |"]
            + [f"| {r['src']} | {r['dst']} | {r['score']:.4f} | {r['rank']} |" for r in rows]
        )
        context.log.info(
            f"predictions: the top {s['k']} of relation {s['relation']} for {s['sources']} sources "
            f"({s['rows']} rows) in {s['seconds']:.3g} s"
        )
        metadata = {
            "path": dg.MetadataValue.path(str(out / RECOMMENDATIONS)),
            **{k: s[k] for k in ("relation", "k", "sources", "rows", "seconds")},
            "preview": dg.MetadataValue.md(preview),
            **disk_metadata(out),
        }
        return dg.MaterializeResult(metadata=metadata)

    @classmethod
    def evaluate(cls, context, storage: GnnflowStorage, dataset: str):
        """ROC-AUC, MRR and Hits@K of trained_model's model.safetensors on edge_split's validation
        and test edges against its fixed negatives, recomputed (`training.link.evaluate_saved`)."""
        with storage.lock(dataset, context.log.info):
            model = storage.upstream_dir(dataset, TRAINED_MODEL)
            split = storage.upstream_dir(dataset, EdgeSplit.STAGE)
            adjacency = storage.upstream_dir(dataset, Adjacency.STAGE)
            shards = storage.asset_dir(dataset, MINIBATCH_SHARDS)
            verified_or_failure(model, [LINK_MODEL, SUMMARY], TRAINED_MODEL)
            try:
                reports = evaluate_saved(model, shards, split, adjacency)
            except (ValueError, FileNotFoundError, KeyError) as exc:
                raise dg.Failure(description=f"dataset '{dataset}': {exc}; re-materialize trained_model") from exc
            out = publish_candidate_metrics(storage, dataset, cls.name, reports)
        test = reports["test"]
        context.log.info(
            f"evaluation: test ROC-AUC {test['auc']:.4f}, MRR {test['mrr']:.4f}, Hits@50 {test['hits@50']:.4f} "
            f"({test['positives']} held-out edges against {test['negatives']} fixed negatives)"
        )
        metadata = {"path": dg.MetadataValue.path(str(out)), "task": cls.name}
        for which, r in reports.items():
            metadata.update({f"{which}_{k}": round(v, 4) for k, v in r.items() if isinstance(v, float)})
        metadata["test_edges"] = test["positives"]
        metadata["eval_negatives"] = test["negatives"]
        return dg.MaterializeResult(metadata=metadata)
