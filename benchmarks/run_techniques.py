"""A small runner for the issue-14b technique modules until `benchmarks/techniques.py` (issue 14a's
harness, which collects every `benchmarks/techniques_<name>.py`) is on main; then these four
names are registered there and this file goes.

    .venv/bin/python benchmarks/run_techniques.py [--only compensation,comm,memory,depth] [--quick] [--seeds N]

Each module exposes ``rows(args) -> list[dict]`` (technique, dataset, acc_on, acc_off, time_on,
time_off, mem_on, mem_off, verdict; optional metric, notes) and prints the same table alone.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _technique_runs import markdown  # noqa: E402

MODULES = ("compensation", "comm", "memory", "depth")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default=",".join(MODULES))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seeds", type=int, default=0)
    p.add_argument("--nodes", type=int, default=0)
    p.add_argument("--work", default="bench_out/techniques")
    args = p.parse_args(argv)
    rows = []
    for name in args.only.split(","):
        if name not in MODULES:
            raise SystemExit(f"--only {name!r}: not one of {MODULES}")
        rows.extend(importlib.import_module(f"techniques_{name}").rows(args))
    print(markdown(rows))


if __name__ == "__main__":
    main()
