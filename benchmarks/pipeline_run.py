"""The whole pipeline on one dataset through Dagster, one stage per command, each command's wall
time and peak RSS recorded: the 100M-edge run of BENCHMARKS.md ("The 100M-edge run").

    .venv/bin/gnnflow generate --num-nodes 10000000 --num-edges 100000000 --feature-dim 128 \\
        --num-edge-files 10 --train-fraction 0.01 --val-fraction 0.01 --out BIG/landing/big100m
    # BIG/landing/big100m/gnnflow.yaml: the dataset's settings (this run's are in BENCHMARKS.md)
    .venv/bin/python benchmarks/pipeline_run.py --root BIG --dataset big100m
    .venv/bin/python benchmarks/pipeline_run.py --table        # the records as a Markdown table
    .venv/bin/python benchmarks/pipeline_run.py --preset memory-wall [OPTIONS]   # benchmarks/memory_wall.py

Each stage runs as `dagster asset materialize -m pipelines.definitions --select STAGE --partition
DATASET` under GNU time (`/usr/bin/time -v`), with `DAGSTER_HOME=ROOT/dagster_home`,
`GNNFLOW_HOME=ROOT/home` and `GNNFLOW_LANDING=ROOT/landing`: "command" figures include Dagster's
start-up and the stage's asset checks, and the peak RSS is the largest of any of the command's
processes (Linux's rusage of the waited-for tree). The asset's own figures (seconds and peak
RSS of the step, from its `run_stats.json`) sit beside them. Dagster's steps fork from a
forkserver (`pipelines/definitions.py`), and GNU time's rusage does not reach a step's process
or torchrun's workers under it (the 100M-edge metis_partitions command: 0.59 GiB, its step
5.9 GiB): the command's CPU seconds and peak cover Dagster's own processes, and the table's peak is the larger of the command's and the
step's (records from before the forkserver, 2026-12-01 before 22:30 UTC, include the step). The run
stops at the first stage that fails. Records go to `--out` (JSON, one per stage, appended as each
stage ends, so a stopped run keeps what it measured), keyed by (stage, edge rows) so runs at
several sizes share one file, which `benchmarks/slopes.py` reads for each stage's log-log slope.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "pipeline_runs.json"
STAGES = (
    "canonical_graph",
    "normalized_adjacency",
    "metis_partitions",
    "compressed_graph",
    "minibatch_shards",
    "trained_model",
    "evaluation",
    "promotion",
)
_MAXRSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
_FIELDS = {"User time (seconds)": "user_s", "System time (seconds)": "sys_s"}


def parse_gnu_time(text: str) -> dict:
    """Peak RSS (bytes) and CPU seconds from `/usr/bin/time -v` output; {} when absent."""
    out: dict = {}
    m = _MAXRSS.search(text)
    if m:
        out["command_peak_rss_bytes"] = int(m.group(1)) * 1024
    for line in text.splitlines():
        key, _, value = line.strip().partition(": ")
        if key in _FIELDS:
            out[_FIELDS[key]] = float(value)
    return out


def asset_stats(home: Path, dataset: str, stage: str) -> dict:
    """The step's own seconds and peak RSS from `<home>/<dataset>/<stage>/run_stats.json`."""
    path = home / dataset / stage / "run_stats.json"
    if not path.is_file():
        return {}
    stats = json.loads(path.read_text())
    found = {}
    for key in ("seconds", "total_seconds", "wall_s"):  # a stage with steps has a dict of "seconds"
        if isinstance(stats.get(key), (int, float)):
            found["asset_s"] = float(stats[key])
            break
    for key in ("peak_rss_bytes", "peak_rss"):
        if isinstance(stats.get(key), (int, float)):
            found["asset_peak_rss_bytes"] = int(stats[key])
            break
    found["run_stats"] = stats
    return found


def dataset_size(landing: Path) -> tuple[int, int]:
    """(nodes, edge rows) of a landing dataset, from its Parquet footers (nodes 0 without nodes.parquet)."""
    import pyarrow.parquet as pq

    edges = landing / "edges"
    files = sorted(edges.glob("*.parquet")) if edges.is_dir() else [landing / "edges.parquet"]
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    nodes_file = landing / "nodes.parquet"
    nodes = pq.ParquetFile(nodes_file).metadata.num_rows if nodes_file.is_file() else 0
    return nodes, rows


def logged_seconds(log_text: str, stage: str) -> float | None:
    """The `seconds N` a stage's summary line in the Dagster log reports (trained_model's run
    keeps no run_stats.json: its outputs are versioned), or None."""
    found = re.findall(rf" - {re.escape(stage)} - {re.escape(stage)} \([^)]*\):.*?\bseconds ([0-9.]+)", log_text)
    return float(found[-1]) if found else None


def run_stage(stage: str, dataset: str, root: Path, log_dir: Path, preexec_fn=None) -> dict:
    """Materialize one stage in a child command; its record (exit code, seconds, peaks).
    `preexec_fn` runs in the child before the command (`benchmarks/memory_wall.py`: into a cgroup)."""
    env = dict(
        os.environ,
        DAGSTER_HOME=str(root / "dagster_home"),
        GNNFLOW_HOME=str(root / "home"),
        GNNFLOW_LANDING=str(root / "landing"),
    )
    dagster = Path(sys.executable).with_name("dagster")
    cmd = ["/usr/bin/time", "-v", str(dagster), "asset", "materialize", "-m", "pipelines.definitions"]
    cmd += ["--select", stage, "--partition", dataset]
    log = log_dir / f"{stage}.log"
    t = time.perf_counter()
    with log.open("w") as fh:
        rc = subprocess.run(
            cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, preexec_fn=preexec_fn
        ).returncode
    wall = time.perf_counter() - t
    record = {"stage": stage, "rc": rc, "command_s": round(wall, 2), "log": str(log), "step_in_command": False}
    text = log.read_text(errors="replace")
    record.update(parse_gnu_time(text))
    record.update(asset_stats(root / "home", dataset, stage))
    logged = None if "asset_s" in record else logged_seconds(text, stage)
    if logged is not None:
        record["asset_s"] = logged
    record.update(training_peak(root / "home", dataset, stage))
    return record


