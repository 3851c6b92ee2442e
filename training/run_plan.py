"""The plan of a node-classification run: pure rules from its settings and the shards' manifest.

This rank's streams, epochs and steps (`StepPlan`), how many epochs run (`training_epochs`)
and how often each sampled epoch is read then (`epoch_passes`: epoch e replays sampled epoch
e % E), the minibatch order of a replay
(`replay_order_seed`), the learning rate of each optimizer step (`learning_rate`), the
model's layer count (`resolve_num_layers`) and whether its layer can use the shards' draws
(`check_sampler_supports`). `training.run_setup`, `training.epoch_loop` and `training.publish`
apply them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphs.formats.shard_format import MANIFEST_NAME
from graphs.formats.shard_manifest import ShardManifest
from training.config import LRScheduleConfig, TrainingConfig
from training.layer_registry import layer_kind, linear_layer_names

__all__ = [
    "StepPlan",
    "check_sampler_supports",
    "epoch_passes",
    "learning_rate",
    "replay_order_seed",
    "resolve_num_layers",
    "training_epochs",
]


@dataclass(frozen=True)
class StepPlan:
    """This rank's share of the shards and the run's length, fixed for the run."""

    my_streams: list[int]  # the streams this rank reads (rank, rank + P, ... of the W the shards hold)
    shard_epochs: int  # sampled epochs the shards hold
    epochs: int  # epochs trained (`training_epochs`)
    per_stream: int  # minibatches per stream and epoch
    steps_per_epoch: int  # optimizer steps per epoch (minibatches / accumulate)

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @classmethod
    def of(cls, manifest: ShardManifest, shards: Path, rank: int, processes: int, tcfg: TrainingConfig) -> "StepPlan":
        """The plan of rank `rank` of `processes` (ValueError when they do not divide the W streams)."""
        W = manifest.world_size
        if W % processes:
            raise ValueError(
                f"{shards}: the shards were cut for world_size={W}; launch a number of processes that divides it "
                f"(got {processes}), e.g. torchrun --nproc-per-node {W}, or re-materialize minibatch_shards "
                f"with world_size={processes}"
            )
        per_stream = manifest.minibatches_per_epoch_per_rank
        steps_per_epoch = math.ceil(per_stream / tcfg.accumulate)
        epochs = training_epochs(tcfg, manifest.epochs, steps_per_epoch)
        return cls(list(range(rank, W, processes)), manifest.epochs, epochs, per_stream, steps_per_epoch)


def training_epochs(tcfg: TrainingConfig, shard_epochs: int, steps_per_epoch: int) -> int:
    """Epochs to run: ``training.epochs``, or when 0 the automatic budget
    ``min(max_epochs, max(shard_epochs, ceil(min_steps / steps_per_epoch)))`` (see its help)."""
    if tcfg.epochs:
        return tcfg.epochs
    return min(tcfg.max_epochs, max(shard_epochs, math.ceil(tcfg.min_steps / max(steps_per_epoch, 1))))


def epoch_passes(epochs: int, shard_epochs: int) -> list[int]:
    """How often each sampled epoch is read when ``epochs`` epochs run (epoch e reads e % E)."""
    return [len(range(k, epochs, shard_epochs)) for k in range(shard_epochs)]


def replay_order_seed(seed: int, epoch: int, shard_epochs: int, stream: int) -> int | None:
    """The minibatch-order seed of ``epoch``'s read of ``stream``: None (stored order) on the
    first pass over the sampled epochs, a seed derived from (seed, epoch, stream) on replays."""
    if epoch < shard_epochs:
        return None
    return int(np.random.SeedSequence([seed, epoch, stream, 0x5EED]).generate_state(1)[0])


def learning_rate(sched: LRScheduleConfig, base_lr: float, step: int, steps_per_epoch: int, total_steps: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based): linear warmup, then the schedule."""
    warmup = sched.warmup_epochs * steps_per_epoch
    if step < warmup:
        return base_lr * (step + 1) / warmup
    if sched.type == "constant":
        return base_lr
    if sched.type == "cosine":
        progress = min(1.0, (step - warmup) / max(1.0, total_steps - warmup))
        return base_lr * (sched.min_lr_ratio + (1 - sched.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
    return base_lr * sched.gamma ** ((step // steps_per_epoch) // sched.step_epochs)


def resolve_num_layers(num_layers: int, manifest: ShardManifest, shards: Path) -> int:
    """The model's layer count: ``num_layers``, or the shards' block count when 0.

    Neighbour-sampled shards hold one block per layer, so a different count is an error;
    cluster_gcn / saint shards hold one block that serves any number of layers.
    """
    num_blocks = manifest.num_layers
    if num_layers == 0:
        return num_blocks
    if not manifest.shared_block and num_layers != num_blocks:
        raise ValueError(
            f"model.num_layers={num_layers} but {shards / MANIFEST_NAME} holds {num_blocks} sampled blocks per "
            f"minibatch (fanouts {manifest.settings.get('fanouts')!r}, one per layer); set model.num_layers to 0 "
            f"(follow the shards) or re-materialize minibatch_shards with {num_layers} fanouts"
        )
    return num_layers


def check_sampler_supports(conv: str, draws: str | None, shards: Path) -> None:
    """Refuse a layer whose aggregation cannot use the sampler's correction weights.

    A layer that is not ``linear`` (`training.layer_registry`: GAT's softmax ratio of
    attention scores, SAGE-pool's element-wise max) has no unbiased form over the draws the
    shards' manifest records as non-uniform (`draws`: its ``non_uniform_draws``, declared by
    the sampler): its result would silently differ from the full-graph one the model is
    evaluated with.
    """
    kind = layer_kind(conv)
    if draws and not kind.linear:
        raise ValueError(
            f"model.conv={conv!r} cannot be trained on shards cut with {draws} ({shards / MANIFEST_NAME}): a "
            f"{kind.aggregates_by} aggregation has no correction for non-uniform draws; re-materialize "
            "minibatch_shards with sampler neighbor (samplers.neighbor.prob uniform) or cluster_gcn, or use a layer whose "
            f"aggregation is linear ({', '.join(linear_layer_names())})"
        )
