"""The `gnnflow` command.

    gnnflow generate --preset demo --out landing/demo      # synthetic DC-SBM dataset
    gnnflow generate --num-nodes 1000000 --num-edges 10000000 --out landing/big
    gnnflow datasets sync                                  # landing sub-folders -> `dataset` partitions
    gnnflow datasets list

`datasets sync` does from the shell what the landing sensor does in the daemon: it adds
every landing sub-folder as a partition of the Dagster instance in $DAGSTER_HOME, so
`dagster asset materialize --partition NAME` and backfills can target it.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import os
import sys
import time
import typing
from datetime import datetime, timezone
from pathlib import Path

DAGSTER_HOME_MISSING = (
    "DAGSTER_HOME is not set, so Dagster uses a throw-away instance that knows no dataset partitions "
    "and keeps no run history; export DAGSTER_HOME=$PWD/.dagster_home (the one the Makefile, make demo and "
    "make ui use) and run `gnnflow datasets sync` before the dagster command"
)


def warn_if_dagster_home_missing() -> None:
    """In the `dagster` CLI without DAGSTER_HOME: say so as the last line the user sees.

    The CLI then runs against an ephemeral instance and fails with a partition error that does
    not mention DAGSTER_HOME; an exit handler prints the cause after Dagster's own output."""
    if os.environ.get("DAGSTER_HOME") or Path(sys.argv[0]).name not in ("dagster", "dagster-daemon"):
        return
    atexit.register(lambda: print(f"gnnflow: {DAGSTER_HOME_MISSING}", file=sys.stderr))


def quiet_dagster_notices() -> None:
    """Ignore two notices about Dagster's own internals that a gnnflow user can do nothing about.

    Filtered by their message, not their category, so every other beta / preview warning still
    shows. Called when `pipelines.definitions` loads, i.e. in the `dagster` CLI before it parses
    `--select`, and in every step worker:
    - `--select '*'` resolves through ``AssetSelection.all(include_sources=...)``, a beta parameter;
    - trained_model's pipes session reads ``PipesMessageReader.expected_writer_count``, a preview
      property.
    (`dagster asset materialize` itself is "superseded" by `dg launch` of the separate dagster-dg-cli
    package; that notice comes before any project code loads, so the Makefile's demo target filters it.)
    """
    import warnings

    import dagster as dg

    warnings.filterwarnings("ignore", r"Parameter `include_sources` of function `AssetSelection\.all`", dg.BetaWarning)
    warnings.filterwarnings("ignore", r"Function `PipesMessageReader\.expected_writer_count`", dg.PreviewWarning)


def failure_causes(instance, since: float) -> list[str]:
    """One line per failed step of the runs created after `since` (a timestamp): the asset,
    the dataset and the cause (a `dagster.Failure`'s description, which names the file and
    column for bad input; else the innermost error's first line)."""
    import dagster as dg

    lines = []
    runs = instance.get_runs(
        filters=dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.FAILURE], created_after=datetime.fromtimestamp(since, tz=timezone.utc)
        )
    )
    for run in runs:
        for record in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
            event = record.dagster_event
            data = event.step_failure_data
            if data.user_failure_data is not None and data.user_failure_data.description:
                cause = data.user_failure_data.description
            else:
                err = data.error
                while err is not None and err.cause is not None:
                    err = err.cause
                cause = err.message.strip().splitlines()[0] if err is not None else "unknown error"
            where = f" ({run.tags['dagster/partition']})" if "dagster/partition" in run.tags else ""
            lines.append(f"{event.step_key}{where} failed: {cause}")
    return lines


def summarize_failures_at_exit() -> None:
    """In `dagster asset materialize` / `dagster job execute`: after Dagster's "Materialization
    failed" and its tracebacks, print each failed step's one-line cause as the last lines."""
    if Path(sys.argv[0]).name != "dagster" or not os.environ.get("DAGSTER_HOME"):
        return
    if not ({"materialize", "execute"} & set(sys.argv[1:3])):
        return
    since = time.time()

    def report() -> None:
        import dagster as dg

        try:
            with dg.DagsterInstance.get() as instance:
                lines = failure_causes(instance, since)
        except Exception:  # never mask Dagster's own exit with ours
            return
        for line in lines:
            print(f"gnnflow: {line}", file=sys.stderr)

    atexit.register(report)


def _add_dataclass_arguments(parser: argparse.ArgumentParser, dataclass_type) -> None:
    """One --flag per field of a config dataclass, with its help text; default: the field's."""
    hints = typing.get_type_hints(dataclass_type)
    for f in dataclasses.fields(dataclass_type):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        if kind is bool:
            parser.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=f.metadata.get("help")
            )
        else:
            parser.add_argument(flag, dest=f.name, type=kind, default=None, help=f.metadata.get("help"))


def _cmd_generate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from assets.reporting import rounded
    from graphs import generate
    from graphs.storage import DatasetNameError, validate_dataset_name

    try:  # the folder's name becomes the dataset's partition key
        validate_dataset_name(Path(args.out).name)
    except DatasetNameError as exc:
        print(f"gnnflow generate: --out {args.out}: {exc}", file=sys.stderr)
        return 2

    base = generate.demo_config() if args.preset == "demo" else None
    overrides = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(generate.GenerateConfig)
        if getattr(args, f.name) is not None
    }
    config = dataclasses.replace(base, **overrides) if base else generate.GenerateConfig(**overrides)
    try:
        summary = generate.generate_dataset(config, args.out, progress=not args.quiet)
    except FileExistsError as exc:
        print(f"gnnflow generate: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(rounded(summary), default=str))  # one line, numbers to 4 significant digits
    return 0


def _cmd_datasets(args: argparse.Namespace) -> int:
    import dagster as dg

    from assets.common import GnnflowStorage, dataset_partitions
    from pipelines.sensors import register_datasets

    if not os.environ.get("DAGSTER_HOME"):
        print(f"gnnflow datasets: {DAGSTER_HOME_MISSING}", file=sys.stderr)
        return 2
    storage = GnnflowStorage.from_env()
    instance = dg.DagsterInstance.get()
    if args.action == "sync":
        new = register_datasets(instance, storage)
        names = storage.landing_datasets()
        print(
            f"landing folder {storage.landing}: {len(names)} dataset(s); newly registered: {', '.join(new) or 'none'}"
        )
        for bad in storage.landing_folders_with_bad_names():
            print(f"ignored landing folder {bad!r}: not a valid dataset name", file=sys.stderr)
    known = instance.get_dynamic_partitions(dataset_partitions.name)
    print("registered dataset partitions: " + (", ".join(sorted(known)) or "none"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gnnflow", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="write a synthetic DC-SBM dataset in the landing layout")
    gen.add_argument("--out", required=True, help="dataset folder to write, e.g. landing/demo")
    gen.add_argument("--preset", choices=["demo"], help="start from a named recipe, then apply the flags")
    gen.add_argument("--quiet", action="store_true", help="no progress bar")
    from graphs.generate import GenerateConfig

    _add_dataclass_arguments(gen, GenerateConfig)
    gen.set_defaults(func=_cmd_generate)

    ds = sub.add_parser("datasets", help="register landing sub-folders as `dataset` partitions")
    ds.add_argument("action", choices=["sync", "list"])
    ds.set_defaults(func=_cmd_datasets)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
