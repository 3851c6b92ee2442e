"""What every asset shares: the `dataset` partitions, the storage resource, metadata helpers.

The storage resource says where datasets land and where each stage writes its files, and
carries the stage protocol every asset follows:

    dataset = storage.dataset(context)                  # the validated partition key
    with storage.lock(dataset, context.log.info):       # one writer per dataset (fcntl)
        with storage.publishing(dataset, ASSET) as out: # a temporary sibling folder
            build_x(..., out, cfg)                      # the library writes its files
            checks = check_x(out, ...)                  # checks re-read those files
            refuse_failed_checks(dataset, ASSET, checks)  # nothing is published on a failure

Picked per deployment by environment variables (the only knobs a deployment needs):
  GNNFLOW_HOME     root of materialized files, default ./.gnnflow
  GNNFLOW_LANDING  landing folder with one sub-folder per dataset, default ./landing
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import dagster as dg

from assets.settings import (
    SETTINGS_FILE,
    SettingsError,
    config_metadata,
    explicit_run_config,
    read_settings_file,
    read_task,
    registered_configs,
    resolve,
)
from assets.task_registry import Task, task_class
from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.shard_format import STAGE as MINIBATCH_SHARDS
from graphs.formats.stage_artifact import StageArtifact
from graphs.infra.dataset_names import DatasetNameError, is_valid_dataset_name, validate_dataset_name
from graphs.infra.folder_swap import clean_stale_temporaries, staging_dir_for
from graphs.infra.storage import (
    HASHES_NAME,
    CorruptFileError,
    dataset_lock,
    dir_bytes,
    staged_output,
    verify_files,
)
from graphs.stages.canonical import has_training_labels, is_dataset_folder
from graphs.stages.edge_split import EdgeSplit
from graphs.stages.normalize import Adjacency
from training.checkpoint import data_version
from training.outputs import MODEL_BEST, PICKLED_MODEL_BEST, PREDICTIONS, SUMMARY, read_version, write_version_file
from training.outputs import STAGE as TRAINED_MODEL
from training.promotion import LABELS_FILE, PromotionConfig, read_training_label_counts, write_label_counts
from training.promotion import STAGE as PROMOTION

# One partition per dataset: `dagster asset materialize --partition cora`, backfills over many.
dataset_partitions = dg.DynamicPartitionsDefinition(name="dataset")

# Tag on assets that only make sense for a dataset with labels (the landing sensor skips
# them for unlabelled datasets).
NEEDS_LABELS_TAG = "gnnflow/needs"

# Metadata key of canonical_graph: the fingerprint of the landing files it ingested, which
# the landing sensor compares with the files as they are now.
LANDING_FINGERPRINT = "landing_fingerprint"


class GnnflowStorage(dg.ConfigurableResource):
    """Paths of the landing folder and of every asset's output folder."""

    home: str = ".gnnflow"
    landing: str = "landing"

    @classmethod
    def from_env(cls) -> "GnnflowStorage":
        return cls(
            home=os.environ.get("GNNFLOW_HOME", ".gnnflow"),
            landing=os.environ.get("GNNFLOW_LANDING", "landing"),
        )

    def dataset(self, context: dg.AssetExecutionContext) -> str:
        """The run's partition key, refused (failing the run, naming it) unless a valid dataset name."""
        try:
            return validate_dataset_name(context.partition_key)
        except DatasetNameError as exc:
            raise dg.Failure(description=str(exc)) from exc

    def dataset_dir(self, dataset: str) -> Path:
        """<GNNFLOW_HOME>/<dataset>/ (the name validated first)."""
        return Path(self.home).resolve() / validate_dataset_name(dataset)

    def asset_dir(self, dataset: str, asset: str) -> Path:
        """<GNNFLOW_HOME>/<dataset>/<asset>/"""
        return self.dataset_dir(dataset) / asset

    @contextlib.contextmanager
    def lock(self, dataset: str, log: Callable[[str], None] | None = None) -> Iterator[Path]:
        """Hold the dataset's write lock (`graphs.infra.storage.dataset_lock`) for the block; stale
        temporaries of earlier killed runs of this dataset are removed once it is held."""
        with dataset_lock(self.dataset_dir(dataset), log=log) as lock_file:
            yield lock_file

    @contextlib.contextmanager
    def publishing(self, dataset: str, asset: str) -> Iterator[Path]:
        """A temporary sibling of the asset's folder (not yet created) that replaces it when
        the block ends without an exception; on any exception the old folder stays."""
        with staged_output(self.asset_dir(dataset, asset)) as tmp:
            yield tmp

    def settings_file(self, dataset: str) -> Path:
        """landing/<dataset>/gnnflow.yaml (see `assets.settings`)."""
        return self.landing_dir(dataset) / SETTINGS_FILE

    def settings(
        self, context: dg.AssetExecutionContext, dataset: str, asset: str, config: dg.Config
    ) -> tuple[Any, dict[str, dg.MetadataValue]]:
        """The asset's effective config (explicit run config > landing/<dataset>/gnnflow.yaml >
        defaults) and metadata entries recording it; an invalid settings file fails the run,
        naming the file and the key."""
        path = self.settings_file(dataset)
        try:
            blocks = read_settings_file(path, registered_configs())
            effective, provenance = resolve(
                type(config), asset, _explicit(context, asset, config), blocks.get(asset, {}), path
            )
        except SettingsError as exc:
            raise dg.Failure(description=f"dataset '{dataset}': {exc}") from exc
        if provenance["from_file"]:
            context.log.info(f"{asset}: {', '.join(provenance['from_file'])} from {path}")
        return effective, config_metadata(effective, provenance)

    # ------------------------------------------------------------ model versions, promotion
    # <dataset>/trained_model/ is always the newest model (existing readers keep working);
    # every finished training is also kept as <dataset>/model_versions/<version>/ (hard links),
    # and <dataset>/promoted is a symlink to the version the promotion asset accepted. Training
    # names the model (trained_model/version.json) before it publishes the folder, so the
    # version can be recorded again from trained_model/ by any later step if a run died between
    # publishing and recording.

    def versions_dir(self, dataset: str) -> Path:
        return self.dataset_dir(dataset) / "model_versions"

    def evaluations_dir(self, dataset: str) -> Path:
        """<dataset>/model_evaluations/: one folder per version with the evaluation it was last judged
        by (metrics.json, test_labels.parquet: `training.promotion`); the promoted version's is kept
        as it was when it was promoted."""
        return self.dataset_dir(dataset) / "model_evaluations"

    def promoted_dir(self, dataset: str) -> Path:
        """<GNNFLOW_HOME>/<dataset>/promoted (a symlink into model_versions/, absent before the first promotion)."""
        return self.dataset_dir(dataset) / "promoted"

    def promoted_version(self, dataset: str) -> str | None:
        """The version `promoted` points at (None before the first promotion)."""
        link = self.promoted_dir(dataset)
        return Path(os.readlink(link)).name if link.is_symlink() else None

    def record_model_version(self, dataset: str, run_id: str) -> str:
        """Keep the current trained_model/ as model_versions/<version>/ (the version its
        version.json names) unless it is already kept; the version. Idempotent: every step that
        reads trained_model/ may call it. The files are hard links where the filesystem allows
        (training replaces trained_model/ as a whole, never a file in place) made read-only, so
        a writer that did rewrite one in place would fail, not alter a version. The version also
        gets `training.promotion.LABELS_FILE`, its training labels per class, read from
        canonical_graph unless the model's summary names another data version than the files
        now hold. A trained_model/ without version.json (not written by `training.publish`) is
        named ``<UTC time>-<run id>`` first. Older versions are then removed by `apply_retention`."""
        model = self.asset_dir(dataset, TRAINED_MODEL)
        version = self.model_version(model) or write_version_file(model, suffix=run_id[:8])
        target = self.versions_dir(dataset) / version
        if target.is_dir():
            return version
        try:  # the version's fresh hashes.json must not vouch for a file damaged since training published it
            verify_files(model, stage=TRAINED_MODEL)
            counts = self._training_label_counts(dataset, model)
        except CorruptFileError as exc:
            raise dg.Failure(description=f"dataset '{dataset}': {exc}") from None
        with staged_output(target) as tmp:  # a fresh hashes.json: the linked one must not be rewritten
            shutil.copytree(model, tmp, copy_function=_link_or_copy, ignore=_not_linked)
            if counts is not None:
                write_label_counts(tmp / LABELS_FILE, counts)
            for f in tmp.rglob("*"):  # shared inodes: an in-place writer now fails instead of altering a version
                if f.is_file():
                    f.chmod(0o444)
        self.apply_retention(dataset, self.kept_versions(dataset))
        return version

    def _training_label_counts(self, dataset: str, model: Path) -> dict | None:
        """canonical_graph's training labels per class, or None when the model was trained on other files."""
        canonical = self.asset_dir(dataset, CanonicalGraph.STAGE)
        summary = json.loads((model / SUMMARY).read_text()) if (model / SUMMARY).is_file() else {}
        shards, adjacency = self.asset_dir(dataset, MINIBATCH_SHARDS), self.asset_dir(dataset, Adjacency.STAGE)
        if "data_version" in summary and summary["data_version"] != data_version(shards, canonical, adjacency):
            return None
        return read_training_label_counts(canonical) if (canonical / CanonicalGraph.NODES).is_file() else None

    def model_version(self, folder: Path) -> str | None:
        """The version name recorded in a model folder (None for one without version.json)."""
        try:
            return read_version(folder)
        except ValueError as exc:
            raise dg.Failure(description=str(exc)) from None

    def promote(self, dataset: str, version: str) -> Path:
        """Point <dataset>/promoted at model_versions/<version> (an atomic symlink replace)."""
        target = self.versions_dir(dataset) / validate_dataset_name(version)
        if not (target / PREDICTIONS).is_file():
            raise FileNotFoundError(f"{target}: no such model version")
        link = self.promoted_dir(dataset)
        tmp = link.with_name(f".promoted.tmp-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        os.symlink(os.path.relpath(target, link.parent), tmp)
        os.replace(tmp, link)
        return link

    def model_versions(self, dataset: str) -> list[str]:
        """The kept versions, newest first (version names start with their UTC time)."""
        folder = self.versions_dir(dataset)
        if not folder.is_dir():
            return []
        return sorted((p.name for p in folder.iterdir() if p.is_dir() and is_valid_dataset_name(p.name)), reverse=True)

    def pins_file(self, dataset: str) -> Path:
        """<dataset>/model_pins.json: {"pinned": [version, ...]} (`gnnflow models pin`)."""
        return self.dataset_dir(dataset) / "model_pins.json"

    def pinned_versions(self, dataset: str) -> list[str]:
        path = self.pins_file(dataset)
        if not path.is_file():
            return []
        try:
            pinned = json.loads(path.read_text())["pinned"]
            return [validate_dataset_name(v) for v in pinned]
        except (ValueError, KeyError, TypeError) as exc:
            raise dg.Failure(
                description=f"{path}: unreadable ({str(exc)[:120]}); remove it and pin the versions again"
            ) from None

    def set_pinned(self, dataset: str, version: str, pinned: bool) -> list[str]:
        """Pin or unpin a kept version (call under the dataset lock); the pinned versions."""
        version = validate_dataset_name(version)
        if pinned and not (self.versions_dir(dataset) / version).is_dir():
            raise FileNotFoundError(f"{self.versions_dir(dataset) / version}: no such model version")
        kept = [v for v in self.pinned_versions(dataset) if v != version] + ([version] if pinned else [])
        path = self.pins_file(dataset)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"pinned": sorted(kept)}))
        os.replace(tmp, path)
        return sorted(kept)

    def kept_versions(self, dataset: str) -> int:
        """`keep_versions` of the dataset's gnnflow.yaml promotion block (its default without one)."""
        path = self.settings_file(dataset)
        try:
            block = read_settings_file(path, registered_configs()).get(PROMOTION, {})
            return PromotionConfig(**{k: v for k, v in block.items() if k == "keep_versions"}).keep_versions
        except (SettingsError, ValueError, TypeError) as exc:
            raise dg.Failure(description=f"dataset '{dataset}': {path}: {str(exc)[:300]}") from None

    def apply_retention(self, dataset: str, keep: int) -> list[str]:
        """Delete kept versions (and their evaluation records) beyond the newest `keep`, never the
        promoted, a pinned one or the one trained_model/ holds (call under the dataset lock); the
        versions deleted."""
        spared = {self.promoted_version(dataset), self.model_version(self.asset_dir(dataset, TRAINED_MODEL))}
        spared.update(self.pinned_versions(dataset))
        doomed = [v for v in self.model_versions(dataset)[keep:] if v not in spared]
        clean_stale_temporaries(self.versions_dir(dataset))
        clean_stale_temporaries(self.evaluations_dir(dataset))
        for version in doomed:
            for folder in (self.versions_dir(dataset) / version, self.evaluations_dir(dataset) / version):
                if folder.is_dir():  # renamed first: a kill mid-delete leaves a temporary the next call removes
                    gone = staging_dir_for(folder)
                    os.replace(folder, gone)
                    shutil.rmtree(gone, ignore_errors=True)
        return doomed

    def upstream_dir(self, dataset: str, asset: str) -> Path:
        """An upstream asset's folder; fails the run, naming it, when it was never materialized."""
        path = self.asset_dir(dataset, asset)
        if not (path / StageArtifact.SUMMARY).is_file():
            raise dg.Failure(description=f"dataset '{dataset}': no {asset} at {path}; materialize {asset} first")
        return path

    def task(self, dataset: str) -> type[Task]:
        """The dataset's task (`task:` of its gnnflow.yaml; node_classification by default), the
        registered `assets.task_registry.Task`; an invalid settings file fails the run, naming the
        file and the key."""
        try:
            return task_class(read_task(self.settings_file(dataset)))
        except SettingsError as exc:
            raise dg.Failure(description=f"dataset '{dataset}': {exc}") from exc

    def graph_dir(self, dataset: str) -> Path:
        """The graph that message passing sees, in the canonical layout: edge_split's (held-out
        edges removed) for link prediction, else canonical_graph's."""
        return self.upstream_dir(
            dataset, EdgeSplit.STAGE if self.task(dataset).traits.holds_out_edges else CanonicalGraph.STAGE
        )

    def inference_model_dir(self, dataset: str) -> Path:
        """The model folder that scores new data: `<dataset>/promoted/` when a model was
        promoted, else `<dataset>/trained_model/`; fails the run, naming both, when neither
        holds a model file, and naming the file when the first one found was written in the
        pickled format of older gnnflow versions (never loaded)."""
        for name in ("promoted", TRAINED_MODEL):
            path = self.asset_dir(dataset, name)
            if (path / MODEL_BEST).is_file():
                return path
            if (path / PICKLED_MODEL_BEST).is_file():
                raise dg.Failure(
                    description=f"{path / PICKLED_MODEL_BEST}: a model file of an older gnnflow (a torch pickle, "
                    f"which gnnflow never loads: it can run code); re-materialize trained_model to write "
                    f"{MODEL_BEST}, then evaluation and promotion"
                )
        raise dg.Failure(
            description=f"dataset '{dataset}': no model to score with in {self.asset_dir(dataset, 'promoted')} "
            f"nor {self.asset_dir(dataset, TRAINED_MODEL)}; materialize trained_model first"
        )

    def landing_dir(self, dataset: str) -> Path:
        return Path(self.landing).resolve() / validate_dataset_name(dataset)

    def _landing_folders(self) -> list[Path]:
        """Sub-folders of the landing folder that hold edge files (temporaries excluded)."""
        root = Path(self.landing)
        if not root.is_dir():
            return []
        return [
            sub
            for sub in sorted(root.iterdir())
            if sub.is_dir() and not sub.name.startswith(".") and is_dataset_folder(sub)
        ]

    def landing_datasets(self) -> list[str]:
        """Sub-folders of the landing folder that hold edge files and have a valid name."""
        return [sub.name for sub in self._landing_folders() if is_valid_dataset_name(sub.name)]

    def landing_folders_with_bad_names(self) -> list[str]:
        """Landing sub-folders with edge files whose name is not a valid dataset name (ignored)."""
        return [sub.name for sub in self._landing_folders() if not is_valid_dataset_name(sub.name)]


