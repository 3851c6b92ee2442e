"""One ``training`` block for every task, each task's own defaults on top of it.

Every task is trained from the same run-config blocks: ``model`` (`training.layers.ModelConfig`)
and ``training`` (`training.config.TrainingConfig`), plus a block of the settings only it has
(``link``, ``graph``). Where a task is best served by another value of a shared setting (link
prediction's learning rate, graph property's GIN encoder), it declares that value as its own
default: a mapping from the setting's dotted key under the asset's config to the value, e.g.
``{"training.optimizer.lr": 1e-3}``. A value the run config or the dataset's gnnflow.yaml sets
wins over the task's default; the task's default wins over the dataclass's.

`with_values` applies such values to a config dataclass (each block on the way validated
again), `block_values` picks a block's entries, `task_blocks` builds a task's ``model`` and
``training`` blocks at its defaults (what a benchmark or a test of the task's training runs),
and `LOOP_SETTINGS` names the ``training`` settings the shared loop reads for every task
(node classification reads the whole block).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

from training.config import TrainingConfig
from training.layers import ModelConfig

__all__ = ["LOOP_SETTINGS", "block_values", "read_by", "task_blocks", "with_values"]

T = TypeVar("T")

LOOP_SETTINGS = tuple(
    f"training.{k}"
    for k in ("optimizer", "epochs", "min_steps", "max_epochs", "early_stopping_patience", "eval_every", "seed")
    + ("prefetch",)
)
"""The ``training`` settings every task's loop reads (`training.loop.run_epochs` and its heads)."""


def with_values(block: T, values: Mapping[str, Any]) -> T:
    """`block` (a config dataclass) with each value of `values` set at its dotted path relative
    to the block (``optimizer.lr``); every dataclass on the path is built again, so validated."""
    for path, value in values.items():
        block = _replace(block, path.split("."), value)
    return block


def _replace(obj, parts: list[str], value: Any):
    if not dataclasses.is_dataclass(obj) or parts[0] not in {f.name for f in dataclasses.fields(obj)}:
        raise KeyError(f"{type(obj).__name__} has no setting {parts[0]!r}")
    inner = value if len(parts) == 1 else _replace(getattr(obj, parts[0]), parts[1:], value)
    return dataclasses.replace(obj, **{parts[0]: inner})


def block_values(values: Mapping[str, Any], block: str) -> dict[str, Any]:
    """The entries of `values` (dotted keys under the asset's config) inside `block`, keyed
    relative to it: ``{"training.optimizer.lr": v}`` gives ``{"optimizer.lr": v}`` for "training"."""
    prefix = block + "."
    return {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}


def task_blocks(defaults: Mapping[str, Any]) -> tuple[ModelConfig, TrainingConfig]:
    """The ``model`` and ``training`` blocks a task trains with when nothing is set: the shared
    defaults with the task's own `defaults` on top."""
    model = with_values(ModelConfig(), block_values(defaults, "model"))
    return model, with_values(TrainingConfig(), block_values(defaults, "training"))


def read_by(key: str, reads: tuple[str, ...]) -> bool:
    """Whether the setting `key` (dotted) is one a task reading `reads` (dotted keys or blocks) uses."""
    return any(key == r or key.startswith(r + ".") for r in reads)