def training_peak(home: Path, dataset: str, stage: str) -> dict:
    """trained_model's peak RSS on the CPU: rank 0's, from the run's summary.json (its DDP workers
    are torchrun's children, out of GNU time's reach); {} for other stages or on a GPU, where
    the summary holds device memory."""
    from graphs.formats.stage_artifact import StageArtifact

    path = home / dataset / stage / StageArtifact.SUMMARY
    if stage != "trained_model" or not path.is_file():
        return {}
    summary = json.loads(path.read_text())
    if summary.get("device") != "cpu" or not isinstance(summary.get("peak_memory_mb"), (int, float)):
        return {}
    return {"asset_peak_rss_bytes": int(summary["peak_memory_mb"] * 2**20), "asset_peak_of": "rank 0"}


def prepare_home(root: Path) -> None:
    """ROOT/dagster_home with the project's dagster.yaml, and Dagster's partitions synced with
    the datasets in ROOT/landing."""
    (root / "dagster_home").mkdir(parents=True, exist_ok=True)
    dagster_yaml = root / "dagster_home" / "dagster.yaml"
    if not dagster_yaml.exists():
        dagster_yaml.write_text((REPO / "pipelines" / "dagster.yaml").read_text())
    env = dict(os.environ, DAGSTER_HOME=str(root / "dagster_home"), GNNFLOW_LANDING=str(root / "landing"))
    subprocess.run([str(Path(sys.executable).with_name("gnnflow")), "datasets", "sync"], cwd=REPO, env=env, check=True)


def machine() -> str:
    """CPU model, cores and memory of this machine, in words (`harness.machine`)."""
    m = harness.machine()
    return f"{m['cpu']}, {m['cores']} cores, {m['memory_bytes'] / 2**30:.0f} GiB RAM"


def _peak(record: dict) -> int:
    """Peak RSS of a stage: its command's or its step's, whichever is larger (see above)."""
    return max(record.get("command_peak_rss_bytes", 0), record.get("asset_peak_rss_bytes", 0))


def markdown_table(records: list[dict]) -> str:
    """One row per stage, one column group per size: the step's seconds, the whole command's
    seconds and peak RSS (GiB), from `records` as this script writes them."""
    sizes = sorted({r["edges"] for r in records})
    by = {(r["stage"], r["edges"]): r for r in records}
    stages = [s for s in ("generate", *STAGES) if any((s, e) in by for e in sizes)]
    head = " | ".join(f"{e:,} rows: step s / command s / peak GiB" for e in sizes)
    lines = [f"| stage | {head} |", "| --- |" + " --- |" * len(sizes)]
    for stage in stages:
        cells = []
        for e in sizes:
            r = by.get((stage, e))
            if r is None:
                cells.append("—")
                continue
            step = f"{r['asset_s']:.1f}" if r.get("asset_s") is not None else "—"
            peak = _peak(r) / 2**30
            cells.append(
                f"{step} / {r['command_s']:.1f} / {peak:.2f}" + ("" if r["rc"] == 0 else f" (failed, rc {r['rc']})")
            )
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    totals = [sum(by[(s, e)]["command_s"] for s in stages if (s, e) in by) for e in sizes]
    lines.append("| all stages | " + " | ".join(f"{t:.0f} s ({t / 60:.1f} min)" for t in totals) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:2] == ["--preset", "memory-wall"]:  # its own options follow (benchmarks/memory_wall.py)
        import memory_wall  # noqa: PLC0415  (benchmarks/memory_wall.py imports this module)

        return memory_wall.main(argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, help="holds landing/<dataset>; home/ etc. are made")
    parser.add_argument("--dataset")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated, in order")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON records, keyed by (stage, edges)")
    parser.add_argument("--table", action="store_true", help="print --out's records as a Markdown table, run nothing")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(args.out.read_text())))
        return 0
    if args.root is None or args.dataset is None:
        parser.error("--root and --dataset are required (unless --table)")
    root = args.root.resolve()
    out = args.out
    nodes, edges = dataset_size(root / "landing" / args.dataset)
    prepare_home(root)
    records = json.loads(out.read_text()) if out.is_file() else []
    log_dir = root / "logs" / args.dataset
    log_dir.mkdir(parents=True, exist_ok=True)
    for stage in args.stages.split(","):
        record = run_stage(stage, args.dataset, root, log_dir)
        record.update(dataset=args.dataset, nodes=nodes, edges=edges, machine=machine())
        record["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        record["loadavg_end"] = os.getloadavg()
        records = [r for r in records if (r["stage"], r["edges"]) != (stage, edges)] + [record]
        out.write_text(json.dumps(records, indent=1, default=str) + "\n")
        peak = _peak(record) / 2**30
        print(f"{stage}: rc {record['rc']}, {record['command_s']:.1f} s, peak {peak:.2f} GiB", flush=True)
        if record["rc"] != 0:
            print(f"{stage} failed: see {record['log']}", file=sys.stderr)
            return record["rc"]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