def _explicit(context: dg.AssetExecutionContext, asset: str, config: dg.Config) -> dict:
    """What the run set explicitly for `asset`: the run's raw config; when the asset function is
    called directly (no run, as in unit tests), the fields set when `config` was constructed."""
    try:
        run_config = context.run.run_config
    except dg.DagsterInvariantViolationError:
        return config.model_dump(exclude_unset=True)
    return explicit_run_config(run_config, asset)


def _not_linked(folder: str, names: list[str]) -> set[str]:
    """What `record_model_version` does not hard-link: the hash record (staged_output writes
    the version's own) and staging leftovers."""
    return {n for n in names if n == HASHES_NAME or ".tmp-" in n}


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def skip_without_labels(
    context: dg.AssetExecutionContext, summary: dict, doing: str, check_names: list[str]
) -> dg.MaterializeResult | None:
    """A 'skipped' result (checks passed, saying why) when the canonical graph has no
    labels or no training nodes; None when there is something to train on."""
    if has_training_labels(summary):
        return None
    reason = "no labels" if not summary.get("has_labels") else "no training nodes"
    context.log.info(f"dataset '{context.partition_key}' has {reason}: nothing to {doing}, skipped")
    return dg.MaterializeResult(
        metadata={"skipped": reason},
        check_results=[
            dg.AssetCheckResult(check_name=c, passed=True, metadata={"skipped": reason}) for c in check_names
        ],
    )


