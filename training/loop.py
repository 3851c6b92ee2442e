"""The one epoch loop every training task runs: a task head trains, evaluates and checkpoints.

`run_epochs` is the loop of node classification (`training.train`, DDP under torchrun), of link
prediction (`training.link_train`, one process) and of DistDGL's trainers (`training.distdgl`):
per epoch, the head trains one epoch on this
rank and returns its metric row; rank 0 evaluates when due (the head fills in the row, keeps
the best model and says whether early stopping fires); rank 0's decision reaches every rank;
every rank's rows are gathered into ``run.history``; rank 0 logs the progress line and
checkpoints when due, so a rerun of the same settings on the same data continues after the last
checkpointed epoch. Epochs are counted from 0 here and from 1 in every row, log line and file.

A task is a `TaskHead` subclass: what one epoch, one evaluation, one checkpoint and one progress
line are for it. Its run state (`LoopState`) carries what the loop reads and advances; the rest of the
run (model, optimizer, data) is the head's.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

from graphs.infra.progress import Progress
from training.distributed import DistInfo, all_gather_objects, broadcast_flag

__all__ = ["EpochHook", "LoopState", "TaskHead", "run_epochs"]

EpochHook = Callable[[int, list], None]


class LoopState(Protocol):
    """What `run_epochs` reads and advances on a task's run state."""

    info: DistInfo
    epochs: int  # planned
    start_epoch: int  # the first epoch to train (after a checkpoint's)
    stopped_early: bool
    history: list[dict]  # every rank's metric rows, epochs from 1
    best: dict  # the head's record of its best evaluation; best["epoch"] from 1 (0 = none yet)


class TaskHead:
    """What a task does at each point of the loop (a subclass overrides the first three; the
    rest have defaults)."""

    # True: `train_epoch` returns the same row on every rank (its ranks already combined their
    # figures) and `evaluate` never stops early, so the loop exchanges nothing between ranks
    rows_agree: bool = False

    def train_epoch(self, run, epoch: int) -> dict:
        """Train epoch `epoch` on this rank; this rank's metric row (``epoch`` from 1)."""
        raise NotImplementedError

    def evaluate(self, run, epoch: int, row: dict) -> bool:
        """Rank 0: evaluate when due (figures into `row`, the best model kept); whether early
        stopping fires."""
        raise NotImplementedError

    def checkpoint(self, run, epoch: int) -> None:
        """Rank 0: save what a rerun continues from after `epoch`."""
        raise NotImplementedError

    def checkpoint_due(self, run, epoch: int) -> bool:
        """Rank 0: whether to checkpoint after `epoch` (the loop also does after the last one)."""
        return True

    def epoch_line(self, rows: list[dict]) -> str:
        """An epoch's figures over every rank's rows, for the progress line."""
        return ""

    def stop_line(self, run, epoch: int) -> str:
        """The log line saying that early stopping ended the run after `epoch`."""
        return f"early stopping after epoch {epoch + 1}: the best epoch was {run.best['epoch']}"


def run_epochs(
    run: LoopState,
    head: TaskHead,
    log: Callable[[str], None],
    *,
    progress: bool = True,
    on_epoch_end: EpochHook | None = None,
    before_write: Callable[[], None] | None = None,
    now: Callable[[], float] = time.perf_counter,
) -> None:
    """Train epochs ``run.start_epoch .. run.epochs - 1`` (module docstring). `progress`: rank 0
    logs the epochs' progress line (`graphs.infra.progress`) with the head's `epoch_line` (a head
    that logs its own lines turns it off). `before_write` runs on rank 0 before its progress line
    and checkpoint (e.g. the dataset lock check); ``on_epoch_end(epoch, rows)`` on every rank
    after the checkpoint: an exception it raises ends the run like a kill would, leaving the
    checkpoint to resume from."""
    info = run.info
    bar = Progress("epoch", run.epochs, log, start=run.start_epoch) if progress and info.is_main else None
    for epoch in range(run.start_epoch, run.epochs):
        if run.stopped_early:
            break
        t_epoch = now()
        row = head.train_epoch(run, epoch)
        stop = head.evaluate(run, epoch, row) if info.is_main else False
        if not head.rows_agree:
            stop = broadcast_flag(info, stop)
        run.stopped_early = stop and epoch < run.epochs - 1
        row["epoch_seconds"] = now() - t_epoch
        rows = [row] if head.rows_agree else all_gather_objects(info, row)
        run.history.extend(rows)
        if info.is_main:
            if before_write is not None:
                before_write()
            if bar is not None:
                bar.advance(detail=head.epoch_line(rows))
            if run.stopped_early:
                log(head.stop_line(run, epoch))
            if head.checkpoint_due(run, epoch) or epoch == run.epochs - 1 or run.stopped_early:
                head.checkpoint(run, epoch)
        if on_epoch_end is not None:
            on_epoch_end(epoch, rows)
