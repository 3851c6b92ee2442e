"""The `gnnflow` command.

    gnnflow generate --preset demo --out landing/demo      # synthetic DC-SBM dataset
    gnnflow generate --num-nodes 1000000 --num-edges 10000000 --out landing/big
    gnnflow generate --typed 20000 --out landing/shop              # typed: users, items, categories
    gnnflow datasets sync                                  # landing sub-folders -> `dataset` partitions
    gnnflow datasets list
    gnnflow launch --assets '*' --partition mydata         # run stages (see pipelines.launch_cli)
    gnnflow backfills                                      # how the newest backfills' runs ended
    gnnflow models list --dataset mydata                   # model versions; promote / pin / unpin VERSION
    gnnflow score-pairs --dataset mydata --pairs c.parquet --out s.parquet   # link prediction
    gnnflow config-reference --out docs/configuration.md   # every setting, generated

`datasets sync` does from the shell what the landing sensor does in the daemon: it adds
every landing sub-folder as a partition of the Dagster instance in $DAGSTER_HOME, so
`dagster asset materialize --partition NAME` and backfills can target it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import typing
from pathlib import Path

from graphs.infra.dataset_names import DatasetNameError, validate_dataset_name
from graphs.synthetic import generate
from graphs.synthetic.collection import generate_collection
from graphs.synthetic.typed import generate_typed
from pipelines.config_reference import add_parser as add_config_reference_parser
from pipelines.dagster_cli_hooks import DAGSTER_HOME_MISSING
from pipelines.launch_cli import add_parsers
from pipelines.models_cli import add_parser as add_models_parser
from pipelines.score_pairs_cli import add_parser as add_score_pairs_parser


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

    from assets.reporting import rounded  # lazy: Dagster, +0.47 s on every gnnflow command

    try:  # the folder's name becomes the dataset's partition key
        validate_dataset_name(Path(args.out).name)
    except DatasetNameError as exc:
        print(f"gnnflow generate: --out {args.out}: {exc}", file=sys.stderr)
        return 2

    if args.collection is not None:
        return _generate_collection(args)
    if args.typed is not None:
        return _generate_typed(args)
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


def _generate_collection(args: argparse.Namespace) -> int:
    """`gnnflow generate --collection N`: a graph collection with a planted property."""
    out = Path(args.out)
    if args.collection < 1:
        print(f"gnnflow generate: --collection {args.collection}: give at least 1 graph", file=sys.stderr)
        return 2
    if out.exists() and any(out.iterdir()):
        print(f"gnnflow generate: {out} exists and is not empty; choose a new folder", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else 0
    summary = generate_collection(out, args.collection, seed=seed, label_kind=args.label_kind)
    print(json.dumps(summary))
    return 0


def _generate_typed(args: argparse.Namespace) -> int:
    """`gnnflow generate --typed USERS`: a typed graph (users, items, categories) with planted segments."""
    if args.typed < 100:
        print(f"gnnflow generate: --typed {args.typed}: give at least 100 users", file=sys.stderr)
        return 2
    try:
        summary = generate_typed(args.out, args.typed, seed=args.seed if args.seed is not None else 0)
    except FileExistsError as exc:
        print(f"gnnflow generate: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


def _cmd_datasets(args: argparse.Namespace) -> int:
    import dagster as dg

    from assets.common import GnnflowStorage, dataset_partitions  # lazy: all of assets/ and Dagster, +1.8 s
    from pipelines.sensors import register_datasets  # lazy: all of assets/ and Dagster, +1.7 s

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
    gen.add_argument(
        "--collection", type=int, metavar="GRAPHS",
        help="write a graph collection of GRAPHS small graphs with a planted property instead (graphs.parquet)",
    )  # fmt: skip
    gen.add_argument(
        "--typed", type=int, metavar="USERS",
        help="write a typed graph instead: USERS users, items and categories with planted segments (nodes/, edges/)",
    )  # fmt: skip
    gen.add_argument(
        "--label-kind", choices=["class", "value", "multi_label"], default="class",
        help="with --collection: a class, a value or a list of binary labels per graph",
    )  # fmt: skip
    _add_dataclass_arguments(gen, generate.GenerateConfig)
    gen.set_defaults(func=_cmd_generate)

    ds = sub.add_parser("datasets", help="register landing sub-folders as `dataset` partitions")
    ds.add_argument("action", choices=["sync", "list"])
    ds.set_defaults(func=_cmd_datasets)
    add_parsers(sub)
    add_models_parser(sub)
    add_score_pairs_parser(sub)
    add_config_reference_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
