"""distdgl_model: node classification trained by DistDGL on one machine per METIS part.

For graphs beyond one machine: metis_partitions writes DGL's distributed format
(``distdgl/``), one part per machine, and this asset starts DGL servers and trainers on
every machine (`training.distdgl_cluster`: the ``local`` launcher on this machine alone,
``ssh`` on the hosts of ``cluster.hosts``), which train our plain-torch layers over the
DistGraph and evaluate val/test after every epoch (`training.distdgl`). The run config has
trained_model's ``model`` and ``training`` blocks (`training.layers.ModelConfig`,
`training.config.TrainingConfig`: DistDGL reads the model, ``epochs``, ``optimizer.lr``,
``seed`` and ``profiler``, with its own default of 3 epochs, `DISTDGL_DEFAULTS`; a key it does
not read is reported in the metadata's ``ignored_settings``), its sampling
(`training.distdgl_config.DistDGLSampling`, ``distdgl``) and its machines
(`training.distdgl_cluster.DistDGLCluster`, ``cluster``):

    ops:
      distdgl_model:
        config:
          model: {hidden: 128}
          training: {epochs: 10}
          distdgl: {fanouts: "10,10"}
          cluster: {hosts: [10.0.0.1, 10.0.0.2], launcher: ssh, socket_ifname: eth0}

The trainers write into a work folder next to the asset folder, keyed by the settings and
the partitions' version; rank 0 checkpoints there after every epoch, so a run that died is
continued by the next materialization of the same settings, and only a finished run
replaces ``<GNNFLOW_HOME>/<dataset>/distdgl_model/`` (the files of `training.distdgl`, the
profiler's ``profile/`` with ``training.profiler: torch``, and ``logs/`` with every process's
output). Every process dies with the step.

With metis_partitions of more than one part and no ``cluster.hosts``, the asset is
skipped with the reason (one machine serves one part; `make demo` partitions into 4); a
one-part partition trains on this machine.
"""

import hashlib
import json
import os
import shutil
from dataclasses import asdict, fields
from pathlib import Path

import dagster as dg
from pydantic import Field

from assets.common import NEEDS_LABELS_TAG, GnnflowStorage, dataset_partitions, disk_metadata, skip_without_labels
from assets.config import dagster_config, resolve_blocks, resolved_metadata
from assets.integrity import file_errors_as_failures
from assets.metis_partitions import metis_partitions
from assets.reporting import stage_result
from assets.settings import register_config
from assets.trained_model import BEATS_MAJORITY, check_accuracy
from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.partition_files import Partitions
from graphs.stages.canonical import read_summary
from training.checkpoint import CHECKPOINT_NAME, work_dir_for
from training.config import TrainingConfig
from training.distdgl import STAGE
from training.distdgl_cluster import DistDGLCluster, machine_command, machine_script, run_machines, write_ip_config
from training.distdgl_config import DistDGLSampling, DistDGLTraining, model_for_fanouts
from training.layers import ModelConfig
from training.outputs import METRICS, SUMMARY
from training.profiling import PROFILE_DIR, TRACE_FILE

_ASSET = STAGE
LOGS = "logs"
IP_CONFIG = "ip_config.txt"
DISTDGL_DEFAULTS = {"training.epochs": 3}
"""DistDGL's own default of a shared setting (`training.task_settings`): 3 epochs (it has no
automatic budget: ``training.epochs`` must be at least 1)."""
DISTDGL_READS = ("model", "distdgl", "cluster") + tuple(
    f"training.{k}" for k in ("epochs", "optimizer.lr", "seed", "profiler")
)
"""The settings DistDGL's trainers read; any other key set is reported as ignored."""

DistDGLModelModelConfig = dagster_config(ModelConfig, "DistDGLModelModelConfig")
DistDGLModelTrainingConfig = dagster_config(TrainingConfig, "DistDGLModelTrainingConfig")
DistDGLModelTrainingConfig.moved_settings = {  # the keys DistDGL's own training block had
    "fanouts": "distdgl.fanouts",
    "batch_size": "distdgl.batch_size",
    "stop_after_epoch": "distdgl.stop_after_epoch",
    "lr": "training.optimizer.lr",
    "model": "model",
}
DistDGLSamplingConfig = dagster_config(DistDGLSampling, "DistDGLModelSamplingConfig")
DistDGLClusterConfig = dagster_config(DistDGLCluster, "DistDGLModelClusterConfig")


