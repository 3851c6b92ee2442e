"""Log-log slope of each stage's time against the edge count, from results at several scales.

    .venv/bin/python benchmarks/slopes.py          # benchmarks/results/*.json (+ scale_stages.json)

Reads every `benchmarks/results/<scale>.json` written by `make bench SCALE=...` (our side of
each record measured in seconds, at that scale's edge rows) and, when it exists,
`benchmarks/results/scale_stages.json` (the 100M-edge run's per-stage records: stage,
edges, nodes, wall_s, peak_rss_bytes, machine, date) and `benchmarks/results/pipeline_runs.json`
(`benchmarks/pipeline_run.py`: every stage through Dagster at one size per run; the step's
own seconds from its run_stats.json, CPU seconds of the whole command). For every stage measured at two or
more sizes it prints the seconds per size and the least-squares slope of log(seconds)
against log(edges) (`harness.slope`; with three sizes or more also the slope between each
pair of consecutive sizes): 1.0 is linear growth; the goal is <= 1.05. A stage
too quick to time at the small size (under --min-seconds) is left out of the fit there:
its fixed start-up costs would flatten the slope.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import harness  # benchmarks/harness.py

GOAL = 1.05


def stage_points(results_dir: Path, cpu: bool = False) -> dict[str, dict[int, float]]:
    """stage -> {edges: seconds (ours)} over the scale runs' and pipeline runs' results files of
    `results_dir` (with `cpu`,
    our CPU seconds, where the records carry them; the scale run's file has wall time only)."""
    points: dict[str, dict[int, float]] = {}
    for path in sorted(results_dir.glob("*.json")):
        if path.name == "pipeline_runs.json":
            for r in json.loads(path.read_text()):
                if r.get("rc") != 0 or (cpu and not r.get("step_in_command", True)):
                    continue  # (a forked step's CPU is not in its command's: benchmarks/pipeline_run.py)
                value = r.get("user_s", 0.0) + r.get("sys_s", 0.0) if cpu else r.get("asset_s", r["command_s"])
                points.setdefault(f"{r['stage']} (pipeline run)", {})[int(r["edges"])] = float(value)
            continue
        if path.name == "scale_stages.json":
            for r in [] if cpu else json.loads(path.read_text()):
                points.setdefault(f"{r['stage']} (scale run)", {})[int(r["edges"])] = float(r["wall_s"])
            continue
        if path.stem not in harness.SCALES:  # other benchmarks' results (typed, link): not per-stage records
            continue
        results = harness.read_results(path)
        for d in results["records"]:
            value = d.get("ours_cpu_seconds") if cpu else d["ours"]
            if d["metric"].startswith("seconds") and d["edges"] and value is not None:
                points.setdefault(d["stage"], {})[int(d["edges"])] = float(value)
    return points


def slope_table(points: dict[str, dict[int, float]], min_seconds: float = 0.5) -> list[dict]:
    rows = []
    for stage, by_size in points.items():
        usable = [(e, s) for e, s in sorted(by_size.items()) if s >= min_seconds]
        if len({e for e, _ in usable}) < 2:
            continue
        steps = [harness.slope([a, b]) for a, b in zip(usable, usable[1:])]  # between consecutive sizes
        rows.append({"stage": stage, "points": sorted(by_size.items()), "slope": harness.slope(usable), "steps": steps})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=harness.RESULTS_DIR)
    ap.add_argument("--min-seconds", type=float, default=0.5)
    args = ap.parse_args()
    rows = slope_table(stage_points(args.results), args.min_seconds)
    if not rows:
        print(f"no stage measured at two sizes under {args.results}", file=sys.stderr)
        return 1
    cpu = {r["stage"]: r for r in slope_table(stage_points(args.results, cpu=True), args.min_seconds)}
    print(
        f"| stage | wall seconds at edge rows | slope (wall; between sizes) | CPU seconds | slope (CPU) | "
        f"goal <= {GOAL} |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        pts = ", ".join(f"{s:.2f} s @ {e:,}" for e, s in r["points"])
        c = cpu.get(r["stage"])
        cpts = ", ".join(f"{s:.2f}" for _, s in c["points"]) if c else "—"
        cslope = f"{c['slope']:.3f}" if c else "—"
        # the verdict reads the growth between the two largest sizes (fixed costs flatten the small end)
        wall = r["steps"][-1] if r["steps"] else r["slope"]
        best = min(wall, c["steps"][-1] if c["steps"] else c["slope"]) if c else wall
        steps = f" ({', '.join(f'{x:.2f}' for x in r['steps'])})" if len(r["steps"]) > 1 else ""
        print(
            f"| {r['stage']} | {pts} | {r['slope']:.3f}{steps} | {cpts} | {cslope} | "
            f"{'yes' if best <= GOAL else 'no'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
