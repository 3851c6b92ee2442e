"""Run every benchmark at one scale and write benchmarks/results/<scale>.json and .md.

    make bench SCALE=small                                  # what this runs
    .venv/bin/python benchmarks/run.py --scale small
    .venv/bin/python benchmarks/run.py --scale medium --only ingest,adjacency,partition

Each benchmark runs as its own process (`benchmarks/<name>.py`, with the command line
`harness.bench_args` gives for the scale and ``--record FILE``), one after the other, its
output streamed here; the records it appends are collected into the results files
(schema and table: `benchmarks/harness.py`). A benchmark that fails is named in the
results and the run goes on; the exit status is 1 when any failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness  # benchmarks/harness.py

HERE = Path(__file__).resolve().parent


def run_scale(
    scale: str,
    names: list[str],
    out_dir: Path,
    *,
    merge: bool = False,
    python: str = sys.executable,
    cwd: Path | None = None,
) -> tuple[Path, Path, dict]:
    """Run `names` at `scale`; return the json path, the Markdown path and the per-benchmark status.
    With `merge`, the records of other benchmarks in an earlier results file of this scale stay."""
    machine = harness.machine()
    date = harness.utc_now()
    records: list[harness.Record] = []
    status: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-records-") as tmp:
        for name in names:
            record_file = Path(tmp) / f"{name}.jsonl"
            cmd = [python, str(HERE / f"{name}.py"), *harness.bench_args(name, scale), "--record", str(record_file)]
            print(f"=== {' '.join(cmd[1:])}", flush=True)
            t = time.perf_counter()
            rc = subprocess.run(cmd, cwd=cwd or HERE.parent).returncode
            status[name] = {"seconds": round(time.perf_counter() - t, 1), "returncode": rc}
            try:
                got = harness.read_records(record_file)
            except (ValueError, KeyError, TypeError) as exc:  # a record off the schema fails its benchmark only
                print(f"benchmarks/{name}.py wrote a bad record: {exc}", file=sys.stderr)
                got, rc = [], -1
                status[name]["returncode"] = rc
            if rc == 0 and not got:
                status[name]["returncode"] = rc = -1
                print(f"benchmarks/{name}.py wrote no records", file=sys.stderr)
            records += got if rc == 0 else []
    previous = Path(out_dir) / f"{scale}.json"
    earlier: list[dict] = []
    if merge and previous.is_file():  # keep the other benchmarks' records of an earlier run at this scale
        records, status, earlier = harness.merge_earlier(harness.read_results(previous), records, status)
    json_path, md_path = harness.write_results(
        scale, records, status, out_dir=out_dir, machine_facts=machine, date=date, earlier_runs=earlier
    )
    return json_path, md_path, status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="small", choices=sorted(harness.SCALES))
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated benchmarks (default: all of harness.BENCHMARKS); the results file keeps the "
        "other benchmarks' records from its last run",
    )
    ap.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(harness.BENCHMARKS)
    for n in names:
        if n not in harness.BENCHMARKS:
            ap.error(f"unknown benchmark {n!r}; one of {', '.join(harness.BENCHMARKS)}")
    json_path, md_path, status = run_scale(args.scale, names, args.out, merge=bool(args.only))
    print()
    print(md_path.read_text())
    print(f"written: {json_path}, {md_path}")
    return 0 if all(s["returncode"] == 0 for s in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
