"""trained_model: DDP node-classification training, launched by torchrun through dagster-pipes.

The asset runs exactly

    python -m training.launch --nproc-per-node W -m training --config <work folder>/run.yaml

(torchrun's launcher on this node alone, listening on loopback only: `training.launch`; or,
with ``launch.nnodes`` N > 1, torchrun with the rendezvous settings of the ``launch`` block:
this node is node 0, hosting the rendezvous, and the metadata and the log give the command
to run on each other node) as a subprocess in a dagster-pipes session (`run_tied`), tied to
this step: it and its ranks die with the step however the step ends (`training.lifetime`),
and the one-node launcher shares the step's dataset lock, so a killed step leaves no
training behind and the step's next run trains alone. The processes' own output streams into
the run's compute logs, rank 0 sends its progress lines (to the event log only, so each shows
once) and the final metrics over dagster-pipes (`training.report`; read a whole line at a time,
`assets.pipes_messages`), and this function adds the curves, the file paths and an asset check. W (processes) is the shards' world size, and the batch size is theirs too
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

That is node classification's training; the asset runs the dataset task's own
(`assets.task_registry.Task.train`: link prediction's, in this process from the edge-seed
shards, is in `assets.tasks.link_prediction`; its ``link`` block of this run config holds
the scorer, learning rate and epochs).
"""

import json
import os
import shutil
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
from pydantic import Field

from assets.common import (
    NEEDS_LABELS_TAG,
    GnnflowStorage,
    dataset_partitions,
    disk_metadata,
    png_markdown,
    skip_without_labels,
)
from assets.config import dagster_config, resolved_metadata, with_settings
from assets.evaluation import promoted_training_labels, promotion_config
from assets.integrity import file_errors_as_failures
from assets.pipes_messages import WholeLineMessageReader
from assets.reporting import stage_result
from assets.settings import register_config
from assets.task_registry import built_in_tasks, task_class, task_settings
from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.compress_files import CompressedGraph
from graphs.formats.graph_schema import TypedSchema
from graphs.formats.shard_format import STAGE as MINIBATCH_SHARDS
from graphs.formats.shard_format import refuse_republished_upstream
from graphs.formats.shard_manifest import ShardManifest
from graphs.infra.storage import held_lock_fd
from graphs.stages.canonical import read_summary
from graphs.stages.normalize import Adjacency
from training.checkpoint import data_version, run_key, work_dir_for
from training.config import PathsConfig, RunConfig, TrainingConfig
from training.data import ShardError
from training.graph_train import GraphConfig
from training.launch import LOCK_FD_ENV, LaunchConfig, launch_env, other_node_command, torchrun_command
from training.layers import ModelConfig
from training.lifetime import LAUNCHER_PID_ENV, tied_process
from training.link import LinkConfig
from training.outputs import CURVES, SUMMARY
from training.outputs import STAGE as TRAINED_MODEL
from training.profiling import PROFILE_DIR, TRACE_FILE
from training.promotion import PromotionConfig, read_training_label_counts, training_label_problem
from training.threads import thread_env

_ASSET = TRAINED_MODEL
BEATS_MAJORITY = "test_accuracy_above_majority_class"
REPO_ROOT = Path(__file__).resolve().parents[1]

_RUN_HELP = {f: RunConfig.__dataclass_fields__[f].metadata["help"] for f in ("model", "training")}
TrainedModelModelConfig = dagster_config(ModelConfig, "TrainedModelModelConfig")
TrainedModelTrainingConfig = dagster_config(TrainingConfig, "TrainedModelTrainingConfig")
TrainedModelLaunchConfig = dagster_config(LaunchConfig, "TrainedModelLaunchConfig")
TrainedModelLinkConfig = dagster_config(LinkConfig, "TrainedModelLinkConfig")
TrainedModelGraphConfig = dagster_config(GraphConfig, "TrainedModelGraphConfig")


