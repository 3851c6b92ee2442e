"""The `gnnflow` command.

    gnnflow generate --preset demo --out landing/demo      # synthetic DC-SBM dataset
    gnnflow generate --num-nodes 1000000 --num-edges 10000000 --out landing/big
    gnnflow datasets sync                                  # landing sub-folders -> `dataset` partitions
    gnnflow datasets list
    gnnflow launch --assets '*' --partition mydata         # run stages (see pipelines.launch_cli)
    gnnflow backfills                                      # how the newest backfills' runs ended
    gnnflow models list --dataset mydata                   # model versions; promote / pin / unpin VERSION
    gnnflow score-pairs --dataset mydata --pairs c.parquet --out s.parquet   # link prediction

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

from pipelines.launch_cli import DAGSTER_HOME_MISSING, DATASETS_SYNC_HINT, add_parsers, failure_causes
from pipelines.models_cli import add_parser as add_models_parser
from pipelines.score_pairs_cli import add_parser as add_score_pairs_parser


def warn_if_dagster_home_missing() -> None:
    """In the `dagster` CLI: say what is wrong as the last line the user sees, when DAGSTER_HOME
    is not set (Dagster then runs against a throw-away instance and fails with a partition error
    that does not mention it) or when the `--partition` given is not a registered dataset
    partition (a forgotten `gnnflow datasets sync`; Dagster's own error is a long traceback)."""
    if Path(sys.argv[0]).name not in ("dagster", "dagster-daemon"):
        return
    if not os.environ.get("DAGSTER_HOME"):
        atexit.register(lambda: print(f"gnnflow: {DAGSTER_HOME_MISSING}", file=sys.stderr))
        return
    args = sys.argv[1:]
    if "--partition" in args[:-1]:
        atexit.register(_hint_unregistered, args[args.index("--partition") + 1])


def _hint_unregistered(partition: str) -> None:
    import dagster as dg

    from assets.common import dataset_partitions

    try:
        with dg.DagsterInstance.get() as instance:
            known = instance.get_dynamic_partitions(dataset_partitions.name)
    except Exception:  # never mask Dagster's own exit with ours
        return
    if partition not in known:
        print(
            f"gnnflow: dataset {partition[:80]!r} is not a registered partition; {DATASETS_SYNC_HINT}", file=sys.stderr
        )


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
                after = datetime.fromtimestamp(since, tz=timezone.utc)
                runs = instance.get_runs(
                    filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], created_after=after)
                )
                lines = failure_causes(instance, runs)
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
    add_parsers(sub)
    add_models_parser(sub)
    add_score_pairs_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
