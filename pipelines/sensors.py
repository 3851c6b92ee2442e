"""The landing sensor: every landing sub-folder becomes a `dataset` partition, and a change
to its files requests a run of the stages that dataset can feed.

A dataset whose nodes.parquet holds no labels gets the preprocessing stages only; assets
tagged `gnnflow/needs: labels` (sampling for training, training) are left out for it.
The cursor keeps one fingerprint (names, sizes, mtimes of its Parquet files) per dataset.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import dagster as dg
import pyarrow.compute as pc
import pyarrow.parquet as pq

from assets.common import NEEDS_LABELS_TAG, GnnflowStorage, dataset_partitions


def folder_fingerprint(folder: Path) -> str:
    """Hash of the relative path, size and mtime of every Parquet file under `folder`."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*.parquet")):
        st = p.stat()
        h.update(f"{p.relative_to(folder)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def dataset_has_labels(folder: Path) -> bool:
    """True when nodes.parquet has a `label` column with at least one known (>= 0) label."""
    nodes = folder / "nodes.parquet"
    if not nodes.is_file():
        return False
    try:
        if "label" not in pq.read_schema(nodes).names:
            return False
        labels = pq.read_table(nodes, columns=["label"]).column("label")
    except Exception:
        return True  # unreadable: let the run fail with the ingest stage's clear message
    top = pc.max(labels).as_py()
    return top is not None and top >= 0


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
        description="Registers landing sub-folders as dataset partitions and runs the pipeline when their files change.",
    )
    def landing_sensor(context: dg.SensorEvaluationContext, storage: GnnflowStorage) -> dg.SensorResult:
        seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
        names = storage.landing_datasets()
        for bad in storage.landing_folders_with_bad_names():
            context.log.warning(f"ignored landing folder {bad!r}: not a valid dataset name (see validate_dataset_name)")
        new_partitions = unregistered_datasets(context.instance, names)
        runs = []
        current = {}
        for name in names:
            folder = storage.landing_dir(name)
            fp = folder_fingerprint(folder)
            current[name] = fp
            if seen.get(name) == fp:
                continue
            labelled = dataset_has_labels(folder)
            selection = every if labelled else [k for k in every if k not in needs_labels]
            context.log.info(
                f"dataset '{name}' changed ({'with' if labelled else 'without'} labels): "
                f"requesting {', '.join(k.to_user_string() for k in selection)}"
            )
            runs.append(dg.RunRequest(run_key=f"{name}:{fp}", partition_key=name, asset_selection=selection))
        requests = [dataset_partitions.build_add_request(new_partitions)] if new_partitions else []
        return dg.SensorResult(
            run_requests=runs,
            dynamic_partitions_requests=requests,
            cursor=json.dumps(current, sort_keys=True),
            skip_reason=None if runs or requests else "no landing folder changed",
        )

    return landing_sensor
