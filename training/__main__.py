"""``python -m training --config run.yaml`` (also under torchrun): see `training.train`.

python -m training.launch --nproc-per-node 2 -m training --config run.yaml   # one node (torchrun, loopback)
python -m training --config run.yaml --set training.epochs=5 --set model.hidden=64
python -m training --help-config          # every setting with its help text
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from training.threads import set_thread_env

set_thread_env()  # each OpenMP runtime reads its threads and wait policy once, when torch or DGL loads it

import yaml  # noqa: E402

from graphs.infra.config_checks import read_yaml_file  # noqa: E402
from training.config import RunConfig, field_help, unwrap_dagster_run_config  # noqa: E402
from training.lifetime import LAUNCHER_PID_ENV, die_with_parent  # noqa: E402
from training.train import train  # noqa: E402


def _apply_override(data: dict, assignment: str) -> None:
    """``a.b.c=value`` (value parsed as YAML) into the nested dict ``data``."""
    if "=" not in assignment:
        raise SystemExit(f"--set {assignment!r}: expected KEY=VALUE, e.g. training.epochs=5")
    key, value = assignment.split("=", 1)
    *parents, leaf = key.strip().split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = yaml.safe_load(value)


def _die_with_launcher() -> None:
    """A rank lives no longer than its launcher (`training.lifetime`); one whose launcher is
    already gone exits at once."""
    launcher = os.environ.get(LAUNCHER_PID_ENV, "")
    if not die_with_parent(int(launcher) if launcher.isdigit() else None):
        raise SystemExit(f"rank {os.environ['RANK']}: its launcher (pid {launcher}) is gone; not training")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="run YAML: model, training, paths (or a Dagster run config)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one setting, e.g. training.optimizer.lr=0.01 (repeatable)",
    )
    parser.add_argument("--help-config", action="store_true", help="list every setting and exit")
    args = parser.parse_args(argv)
    if args.help_config:
        for name, text in field_help(RunConfig).items():
            print(f"{name:42s} {text}")
        return 0
    if not args.config:
        parser.error("--config is required")

    if "RANK" in os.environ:
        _die_with_launcher()
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {rank}] %(message)s", stream=sys.stdout)
    try:
        data = read_yaml_file(args.config) or {}  # size-limited, anchors and aliases refused
    except (OSError, ValueError) as exc:
        raise SystemExit(str(exc)) from None
    data = unwrap_dagster_run_config(data)  # a Dagster run-config file: its trained_model block
    for assignment in args.set:
        _apply_override(data, assignment)
    try:
        cfg = RunConfig.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"{args.config}: {exc}") from None

    train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
