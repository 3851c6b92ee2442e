"""Node-classification training from minibatch shards: DDP, AMP, checkpoints, metrics.

Run it (``run.yaml``: see `training.config`; world size and batch size come from the
shards' manifest, so ``--nproc-per-node`` must divide the manifest's ``world_size``)::

    # one machine, 2 processes: gloo on CPU, nccl on GPUs (one GPU per process); torchrun's
    # launcher with nothing listening beyond loopback (training.launch)
    python -m training.launch --nproc-per-node 2 -m training --config run.yaml

    # several machines: the same command on every node, with a c10d rendezvous
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        --rdzv-id myrun -m training --config run.yaml

    # one process, no torchrun (reads every rank's stream itself, see below)
    python -m training --config run.yaml

What one epoch does, on every rank r of R processes:

1. Read the shard streams of ranks r, r+R, ... of the manifest's W (one stream when R = W)
   with `training.data.ShardStream`: a background thread reads, checks and decodes the
   next minibatches while the current one trains.
2. For each optimizer step, run ``accumulate`` minibatches per stream forward and
   backward under autocast (``training.precision``), scaling each loss by
   1 / (minibatches in the step); DDP averages the gradients over the R processes
   during the backward of the step's last minibatch (``no_sync`` before it). So every
   update is the mean gradient over ``batch_size x W x accumulate`` seeds, whatever R:
   one process reading both streams of W = 2 shards makes the same update as 2 DDP ranks
   (up to dropout randomness and BatchNorm statistics).
3. Set the scheduled learning rate, unscale (fp16 loss scaling), clip the gradient norm,
   step the optimizer (AdamW by default).
4. Rank 0 evaluates by full-graph layer-wise inference over the normalized adjacency every
   ``eval_every`` epochs, tracks the best validation accuracy, decides on early stopping
   and broadcasts the decision; every rank's timings are gathered to rank 0, which
   checkpoints (`training.checkpoint`).

When the last epoch is done (or early stopping fired), rank 0 writes the outputs
(`training.publish`, in the format of `training.outputs`) into the trained_model folder
atomically and removes the work folder.
A re-run with the same config and data resumes from the last checkpoint instead.

Reading order (top to bottom): `train` sets up the process group; `_train` runs the run:
`training.run_setup.setup_run` builds the `Run` state once (shards' plan, features,
model/DDP/optimizer/AMP, `resume` from a checkpoint, rank 0's `load_eval_graph`), then
`training.loop.run_epochs` (the loop every task shares) calls the `NodeClassification` head
per epoch: `training.epoch_loop.train_epoch` (steps 1-3, `forward_backward` per minibatch),
`evaluate_epoch` (step 4, rank 0), `save_run_checkpoint`; `training.publish.finish_run`
writes the outputs. The rules the run's plan follows (epochs, replays of the sampled epochs,
learning rate, layer count, sampler support) are `training.run_plan`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from graphs.infra.host_memory import reuse_freed_memory
from graphs.infra.storage import dataset_lock, verify_lock_held
from training.checkpoint import code_version, save_checkpoint
from training.config import RunConfig
from training.distributed import DistInfo, all_gather_objects, init_distributed, shutdown, state_digest
from training.epoch_loop import train_epoch
from training.evaluate import accuracies
from training.imbalance import selection_score
from training.loop import EpochHook, TaskHead, run_epochs
from training.profiling import PROFILE_DIR, StepProfiler, nvtx_context
from training.publish import finish_run
from training.report import Reporter, open_reporter
from training.run_setup import Run, setup_run

__all__ = ["EpochHook", "NodeClassification", "train"]


def train(cfg: RunConfig, *, on_epoch_end: EpochHook | None = None) -> dict | None:
    """Train (or resume) the run ``cfg``; returns the summary dict on rank 0, None elsewhere.

    ``on_epoch_end(epoch, rows)`` is called on every rank after each epoch's checkpoint
    (rows: every rank's metric rows of that epoch); an exception it raises ends the run
    like a kill would, leaving the checkpoint to resume from.
    """
    # Rank 0 holds the dataset's write lock (the folder holding paths.out) for the whole run,
    # before anything is read; the other ranks wait for it in the process group's rendezvous.
    # Launched by the trained_model asset, rank 0 runs under the step's lock and checks after
    # every epoch and before publishing that the step still holds it (`_check_lock`).
    is_rank0 = int(os.environ.get("RANK", "0")) == 0
    with dataset_lock(_dataset_folder(cfg)) if is_rank0 else contextlib.nullcontext():
        info = init_distributed(cfg.training.device, cfg.training.dist_timeout_s)
        try:
            with open_reporter(info.is_main) as report:
                summary = _train(cfg, info, report, on_epoch_end)
        except BaseException:
            shutdown(info, clean=False)
            raise
        shutdown(info)
    return summary


def _dataset_folder(cfg: RunConfig) -> Path:
    """The dataset's folder (holding paths.out and its lock)."""
    return Path(cfg.paths.out).resolve().parent


def _check_lock(cfg: RunConfig) -> None:
    """Rank 0, before it writes: DatasetLockLost when the dataset lock is no longer held for this
    run (its step was killed), so an orphan never writes beside the step's next run."""
    verify_lock_held(_dataset_folder(cfg))


def _train(cfg: RunConfig, info: DistInfo, report: Reporter, on_epoch_end: EpochHook | None) -> dict | None:
    run = setup_run(cfg, info, report)
    tcfg = cfg.training
    profiling = info.is_main and tcfg.profiler == "torch" and run.start_epoch < run.epochs
    profiler = StepProfiler(profiling, run.work / PROFILE_DIR, run.device)

    # ------------------------------------------------------------------ the loop
    # the steps reuse the host memory their predecessors freed (and the evaluation between epochs
    # the steps' memory); handed back to the system after the last epoch. The progress line:
    # percent of the epochs and time left, with the latest epoch's figures, every few seconds.
    with nvtx_context(tcfg.profiler, run.device), reuse_freed_memory(tcfg.reuse_host_memory):
        run_epochs(
            run,
            NodeClassification(profiler),
            report.info,
            on_epoch_end=on_epoch_end,
            before_write=lambda: _check_lock(cfg),
            now=run.now,
        )
    profiler.close()
    if run.grad_stats is not None:  # every rank's counts, summed (rank 0 writes them)
        run.grad_stats.all_reduce(info.initialized, info.backend, run.device)
    # every rank's final model state: DDP keeps the replicas identical, on one node or many
    replicas = all_gather_objects(info, state_digest(run.model))

    # ------------------------------------------------------------------ outputs (rank 0)
    if not info.is_main:
        return None
    _check_lock(cfg)
    summary = finish_run(run, replicas)
    report.materialization(_pipes_metadata(summary))
    report.info(
        f"done: best val {summary['best_val_acc']:.4f} (epoch {summary['best_epoch']}), "
        f"test {summary['test_acc_at_best_val']:.4f}; outputs in {cfg.paths.out}"
    )
    return summary


class NodeClassification(TaskHead):
    """The node-classification head of `training.loop.run_epochs`: the epoch of
    `training.epoch_loop`, full-graph accuracy on rank 0, the checkpoints of `training.checkpoint`."""

    def __init__(self, profiler: StepProfiler):
        self.profiler = profiler

    def train_epoch(self, run: Run, epoch: int) -> dict:
        return train_epoch(run, epoch, self.profiler)

    def evaluate(self, run: Run, epoch: int, row: dict) -> bool:
        return evaluate_epoch(run, epoch, row)

    def checkpoint_due(self, run: Run, epoch: int) -> bool:
        return (epoch + 1) % run.cfg.training.checkpoint_every == 0

    def checkpoint(self, run: Run, epoch: int) -> None:
        save_run_checkpoint(run, epoch)

    def epoch_line(self, rows: list[dict]) -> str:
        return _epoch_line(rows)

    def stop_line(self, run: Run, epoch: int) -> str:
        return f"early stopping: validation accuracy last improved at epoch {run.best['epoch']}"


def evaluate_epoch(run: Run, epoch: int, row: dict) -> bool:
    """Rank 0: full-graph evaluation when due (accuracies into `row`), the best model so far;
    returns whether early stopping should fire."""
    tcfg = run.cfg.training
    if (epoch + 1) % tcfg.eval_every == 0 or epoch == run.epochs - 1:
        t0 = run.now()
        emb, logits = run.eval_graph.forward(run.model)  # eval mode: the next epoch's model.train() ends it
        row.update(accuracies(logits, run.eval_graph.labels, run.eval_graph.masks))
        score = selection_score(tcfg.select_by, row, logits, run.eval_graph.labels, run.eval_graph.masks["val"])
        row["eval_seconds"] = run.now() - t0
        if score > run.best.get("score", run.best["val_acc"]):
            run.best = {
                "score": score,
                "epoch": epoch + 1,
                "val_acc": row["val_acc"],
                "test_acc": row["test_acc"],
                "model": {k: v.detach().cpu().clone() for k, v in run.model.state_dict().items()},
            }
            # kept only after the last scheduled epoch: no copy is held while training goes on
            run.best_outputs = (epoch + 1, emb, logits) if epoch == run.epochs - 1 else None
    return bool(
        tcfg.early_stopping_patience
        and run.best["epoch"] >= 1
        and epoch + 1 - run.best["epoch"] >= tcfg.early_stopping_patience
    )


def save_run_checkpoint(run: Run, epoch: int) -> None:
    """Rank 0: the checkpoint a resumed run continues from after `epoch`."""
    save_checkpoint(
        run.checkpoint_path,
        {
            "epoch": epoch,
            "step": run.step,
            "model": run.model.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "scaler": run.scaler.state_dict() if run.precision.loss_scaling else {},
            "best": run.best,
            "history": run.history,
            "stopped_early": run.stopped_early,
            "config": run.cfg.to_dict(),
            "run_key": run.key,
            "data_version": run.data_version,
            "code_version": code_version(),
        },
    )


def _epoch_line(rows: list[dict]) -> str:
    """An epoch's figures over every rank (after the progress part, `graphs.infra.progress`)."""
    main = rows[0]
    line = (
        f"loss {np.mean([r['loss'] for r in rows]):.4f}, "
        f"{sum(r['seeds_per_s'] for r in rows):.0f} seeds/s, {max(r['train_seconds'] for r in rows):.2f} s "
        f"(data wait {max(r['data_wait_share'] for r in rows):.0%})"
    )
    if "val_acc" in main:
        line += f", train {main['train_acc']:.4f} val {main['val_acc']:.4f} test {main['test_acc']:.4f}"
    return line


def _pipes_metadata(summary: dict) -> dict:
    """The summary's numbers and strings (what dagster-pipes reports as metadata); lists of
    numbers (``sampled_epoch_passes``) as comma-separated text."""
    out = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool))}
    out.update({k: ",".join(map(str, v)) for k, v in summary.items() if isinstance(v, list) and k != "profile"})
    return out