class DistDGLModelConfig(dg.Config):
    """The run config of distdgl_model: what is trained (model, training), how the trainers
    sample (distdgl), and on which machines (cluster)."""

    model: DistDGLModelModelConfig = Field(  # type: ignore[valid-type]
        default_factory=DistDGLModelModelConfig, description="the GNN architecture, as trained_model's"
    )
    training: DistDGLModelTrainingConfig = Field(  # type: ignore[valid-type]
        default_factory=DistDGLModelTrainingConfig,
        description="trained_model's training block; DistDGL reads epochs (its own default: 3), optimizer.lr, "
        "seed and profiler (torch or none)",
    )
    distdgl: DistDGLSamplingConfig = Field(  # type: ignore[valid-type]
        default_factory=DistDGLSamplingConfig, description=(DistDGLSampling.__doc__ or "").strip()
    )
    cluster: DistDGLClusterConfig = Field(  # type: ignore[valid-type]
        default_factory=DistDGLClusterConfig, description=(DistDGLCluster.__doc__ or "").strip()
    )

    @classmethod
    def readers(cls) -> list[tuple[str, dict, tuple[str, ...]]]:
        """(name, own defaults, settings read) of what reads this config (the configuration reference's columns)."""
        return [("distdgl", DISTDGL_DEFAULTS, DISTDGL_READS)]

    def to_dataclass(self) -> tuple[DistDGLTraining, DistDGLCluster]:
        """What one run trains (`DistDGLTraining`, from the model, training and distdgl blocks at
        DistDGL's defaults) and the machines; every block validated."""
        resolved = resolve_blocks(self, DISTDGL_DEFAULTS, DISTDGL_READS)
        return distdgl_training(resolved.blocks), resolved.blocks["cluster"]


def distdgl_training(blocks: dict) -> DistDGLTraining:
    """The `DistDGLTraining` of resolved blocks (`assets.config.resolve_blocks`)."""
    training, sampling = blocks["training"], blocks["distdgl"]
    return DistDGLTraining(
        **{f.name: getattr(sampling, f.name) for f in fields(DistDGLSampling)},
        epochs=training.epochs, lr=training.optimizer.lr, seed=training.seed, profiler=training.profiler,
        model=blocks["model"],
    )  # fmt: skip


register_config(_ASSET, DistDGLModelConfig)


@dg.asset(
    name=_ASSET,
    partitions_def=dataset_partitions,
    deps=[metis_partitions],
    group_name="distdgl",
    kinds={"pytorch", "dgl"},
    tags={NEEDS_LABELS_TAG: "labels"},
    check_specs=[
        dg.AssetCheckSpec(
            BEATS_MAJORITY,
            asset=_ASSET,
            description="The best-on-validation model's test accuracy is above always predicting the most "
            "frequent training label (a quality check: it warns, it does not block).",
        )
    ],
)
def distdgl_model(
    context: dg.AssetExecutionContext, config: DistDGLModelConfig, storage: GnnflowStorage
) -> dg.MaterializeResult:
    """GNN trained by DistDGL servers and trainers, one machine per METIS part."""
    dataset = storage.dataset(context)
    config, config_metadata = storage.settings(context, dataset, _ASSET, config)
    with storage.lock(dataset, context.log.info):
        canonical = storage.upstream_dir(dataset, CanonicalGraph.STAGE)
        skipped = skip_without_labels(context, read_summary(canonical), "train on", [BEATS_MAJORITY])
        if skipped is not None:
            return skipped
        if CanonicalGraph.open(canonical).typed:
            return _skipped(
                context,
                "the graph is typed, and the DistDGL engine trains untyped graphs only (metis_partitions "
                "writes the typed graph's parts in DGL's heterogeneous format); trained_model trains the "
                "typed graph's relational model",
            )
        try:
            resolved = resolve_blocks(config, DISTDGL_DEFAULTS, DISTDGL_READS)
            training, cluster = distdgl_training(resolved.blocks), resolved.blocks["cluster"]
            model_for_fanouts(training)  # the layers match the fanouts
        except ValueError as exc:
            raise dg.Failure(description=f"{_ASSET} config: {exc}") from exc
        config_metadata |= resolved_metadata(resolved, f"{_ASSET}: DistDGL", context.log.warning)
        with file_errors_as_failures(dataset):
            parts = Partitions.open(storage.upstream_dir(dataset, Partitions.STAGE))
        part_config = _part_config(parts, dataset)
        if parts.num_parts != len(cluster.addresses):
            if cluster.hosts:
                raise dg.Failure(
                    description=f"dataset '{dataset}': metis_partitions has {parts.num_parts} parts but "
                    f"{_ASSET}.cluster.hosts lists {len(cluster.hosts)} machines (one machine serves one part)"
                )
            return _skipped_without_hosts(context, parts.num_parts)
        out = storage.asset_dir(dataset, _ASSET)
        work = _train(context, training, cluster, parts, part_config, out)
        summary = json.loads((work / SUMMARY).read_text())
        check = check_accuracy(work, canonical)  # before publishing: a failure here keeps the checkpoint
        with storage.publishing(dataset, _ASSET) as staging:
            shutil.copytree(work, staging, ignore=shutil.ignore_patterns(CHECKPOINT_NAME))
        for folder in out.parent.glob(f".{out.name}.work-*"):  # this run's, and those of abandoned settings
            shutil.rmtree(folder, ignore_errors=True)
        metadata = {
            **{k: summary[k] for k in ("best_epoch", "best_val_acc", "test_acc_at_best_val", "final_epoch")},
            **{k: summary[k] for k in ("machines", "trainers", "seconds", "resumed_after_epoch")},
            "remote_input_share": summary["remote_input_share"],
            "launcher": cluster.launcher,
            "path": dg.MetadataValue.path(str(out)),
            "metrics": dg.MetadataValue.path(str(out / METRICS)),
            **disk_metadata(out),
            **config_metadata,
        }
        if (out / PROFILE_DIR / TRACE_FILE).is_file():
            metadata["profiler_trace"] = dg.MetadataValue.path(str(out / PROFILE_DIR / TRACE_FILE))
    headline = ("test_acc_at_best_val", "best_val_acc", "best_epoch", "machines", "seconds")
    return stage_result(context, _ASSET, metadata, headline=headline, check_results=[check])