class TrainedModelConfig(dg.Config):
    """The run config of trained_model: the `model` and `training` blocks of a training YAML."""

    model: TrainedModelModelConfig = Field(  # type: ignore[valid-type]
        default_factory=TrainedModelModelConfig, description=_RUN_HELP["model"]
    )
    training: TrainedModelTrainingConfig = Field(  # type: ignore[valid-type]
        default_factory=TrainedModelTrainingConfig, description=_RUN_HELP["training"]
    )
    launch: TrainedModelLaunchConfig = Field(  # type: ignore[valid-type]
        default_factory=TrainedModelLaunchConfig, description=(LaunchConfig.__doc__ or "").strip()
    )
    link: TrainedModelLinkConfig = Field(  # type: ignore[valid-type]
        default_factory=TrainedModelLinkConfig,
        description="link prediction only (task: link_prediction): " + (LinkConfig.__doc__ or "").strip(),
    )
    graph: TrainedModelGraphConfig = Field(  # type: ignore[valid-type]
        default_factory=TrainedModelGraphConfig,
        description="graph collections only (task: graph_property): " + (GraphConfig.__doc__ or "").strip(),
    )

    def to_dataclass(self) -> tuple[ModelConfig, TrainingConfig, LaunchConfig]:
        """The `model`, `training` and `launch` dataclasses (validated by their `__post_init__`); the
        `link` and `graph` blocks are validated too, so a bad value there fails with the others, before any run."""
        self.link.to_dataclass()
        self.graph.to_dataclass()
        return self.model.to_dataclass(), self.training.to_dataclass(), self.launch.to_dataclass()

    @classmethod
    def readers(cls) -> list[tuple[str, dict, tuple[str, ...]]]:
        """(name, own defaults, settings read) of every built-in task (the configuration reference's columns)."""
        return [(name, dict(task_class(name).defaults), task_class(name).reads) for name in built_in_tasks()]

    def to_run_config(self, paths: PathsConfig) -> RunConfig:
        return RunConfig(model=self.model.to_dataclass(), training=self.training.to_dataclass(), paths=paths)


register_config(_ASSET, TrainedModelConfig)


def process_count(world_size: int, device: str, launch: LaunchConfig | None = None) -> int:
    """Processes to launch per node: ``launch.nproc_per_node`` when set, else the shards' world size
    over the nodes, or on GPUs its largest divisor <= the GPU count; nodes x processes must divide
    the world size (each process then reads several streams)."""
    launch = launch or LaunchConfig()
    if launch.nproc_per_node or launch.nnodes > 1:
        nproc = launch.nproc_per_node or world_size // launch.nnodes
        total = nproc * launch.nnodes
        if nproc < 1 or world_size % total:
            raise dg.Failure(
                description=f"launch: {launch.nnodes} node(s) x {nproc} process(es) = {total} does not divide the "
                f"shards' world_size={world_size}; re-materialize minibatch_shards with world_size a multiple "
                f"of {launch.nnodes * max(nproc, 1)}, or change launch.nproc_per_node"
            )
        return nproc
    if device == "cpu":
        return world_size
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        if device == "cuda":
            raise dg.Failure(description="training.device='cuda' but no GPU is visible")
        return world_size
    return max(d for d in range(1, world_size + 1) if world_size % d == 0 and d <= gpus)


def k8s_pipes_run(launch: LaunchConfig, nproc: int, run_yaml: Path, env: dict, home: Path) -> tuple[object, dict]:
    """``(PipesK8sClient(), run kwargs)`` for ``launch.runner='k8s'``: one pod from ``launch.k8s_image``
    running the same torchrun command, with the claim ``launch.k8s_volume_claim`` mounted at
    `home` (GNNFLOW_HOME) so run.yaml, the shards and the outputs are at the paths they have here.
    Single node (several GPUs in the pod); many nodes on Kubernetes: deploy/k8s/torchrun-indexed-job.yaml."""
    try:
        from dagster_k8s import PipesK8sClient
    except ImportError as exc:
        raise dg.Failure(description="launch.runner='k8s' needs dagster-k8s: pip install -e '.[scaleout]'") from exc
    if launch.nnodes > 1:
        raise dg.Failure(
            description="launch.runner='k8s' runs one pod (one node); for several nodes apply "
            "deploy/k8s/torchrun-indexed-job.yaml with the same torchrun command"
        )
    container: dict = {"name": "dagster-pipes-execution", "working_dir": "/app"}
    if launch.k8s_gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": launch.k8s_gpus}}
    pod: dict = {"containers": [container]}
    if launch.k8s_volume_claim:
        container["volume_mounts"] = [{"name": "gnnflow-home", "mount_path": str(home)}]
        pod["volumes"] = [{"name": "gnnflow-home", "persistent_volume_claim": {"claim_name": launch.k8s_volume_claim}}]
    kwargs = {
        "image": launch.k8s_image,
        "command": torchrun_command(nproc, run_yaml, launch, executable="python"),
        "namespace": launch.k8s_namespace,
        "env": env,
        "base_pod_spec": pod,
    }
    return PipesK8sClient(), kwargs


