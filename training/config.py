"""Typed configuration of a training run: one keyword-only dataclass per component.

A run is :class:`RunConfig` = ``model`` (:class:`training.layers.ModelConfig`) +
``training`` (:class:`TrainingConfig`, with nested :class:`OptimizerConfig` and
:class:`LRScheduleConfig`) + ``paths`` (:class:`PathsConfig`). Every field has one help
text (``metadata["help"]``) and is validated in ``__post_init__``; an error names the
field by its dotted path (``training.optimizer.lr=-1: must be > 0``).

The same YAML file works in two places::

    # run.yaml
    model:    {conv: sage, hidden: 256}
    training: {precision: mixed_float16, optimizer: {type: AdamW, lr: 0.001, weight_decay: 0.01},
               gradient_clipping: 1.0, accumulate: 4}
    paths:    {shards: .gnnflow/demo/minibatch_shards, ...}     # only for `python -m training`

    python -m training.launch --nproc-per-node 2 -m training --config run.yaml
    dagster asset materialize -m pipelines.definitions --select trained_model --partition demo -c run.yaml

For Dagster the ``model`` and ``training`` blocks go under ``ops: trained_model: config:``
(the asset fills ``paths`` in itself); :meth:`RunConfig.from_yaml` also accepts that
shape, so one file can serve both.

World size and batch size are not here: they come from the shards' manifest (the
minibatch_shards stage owns sampling). The global batch is
``batch_size x world_size x accumulate`` seeds per optimizer step.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar, Union

from graphs.infra.config_checks import (
    MAX_EPOCHS,
    MAX_PREFETCH,
    MAX_RATE,
    MAX_ROWS,
    MAX_SCALE,
    MAX_SEED,
    MAX_STEPS,
    asset_config_block,
    bounded_repr,
    check_fields,
    dump_yaml,
    help_text,
    read_yaml_file,
)
from training.comm_hooks import CommConfig
from training.compensation import CompensationConfig
from training.feature_cache import WARM_POLICIES
from training.imbalance import SELECT_BY
from training.layers import ModelConfig
from training.outputs import STAGE as TRAINED_MODEL

__all__ = [
    "CommConfig",
    "CompensationConfig",
    "LRScheduleConfig",
    "OptimizerConfig",
    "PathsConfig",
    "RunConfig",
    "TrainingConfig",
    "config_from_dict",
    "config_to_dict",
    "field_help",
    "unwrap_dagster_run_config",
]

PRECISIONS = ("fp32", "mixed_float16", "bf16")
OPTIMIZERS = ("AdamW", "Adam", "SGD")
SCHEDULES = ("constant", "cosine", "step")
FEATURE_NORMALIZATIONS = ("row", "standard", "none")
PROFILERS = ("torch", "nsys", "none")
DEVICES = ("auto", "cpu", "cuda")
AGGREGATIONS = ("auto", "torch", "dgl")

T = TypeVar("T")


def _fail(path: str, value: Any, why: str) -> None:
    raise ValueError(f"{path}={bounded_repr(value)}: {why}")


DEFAULT_LR = 0.003  # the default learning rate of every training engine (shards, DistDGL)


@dataclass(kw_only=True)
class OptimizerConfig:
    """The optimizer (its parameters are the model's; one param group)."""

    type: str = field(
        default="AdamW",
        metadata={
            "help": f"optimizer, one of {OPTIMIZERS}; Adam applies weight_decay as L2 "
            "(the GCN paper's recipe), AdamW decoupled"
        },
    )
    lr: float = field(default=DEFAULT_LR, metadata={"max": MAX_RATE, "help": "peak learning rate (after warmup)"})
    weight_decay: float = field(
        default=0.0, metadata={"max": MAX_RATE, "help": "weight decay (L2 for Adam/SGD, decoupled for AdamW)"}
    )
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata={"help": "Adam/AdamW (beta1, beta2)"})
    momentum: float = field(default=0.9, metadata={"help": "SGD momentum"})

    def __post_init__(self) -> None:
        p = "training.optimizer"
        check_fields(self, p)
        if self.type not in OPTIMIZERS:
            _fail(f"{p}.type", self.type, f"must be one of {OPTIMIZERS}")
        if not self.lr > 0:
            _fail(f"{p}.lr", self.lr, "must be > 0")
        if self.weight_decay < 0:
            _fail(f"{p}.weight_decay", self.weight_decay, "must be >= 0")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            _fail(f"{p}.betas", self.betas, "must be two numbers in [0, 1)")
        if not 0 <= self.momentum < 1:
            _fail(f"{p}.momentum", self.momentum, "must be in [0, 1)")


