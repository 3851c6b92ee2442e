"""Link-prediction training: the link head on the loop every task shares (`training.loop`).

`train_link` trains a `training.link.LinkModel` from the edge-seed shards in this process:
`training.loop.run_epochs` runs the `LinkPrediction` head, whose epoch reads every rank's stream
of the sampled epoch in turn, each minibatch one optimizer step (binary cross-entropy on its
positive pairs against the shards' negatives plus one hard negative per positive,
``hard_negatives``), whose evaluation scores the validation split by full-graph embeddings
every ``eval_every`` epochs (the model of the best validation MRR is kept, early stopping after
``early_stopping_patience`` evaluations without a better one), and whose checkpoints make a
rerun continue.

Checkpoints. Given ``checkpoint_beside`` (the folder the outputs will end up in: the
trained_model asset passes its own), the run checkpoints after every epoch into
``<its parent>/.<its name>.work-<key>/checkpoint.safetensors`` (`training.checkpoint`:
``key`` hashes the settings that change the result and the data version of the shards, the
edge split and the adjacency), a `training.state_file` of kind ``link_checkpoint``, format
``LINK_CHECKPOINT_FORMAT``: ``epoch`` (the last completed one, from 0), ``model``,
``optimizer``, ``rng`` (torch's generator and the hard negatives' one, as uint8 tensors),
``history`` (one row per epoch), ``rows`` (the metrics rows so far), ``best`` (epoch from 1,
its validation report, loss and model state), ``stale``, ``stopped_early``, ``run_key``,
``code_version``. A rerun with the same settings on the same data continues after that epoch
and gives the figures of an uninterrupted run; a finished run removes the folder. A checkpoint
that cannot be read is set aside and the run starts over (`training.checkpoint.resume_state`).

The files written into ``out_dir`` are `training.link`'s (``model.safetensors``,
``metrics.parquet``, ``summary.json``).

Usage::

    model_cfg, training = task_blocks(LINK_DEFAULTS)  # the model and training blocks at link prediction's defaults
    summary = train_link(shards_dir, split_dir, adjacency_dir, out_dir, LinkConfig(), model_cfg, training)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

from graphs.formats.shard_format import MANIFEST_NAME
from graphs.formats.shard_manifest import LINK_PREDICTION, ShardManifest
from graphs.infra.progress import Progress
from graphs.stages.edge_split import load_edge_split
from training.checkpoint import (
    CHECKPOINT_NAME,
    data_version,
    loop_state,
    restore_loop_state,
    resume_state,
    run_key,
    work_dir_for,
)
from training.checkpoint import save_checkpoint as save_state
from training.config import TrainingConfig
from training.data import ShardStream
from training.distributed import DistInfo
from training.layers import ModelConfig
from training.link import (
    LINK_MODEL_FORMAT,
    LINK_MODEL_KIND,
    LinkConfig,
    LinkGraph,
    LinkModel,
    embed,
    evaluate_link,
    new_link_model,
    ranked_splits,
    ranking,
    selection_metric,
)
from training.loop import EpochHook, TaskHead, run_epochs
from training.loss_check import NonFiniteLossError, non_finite_loss
from training.metrics import LINK_HITS_AT
from training.outputs import LINK_MODEL, METRICS, SUMMARY
from training.pair_features import two_hop_negatives
from training.run_plan import training_epochs
from training.run_setup import make_optimizer
from training.state_file import write_state_file

__all__ = ["LINK_CHECKPOINT_FORMAT", "LinkPrediction", "LinkRun", "train_link"]

LINK_CHECKPOINT_FORMAT = 1
_CHECKPOINT_KIND = "link_checkpoint"
_ONE_PROCESS = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


@dataclass(eq=False)
class LinkRun:
    """One `train_link` run: fixed inputs and model, and what the loop and the head advance."""

    cfg: LinkConfig
    model_cfg: ModelConfig
    training: TrainingConfig
    manifest: ShardManifest
    shards: Path
    split: object  # graphs.stages.edge_split.SplitPairs
    graph: LinkGraph
    model: LinkModel
    opt: torch.optim.Optimizer
    epochs: int
    steps_per_epoch: int
    generator: torch.Generator  # the hard negatives' draws
    log: object  # Callable[[str], None]
    key: str
    work: Path | None  # the checkpoint folder; None: no checkpoints
    steps: Progress | None = None  # the steps' progress line (set once the start is known)
    info: DistInfo = _ONE_PROCESS
    start_epoch: int = 0
    stopped_early: bool = False
    history: list = field(default_factory=list)  # one row per epoch (epoch from 1, loss, train_seconds)
    rows: list = field(default_factory=list)  # metrics.parquet's rows so far
    best: dict = field(default_factory=lambda: {"epoch": 0, "val": None, "loss": math.nan, "state": None})
    stale: int = 0  # evaluations since the best one


class LinkPrediction(TaskHead):
    """The link-prediction head of `training.loop.run_epochs`."""

    def train_epoch(self, run: LinkRun, epoch: int) -> dict:
        """Every rank's stream of sampled epoch ``epoch % E`` in turn, each minibatch one step."""
        manifest = run.manifest
        t0 = time.perf_counter()
        total, steps, seeds = 0.0, 0, 0
        for r in range(manifest.world_size):
            if steps >= run.steps_per_epoch:
                break
            sampled = epoch % manifest.epochs
            stream = ShardStream(
                run.shards, r, sampled, "cpu", run.training.prefetch, features=run.graph.x, manifest=manifest.doc
            )
            with stream:
                for mb in stream:
                    total, steps = total + _step(run, mb, epoch, steps), steps + 1
                    seeds += int(mb.extra["pos_pairs"].shape[1])
                    rate = seeds / max(time.perf_counter() - t0, 1e-9)
                    detail = f"epoch {epoch + 1}/{run.epochs}, loss {total / steps:.4f}, {rate:.0f} seeds/s"
                    run.steps.advance(detail=detail)
                    if steps >= run.steps_per_epoch:
                        break
        seconds = time.perf_counter() - t0
        return {"epoch": epoch + 1, "rank": 0, "loss": total / max(steps, 1), "steps": steps, "train_seconds": seconds}

    def evaluate(self, run: LinkRun, epoch: int, row: dict) -> bool:
        """When due: validation MRR, the best model kept; whether early stopping fires."""
        if (epoch + 1) % run.training.eval_every and epoch != run.epochs - 1:
            return False
        g, t = run.graph, run.training
        h = embed(run.model, g.block, g.x, t.eval_batch_size)  # once, for both reports
        val = evaluate_link(run.model, g.block, g.x, run.split, "val", h=h)
        if g.target is not None:  # a typed relation: its users' rankings select the model
            val |= ranking(run.model, g, run.split, "val", h, run.cfg.ranking_users, t.seed, baselines=False)
        run.rows.append({"epoch": epoch + 1, "split": "val", "loss": row["loss"], **val})
        key = selection_metric(run.graph)
        if run.best["val"] is None or val[key] > run.best["val"][key]:
            state = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
            run.best, run.stale = {"epoch": epoch + 1, "val": val, "loss": row["loss"], "state": state}, 0
        else:
            run.stale += 1
        run.log(
            f"epoch {epoch + 1}/{run.epochs}: loss {row['loss']:.4f} val auc {val['auc']:.4f} mrr {val['mrr']:.4f} "
            f"hits@50 {val['hits@50']:.4f}"
            + (f" user_mrr {val['user_mrr']:.4f} recall@20 {val['recall@20']:.4f}" if "user_mrr" in val else "")
            + f" ({row['train_seconds']:.2f} s); best epoch {run.best['epoch']}"
        )
        patience = run.training.early_stopping_patience
        return bool(patience and run.stale >= patience)

    def checkpoint(self, run: LinkRun, epoch: int) -> None:
        if run.work is None:
            return
        state = loop_state(run, epoch, {"hard_negatives": run.generator.get_state()})
        save_state(run.work / CHECKPOINT_NAME, state, kind=_CHECKPOINT_KIND, format_version=LINK_CHECKPOINT_FORMAT)

    def stop_line(self, run: LinkRun, epoch: int) -> str:
        metric = "per-user MRR" if run.graph.target is not None else "MRR"
        return (
            f"early stopping after epoch {epoch + 1}: validation {metric} has not improved for "
            f"{run.training.early_stopping_patience} evaluations"
        )


