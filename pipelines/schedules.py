"""Schedules: weekly retraining of every labelled dataset.

`dataset` is a dynamic partitions definition, so a schedule cannot be derived from a
time window: `retrain_weekly` asks the instance for the registered datasets and requests
one run of the `train` job (the `training` group: trained_model) per dataset whose
canonical graph has labels. Stopped by default; switch it on in the UI (Automation).
"""

from __future__ import annotations

import dagster as dg

from assets.common import GnnflowStorage, dataset_partitions
from graphs.canonical import has_training_labels, read_summary
from graphs.storage import is_valid_dataset_name


def labelled_datasets(instance: dg.DagsterInstance, storage: GnnflowStorage) -> list[str]:
    """Registered dataset partitions whose canonical_graph summary says it has training labels."""
    names = []
    for name in instance.get_dynamic_partitions(dataset_partitions.name):
        if not is_valid_dataset_name(name):  # a key added by hand that cannot be a folder
            continue
        folder = storage.asset_dir(name, "canonical_graph")
        if not (folder / "summary.json").is_file():
            continue
        summary = read_summary(folder)
        if has_training_labels(summary):
            names.append(name)
    return names


def make_retrain_schedule(job: dg.UnresolvedAssetJobDefinition) -> dg.ScheduleDefinition:
    @dg.schedule(
        name="retrain_weekly",
        job=job,
        cron_schedule="0 3 * * 0",
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Sundays 03:00: retrain trained_model for every registered dataset with labels.",
    )
    def retrain_weekly(context: dg.ScheduleEvaluationContext, storage: GnnflowStorage):
        names = labelled_datasets(context.instance, storage)
        if not names:
            return dg.SkipReason("no registered dataset has a labelled canonical_graph")
        tick = context.scheduled_execution_time.strftime("%Y-%m-%d")
        return [dg.RunRequest(run_key=f"{name}:{tick}", partition_key=name) for name in names]

    return retrain_weekly