@dataclass(kw_only=True)
class LRScheduleConfig:
    """Learning-rate schedule, applied per optimizer step (see `training.run_plan.learning_rate`)."""

    type: str = field(
        default="constant",
        metadata={
            "help": f"one of {SCHEDULES}: cosine decays to min_lr_ratio x lr over the run, "
            "step multiplies by gamma every step_epochs"
        },
    )
    warmup_epochs: float = field(
        default=0.0,
        metadata={"max": MAX_EPOCHS, "help": "linear warmup from 0 over this many epochs (fractions allowed)"},
    )
    min_lr_ratio: float = field(default=0.0, metadata={"help": "cosine: final lr as a fraction of lr"})
    step_epochs: int = field(default=30, metadata={"max": MAX_EPOCHS, "help": "step: epochs between decays"})
    gamma: float = field(default=0.1, metadata={"help": "step: decay factor"})

    def __post_init__(self) -> None:
        p = "training.lr_schedule"
        check_fields(self, p)
        if self.type not in SCHEDULES:
            _fail(f"{p}.type", self.type, f"must be one of {SCHEDULES}")
        if self.warmup_epochs < 0:
            _fail(f"{p}.warmup_epochs", self.warmup_epochs, "must be >= 0")
        if not 0 <= self.min_lr_ratio <= 1:
            _fail(f"{p}.min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")
        if self.step_epochs < 1:
            _fail(f"{p}.step_epochs", self.step_epochs, "must be >= 1")
        if not 0 < self.gamma <= 1:
            _fail(f"{p}.gamma", self.gamma, "must be in (0, 1]")