def _step(run: LinkRun, mb, epoch: int, step: int) -> float:
    """One optimizer step on a minibatch; its loss (NonFiniteLossError when not finite)."""
    neg_pairs = mb.extra["neg_pairs"]
    if run.cfg.hard_negatives:
        walk = run.graph.hard_negative_walk()
        hard = two_hop_negatives(run.graph.heuristics, mb.seeds, mb.extra["pos_pairs"][0], run.generator, **walk)
        neg_pairs = torch.cat([neg_pairs, hard], 1)
    pos, neg = run.model(mb.blocks, mb.x, mb.extra["pos_pairs"], neg_pairs, mb.seeds)
    scores = torch.cat([pos, neg])
    labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
    loss = F.binary_cross_entropy_with_logits(scores, labels)
    value = float(loss.detach())
    if not math.isfinite(value):
        raise _non_finite_loss(value, run, epoch, step)
    run.opt.zero_grad()
    loss.backward()
    run.opt.step()
    return value


def _non_finite_loss(value: float, run: LinkRun, epoch: int, step: int) -> NonFiniteLossError:
    """The error stopping the run at `step` (from 0) of `epoch` (from 0; `training.loss_check`);
    each minibatch of every rank's stream is one optimizer step."""
    training = run.training
    return non_finite_loss(
        value,
        epoch=epoch + 1,
        step=step + 1,
        steps=run.steps_per_epoch,
        causes=[
            f"a learning rate too high: training.optimizer.lr={training.optimizer.lr:g}",
            "features on scales far apart, or a NaN, infinite or huge value in the dataset's features "
            f"(features.parquet; a graph without them gets {training.degree_buckets} one-hot degree buckets)",
            "a corrupted input: check the landing files, then re-materialize canonical_graph and the stages after it",
        ],
    )