def nsys_wrap(command: list[str], report: Path) -> tuple[list[str], str]:
    """``nsys profile ... command`` when nsys is on the PATH, else the command; and what was done."""
    nsys = shutil.which("nsys")
    if nsys is None:
        return command, "skipped: nsys is not on the PATH (install NVIDIA Nsight Systems to profile with it)"
    wrapped = [nsys, "profile", "--trace=cuda,nvtx,osrt", "--force-overwrite=true", "-o", str(report), *command]
    return wrapped, f"profiled with nsys; report {report}.nsys-rep, copied to profile/nsys/"


def nsys_dir_for(work: Path) -> Path:
    """Where nsys writes its report: a sibling of the work folder, not inside it — rank 0
    removes the work folder when training succeeds, before nsys (the parent of the ranks)
    writes its report at exit."""
    return work.parent / f"{work.name}.nsys"


def keep_nsys_report(nsys_dir: Path, out: Path) -> list[str]:
    """Move nsys's report files into `<out>/profile/nsys/` and remove `nsys_dir`; the names kept."""
    if not nsys_dir.is_dir():
        return []
    kept = sorted(p.name for p in nsys_dir.iterdir() if p.is_file())
    if kept:
        shutil.copytree(nsys_dir, out / PROFILE_DIR / "nsys", dirs_exist_ok=True)
    shutil.rmtree(nsys_dir, ignore_errors=True)
    return kept


