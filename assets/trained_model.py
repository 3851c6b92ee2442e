"""trained_model: DDP node-classification training, launched by torchrun through dagster-pipes.

The asset runs exactly

    torchrun --standalone --nproc-per-node W -m training --config <work folder>/run.yaml

as a subprocess with `dagster.PipesSubprocessClient`: the training logs stream into the
run's compute logs, rank 0 forwards its progress lines and reports the final metrics over
dagster-pipes (`training.report`), and this function adds the curves, the file paths and
an asset check. W (processes) is the shards' world size, and the batch size is theirs too
(the minibatch_shards stage owns sampling); on GPUs W is lowered to the largest divisor of
the world size that fits the visible GPUs (every process then reads several streams, see
`training.train`). Everything else is this asset's run config, whose `model` and
`training` blocks are `training.config`'s dataclasses field for field, so the same YAML
serves `python -m training --config run.yaml` and `dagster asset materialize -c run.yaml`:

    ops:
      trained_model:
        config:
          model: {conv: sage, hidden: 128}
          training: {precision: mixed_float16, optimizer: {type: AdamW, lr: 0.001, weight_decay: 0.01},
                     gradient_clipping: 1.0, accumulate: 4}

Checkpoints go to a work folder next to the asset folder (keyed by config and data
version); a run that dies is resumed by the next materialization, and only a finished
run replaces `<GNNFLOW_HOME>/<dataset>/trained_model/` (files: `training.outputs`), which is
also kept as `<dataset>/model_versions/<version>/` (see `GnnflowStorage.record_model_version`;
the `evaluation` and `promotion` assets decide whether it becomes `<dataset>/promoted`). With
`training.profiler: nsys` the command is wrapped in `nsys profile` when `nsys` is on the
PATH; otherwise the metadata says why it was skipped. A dataset without labels is skipped.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
from pydantic import Field

from assets.common import NEEDS_LABELS_TAG, GnnflowStorage, dataset_partitions, png_markdown, skip_without_labels
from assets.config import dagster_config
from assets.settings import register_config
from graphs.canonical import read_summary
from training.checkpoint import data_version, run_key, work_dir_for
from training.config import PathsConfig, RunConfig, TrainingConfig
from training.data import ShardError, read_manifest
from training.layers import ModelConfig

_ASSET = "trained_model"
BEATS_MAJORITY = "test_accuracy_above_majority_class"
REPO_ROOT = Path(__file__).resolve().parents[1]

_RUN_HELP = {f: RunConfig.__dataclass_fields__[f].metadata["help"] for f in ("model", "training")}
TrainedModelModelConfig = dagster_config(ModelConfig, "TrainedModelModelConfig")
TrainedModelTrainingConfig = dagster_config(TrainingConfig, "TrainedModelTrainingConfig")


class TrainedModelConfig(dg.Config):
    """The run config of trained_model: the `model` and `training` blocks of a training YAML."""

    model: TrainedModelModelConfig = Field(  # type: ignore[valid-type]
        default_factory=TrainedModelModelConfig, description=_RUN_HELP["model"]
    )
    training: TrainedModelTrainingConfig = Field(  # type: ignore[valid-type]
        default_factory=TrainedModelTrainingConfig, description=_RUN_HELP["training"]
    )

    def to_dataclass(self) -> tuple[ModelConfig, TrainingConfig]:
        """The `model` and `training` dataclasses (validated by their `__post_init__`)."""
        return self.model.to_dataclass(), self.training.to_dataclass()

    def to_run_config(self, paths: PathsConfig) -> RunConfig:
        return RunConfig(model=self.model.to_dataclass(), training=self.training.to_dataclass(), paths=paths)


register_config(_ASSET, TrainedModelConfig)


def torchrun_command(nproc: int, config_path: str | os.PathLike) -> list[str]:
    """``torchrun --standalone --nproc-per-node N -m training --config PATH`` (this venv's torchrun)."""
    exe = Path(sys.executable).with_name("torchrun")
    launcher = [str(exe)] if exe.is_file() else [sys.executable, "-m", "torch.distributed.run"]
    return [*launcher, "--standalone", f"--nproc-per-node={nproc}", "-m", "training", "--config", str(config_path)]


def process_count(world_size: int, device: str) -> int:
    """Processes to launch: the shards' world size, or on GPUs its largest divisor <= the GPU count."""
    if device == "cpu":
        return world_size
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        if device == "cuda":
            raise dg.Failure(description="training.device='cuda' but no GPU is visible")
        return world_size
    return max(d for d in range(1, world_size + 1) if world_size % d == 0 and d <= gpus)


def nsys_wrap(command: list[str], report: Path) -> tuple[list[str], str]:
    """``nsys profile ... command`` when nsys is on the PATH, else the command; and what was done."""
    nsys = shutil.which("nsys")
    if nsys is None:
        return command, "skipped: nsys is not on the PATH (install NVIDIA Nsight Systems to profile with it)"
    wrapped = [nsys, "profile", "--trace=cuda,nvtx,osrt", "--force-overwrite=true", "-o", str(report), *command]
    return wrapped, f"profiled with nsys; report {report}.nsys-rep, copied to profile/nsys/"


def _threads_per_process(nproc: int) -> str:
    return str(max(1, (os.cpu_count() or 1) // nproc))


@dg.asset(
    partitions_def=dataset_partitions,
    # every stage whose files training reads: the shards, and through them the canonical
    # graph (labels, splits, features), Â (full-graph evaluation) and compressed_graph (INT8 codes)
    deps=["canonical_graph", "normalized_adjacency", "compressed_graph", "minibatch_shards"],
    group_name="training",
    kinds={"pytorch"},
    tags={NEEDS_LABELS_TAG: "labels"},
    check_specs=[
        dg.AssetCheckSpec(
            BEATS_MAJORITY,
            asset=_ASSET,
            description="The model's test accuracy (full-graph "
            "inference, best-on-validation model) is above always predicting the most "
            "frequent training label (a quality check: it warns, it does not block).",
        ),
    ],
)
def trained_model(
    context: dg.AssetExecutionContext, config: TrainedModelConfig, storage: GnnflowStorage
) -> dg.MaterializeResult:
    """GNN trained with torchrun DDP from the minibatch shards: models, predictions, metrics, curves, traces."""
    dataset = storage.dataset(context)
    config, config_metadata = storage.settings(context, dataset, _ASSET, config)
    # the torchrun ranks take the same lock; as descendants of this process they run under it
    with storage.lock(dataset, context.log.info):
        canonical = storage.upstream_dir(dataset, "canonical_graph")
        shards = storage.asset_dir(dataset, "minibatch_shards")
        summary = read_summary(canonical)
        skipped = skip_without_labels(context, summary, "train on", [BEATS_MAJORITY])
        if skipped is not None:
            return skipped
        result, command, nproc, work, extra = _launch(context, config, storage, dataset, canonical, shards)
        out = storage.asset_dir(dataset, _ASSET)
        check = check_accuracy(out, canonical)
        if (work / "nsys").is_dir():  # nsys writes its report after the processes exit
            shutil.copytree(work / "nsys", out / "profile" / "nsys", dirs_exist_ok=True)
            shutil.rmtree(work, ignore_errors=True)
        metadata = {
            **result.metadata,
            **extra,
            "path": dg.MetadataValue.path(str(out)),
            "processes": nproc,
            "launch": " ".join(command),
            "curves": png_markdown(out / "curves.png", "training curves"),
            **config_metadata,
        }
        if (out / "profile" / "trace.json").is_file():
            metadata["profiler_trace"] = dg.MetadataValue.path(str(out / "profile" / "trace.json"))
        metadata["version"] = storage.record_model_version(dataset, context.run_id)
    return dg.MaterializeResult(metadata=metadata, check_results=[check])


def _launch(context, config, storage: GnnflowStorage, dataset: str, canonical: Path, shards: Path):
    """Write run.yaml into the work folder and run torchrun through dagster-pipes."""
    try:
        manifest = read_manifest(shards)
    except ShardError as exc:
        raise dg.Failure(description=f"dataset '{dataset}': {exc}") from exc

    out = storage.asset_dir(dataset, _ASSET)
    adjacency = storage.asset_dir(dataset, "normalized_adjacency")
    try:
        cfg = config.to_run_config(
            PathsConfig(shards=str(shards), canonical=str(canonical), adjacency=str(adjacency), out=str(out))
        )
    except (ValueError, TypeError) as exc:
        raise dg.Failure(description=f"trained_model config: {exc}") from exc
    work = work_dir_for(out, run_key(cfg.to_dict(), data_version(shards, canonical, adjacency)))
    work.mkdir(parents=True, exist_ok=True)
    run_yaml = work / "run.yaml"
    cfg.to_yaml(run_yaml)

    nproc = process_count(int(manifest["world_size"]), cfg.training.device)
    command = torchrun_command(nproc, run_yaml)
    extra: dict = {}
    if cfg.training.profiler == "nsys":
        command, extra["nsys"] = nsys_wrap(command, work / "nsys" / "trained_model")
        context.log.info(f"training.profiler=nsys: {extra['nsys']}")
    context.log.info(f"launching: {' '.join(command)}")
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", _threads_per_process(nproc))}
    result = (
        dg.PipesSubprocessClient(cwd=str(REPO_ROOT))
        .run(context=context, command=command, env=env)
        .get_materialize_result()
    )
    return result, command, nproc, work, extra


def check_accuracy(out: Path, canonical: Path) -> dg.AssetCheckResult:
    """Test accuracy of the written model vs the majority-class baseline (labels from canonical_graph)."""
    s = json.loads((out / "summary.json").read_text())
    nodes = pq.read_table(canonical / "nodes.parquet", columns=["label", "split"]).to_pandas()
    train = nodes[(nodes.split == "train") & (nodes.label >= 0)].label
    test = nodes[(nodes.split == "test") & (nodes.label >= 0)].label
    majority = float((test == train.mode().iloc[0]).mean()) if len(train) and len(test) else 0.0
    acc = float(s["test_acc_at_best_val"])
    return dg.AssetCheckResult(
        check_name=BEATS_MAJORITY,
        passed=bool(acc > majority),
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"test_acc": acc, "majority_class_acc": majority},
    )