def train_link(
    shards_dir: str | os.PathLike,
    split_dir: str | os.PathLike,
    adjacency_dir: str | os.PathLike,
    out_dir: str | os.PathLike | None,
    cfg: LinkConfig,
    model_cfg: ModelConfig,
    training: TrainingConfig,
    log=print,
    *,
    checkpoint_beside: str | os.PathLike | None = None,
    on_epoch_end: EpochHook | None = None,
) -> dict:
    """Train on the link-prediction shards, evaluate on the split (the link block `cfg`, the
    encoder `model_cfg`, the ``training`` block `training`); write `out_dir` (module docstring)
    unless None; checkpoint beside `checkpoint_beside` when given (and continue from its
    checkpoint). ``on_epoch_end(epoch, rows)`` as in `training.loop.run_epochs`. Returns the
    summary."""
    run = _setup(shards_dir, split_dir, adjacency_dir, (cfg, model_cfg, training), log, checkpoint_beside)
    run.model.train()
    run_epochs(run, LinkPrediction(), log, progress=False, on_epoch_end=on_epoch_end)
    summary = _finish(run, out_dir)
    if run.work is not None:
        shutil.rmtree(run.work, ignore_errors=True)
    return summary


def _setup(shards_dir, split_dir, adjacency_dir, settings: tuple, log, beside) -> LinkRun:
    """The run of `settings` (link block, model, training): shards, split, graph and features, the
    model and optimizer, restored from the checkpoint when there is one."""
    cfg, model_cfg, training = settings
    shards = Path(shards_dir)
    manifest = ShardManifest.open(shards)
    if manifest.task != LINK_PREDICTION:
        raise ValueError(f"{shards / MANIFEST_NAME}: not link-prediction shards; materialize minibatch_shards")
    layers = manifest.num_layers
    if model_cfg.num_layers not in (0, layers):
        raise ValueError(f"model.num_layers={model_cfg.num_layers}, but the shards hold {layers} blocks")
    model_cfg = ModelConfig(**{**asdict(model_cfg), "num_layers": layers})
    split = load_edge_split(split_dir)
    graph = LinkGraph.load(manifest, shards, adjacency_dir, training.degree_buckets)

    torch.manual_seed(training.seed)
    model = new_link_model(cfg, model_cfg, graph)
    steps = manifest.minibatches_per_epoch_per_rank * manifest.world_size
    steps = min(steps, cfg.max_steps_per_epoch or steps)
    epochs = training_epochs(training, manifest.epochs, steps)
    settings = {"model": asdict(model_cfg), "link": asdict(cfg), "training": asdict(training)}
    key = run_key(settings, data_version(shards, split_dir, adjacency_dir))
    run = LinkRun(
        cfg, model_cfg, training, manifest, shards, split, graph, model, make_optimizer(training.optimizer, model),
        epochs, steps, torch.Generator().manual_seed(training.seed), log, key,
        None if beside is None else work_dir_for(beside, key),
    )  # fmt: skip
    _resume(run)
    run.steps = Progress("step", epochs * steps, log, unit="steps", start=run.start_epoch * steps)
    return run


