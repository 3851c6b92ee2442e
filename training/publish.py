"""Rank 0's end of a node-classification run: the trained_model folder written from the finished `Run`.

`finish_run` writes the final and the best model files, the best model's predictions and
embeddings (reusing the last evaluation's pass when the last epoch is the best), metrics,
curves, run.yaml, the profile and the summary (`model_preprocessing` records how the input
was built) into the folder atomically, in the format `training.outputs` documents, then
removes the run's work folder.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from graphs.formats.label_classes import copy_label_classes
from graphs.infra.storage import atomic_output_dir
from graphs.stages.normalize import Adjacency
from training.checkpoint import code_version
from training.data import FeatureRows
from training.features import read_node_table
from training.outputs import (
    CURVES,
    EMBEDDINGS,
    METRICS,
    MODEL_BEST,
    MODEL_FINAL,
    PREDICTIONS,
    SUMMARY,
    Preprocessing,
    model_file_state,
    plot_curves,
    save_model_file,
    write_json,
    write_metrics,
    write_predictions,
    write_version_file,
)
from training.profiling import PROFILE_DIR
from training.run_plan import epoch_passes
from training.run_setup import Run

__all__ = ["finish_run", "model_preprocessing"]


def finish_run(run: Run, replicas: list[str] | None = None) -> dict:
    """Rank 0: write the trained_model folder atomically (models, predictions, embeddings,
    metrics, curves, summary), then drop the work folder; returns the summary.
    `replicas`: every rank's `state_digest` of its final model, in rank order."""
    cfg, model, history = run.cfg, run.model, run.history
    in_feats, num_classes, work = run.in_feats, run.num_classes, run.work
    best = run.best
    if best["model"] is None:  # never evaluated (cannot happen with eval after the last epoch)
        best = {**best, "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}
    last_epoch = max((r["epoch"] for r in history), default=0)  # from 1
    nodes = read_node_table(run.canonical)
    seconds = time.perf_counter() - run.t_start
    out = Path(cfg.paths.out)
    model_cfg = asdict(cfg.model)
    preprocessing = model_preprocessing(run)
    final_state = model_file_state(model, model_cfg, in_feats, num_classes, last_epoch, preprocessing)
    model.load_state_dict(best["model"])
    best_state = model_file_state(model, model_cfg, in_feats, num_classes, best["epoch"], preprocessing)
    if run.best_outputs is not None and run.best_outputs[0] == best["epoch"]:
        emb, logits = run.best_outputs[1:]  # the best model is the last one evaluated: its outputs
    else:
        emb, logits = run.eval_graph.forward(model)
    summary = _run_summary(run, best, last_epoch, seconds, replicas)
    with atomic_output_dir(out) as tmp:
        save_model_file(tmp / MODEL_FINAL, final_state)
        save_model_file(tmp / MODEL_BEST, best_state)
        summary["version"] = write_version_file(tmp)  # before the swap: a kill after it leaves a named model
        write_predictions(tmp / PREDICTIONS, nodes.original_id, logits, nodes.predicted)
        copy_label_classes(run.canonical, tmp)  # the user's label values, in every model version
        run.eval_graph.save_embeddings(emb, tmp / EMBEDDINGS)
        write_metrics(history, tmp / METRICS)
        plot_curves(history, tmp / CURVES)
        cfg_out = replace(cfg, paths=replace(cfg.paths, work=str(work)))
        cfg_out.to_yaml(tmp / "run.yaml")
        if (work / PROFILE_DIR).is_dir():
            shutil.copytree(work / PROFILE_DIR, tmp / PROFILE_DIR)
            summary["profile"] = sorted(p.name for p in (tmp / PROFILE_DIR).iterdir())
        if run.grad_stats is not None:
            summary["node_grad_stats"] = run.grad_stats.write(tmp)
        write_json(tmp / SUMMARY, summary)
    shutil.rmtree(work, ignore_errors=True)
    return summary


def _run_summary(run: Run, best: dict, last_epoch: int, seconds: float, replicas: list[str] | None) -> dict:
    """The summary's accuracies, epochs, timings, batch and setup facts and identities."""
    cfg, info, manifest, history = run.cfg, run.info, run.manifest, run.history
    final_row = next(r for r in reversed(history) if r["rank"] == 0 and "val_acc" in r)
    main_rows = [r for r in history if r["rank"] == 0]
    return {
        "best_epoch": best["epoch"],
        "best_val_acc": best["val_acc"],
        "test_acc_at_best_val": best["test_acc"],
        "final_epoch": last_epoch,
        "final_train_acc": final_row["train_acc"],
        "final_val_acc": final_row["val_acc"],
        "final_test_acc": final_row["test_acc"],
        "final_loss": float(np.mean([r["loss"] for r in history if r["epoch"] == last_epoch])),
        "epochs_trained": last_epoch,
        "epochs_planned": run.epochs,
        "sampled_epochs": run.plan.shard_epochs,
        "sampled_epoch_passes": epoch_passes(last_epoch, run.plan.shard_epochs),
        "optimizer_steps": run.step,
        "stopped_early": run.stopped_early,
        "mean_epoch_seconds": float(np.mean([r["epoch_seconds"] for r in main_rows])),
        "mean_train_seconds": float(np.mean([r["train_seconds"] for r in main_rows])),
        "seeds_per_s": float(
            np.mean([sum(r["seeds_per_s"] for r in history if r["epoch"] == e) for e in {r["epoch"] for r in history}])
        ),
        "data_wait_share": float(np.mean([r["data_wait_share"] for r in history])),
        "peak_memory_mb": float(max(r["peak_memory_mb"] for r in history)),
        **_comm_summary(history),
        **_feature_cache_summary(run.feature_rows),
        "world_size": manifest.world_size,
        "processes": info.world_size,
        "batch_size": manifest.batch_size,
        "accumulate": cfg.training.accumulate,
        "global_batch": manifest.batch_size * manifest.world_size * cfg.training.accumulate,
        "precision": run.precision.note,
        "backend": info.backend or "none",
        "device": str(info.device),
        "nodes": manifest.n,
        "num_classes": run.num_classes,
        "in_feats": run.in_feats,
        "seconds": seconds,
        "run_key": run.key,
        "data_version": run.data_version,
        "replica_sha256": list(replicas or []),
        "replicas_identical": len(set(replicas or [])) <= 1,
        "code_version": code_version(),
    }


def model_preprocessing(run: Run) -> Preprocessing:
    """How this run built the model's input (stored in the model files for inference on new data)."""
    adjacency_summary = Adjacency.open(run.adjacency).summary
    return Preprocessing(
        input="features" if run.stream_features == "manifest" else "degree",
        feature_norm=run.transform.kind,
        degree_buckets=run.cfg.training.degree_buckets,
        degree_norm=str(adjacency_summary.get("degree_norm", "both")),
        mean=run.transform.mean,
        std=run.transform.std,
        self_loops=run.manifest.self_loops,
    )


def _comm_summary(history: list[dict]) -> dict:
    """Mean gradient bytes sent per rank and optimizer step (training.comm.count_bytes), if counted."""
    counted = [r["comm_bytes_per_step"] for r in history if "comm_bytes_per_step" in r]
    return {"comm_bytes_per_step": float(np.mean(counted))} if counted else {}


def _feature_cache_summary(rows: FeatureRows | None) -> dict:
    """Rank 0's feature cache (training.feature_cache or feature_cache_hot > 0): the rows of its
    tiers, and the share of the minibatches' unique rows they served in this process."""
    if rows is None or rows.cache is None:
        return {}
    cache = rows.cache
    return {
        "feature_cache_rows": cache.capacity,
        "feature_cache_hot_rows": len(cache.hot_nodes),
        "feature_cache_hit_rate": cache.stats.hit_rate,
        "feature_cache_hot_hit_rate": cache.stats.hot_hits / max(1, cache.stats.requested),
        "feature_cold_rows": cache.stats.cold_reads,
        "feature_cold_page_runs": cache.stats.cold_runs,
        "feature_cold_pages": cache.stats.cold_pages,
    }
