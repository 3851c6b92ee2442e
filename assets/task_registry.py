"""What a dataset is trained for (its gnnflow.yaml ``task:``), by name, each task with the traits it declares.

A task is a `Task` subclass registered with `register_task` under its ``name``; the built-in
ones live one module each in `assets.tasks`, and every module of that package is imported on
the first lookup, so a new task is one new file there plus its test. The assets never compare
task names: each reads a declared trait or calls the task's part of its stage.

Traits (`TaskTraits`):

- ``holds_out_edges``: edge_split holds out validation and test edges, and message passing
  (normalized_adjacency, the shards, training) sees edge_split's graph instead of
  canonical_graph's;
- ``needs_labels``: training needs node labels, so a dataset without them is ingested and
  prepared but not sampled, trained or evaluated (the landing sensor, minibatch_shards);
- ``seeds``: what a seed sampler's minibatches grow around, ``"nodes"`` (every training node
  once per epoch, checked on the shards) or ``"edges"``, or what the loss is over, ``"graphs"``;
- ``graph_level``: the task learns from a graph collection (`graphs.stages.collection`): the
  task of a collection folder whose gnnflow.yaml names none, and the only kind a collection takes;
- ``not_promoted`` / ``no_node_predictions``: None where the promotion / predictions assets
  apply to the task, else why they do not (a line for the log and the metadata).

Every task trains from trained_model's one run config (`training.task_settings`): the shared
``model`` and ``training`` blocks and a block of its own. A task declares ``defaults`` (its own
default of a shared setting, by dotted key under the asset's config, applied where the run config
and gnnflow.yaml leave the key unset) and ``reads`` (the blocks and keys its training reads; a key
set outside them is reported as ignored). `task_settings` resolves both for a run config
(`assets.config.resolve_blocks`).

A task's parts of the stages are its class methods `write_shards`, `train`, `evaluate` and
`decide_promotion`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping

import dagster as dg

from assets.config import ResolvedSettings, resolve_blocks
from graphs.formats.shard_manifest import GRAPH_PROPERTY, NODE_CLASSIFICATION
from graphs.infra.variants import Registry

__all__ = [
    "DEFAULT_TASK",
    "GRAPH_TASK",
    "Task",
    "TaskTraits",
    "built_in_tasks",
    "register_task",
    "task_class",
    "task_names",
    "task_settings",
]

DEFAULT_TASK = NODE_CLASSIFICATION
"""The task of a dataset (one graph) whose gnnflow.yaml names none."""
GRAPH_TASK = GRAPH_PROPERTY
"""The task of a graph collection whose gnnflow.yaml names none."""

SEED_KINDS = ("nodes", "edges", "graphs")


@dataclass(frozen=True, kw_only=True)
class TaskTraits:
    """What a task is, as the stages need to know it (the module docstring says what each means)."""

    holds_out_edges: bool
    needs_labels: bool
    seeds: str
    graph_level: bool = False
    not_promoted: str | None = None
    no_node_predictions: str | None = None

    def __post_init__(self):
        if self.seeds not in SEED_KINDS:
            raise ValueError(f"TaskTraits.seeds={self.seeds!r} is not one of {SEED_KINDS}")


class Task:
    """A task: its traits and its part of the stages that differ by task."""

    name: ClassVar[str]
    traits: ClassVar[TaskTraits]
    defaults: ClassVar[Mapping[str, Any]] = {}  # its own defaults of shared settings (module docstring)
    # on a typed graph (canonical_graph's types.json), its own defaults on top of `defaults`
    typed_defaults: ClassVar[Mapping[str, Any]] = {}
    reads: ClassVar[tuple[str, ...]] = ("model", "training", "launch")  # the settings its training reads

    @classmethod
    def write_shards(cls, inputs, out: Path, cfg, *, canonical: Path, log: Callable[[str], None]) -> dict:
        """Write the minibatch shards of `inputs` (`graphs.sampling.inputs.ShardInputs`, read
        from the task's message-passing graph) to `out` under `cfg` (a ShardConfig); the manifest."""
        raise NotImplementedError(f"task {cls.name!r} ({cls.__qualname__}) implements no write_shards()")

    @classmethod
    def train(cls, context, config, storage, dataset: str, config_metadata: dict):
        """trained_model's materialization (a ``dg.MaterializeResult``) under the dataset's lock, from
        the asset's context, its run config `config` (`assets.trained_model.TrainedModelConfig`), the
        `assets.common.GnnflowStorage` and the settings' metadata."""
        raise NotImplementedError(f"task {cls.name!r} ({cls.__qualname__}) implements no train()")

    @classmethod
    def evaluate(cls, context, storage, dataset: str):
        """evaluation's materialization (a ``dg.MaterializeResult``): the test metrics of the newest model."""
        raise NotImplementedError(f"task {cls.name!r} ({cls.__qualname__}) implements no evaluate()")

    @classmethod
    def predictions(cls, context, storage, dataset: str):
        """The predictions asset's result (a ``dg.MaterializeResult``) for a task that writes no
        node predictions (``no_node_predictions`` set): by default, skipped with that reason;
        None for a task whose nodes the predictions asset scores."""
        why = cls.traits.no_node_predictions
        if why is None:
            return None
        context.log.info(f"dataset '{dataset}': {why}")
        return dg.MaterializeResult(metadata={"skipped": why})

    @classmethod
    def decide_promotion(cls, storage, dataset: str, record: dict, cfg):
        """Whether the candidate of evaluation's `record` (its metrics.json) replaces the promoted
        model under `cfg` (`training.promotion.PromotionConfig`): a `training.promotion.Decision`.
        Called only for a task whose traits leave ``not_promoted`` unset."""
        raise NotImplementedError(f"task {cls.name!r} ({cls.__qualname__}) implements no decide_promotion()")


def task_settings(task: type[Task], config, typed: bool = False) -> ResolvedSettings:
    """trained_model's effective run config `config` with `task`'s defaults where a key is unset
    (`assets.config.resolve_blocks`), its ``typed_defaults`` on top of them for a typed graph."""
    return resolve_blocks(config, {**task.defaults, **(task.typed_defaults if typed else {})}, task.reads)


def _check_traits(cls: type) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"{cls!r} is not a Task subclass")
    if not isinstance(getattr(cls, "traits", None), TaskTraits):
        raise TypeError(f"task {cls.name!r} ({cls.__qualname__}) declares no TaskTraits in `traits`")


TASKS = Registry("task", "task", "assets.tasks", _check_traits)


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: register the `Task` subclass `cls` under ``cls.name``, with its ``cls.traits``."""
    return TASKS.register(cls)


def task_names() -> tuple[str, ...]:
    """The registered task names (the built-in ones first)."""
    return TASKS.names()


def built_in_tasks() -> list[str]:
    """The names of the tasks of the `assets.tasks` package (not those a script or a test registers), sorted."""
    return sorted(n for n in task_names() if task_class(n).__module__.startswith("assets.tasks."))


def task_class(name: str) -> type[Task]:
    """The task registered as `name` (ValueError naming the registered ones otherwise)."""
    return TASKS.get(name)