def _resume(run: LinkRun) -> None:
    """Restore the model, optimizer, random generators and progress from the run's checkpoint."""
    if run.work is None:
        return
    path = run.work / CHECKPOINT_NAME
    state = resume_state(path, run.log, kind=_CHECKPOINT_KIND, format_version=LINK_CHECKPOINT_FORMAT)
    if state is None:
        return
    restore_loop_state(run, state, path)
    run.generator.set_state(state["rng"]["hard_negatives"])


def _finish(run: LinkRun, out_dir) -> dict:
    """Restore the best validation model, test it, write the outputs; the summary."""
    best = run.best
    run.model.load_state_dict(best["state"])
    g, t = run.graph, run.training
    h = embed(run.model, g.block, g.x, t.eval_batch_size)  # once, for both reports
    test = evaluate_link(run.model, g.block, g.x, run.split, "test", h=h)
    ranked = ranked_splits(run.model, g, run.split, run.cfg.ranking_users, t.seed, h)
    best["val"] = {**best["val"], **ranked["val"]}
    test |= ranked["test"]
    run.rows.append({"epoch": best["epoch"], "split": "test", "loss": best["loss"], **test})
    run.log(
        f"best epoch {best['epoch']} of {len(run.history)}: test auc {test['auc']:.4f} mrr {test['mrr']:.4f} "
        f"hits@50 {test['hits@50']:.4f}"
        + (
            f"; per user recall@20 {test['recall@20']:.4f} (popularity {test['popularity_recall@20']:.4f})"
            if ranked["test"]
            else ""
        )
    )
    summary = {
        "task": LINK_PREDICTION,
        "epochs": len(run.history),
        "best_epoch": best["epoch"],
        "epoch_seconds": [r["train_seconds"] for r in run.history],
        "losses": [r["loss"] for r in run.history],
        "val": best["val"],
        "test": test,
        "config": asdict(run.cfg),
        "model_config": asdict(run.model_cfg),
        "training": asdict(run.training),
        "degree_buckets": run.training.degree_buckets,
        "eval_batch_size": run.training.eval_batch_size,
        "ranking_seed": run.training.seed,
        "in_feats": int(run.graph.x.shape[1]),
        "graph": run.graph.fingerprint(),
        "hits_at": list(LINK_HITS_AT),
    }
    if out_dir is not None:
        _write_outputs(Path(out_dir), run.model, run.rows, summary)
    summary["trained"] = run.model  # not written: the state_dict is LINK_MODEL
    return summary


def _write_outputs(out: Path, model: LinkModel, rows: list[dict], summary: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = {
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        **{
            k: summary[k]
            for k in (
                "config",
                "model_config",
                "degree_buckets",
                "eval_batch_size",
                "ranking_seed",
                "in_feats",
                "graph",
            )
        },
    }
    write_state_file(out / LINK_MODEL, state, kind=LINK_MODEL_KIND, format_version=LINK_MODEL_FORMAT)
    pq.write_table(pa.Table.from_pylist(rows), out / METRICS)
    (out / SUMMARY).write_text(json.dumps(summary, indent=2, default=float))
