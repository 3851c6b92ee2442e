"""`gnnflow models`: a dataset's kept model versions, rollback and pins.

    gnnflow models list --dataset cora                  # newest first: test metrics, promoted, pinned
    gnnflow models promote VERSION --dataset cora       # point <dataset>/promoted at VERSION (rollback)
    gnnflow models pin VERSION --dataset cora           # never deleted; promotion does not replace it
    gnnflow models unpin VERSION --dataset cora

Versions live in `<GNNFLOW_HOME>/<dataset>/model_versions/` (GNNFLOW_HOME from the environment,
default ./.gnnflow); their test metrics come from the evaluation that last judged each one
(`<dataset>/model_evaluations/<version>/metrics.json`). Changing the promoted version or the pins
holds the dataset's lock, so it never interleaves with a pipeline run of that dataset, and applies
the retention setting (``keep_versions`` of the dataset's gnnflow.yaml promotion block) after it.
"""

from __future__ import annotations

import argparse
import json
import sys

from graphs.infra.config_checks import bounded_repr
from graphs.infra.dataset_names import is_valid_dataset_name
from graphs.infra.storage import CorruptFileError, verify_files

_PROG = "gnnflow models"


def add_parser(subparsers) -> None:
    """Register `models` and its actions on the `gnnflow` command's subparsers."""
    models = subparsers.add_parser("models", help="list, promote (roll back), pin and unpin model versions")
    actions = models.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="kept versions, newest first, with test metrics, promoted and pinned")
    listing.add_argument("--dataset", required=True, help="dataset name (a partition of `dataset`)")
    for name, text in (
        ("promote", "point the dataset's promoted model at VERSION (a rollback); VERSION must verify"),
        ("pin", "keep VERSION whatever keep_versions says; promotion does not replace it while promoted"),
        ("unpin", "undo pin"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("version", metavar="VERSION", help="a name listed by `gnnflow models list`")
        action.add_argument("--dataset", required=True, help="dataset name (a partition of `dataset`)")
    models.set_defaults(func=run)


class _Refused(Exception):
    """A request that cannot be done; the message says why and what to do."""


def run(args: argparse.Namespace) -> int:
    import dagster as dg

    from assets.common import GnnflowStorage  # lazy: all of assets/ and Dagster, +1.8 s on gnnflow

    storage = GnnflowStorage.from_env()
    try:
        dataset = _name(args.dataset, "dataset")
        if args.action == "list":
            print(_listing(storage, dataset))
            return 0
        version = _name(args.version, "version")
        print(_change(storage, dataset, version, args.action))
        return 0
    except _Refused as exc:
        print(f"{_PROG} {args.action}: {exc}", file=sys.stderr)
        return 2
    except dg.Failure as exc:
        print(f"{_PROG} {args.action}: {exc.description}", file=sys.stderr)
        return 1


def _name(value: str, what: str) -> str:
    if not is_valid_dataset_name(value):
        raise _Refused(
            f"{what} {bounded_repr(value)} is not a valid name: 1-128 letters, digits, '_', '.', '-', starting "
            "with a letter or digit, without '..'"
        )
    return value


def _listing(storage, dataset: str) -> str:
    versions = storage.model_versions(dataset)
    if not versions:
        raise _Refused(f"dataset '{dataset}' has no model versions in {storage.versions_dir(dataset)}; train it first")
    promoted, pinned = storage.promoted_version(dataset), set(storage.pinned_versions(dataset))
    rows = [("VERSION", "ACCURACY", "MACRO_F1", "TEST_NODES", "STATUS")]
    for version in versions:
        metrics = _metrics(storage, dataset, version)
        status = ", ".join(s for s, on in (("promoted", version == promoted), ("pinned", version in pinned)) if on)
        rows.append((version, *metrics, status))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(r[:4], widths)), r[4]]).rstrip() for r in rows]
    head = (
        f"dataset {dataset}: {len(versions)} model version(s) in {storage.versions_dir(dataset)}, newest first "
        f"(keep_versions {storage.kept_versions(dataset)}; promoted: {promoted or 'none'})"
    )
    return "\n".join([head, *lines])


def _metrics(storage, dataset: str, version: str) -> tuple[str, str, str]:
    """(accuracy, macro F1, test nodes) of the version's latest evaluation; '-' where none was kept."""
    from assets.evaluation import METRICS_FILE  # lazy: all of assets/ and Dagster, +1.8 s on gnnflow

    path = storage.evaluations_dir(dataset) / version / METRICS_FILE
    try:
        candidate = json.loads(path.read_text())["candidate"]
    except (OSError, ValueError, KeyError, TypeError):
        return "-", "-", "-"
    return tuple(_shown(candidate.get(k)) for k in ("accuracy", "macro_f1", "test_nodes"))


def _shown(value) -> str:
    if isinstance(value, bool) or value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _change(storage, dataset: str, version: str, action: str) -> str:
    """Promote, pin or unpin under the dataset lock, then apply retention; what was done."""
    from training.outputs import PREDICTIONS  # lazy: torch, +0.85 s on gnnflow
    from training.outputs import STAGE as TRAINED_MODEL  # lazy: torch, +0.85 s on gnnflow

    folder = storage.versions_dir(dataset) / version
    if not storage.dataset_dir(dataset).is_dir():
        raise _Refused(f"dataset '{dataset}' has nothing in {storage.dataset_dir(dataset)}; check GNNFLOW_HOME")
    if action != "unpin" and not folder.is_dir():
        kept = storage.model_versions(dataset)
        raise _Refused(
            f"dataset '{dataset}' has no model version '{version}' in {storage.versions_dir(dataset)} (kept: "
            f"{', '.join(kept[:5]) or 'none'}{', ...' if len(kept) > 5 else ''}); see `{_PROG} list --dataset {dataset}`"
        )
    with storage.lock(dataset):
        if action == "promote":
            try:
                verify_files(folder, stage=TRAINED_MODEL)
            except CorruptFileError as exc:
                raise _Refused(f"{exc}; promote another version") from None
            if not (folder / PREDICTIONS).is_file():
                raise _Refused(f"{folder}: not a node-classification model (no predictions.parquet); nothing promoted")
            before = storage.promoted_version(dataset)
            storage.promote(dataset, version)
            done = f"dataset {dataset}: promoted {version} (was {before or 'none'})"
        else:
            was = version in storage.pinned_versions(dataset)
            storage.set_pinned(dataset, version, action == "pin")
            state = "pinned" if action == "pin" else "unpinned"
            done = f"dataset {dataset}: {version} {state}" + (" (already)" if was == (action == "pin") else "")
        removed = storage.apply_retention(dataset, storage.kept_versions(dataset))
    if removed:
        done += f"; removed {len(removed)} older version(s) beyond keep_versions: {', '.join(removed)}"
    return done