@dataclass(kw_only=True)
class TrainingConfig:
    """How to train: precision, optimization, evaluation, checkpoints, profiling, device."""

    epochs: int = field(
        default=0,
        metadata={
            "max": MAX_EPOCHS,
            "help": "epochs to train; 0 = the automatic budget: min(max_epochs, max(E, ceil(min_steps / S))) "
            "with E the shards' sampled epochs and S = ceil(M / accumulate) optimizer steps per epoch (M "
            "minibatches per rank and epoch), ended earlier by early_stopping_patience. More epochs than the "
            "shards hold replay them: epoch e reads sampled epoch e % E, its minibatches in a new seeded order "
            "per pass",
        },
    )
    min_steps: int = field(
        default=400,
        metadata={
            "max": MAX_STEPS,
            "help": "automatic budget (epochs=0): train at least this many optimizer steps (replaying the "
            "shards as needed), so a small graph with one step per epoch still converges",
        },
    )
    max_epochs: int = field(
        default=200,
        metadata={"max": MAX_EPOCHS, "help": "automatic budget (epochs=0): at most this many epochs"},
    )
    precision: str = field(
        default="fp32",
        metadata={
            "help": f"one of {PRECISIONS}. mixed_float16: fp16 autocast + loss scaling on CUDA, "
            "bf16 autocast on CPU (fp32 where kernels lack bf16); bf16: bf16 autocast, no scaling"
        },
    )
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig, metadata={"help": "the optimizer"})
    lr_schedule: LRScheduleConfig = field(default_factory=LRScheduleConfig, metadata={"help": "learning-rate schedule"})
    gradient_clipping: float = field(
        default=0.0, metadata={"max": MAX_SCALE, "help": "clip the global gradient norm to this value; 0 = off"}
    )
    accumulate: int = field(
        default=1,
        metadata={
            "max": 1 << 16,
            "help": "minibatches per optimizer step on each rank (gradient accumulation); "
            "global batch = batch_size x world_size x accumulate",
        },
    )
    eval_every: int = field(
        default=1,
        metadata={"max": MAX_EPOCHS, "help": "full-graph validation/test accuracy every k epochs (and after the last)"},
    )
    eval_batch_size: int = field(
        default=0,
        metadata={
            "max": MAX_ROWS,
            "help": "0 = rank 0 holds Â and the features in memory for the full-graph evaluation; > 0 = "
            "stream it: each layer runs over chunks of this many destination rows read from the memory-mapped "
            "Â and feature files (INT8 decoded per chunk), its output written to a memory-mapped file, so "
            "device memory is bounded by one chunk (training.evaluate.StreamingEval)",
        },
    )
    early_stopping_patience: int = field(
        default=50,
        metadata={
            "max": MAX_EPOCHS,
            "help": "stop when the validation metric (the task's: accuracy or select_by, MRR, ROC-AUC or MAE) "
            "has not improved for this many evaluations (the model of the best one is kept); 0 = off",
        },
    )
    feature_norm: str = field(
        default="row",
        metadata={
            "help": f"feature preprocessing, one of {FEATURE_NORMALIZATIONS}: row = divide each row by "
            "its L1 norm (the Planetoid recipe), standard = zero mean / unit variance per column"
        },
    )
    degree_buckets: int = field(
        default=16,
        metadata={"max": 64, "help": "datasets without features get one-hot log2-degree buckets of this many classes"},
    )
    profiler: str = field(
        default="torch",
        metadata={
            "help": f"one of {PROFILERS}: torch = a torch.profiler trace of steps 3-5 (wait 1, warmup 1, "
            "active 3; Chrome JSON + key-averages table); nsys = the launcher wraps the run in `nsys profile` "
            "when nsys exists"
        },
    )
    aggregation: str = field(
        default="auto",
        metadata={
            "help": f"sparse kernel for the sampled minibatch blocks, one of {AGGREGATIONS} (see "
            "training.aggregate): auto = DGL's fused CPU kernels when DGL imports and the tensors are on the "
            "CPU (a block gets only the formats its kernels read), torch sparse otherwise. Full-graph inference "
            "always uses auto"
        },
    )
    reuse_host_memory: bool = field(
        default=True,
        metadata={
            "help": "during the training steps, glibc keeps freed host memory for the next step's tensors instead "
            "of unmapping it and faulting it in again (graphs.infra.host_memory: shorter CPU epochs for a somewhat "
            "higher peak RSS); false = glibc's defaults"
        },
    )
    class_weighted_loss: bool = field(
        default=False,
        metadata={
            "help": "imbalanced classes: weight each training node's loss by T / (C x T_c) of its class "
            "(training.imbalance); pair with minibatch_shards seed_weighting: class_balanced"
        },
    )
    select_by: str = field(
        default="val_acc",
        metadata={
            "help": f"what picks the best model (kept, and early stopping's yardstick), one of {SELECT_BY}; "
            "val_macro_f1 for imbalanced classes, where accuracy rewards predicting the majority class"
        },
    )
    node_grad_stats: bool = field(
        default=False,
        metadata={
            "help": "adaptive sampling's feedback: record the norm of the loss gradient w.r.t. each input node's "
            "features and write node_grad_norm.npz into the trained_model folder, which minibatch_shards with "
            "samplers.neighbor.prob: adaptive reads on the next materialization (training.node_stats); one extra "
            "gradient through the first layer per step"
        },
    )
    seed: int = field(
        default=0, metadata={"max": MAX_SEED, "help": "seed of parameter init and dropout (per epoch and rank)"}
    )
    device: str = field(default="auto", metadata={"help": f"one of {DEVICES}; auto = cuda when available, else cpu"})
    prefetch: int = field(
        default=2,
        metadata={"max": MAX_PREFETCH, "help": "minibatches read ahead by each shard stream's background thread"},
    )
    feature_cache: float = field(
        default=0.0,
        metadata={
            "help": "share of the feature rows (0..1) each rank keeps in a cache in CPU memory between the "
            "memory-mapped feature file and the minibatches (training/feature_cache.py; which rows: "
            "feature_cache_policy; compact INT8 codes when compressed features are chosen); 0 = off, every "
            "row is read from the file's mapping"
        },
    )
    feature_cache_policy: str = field(
        default="degree",
        metadata={
            "help": f"which rows the feature cache keeps, one of {WARM_POLICIES}: degree = the highest-degree "
            "nodes, filled once before the first step (neighbour sampling reads a node in proportion to its "
            "degree); lru = the rows read most recently, filled as the minibatches read them"
        },
    )
    feature_cache_hot: float = field(
        default=0.0,
        metadata={
            "help": "share of the feature rows (0..1), those of the highest-degree nodes, that each rank keeps "
            "on its training device (the GPU's memory; on the CPU, another tier in memory): a minibatch's "
            "hot rows are not read nor copied from the host; the warm tier (feature_cache) holds rows "
            "besides them. 0 = off"
        },
    )
    verify_shards: bool = field(
        default=True,
        metadata={
            "help": "check every shard file's SHA-256 against the manifest (once per process and file; "
            "again when the file's inode, size or modification time changes)"
        },
    )
    checkpoint_every: int = field(
        default=1, metadata={"max": MAX_EPOCHS, "help": "epochs between checkpoints on rank 0 (always after the last)"}
    )
    compensation: CompensationConfig = field(
        default_factory=CompensationConfig,
        metadata={"help": "historical compensation for small fanouts: gradient moving average, VR-GCN (off)"},
    )
    comm: CommConfig = field(
        default_factory=CommConfig,
        metadata={"help": "DDP gradient communication: compression hook, bucket size, byte counting"},
    )
    dist_timeout_s: int = field(
        default=1800,
        metadata={
            "max": 30 * 24 * 3600,
            "help": "seconds a rank waits in a collective (or to join the process group) before the run fails "
            "naming the missing rank; longer than rank 0's slowest evaluation",
        },
    )

    RENAMED_FIELDS: ClassVar[dict[str, str]] = {"normalize": "feature_norm"}

    def __post_init__(self) -> None:
        p = "training"
        check_fields(self, p)
        for name, choices in (
            ("precision", PRECISIONS),
            ("feature_norm", FEATURE_NORMALIZATIONS),
            ("profiler", PROFILERS),
            ("device", DEVICES),
            ("aggregation", AGGREGATIONS),
            ("select_by", SELECT_BY),
            ("feature_cache_policy", WARM_POLICIES),
        ):
            if getattr(self, name) not in choices:
                _fail(f"{p}.{name}", getattr(self, name), f"must be one of {choices}")
        for name in (
            "accumulate",
            "eval_every",
            "degree_buckets",
            "checkpoint_every",
            "dist_timeout_s",
            "min_steps",
            "max_epochs",
        ):
            if getattr(self, name) < 1:
                _fail(f"{p}.{name}", getattr(self, name), "must be >= 1")
        for name in ("epochs", "eval_batch_size", "early_stopping_patience", "seed", "prefetch"):
            if getattr(self, name) < 0:
                _fail(f"{p}.{name}", getattr(self, name), "must be >= 0")
        for name in ("feature_cache", "feature_cache_hot"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                _fail(f"{p}.{name}", getattr(self, name), "must be a share of the rows in [0, 1]")
        if self.gradient_clipping < 0:
            _fail(f"{p}.gradient_clipping", self.gradient_clipping, "must be >= 0 (0 = off)")


@dataclass(kw_only=True)
class PathsConfig:
    """Where the inputs are and where the outputs go (filled in by the Dagster asset)."""

    shards: str = field(default="", metadata={"help": "minibatch_shards folder (holds manifest.json)"})
    canonical: str = field(
        default="",
        metadata={"help": "canonical_graph folder (labels, splits, original ids); default: the one the manifest names"},
    )
    adjacency: str = field(
        default="",
        metadata={"help": "normalized_adjacency folder (full-graph inference); default: the one the manifest names"},
    )
    out: str = field(
        default="", metadata={"help": "the trained_model folder, replaced atomically when the run finishes"}
    )
    work: str = field(
        default="",
        metadata={"help": "checkpoint folder; default: `.<out name>.work-<hash of config and data>` next to out"},
    )

    def __post_init__(self) -> None:
        check_fields(self, "paths")
        for name in ("shards", "out"):
            if not getattr(self, name):
                _fail(f"paths.{name}", getattr(self, name), "is required")


@dataclass(kw_only=True)
class RunConfig:
    """One training run: model, training and paths."""

    model: ModelConfig = field(
        default_factory=ModelConfig,
        metadata={"help": "the GNN architecture (every task's encoder; a task may default some keys otherwise)"},
    )
    training: TrainingConfig = field(
        default_factory=TrainingConfig,
        metadata={
            "help": "how to train, for every task; a task's own defaults of some keys (link_prediction, "
            "graph_property: training.task_settings) apply where this block leaves them unset, and the "
            "materialization's metadata lists them (own_defaults), the effective config and the keys the task "
            "does not read"
        },
    )
    paths: PathsConfig = field(metadata={"help": "inputs and outputs"})

    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        """Build and validate from a plain dict (unknown keys and wrong types name the field)."""
        return config_from_dict(cls, unwrap_dagster_run_config(data))

    @classmethod
    def from_yaml(cls, path: str | Path) -> "RunConfig":
        """Read, check (`graphs.infra.config_checks.read_yaml_file`: size, no aliases) and validate a run YAML."""
        data = read_yaml_file(path) or {}
        try:
            return cls.from_dict(data)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{path}: {exc}") from exc

    def to_dict(self) -> dict:
        return config_to_dict(self)

    def to_yaml(self, path: str | Path | None = None) -> str:
        text = dump_yaml(self.to_dict())
        if path is not None:
            Path(path).write_text(text)
        return text


# ----------------------------------------------------------------------------- dict <-> dataclass


def unwrap_dagster_run_config(data: Any) -> Any:
    """A Dagster run-config dict's ``ops: trained_model: config:`` block (plus any other
    top-level keys, e.g. ``paths``); any other dict unchanged."""
    if not isinstance(data, dict) or "ops" not in data:
        return data
    block = asset_config_block(data, TRAINED_MODEL, needs="{model, training}")
    block = {k: v for k, v in block.items() if k != "launch"}  # the launcher's (training.launch), not the run's
    return {**block, **{k: v for k, v in data.items() if k not in ("ops", "resources", "execution", "loggers")}}


def config_to_dict(obj) -> dict:
    """A config dataclass as nested plain dicts/lists (YAML- and JSON-safe)."""
    return dataclasses.asdict(obj)


def config_from_dict(cls: type[T], data: Any, path: str = "") -> T:
    """``cls(**data)`` recursively, with type checks that name the offending field.

    Nested dataclass fields take dicts; ints are accepted for float fields; a missing
    field takes its default; an unknown key raises with the known ones listed.
    """
    where = path or cls.__name__
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TypeError(f"{where}: expected a mapping of fields, got {type(data).__name__} {bounded_repr(data)}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(known))
    prefix = f"{path}." if path else ""
    renamed = getattr(cls, "RENAMED_FIELDS", {})
    for old in unknown:
        if old in renamed:
            raise ValueError(f"{prefix}{old} was renamed {prefix}{renamed[old]}; rename it in your config")
    if unknown:
        raise ValueError(
            f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(prefix + k for k in unknown)}; "
            f"known fields: {', '.join(known)}"
        )
    kwargs = {}
    for name, value in data.items():
        fpath = f"{path}.{name}" if path else name
        kwargs[name] = _convert(value, hints[name], fpath)
    return cls(**kwargs)


def _convert(value: Any, hint: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        return config_from_dict(hint, value, path)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise TypeError(errors[0] if len(errors) == 1 else f"{path}={bounded_repr(value)}: expected {hint}")
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{path}={bounded_repr(value)}: expected a list")
        return [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{path}={bounded_repr(value)}: expected true or false")
        return value
    if hint in (int, float):
        return _convert_number(value, hint, path)
    if hint is str:
        if not isinstance(value, str):
            raise TypeError(f"{path}={bounded_repr(value)}: expected a string")
        return value
    raise TypeError(f"{path}: unsupported field type {hint}")


def _convert_number(value: Any, hint: type, path: str) -> int | float:
    ok = (int,) if hint is int else (int, float)
    if not isinstance(value, bool) and isinstance(value, ok):
        return hint(value)
    why = "expected an integer" if hint is int else "expected a number"
    if isinstance(value, str):  # YAML 1.1 reads 1e6 (no dot) as text
        why += ", written as digits, e.g. 1000000" if hint is int else ", e.g. 0.001 or 1.0e-3"
    raise TypeError(f"{path}={bounded_repr(value)}: {why}")


def field_help(cls) -> dict[str, str]:
    """Dotted field name -> help text, nested dataclasses flattened (for --help and docs)."""
    out: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out.update({f"{f.name}.{k}": v for k, v in field_help(hints[f.name]).items()})
        else:
            out[f.name] = help_text(f)
    return out
