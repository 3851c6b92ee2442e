"""The landing sensor: every landing sub-folder becomes a `dataset` partition, and a change
to its files requests a run of the stages that dataset can feed, once the files are stable.

What counts as a change: the landing files' fingerprint (`graphs.stages.landing.landing_fingerprint`:
the name and content hash of every input file and of the dataset's gnnflow.yaml, hashed again
only when a file's size or times change) differs from the one recorded in the metadata of the dataset's latest canonical_graph
materialization in the instance (`landing_fingerprint`), whoever launched it (`make demo`, a
CLI run with tuned settings, the UI). A dataset whose files were ingested as they are requests
nothing, even the first time the sensor sees it, and copying back an identical file is no change.

When it is stable: a changed fingerprint is requested once it is the same on two
consecutive ticks (the sensor runs every 30 s), or at once when the folder holds a
`_SUCCESS` marker newer than every Parquet file (write it last when copying). A file still
being copied changes between ticks, so its dataset waits.

The cursor holds, per dataset, the fingerprint seen at the previous tick (`pending`) and the
fingerprint last requested (`requested`, so a failed run is not relaunched every tick; the
next change of the files is). While the run requested for a dataset's current files has
failed, the tick's skip reason says so, naming the dataset (never "as last ingested"). A
dataset whose nodes hold no labels gets the stages that need none; assets tagged
`gnnflow/needs: labels` are left out for it. A run ends with `predictions`, scored by the
model its promotion step decided on.

A problem in one dataset folder never stops the sensor for the others: a folder whose inputs
`graphs.stages.landing.find_dataset_files` refuses (a dangling symlink, a symlink out of the landing
folder, a FIFO or folder in a file's place, ...) or that cannot be read is skipped with a
warning naming the entry, at every tick until it changes; the other datasets go on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import dagster as dg

from assets.common import NEEDS_LABELS_TAG, GnnflowStorage, dataset_partitions, ingested_fingerprint
from assets.settings import SETTINGS_FILE, SettingsError, read_task
from assets.task_registry import DEFAULT_TASK, task_class
from graphs.stages.canonical import InputError, find_dataset_files, landing_fingerprint, landing_marked_ready
from graphs.stages.user_files import landing_has_labels

RUN_KEY_TAG = "dagster/run_key"  # the tag a sensor's run carries its RunRequest's run_key in
FAILED_RUN = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


def run_key(dataset: str, fingerprint: str) -> str:
    """The run key of the sensor's request for these files of a dataset (one run per content)."""
    return f"{dataset}:{fingerprint}"


def requested_run_status(instance: dg.DagsterInstance, dataset: str, fingerprint: str) -> dg.DagsterRunStatus | None:
    """The status of the newest run the sensor requested for these files (None: none found)."""
    runs = instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: run_key(dataset, fingerprint)}), limit=1)
    return runs[0].status if runs else None


def dataset_task(folder: Path) -> str:
    """The landing folder's gnnflow.yaml `task:` (link prediction trains without node labels);
    the default when the file is unreadable (the run then fails naming the file and key)."""
    try:
        return read_task(folder / SETTINGS_FILE)
    except SettingsError:
        return DEFAULT_TASK


def split_by_labels(assets: Sequence[dg.AssetsDefinition]) -> tuple[list[dg.AssetKey], list[dg.AssetKey]]:
    """(every asset key, the keys that need labels) of the given assets."""
    every, needs = [], []
    for a in assets:
        for spec in a.specs:
            every.append(spec.key)
            if spec.tags.get(NEEDS_LABELS_TAG) == "labels":
                needs.append(spec.key)
    return every, needs


def unregistered_datasets(instance: dg.DagsterInstance, names: Sequence[str]) -> list[str]:
    """The landing dataset `names` that are not yet partitions of `dataset_partitions`."""
    known = set(instance.get_dynamic_partitions(dataset_partitions.name))
    return [n for n in names if n not in known]


def register_datasets(instance: dg.DagsterInstance, storage: GnnflowStorage) -> list[str]:
    """Add every landing dataset as a `dataset` partition; return the names newly added."""
    new = unregistered_datasets(instance, storage.landing_datasets())
    if new:
        instance.add_dynamic_partitions(dataset_partitions.name, new)
    return new


def make_landing_sensor(assets: Sequence[dg.AssetsDefinition]) -> dg.SensorDefinition:
    every, needs_labels = split_by_labels(assets)

    @dg.sensor(
        name="landing_sensor",
        target=every,
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Registers landing sub-folders as dataset partitions and runs the pipeline for a dataset "
        "whose files differ from the ones its latest canonical_graph ingested, once they are stable.",
    )
    def landing_sensor(context: dg.SensorEvaluationContext, storage: GnnflowStorage) -> dg.SensorResult:
        state = json.loads(context.cursor) if context.cursor else {}
        pending: dict[str, str] = dict(state.get("pending", {})) if isinstance(state, dict) else {}
        requested: dict[str, str] = dict(state.get("requested", {})) if isinstance(state, dict) else {}
        names = storage.landing_datasets()
        for bad in storage.landing_folders_with_bad_names():
            context.log.warning(f"ignored landing folder {bad!r}: not a valid dataset name (see validate_dataset_name)")
        new_partitions = unregistered_datasets(context.instance, names)
        runs, waiting, refused, failed = [], [], [], []
        for name in names:
            folder = storage.landing_dir(name)
            try:
                find_dataset_files(folder)  # the ingest's rule; opens no file
                fp = landing_fingerprint(folder)
            except (InputError, OSError) as exc:
                context.log.warning(f"dataset '{name}' skipped: {exc}")
                refused.append(name)
                continue
            if fp == ingested_fingerprint(context.instance, name):
                pending.pop(name, None)
                requested.pop(name, None)
                continue
            if requested.get(name) == fp:  # already asked for these files; their run decides
                status = requested_run_status(context.instance, name, fp)
                if status in FAILED_RUN:
                    failed.append(f"{name} ({status.value.lower()})")
                continue
            if not (landing_marked_ready(folder) or pending.get(name) == fp):
                pending[name] = fp
                waiting.append(name)
                continue
            pending.pop(name, None)
            requested[name] = fp
            labelled = landing_has_labels(folder) or not task_class(dataset_task(folder)).traits.needs_labels
            selection = every if labelled else [k for k in every if k not in needs_labels]
            context.log.info(
                f"dataset '{name}' changed since its last ingest ({'with' if labelled else 'without'} labels): "
                f"requesting {', '.join(k.to_user_string() for k in selection)}"
            )
            runs.append(dg.RunRequest(run_key=run_key(name, fp), partition_key=name, asset_selection=selection))
        for name in list(pending):
            if name not in names:
                del pending[name]
        requests = [dataset_partitions.build_add_request(new_partitions)] if new_partitions else []
        if waiting:
            context.log.info(f"waiting for the files of {', '.join(waiting)} to stay unchanged until the next tick")
        skip = None
        if not runs and not requests:
            reasons = [f"files still changing: {', '.join(waiting)}"] if waiting else []
            reasons += [f"refused (see the warnings): {', '.join(refused)}"] if refused else []
            if failed:
                reasons.append(f"the run for the current files failed, retried when they change: {', '.join(failed)}")
            skip = "; ".join(reasons) or "every landing folder is as last ingested"
        return dg.SensorResult(
            run_requests=runs,
            dynamic_partitions_requests=requests,
            cursor=json.dumps({"pending": pending, "requested": requested}, sort_keys=True),
            skip_reason=skip,
        )

    return landing_sensor
