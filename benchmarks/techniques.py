"""Training techniques, each measured against its off switch in the same run: one Markdown table.

    .venv/bin/python benchmarks/techniques.py                       # every technique, full size
    .venv/bin/python benchmarks/techniques.py --only adaptive,imbalanced --seeds 5
    .venv/bin/python benchmarks/techniques.py --quick --out /tmp/t.md   # tiny sizes (what the tests run)

The table (issue 14's deliverable) has one row per (technique, dataset): the metric with the
technique on and off, time on/off, peak memory on/off, and a verdict. Each technique lives in
its own module ``benchmarks/techniques_<name>.py`` exposing

    rows(args: argparse.Namespace) -> list[dict]

with the keys of `ROW_KEYS` (``technique, dataset, acc_on, acc_off, time_on, time_off, mem_on,
mem_off, verdict``) and optionally those of `OPTIONAL_KEYS` (``metric``: what ``acc_*`` measures,
"test acc" when absent; ``notes``). Values: ``acc_*`` a number (a fraction in [0, 1]) or a list of
numbers (one per seed: shown as mean ± std in percent), or a ready string; ``time_*`` seconds;
``mem_*`` peak MB (RSS on CPU, allocated on CUDA); None = not measured (shown as "-"). A module
reads the shared options below from ``args`` (``quick``, ``seeds``, ``work``) and runs on and off
in one process, so the ratio is a same-run measurement. Registering a technique = adding its
name to `TECHNIQUES`.

Timings on a shared machine are noisy: compare on and off of one row, not rows of different
runs. `verdict` gives the wording the modules share: a difference counts only beyond twice its
standard error over seeds.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
# this checkout's packages and the technique modules next to this file
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

# benchmarks/techniques_<name>.py, in table order (one line each, so registrations merge cleanly)
TECHNIQUES = [
    "adaptive",
    "imbalanced",
    "subgraph",
    "compensation",
    "comm",
    "memory",
    "depth",
]
ROW_KEYS = ("technique", "dataset", "acc_on", "acc_off", "time_on", "time_off", "mem_on", "mem_off", "verdict")
OPTIONAL_KEYS = ("metric", "notes")
COLUMNS = (
    "technique",
    "dataset",
    "metric",
    "on",
    "off",
    "time on (s)",
    "time off (s)",
    "peak MB on",
    "peak MB off",
    "verdict",
)


# ----------------------------------------------------------------------------- helpers for the modules


def mean_std(values) -> tuple[float, float]:
    """(mean, sample std) of a list of numbers; std 0 for one value."""
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def verdict(on, off, *, higher_is_better: bool = True, what: str = "points") -> str:
    """'helps' / 'hurts' when the mean difference exceeds twice its standard error over seeds
    (Welch: sqrt(s_on²/n_on + s_off²/n_off)), else 'no measurable effect'; with one value per
    side (no spread to judge by) the difference is reported as 'single seed'."""
    a, b = np.atleast_1d(np.asarray(on, dtype=np.float64)), np.atleast_1d(np.asarray(off, dtype=np.float64))
    diff = (a.mean() - b.mean()) * (100.0 if what == "points" else 1.0)
    if a.size < 2 or b.size < 2:
        return f"{diff:+.2f} {what} (single seed)"
    scale = 100.0 if what == "points" else 1.0
    se = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size) * scale
    better = diff if higher_is_better else -diff
    if abs(diff) <= 2 * se:
        return f"no measurable effect ({diff:+.2f} {what}, 2 SE = {2 * se:.2f})"
    return f"{'helps' if better > 0 else 'hurts'} ({diff:+.2f} {what}, 2 SE = {2 * se:.2f})"


def _fmt_acc(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, np.ndarray)):
        mean, std = mean_std(value)
        return f"{100 * mean:.2f} ± {100 * std:.2f} (n={len(value)})"
    return f"{100 * float(value):.2f}"


def _fmt_num(value, digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{float(value):.{digits}f}"


def check_row(row: dict, module: str) -> dict:
    """The row, or ValueError naming the module and the missing / unknown keys."""
    missing = [k for k in ROW_KEYS if k not in row]
    unknown = [k for k in row if k not in ROW_KEYS + OPTIONAL_KEYS]
    if missing or unknown:
        raise ValueError(
            f"benchmarks/techniques_{module}.py returned a row with missing keys {missing} / unknown keys "
            f"{unknown}; rows need {list(ROW_KEYS)} (optional {list(OPTIONAL_KEYS)})"
        )
    return row


def markdown_table(rows: list[dict]) -> str:
    """The Markdown table of `rows` (columns `COLUMNS`; notes, if any, listed below it)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    notes = []
    for r in rows:
        cells = [
            r["technique"],
            r["dataset"],
            r.get("metric", "test acc"),
            _fmt_acc(r["acc_on"]),
            _fmt_acc(r["acc_off"]),
            _fmt_num(r["time_on"], 2),
            _fmt_num(r["time_off"], 2),
            _fmt_num(r["mem_on"], 0),
            _fmt_num(r["mem_off"], 0),
            r["verdict"],
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
        if r.get("notes"):
            notes.append(f"- {r['technique']} / {r['dataset']}: {r['notes']}")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


# ----------------------------------------------------------------------------- running


def load(name: str):
    """The module ``techniques_<name>`` (benchmarks/), checked to expose ``rows(args)``."""
    if name not in TECHNIQUES:
        raise ValueError(f"--only {name!r}: no such technique; known: {', '.join(TECHNIQUES)}")
    module = importlib.import_module(f"techniques_{name}")
    if not callable(getattr(module, "rows", None)):
        raise ValueError(f"benchmarks/techniques_{name}.py has no rows(args) function")
    return module


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default="", help=f"comma-separated techniques (default: all of {TECHNIQUES})")
    p.add_argument("--quick", action="store_true", help="tiny sizes and few epochs: checks the mechanics, not a result")
    p.add_argument("--seeds", type=int, default=0, help="training seeds per setting; 0 = each module's default")
    p.add_argument("--nodes", type=int, default=0, help="nodes of the generated graphs that scale; 0 = module default")
    p.add_argument("--work", default="bench_out/techniques", help="cache of generated graphs and runs")
    p.add_argument("--out", default="", help="also write the table to this Markdown file")
    return p


def run(args: argparse.Namespace) -> str:
    names = [n for n in args.only.split(",") if n] if args.only else list(TECHNIQUES)
    modules = [(n, load(n)) for n in names]  # every name checked before anything runs
    Path(args.work).mkdir(parents=True, exist_ok=True)
    rows = []
    for name, module in modules:
        t0 = time.perf_counter()
        print(f"=== techniques_{name}", flush=True)
        got = module.rows(args)
        rows.extend(check_row(r, name) for r in got)
        print(f"=== techniques_{name}: {len(got)} rows, {time.perf_counter() - t0:.0f} s", flush=True)
    table = markdown_table(rows)
    if args.out:
        Path(args.out).write_text(table)
    return table


def main(argv: list[str] | None = None) -> None:
    print(run(parser().parse_args(argv)))


if __name__ == "__main__":
    main()