def _part_config(parts: Partitions, dataset: str) -> Path:
    name = parts.summary.get("distdgl_config")
    if not name:
        raise dg.Failure(
            description=f"dataset '{dataset}': metis_partitions wrote no DistDGL partitions "
            "(metis_partitions.write_distdgl is false): set it to true and re-materialize metis_partitions"
        )
    return parts.path(name)


def _skipped_without_hosts(context, num_parts: int) -> dg.MaterializeResult:
    return _skipped(
        context,
        f"metis_partitions has {num_parts} parts and DistDGL runs one machine per part: set "
        f"{_ASSET}.cluster.hosts to their {num_parts} addresses (launcher: ssh), or partition into 1 part "
        "(metis_partitions.num_parts: 1) to train on this machine",
    )


def _skipped(context, reason: str) -> dg.MaterializeResult:
    context.log.info(f"{_ASSET} skipped: {reason}")
    check = dg.AssetCheckResult(check_name=BEATS_MAJORITY, passed=True, metadata={"skipped": reason})
    return dg.MaterializeResult(metadata={"skipped": reason}, check_results=[check])


def _work_dir(training: DistDGLTraining, cluster: DistDGLCluster, parts: Partitions, part_config: Path, out: Path):
    """The work folder of these settings on these partitions (`training.checkpoint.work_dir_for`):
    what the trainers' checkpoint identity holds, so a rerun of the same settings continues."""
    trained = {k: v for k, v in asdict(training).items() if k != "stop_after_epoch"}
    processes = {"servers": cluster.servers, "trainers": cluster.trainers, "machines": len(cluster.addresses)}
    files = [parts.path(Partitions.SUMMARY), part_config]
    data = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    key = json.dumps({"training": trained, "processes": processes, "data": data}, sort_keys=True)
    return work_dir_for(out, hashlib.sha256(key.encode()).hexdigest()[:16])


def _train(context, training, cluster, parts: Partitions, part_config: Path, out: Path) -> Path:
    """Run every machine's servers and trainers into the work folder; the folder, once rank 0
    has written the summary (a failure naming the failing machines' logs otherwise)."""
    work = _work_dir(training, cluster, parts, part_config, out)
    logs = work / LOGS
    logs.mkdir(parents=True, exist_ok=True)
    ip_config = write_ip_config(cluster, work / IP_CONFIG)
    (work / SUMMARY).unlink(missing_ok=True)  # rank 0 writes it once this run has finished
    commands = [
        machine_command(
            cluster,
            m,
            machine_script(cluster, training, m, ip_config=ip_config, part_config=part_config, out=work, logs=logs),
        )
        for m in range(len(cluster.addresses))
    ]
    if (work / CHECKPOINT_NAME).is_file():
        context.log.info(f"continuing from the checkpoint in {work}")
    context.log.info(
        f"starting {len(commands)} machine(s) x ({cluster.servers} server(s) + {cluster.trainers} trainer(s)), "
        f"launcher {cluster.launcher}; logs in {logs}"
    )
    codes = run_machines(commands, env=dict(os.environ))
    if any(codes):
        failed = [  # a negative code: stopped here, by the signal, after another machine failed
            f"machine {m} ({cluster.addresses[m]}) " + (f"exited with {c}" if c > 0 else "stopped")
            for m, c in enumerate(codes)
            if c
        ]
        raise dg.Failure(description=f"DistDGL training failed: {'; '.join(failed)}.\n{_log_tails(logs)}")
    if not (work / SUMMARY).is_file() and 0 < training.stop_after_epoch < training.epochs:
        raise dg.Failure(
            description=f"DistDGL training stopped after epoch {training.stop_after_epoch} "
            f"(training.stop_after_epoch); its checkpoint is in {work}: materialize again with the same "
            "settings to continue"
        )
    if not (work / SUMMARY).is_file():
        raise dg.Failure(
            description=f"every machine ended without an error, but rank 0's {work / SUMMARY} is missing: with "
            "launcher 'ssh', GNNFLOW_HOME must be one shared folder, at the same path on every host"
        )
    return work


def _log_tails(logs: Path, chars: int = 1500) -> str:
    """The end of every process's log, for the failure's description."""
    return "\n".join(f"--- {f.name}:\n{f.read_text(errors='replace')[-chars:]}" for f in sorted(logs.glob("*.log")))
