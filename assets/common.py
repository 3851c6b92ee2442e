"""What every asset shares: the `dataset` partitions, the storage resource, metadata helpers.

The storage resource says where datasets land and where each stage writes its files.

Picked per deployment by environment variables (the only knobs a deployment needs):
  GNNFLOW_HOME     root of materialized files, default ./.gnnflow
  GNNFLOW_LANDING  landing folder with one sub-folder per dataset, default ./landing
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import dagster as dg

from graphs.canonical import has_training_labels, is_dataset_folder
from graphs.storage import dir_bytes

# One partition per dataset: `dagster asset materialize --partition cora`, backfills over many.
dataset_partitions = dg.DynamicPartitionsDefinition(name="dataset")

# Tag on assets that only make sense for a dataset with labels (the landing sensor skips
# them for unlabelled datasets).
NEEDS_LABELS_TAG = "gnnflow/needs"

# Metadata key of canonical_graph: the fingerprint of the landing files it ingested, which
# the landing sensor compares with the files as they are now.
LANDING_FINGERPRINT = "landing_fingerprint"

DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


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

    def asset_dir(self, dataset: str, asset: str) -> Path:
        """<GNNFLOW_HOME>/<dataset>/<asset>/"""
        return Path(self.home).resolve() / dataset / asset

    def upstream_dir(self, dataset: str, asset: str) -> Path:
        """An upstream asset's folder; fails the run, naming it, when it was never materialized."""
        path = self.asset_dir(dataset, asset)
        if not (path / "summary.json").is_file():
            raise dg.Failure(description=f"dataset '{dataset}': no {asset} at {path}; materialize {asset} first")
        return path

    def inference_model_dir(self, dataset: str) -> Path:
        """The model folder that scores new data: `<dataset>/promoted/` when a model was
        promoted, else `<dataset>/trained_model/`; fails the run, naming both, when neither
        holds a model file."""
        for name in ("promoted", "trained_model"):
            path = self.asset_dir(dataset, name)
            if (path / "model_best.pt").is_file():
                return path
        raise dg.Failure(
            description=f"dataset '{dataset}': no model to score with in {self.asset_dir(dataset, 'promoted')} "
            f"nor {self.asset_dir(dataset, 'trained_model')}; materialize trained_model first"
        )

    def landing_dir(self, dataset: str) -> Path:
        return Path(self.landing).resolve() / dataset

    def landing_datasets(self) -> list[str]:
        """Sub-folders of the landing folder that hold edge files and have a valid name."""
        root = Path(self.landing)
        if not root.is_dir():
            return []
        names = []
        for sub in sorted(root.iterdir()):
            if not sub.is_dir() or not DATASET_NAME.match(sub.name):
                continue
            if is_dataset_folder(sub):
                names.append(sub.name)
        return names


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


def png_markdown(path: str | os.PathLike, alt: str) -> dg.MetadataValue:
    """An inline PNG for the Dagster UI's metadata panel."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return dg.MetadataValue.md(f"![{alt}](data:image/png;base64,{data})")


def disk_metadata(path: str | os.PathLike) -> dict:
    """`disk_mb`: what the asset's folder takes on disk (its files' sizes, MiB to 3 significant
    digits), the same key on every asset's metadata panel."""
    return {"disk_mb": float(f"{dir_bytes(path) / 2**20:.3g}")}