@dg.asset(
    name=_ASSET,  # the asset key: the stage's constant (also the function's name)
    partitions_def=dataset_partitions,
    # every stage whose files training reads: the shards, and through them the canonical
    # graph (labels, splits, features), Â (full-graph evaluation) and compressed_graph (INT8 codes)
    deps=[CanonicalGraph.STAGE, Adjacency.STAGE, CompressedGraph.STAGE, MINIBATCH_SHARDS],
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
    task = storage.task(dataset)
    try:
        typed = TypedSchema.read(storage.asset_dir(dataset, CanonicalGraph.STAGE)) is not None
        resolved = task_settings(task, config, typed)
    except ValueError as exc:
        raise dg.Failure(
            description=f"dataset '{dataset}': trained_model settings for task {task.name}: {exc}"
        ) from exc
    config_metadata |= resolved_metadata(resolved, f"trained_model: task {task.name}", context.log.warning)
    if typed:  # the training reads the run config itself: the typed defaults that applied enter it
        config = with_settings(config, {k: v for k, v in resolved.own_defaults.items() if k in task.typed_defaults})
    # the launcher shares this lock; rank 0 runs under it, and stops if it ends (graphs.infra.storage)
    with storage.lock(dataset, context.log.info):
        return task.train(context, config, storage, dataset, config_metadata)


def train_node_classification(
    context, config: TrainedModelConfig, storage: GnnflowStorage, dataset: str, config_metadata: dict
) -> dg.MaterializeResult:
    """Node classification's training (the module docstring), under the dataset's lock."""
    canonical = storage.upstream_dir(dataset, CanonicalGraph.STAGE)
    shards = storage.asset_dir(dataset, MINIBATCH_SHARDS)
    summary = read_summary(canonical)
    skipped = skip_without_labels(context, summary, "train on", [BEATS_MAJORITY])
    if skipped is not None:
        return skipped
    with file_errors_as_failures(dataset):
        promoted = promoted_training_labels(storage, dataset, context.log)
        refuse_unfit_training_labels(canonical, dataset, promotion_config(context, storage, dataset), *promoted)
    keep_unrecorded_model(storage, dataset, context.run.run_id, context.log)
    result, command, nproc, work, extra = _launch(context, config, storage, dataset, canonical, shards)
    out = storage.asset_dir(dataset, _ASSET)
    check = check_accuracy(out, canonical)
    keep_nsys_report(nsys_dir_for(work), out)
    metadata = {
        **result.metadata,
        **extra,
        "path": dg.MetadataValue.path(str(out)),
        "processes": nproc,
        **disk_metadata(out),
        "launch": " ".join(command),
        "curves": png_markdown(out / CURVES, "training curves"),
        **config_metadata,
    }
    if (out / PROFILE_DIR / TRACE_FILE).is_file():
        metadata["profiler_trace"] = dg.MetadataValue.path(str(out / PROFILE_DIR / TRACE_FILE))
    metadata["version"] = storage.record_model_version(dataset, context.run.run_id)
    headline = ("test_acc_at_best_val", "best_val_acc", "best_epoch", "epochs_trained", "seconds", "version")
    return stage_result(context, _ASSET, metadata, headline=headline, check_results=[check])


def shard_failure(dataset: str, exc: Exception) -> dg.Failure:
    """The run's failure for shards that cannot be trained from, with the command that rebuilds them."""
    hint = ""
    if "re-materialize minibatch_shards" in str(exc):
        hint = f"; the retrain job does, then trains: gnnflow launch --job retrain --partition {dataset}"
    return dg.Failure(description=f"dataset '{dataset}': {exc}{hint}")


def _launch(context, config, storage: GnnflowStorage, dataset: str, canonical: Path, shards: Path):
    """Write run.yaml into the work folder and run torchrun through dagster-pipes."""
    try:
        manifest = ShardManifest.open(shards)
        refuse_republished_upstream(manifest.doc, shards)
    except ShardError as exc:
        raise shard_failure(dataset, exc) from exc

    out = storage.asset_dir(dataset, _ASSET)
    adjacency = storage.asset_dir(dataset, Adjacency.STAGE)
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

    try:
        launch = config.launch.to_dataclass()
    except ValueError as exc:
        raise dg.Failure(description=f"trained_model config: {exc}") from exc
    nproc = process_count(manifest.world_size, cfg.training.device, launch)
    command = torchrun_command(nproc, run_yaml, launch)
    extra: dict = {}
    if launch.nnodes > 1:
        extra["launch_other_nodes"] = other_node_command(nproc, run_yaml, launch)
        context.log.info(
            f"launch.nnodes={launch.nnodes}: this node hosts the rendezvous at {launch.rdzv_endpoint}; on each of "
            f"the other {launch.nnodes - 1} node(s) run (same files at the same paths): "
            f"{extra['launch_other_nodes']}"
        )
    lock_fd = launcher_lock_fd(launch, cfg.training.profiler, storage.dataset_dir(dataset))
    if cfg.training.profiler == "nsys":
        nsys_dir_for(work).mkdir(exist_ok=True)
        command, extra["nsys"] = nsys_wrap(command, nsys_dir_for(work) / TRAINED_MODEL)
        context.log.info(f"training.profiler=nsys: {extra['nsys']}")
    context.log.info(f"launching: {' '.join(command)}")
    env = {
        **thread_env(nproc),  # each rank's OpenMP teams: its share of the cores, idle threads asleep
        # torchrun's agent polls its workers every 5 s by default (torch 2.2), so a finished run
        # waited up to 5 s more before the step could go on; its env fallback for --monitor-interval
        "PET_MONITOR_INTERVAL": os.environ.get("PET_MONITOR_INTERVAL", "0.5"),
        **launch_env(launch),
        **({LOCK_FD_ENV: str(lock_fd)} if lock_fd is not None else {}),
    }
    extra["launch_nodes"] = launch.nnodes
    if launch.runner == "k8s":
        client, kwargs = k8s_pipes_run(launch, nproc, run_yaml, env, Path(storage.home).resolve())
        context.log.info(f"launch.runner=k8s: pod from {launch.k8s_image} in namespace {launch.k8s_namespace}")
        result = client.run(context=context, **kwargs).get_materialize_result()
    else:
        result = run_tied(context, command, env, () if lock_fd is None else (lock_fd,)).get_materialize_result()
    return result, command, nproc, work, extra


def refuse_unfit_training_labels(
    canonical: Path,
    dataset: str,
    cfg: PromotionConfig,
    promoted_counts: dict | None = None,
    promoted_version: str | None = None,
) -> None:
    """Fail before training when the labelled training nodes cannot judge a model
    (`training.promotion.training_label_problem`): one class (the model would predict it
    everywhere, score 1.0 on the same labels and be promoted over a useful one), a class above
    ``max_class_share``, or a class distribution farther than ``max_label_shift`` from the
    promoted model's training labels. Names the figures, the file and the setting to change."""
    try:
        counts = read_training_label_counts(canonical)
    except ValueError as exc:  # an unreadable label_classes.json, named
        raise dg.Failure(description=f"dataset '{dataset}': {exc}") from None
    problem = training_label_problem(counts, promoted_counts, promoted_version, cfg)
    if problem is not None:
        raise dg.Failure(description=f"dataset '{dataset}': {problem} (labels of {canonical / CanonicalGraph.NODES})")


def launcher_lock_fd(launch: LaunchConfig, profiler: str, dataset_dir: Path) -> int | None:
    """The descriptor of the dataset lock this step holds, for the launcher to share: only a
    one-node launcher in this machine's process tree gets it (a pod has no such descriptor, and
    under nsys its own helper processes could keep the lock)."""
    if launch.nnodes != 1 or launch.runner != "subprocess" or profiler == "nsys":
        return None
    return held_lock_fd(dataset_dir)


def keep_unrecorded_model(storage: GnnflowStorage, dataset: str, run_id: str, log) -> None:
    """Record the published trained_model/ as a model version before training replaces it, when a
    killed step published it without recording it (idempotent: a recorded one is left as it is)."""
    try:
        version = storage.model_version(storage.asset_dir(dataset, _ASSET))
        if version is None or (storage.versions_dir(dataset) / version).is_dir():
            return
        storage.record_model_version(dataset, run_id)
    except dg.Failure as exc:  # a damaged version.json or model file: this run replaces that folder anyway
        log.warning(f"the previous trained_model/ is not kept as a model version: {exc.description}")
        return
    log.info(f"the unrecorded trained_model/ of an earlier run is kept as model version {version}")


def run_tied(
    context, command: list[str], env: dict, pass_fds: tuple[int, ...] = ()
) -> dg.PipesClientCompletedInvocation:
    """`command` in a dagster-pipes session, as `dg.PipesSubprocessClient` runs it, but tied to
    this step (`training.lifetime.tied_process`: it dies with the step, and leaving this function
    by an exception or an interrupted run stops it), with the descriptors `pass_fds` handed over."""
    reader = WholeLineMessageReader()
    with dg.open_pipes_session(context, dg.PipesTempFileContextInjector(), reader) as session:
        # a lock descriptor or launcher pid inherited from whatever started this process names
        # nothing of this run: only `env` may set them
        inherited = {k: v for k, v in os.environ.items() if k not in (LOCK_FD_ENV, LAUNCHER_PID_ENV)}
        full_env = {**inherited, **env, **session.get_bootstrap_env_vars()}
        with tied_process(command, env=full_env, cwd=str(REPO_ROOT), pass_fds=pass_fds) as proc:
            code = proc.wait()
        if code != 0:
            raise dg.Failure(
                description=f"training failed: its launcher exited with code {code}; the log above names the "
                "failing rank and its error"
            )
    return dg.PipesClientCompletedInvocation(session)


def check_accuracy(out: Path, canonical: Path) -> dg.AssetCheckResult:
    """Test accuracy of the written model vs the majority-class baseline (labels from canonical_graph)."""
    s = json.loads((out / SUMMARY).read_text())
    nodes = pq.read_table(CanonicalGraph.open(canonical).nodes_path, columns=["label", "split"]).to_pandas()
    train = nodes[(nodes.split == "train") & (nodes.label >= 0)].label
    test = nodes[(nodes.split == "test") & (nodes.label >= 0)].label
    majority = float((test == train.mode().iloc[0]).mean()) if len(train) and len(test) else 0.0
    if s.get("test_acc_at_best_val") is None:  # no validated epoch (a DistDGL graph without validation nodes)
        return dg.AssetCheckResult(
            check_name=BEATS_MAJORITY,
            passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"test_acc": "not evaluated: no validation nodes", "majority_class_acc": majority},
        )
    acc = float(s["test_acc_at_best_val"])
    return dg.AssetCheckResult(
        check_name=BEATS_MAJORITY,
        passed=bool(acc > majority),
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"test_acc": acc, "majority_class_acc": majority},
    )