def refuse_failed_checks(dataset: str, asset: str, checks: Sequence[dg.AssetCheckResult]) -> None:
    """Fail the run (so nothing is published) when a correctness check evaluated on the new
    files failed, naming each failed check with its metadata. Checks of severity WARN (quality,
    e.g. METIS beating a random partition) are reported, never refused."""
    failed = [c for c in checks if not c.passed and c.severity != dg.AssetCheckSeverity.WARN]
    if not failed:
        return

    def values(c: dg.AssetCheckResult) -> str:
        return ", ".join(f"{k}={getattr(v, 'value', v)}" for k, v in (c.metadata or {}).items())

    detail = "; ".join(f"{c.check_name} ({values(c)})" for c in failed)
    raise dg.Failure(
        description=f"dataset '{dataset}': {asset} not published, a check failed on the new files: {detail}; "
        "the previous materialization is unchanged",
        metadata={"failed_checks": [c.check_name for c in failed]},
    )


def png_markdown(path: str | os.PathLike, alt: str) -> dg.MetadataValue:
    """An inline PNG for the Dagster UI's metadata panel."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return dg.MetadataValue.md(f"![{alt}](data:image/png;base64,{data})")


def disk_metadata(folder: str | os.PathLike) -> dict:
    """`disk_mb`: what the asset's (staged) folder takes on disk, its files' sizes in MiB to 3
    significant digits; the same key on every asset's metadata panel."""
    return {"disk_mb": float(f"{dir_bytes(folder) / 2**20:.3g}")}


INGEST_ASSET = dg.AssetKey(CanonicalGraph.STAGE)


def ingested_fingerprint(instance: dg.DagsterInstance, dataset: str) -> str | None:
    """The `landing_fingerprint` recorded by the dataset's latest canonical_graph materialization."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=INGEST_ASSET, asset_partitions=[dataset]), limit=1
    ).records
    if not records:
        return None
    entry = records[0].asset_materialization.metadata.get(LANDING_FINGERPRINT)
    return None if entry is None else str(entry.value)
