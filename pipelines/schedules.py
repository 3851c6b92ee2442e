"""Schedules: retraining every labelled dataset, with a fresh sampling seed per retrain.

`dataset` is a dynamic partitions definition, so a schedule cannot be derived from a time
window: `retrain_schedule` asks the instance for the registered datasets and requests one run
of the `retrain` job (minibatch_shards onwards: new samples, training, evaluation,
promotion) per dataset whose canonical graph has labels. Stopped by default; switch it on
in the UI (Automation). Its cron string is the deployment's `GNNFLOW_RETRAIN_CRON`
(default weekly, Sundays 03:00).

Each request samples with a fresh seed (`minibatch_shards.seed`, derived from the dataset
and the tick, so a re-evaluated tick asks for the same run) unless the dataset pins
`ops.minibatch_shards.config.seed` in its `landing/<dataset>/gnnflow.yaml`; the seed is
in the run's `gnnflow/sample_seed` tag and in minibatch_shards' `config` metadata.
"""

from __future__ import annotations

import hashlib
import os

import dagster as dg

from assets.common import GnnflowStorage, dataset_partitions
from assets.settings import SettingsError, read_settings_file, registered_configs
from graphs.formats.shard_format import STAGE as MINIBATCH_SHARDS
from graphs.formats.stage_artifact import StageFormatError
from graphs.infra.dataset_names import is_valid_dataset_name
from graphs.stages.canonical import CanonicalGraph, has_training_labels, read_summary

DEFAULT_RETRAIN_CRON = "0 3 * * 0"
SEED_TAG = "gnnflow/sample_seed"


def retrain_cron() -> str:
    """The retraining cron string: $GNNFLOW_RETRAIN_CRON, default weekly."""
    return os.environ.get("GNNFLOW_RETRAIN_CRON", DEFAULT_RETRAIN_CRON).strip()


def labelled_datasets(instance: dg.DagsterInstance, storage: GnnflowStorage) -> list[str]:
    """Registered dataset partitions whose canonical_graph summary says it has training labels."""
    names = []
    for name in instance.get_dynamic_partitions(dataset_partitions.name):
        if not is_valid_dataset_name(name):  # a key added by hand that cannot be a folder
            continue
        folder = storage.asset_dir(name, CanonicalGraph.STAGE)
        if not (folder / CanonicalGraph.SUMMARY).is_file():
            continue
        try:
            summary = read_summary(folder)
        except StageFormatError:  # written by another gnnflow: its run fails naming the stage to redo
            names.append(name)
            continue
        if has_training_labels(summary):
            names.append(name)
    return names


def pinned_seed(storage: GnnflowStorage, dataset: str) -> int | None:
    """The sampling seed the dataset's gnnflow.yaml pins (None: not pinned, or an invalid file,
    which the run itself then reports naming the file and key)."""
    try:
        blocks = read_settings_file(storage.settings_file(dataset), registered_configs())
    except SettingsError:
        return None
    seed = blocks.get(MINIBATCH_SHARDS, {}).get("seed")
    return seed if isinstance(seed, int) else None


def fresh_seed(dataset: str, tick: str) -> int:
    """A seed in [0, 2^31) that differs between ticks and datasets (the same for a re-evaluated tick)."""
    return int.from_bytes(hashlib.sha256(f"{dataset}:{tick}".encode()).digest()[:4], "big") & 0x7FFFFFFF


def make_retrain_schedule(job: dg.UnresolvedAssetJobDefinition, cron: str | None = None) -> dg.ScheduleDefinition:
    cron = cron or retrain_cron()
    try:

        @dg.schedule(
            name="retrain_schedule",
            job=job,
            cron_schedule=cron,
            default_status=dg.DefaultScheduleStatus.STOPPED,
            description=f"Cron '{cron}' (GNNFLOW_RETRAIN_CRON): new samples with a fresh seed, retrain, evaluate "
            "and promote, for every registered dataset with labels.",
        )
        def retrain_schedule(context: dg.ScheduleEvaluationContext, storage: GnnflowStorage):
            names = labelled_datasets(context.instance, storage)
            if not names:
                return dg.SkipReason("no registered dataset has a labelled canonical_graph")
            tick = context.scheduled_execution_time.isoformat()
            requests = []
            for name in names:
                pinned = pinned_seed(storage, name)
                seed = fresh_seed(name, tick) if pinned is None else pinned
                run_config = {} if pinned is not None else {"ops": {MINIBATCH_SHARDS: {"config": {"seed": seed}}}}
                requests.append(
                    dg.RunRequest(
                        run_key=f"{name}:{context.scheduled_execution_time:%Y-%m-%dT%H:%M}",
                        partition_key=name,
                        run_config=run_config,
                        tags={SEED_TAG: str(seed), "gnnflow/seed_source": "pinned" if pinned is not None else "fresh"},
                    )
                )
            return requests

    except dg.DagsterInvalidDefinitionError as exc:
        raise ValueError(f"GNNFLOW_RETRAIN_CRON={cron!r} is not a valid cron string: {exc}") from exc
    return retrain_schedule
