"""`gnnflow launch` and `gnnflow backfills`: runs from the shell, each failure on one line.

    gnnflow launch --assets '*' --partition mydata                # every stage of one dataset
    gnnflow launch --assets canonical_graph --partition mydata -c run.yaml
    gnnflow launch --job retrain --partition mydata
    gnnflow backfills                                            # the newest backfills and how their runs ended

`launch` executes one run (of the job named, or of the `gnnflow_pipeline` job restricted to
the assets selected) in this process tree against the instance in $DAGSTER_HOME (it
shows in the UI like any other run), with the code location's multiprocess executor, and
prints Dagster's event lines at INFO with each error on one line (`pipelines.console`); it
ends with one line per failed step (the cause: a gnnflow `dagster.Failure` names the file,
column or setting) and exits 1 when the run failed, 2 when it could not start (no
DAGSTER_HOME, a dataset that is not a registered partition, an unknown job or asset).
`--verbose` prints every event at DEBUG with the stack traces. The full error of a failed
step is always in the run's event log (the UI's run page).

`backfills` lists backfills (newest first, or the one named) with the status of their runs:
"failed" when any run failed or was canceled, with each failed step's cause; it exits 1 when
a listed backfill has a failed run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from graphs.infra.config_checks import read_yaml_file
from graphs.infra.dataset_names import DatasetNameError, validate_dataset_name
from pipelines.dagster_cli_hooks import DAGSTER_HOME_MISSING, DATASETS_SYNC_HINT, failure_causes

FAILED_STATUSES = ("FAILURE", "CANCELED")
EVERY_ASSET_JOB = "gnnflow_pipeline"  # the job whose assets `--assets` selects from


def named_job(name: str):
    """A job of the code location by name; reconstructable."""
    from pipelines.definitions import defs  # lazy: every asset and Dagster, +2.0 s on gnnflow

    return defs.resolve_job_def(name)


class LaunchError(Exception):
    """A run that cannot start; the message says what to do."""


def _instance_with(partition: str):
    import dagster as dg

    from assets.common import dataset_partitions  # lazy: all of assets/ and Dagster, +1.8 s on gnnflow

    if not os.environ.get("DAGSTER_HOME"):
        raise LaunchError(DAGSTER_HOME_MISSING)
    try:
        validate_dataset_name(partition)
    except DatasetNameError as exc:
        raise LaunchError(f"--partition: {exc}") from None
    instance = dg.DagsterInstance.get()
    if partition not in instance.get_dynamic_partitions(dataset_partitions.name):
        instance.dispose()
        raise LaunchError(f"dataset '{partition}' is not a registered partition of $DAGSTER_HOME; {DATASETS_SYNC_HINT}")
    return instance


def _asset_keys(selection: str) -> list:
    """The asset keys of a comma-separated selection (Dagster's selection syntax per item)."""
    import dagster as dg

    from pipelines.definitions import defs  # lazy: every asset and Dagster, +2.0 s on gnnflow

    graph = defs.resolve_asset_graph()
    keys: set = set()
    for item in filter(None, (s.strip() for s in selection.split(","))):
        try:
            keys |= dg.AssetSelection.from_string(item).resolve(graph)
        except dg.DagsterError as exc:
            raise LaunchError(f"--assets {item[:80]!r}: {str(exc).splitlines()[0]}") from None
    if not keys:
        raise LaunchError(f"--assets {selection[:80]!r} selects no asset")
    return sorted(keys)


def _run_config(files: list[str], verbose: bool) -> dict:
    from assets.settings import merge, moved_keys  # lazy: Dagster and pydantic, +0.5 s on gnnflow

    config: dict = {}
    for name in files:
        try:
            doc = read_yaml_file(Path(name))
        except (OSError, ValueError) as exc:
            raise LaunchError(f"-c {name}: {exc}") from None
        if not isinstance(doc, dict):
            raise LaunchError(f"-c {name}: a run config file is a mapping (ops: ...), got {type(doc).__name__}")
        moved = moved_keys(doc)
        if moved:
            raise LaunchError(f"-c {name}: {'; '.join(moved)}")
        config = merge(config, doc)
    logger = {"log_level": "DEBUG" if verbose else "INFO", "stack_traces": verbose}
    return merge(config, {"loggers": {"console": {"config": logger}}})


def _recon(args):
    import dagster as dg

    from pipelines.definitions import defs  # lazy: every asset and Dagster, +2.0 s on gnnflow

    if args.job is None:
        job = dg.build_reconstructable_job(__name__, "named_job", reconstructable_args=(EVERY_ASSET_JOB,))
        return job, _asset_keys(args.assets)
    names = sorted(j.name for j in defs.jobs if not j.name.startswith("__"))
    if args.job not in names:
        raise LaunchError(f"--job {args.job[:80]!r}: no such job; the jobs are {', '.join(names)}")
    return dg.build_reconstructable_job(__name__, "named_job", reconstructable_args=(args.job,)), None


def _cmd_launch(args: argparse.Namespace) -> int:
    import dagster as dg

    try:
        run_config = _run_config(args.config, args.verbose)
        recon, keys = _recon(args)
        instance = _instance_with(args.partition)
    except LaunchError as exc:
        print(f"gnnflow launch: {exc}", file=sys.stderr)
        return 2
    with instance:
        try:
            result = dg.execute_job(
                recon, instance, run_config=run_config, tags={"dagster/partition": args.partition}, asset_selection=keys
            )
        except dg.DagsterInvalidConfigError as exc:  # raised before a run starts
            errors = "; ".join(e.message for e in exc.errors[:3]) or str(exc).splitlines()[0]
            print(f"gnnflow launch: the run config does not fit: {errors}", file=sys.stderr)
            return 2
        if result.success:
            print(f"gnnflow: run {result.run_id} succeeded ({args.partition})", file=sys.stderr)
            return 0
        for line in failure_causes(instance, [instance.get_run_by_id(result.run_id)]):
            print(f"gnnflow: {line}", file=sys.stderr)
    hint = "" if args.verbose else "; --verbose prints the stack traces"
    print(
        f"gnnflow: run {result.run_id} failed (its whole event log is on the run's page in the UI{hint})",
        file=sys.stderr,
    )
    return 1


def _cmd_backfills(args: argparse.Namespace) -> int:
    import dagster as dg

    if not os.environ.get("DAGSTER_HOME"):
        print(f"gnnflow backfills: {DAGSTER_HOME_MISSING}", file=sys.stderr)
        return 2
    failed_any = False
    with dg.DagsterInstance.get() as instance:
        if args.backfill_id:
            found = instance.get_backfill(args.backfill_id)
            if found is None:
                print(f"gnnflow backfills: no backfill {args.backfill_id[:40]!r} in $DAGSTER_HOME", file=sys.stderr)
                return 2
            backfills = [found]
        else:
            backfills = instance.get_backfills(limit=args.limit)
        if not backfills:
            print("no backfills")
        for backfill in backfills:
            line, causes = backfill_report(instance, backfill)
            failed_any |= bool(causes) or " failed" in line
            print(line)
            for cause in causes:
                print(f"  {cause}")
    return 1 if failed_any else 0


def backfill_report(instance, backfill) -> tuple[str, list[str]]:
    """(one line: id, partitions, state, run counts; the failed steps' causes)."""
    import dagster as dg

    runs = instance.get_runs(filters=dg.RunsFilter.for_backfill(backfill.backfill_id))
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.status.value] = counts.get(run.status.value, 0) + 1
    failed = [r for r in runs if r.status.value in FAILED_STATUSES]
    finished = sum(counts.get(s, 0) for s in ("SUCCESS", *FAILED_STATUSES))
    submitted = backfill.status.value not in ("REQUESTED",)
    if failed:
        state = f"failed: {len(failed)} of {len(runs)} runs failed"
    elif backfill.status.value in ("FAILED", "CANCELED", "COMPLETED_FAILED"):
        state = f"failed: {backfill.status.value.lower()} (no run failed)"
    elif submitted and finished == len(runs):
        state = f"succeeded: {len(runs)} runs"
    else:
        state = f"in progress: {finished} of {len(runs)} runs finished"
    partitions = ",".join(backfill.partition_names or []) or "-"
    detail = ", ".join(f"{k.lower()} {v}" for k, v in sorted(counts.items()))
    line = f"{backfill.backfill_id} {backfill.job_name or 'assets'} [{partitions}] {state} ({detail or 'no runs yet'})"
    return line, failure_causes(instance, failed)


def add_parsers(sub) -> None:
    launch = sub.add_parser("launch", help="run assets or a job for one dataset; failures on one line")
    what = launch.add_mutually_exclusive_group(required=True)
    what.add_argument("--assets", help="asset selection: '*', canonical_graph, 'minibatch_shards*', comma-separated")
    what.add_argument("--job", help="a job: gnnflow_pipeline, ingest, preprocess, train, retrain, predict")
    launch.add_argument("--partition", required=True, help="the dataset (a registered landing folder)")
    launch.add_argument("-c", "--config", action="append", default=[], help="run config YAML file (repeatable)")
    launch.add_argument("--verbose", action="store_true", help="every event at DEBUG, with stack traces")
    launch.set_defaults(func=_cmd_launch)

    backfills = sub.add_parser("backfills", help="backfills and how their runs ended (exit 1 when a run failed)")
    backfills.add_argument("backfill_id", nargs="?", help="one backfill (default: the newest ones)")
    backfills.add_argument("--limit", type=int, default=10, help="how many of the newest backfills to list")
    backfills.set_defaults(func=_cmd_backfills)
