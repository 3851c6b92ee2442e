"""The memory-wall run: the whole pipeline on a graph whose float32 feature matrix, the copy
training reads, cannot stay in the memory the run may hold.

    make bench SCALE=wall          # = .venv/bin/python benchmarks/pipeline_run.py --preset memory-wall
    .venv/bin/python benchmarks/memory_wall.py --table      # the tables of BENCHMARKS.md, from the results

As root on Linux (the wall is a memory cgroup). Steps:

1. **Data**: a generated power-law graph (default 8M nodes, 80M edge rows, 256 float32 features:
   8.2 GB; 1 % training nodes) in ``ROOT/landing/wall`` unless it is there, with the dataset settings
   `SETTINGS` (no DistDGL export, to fit the disk; one rank; a 10 % feature cache; streamed evaluation).
2. **The wall**: a memory cgroup whose limit (``--limit-gib``, default 6) is at most 0.8x the float32
   feature matrix, so the matrix is at least 1.25x the limit. Set by hand it is

       mkdir /sys/fs/cgroup/memory/gnnflow-memory-wall                                   # cgroup v1
       echo 6442450944 > /sys/fs/cgroup/memory/gnnflow-memory-wall/memory.limit_in_bytes
       echo 6442450944 > /sys/fs/cgroup/memory/gnnflow-memory-wall/memory.memsw.limit_in_bytes
       mkdir /sys/fs/cgroup/gnnflow-memory-wall                                          # cgroup v2
       echo 6442450944 > /sys/fs/cgroup/gnnflow-memory-wall/memory.max
       echo 0 > /sys/fs/cgroup/gnnflow-memory-wall/memory.swap.max

   (or ``systemd-run --scope -p MemoryMax=6G -p MemorySwapMax=0 COMMAND``). Each limited stage's
   command writes its pid into the group's ``cgroup.procs`` before it starts, so Dagster, the step
   process and torchrun's workers all run inside (a child stays in its parent's group). Page cache
   is charged to the group, so the feature file cannot stay cached: the stages that hold
   features run inside (`LIMITED`: canonical_graph, compressed_graph, trained_model), those that
   read only the graph's structure outside. Before each limited stage the feature files are
   dropped from the page cache (``posix_fadvise(DONTNEED)``), so no page cached outside the wall
   serves it. Full-graph inference is the exception: streamed in row chunks
   (`training.evaluate.StreamingEval`), each chunk gathers its rows' neighbours at random from a
   float32 copy of the input as large as the features, so inside the wall every chunk would read
   most of that copy from disk again. trained_model's final evaluation therefore runs with the
   limit lifted to the machine's memory (`LiftAfterTraining`: from the moment it starts writing
   its input; the training's own counters are kept), and the evaluation stage runs outside.
3. **Per stage** (`benchmarks/pipeline_run.py`'s record): seconds, peak RSS, and for a limited
   stage the group's peak charge (RSS and page cache: ``memory.max_usage_in_bytes`` or
   ``memory.peak``) and how often the charge hit the limit.
4. **Per training epoch** (the run's metrics and summary): seconds, bytes its ranks read from disk
   (``/proc/self/io``), the share of the epoch waiting for data, the feature cache's hit rate and
   the runs of file pages its misses read.
5. **The disk's rate for the same reads**: the feature file read with ``O_DIRECT`` (no page cache),
   as many runs of pages of the epochs' mean run length at random page offsets as one of rank
   0's epochs read (at most ``--io-seconds`` of them), by ``--io-threads`` threads (the kernel's read-ahead keeps many reads in flight
   too). An epoch bound by nothing but the disk takes (its bytes read) / (that rate): the
   ``disk bound`` column, beside the epoch's own seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import mmap
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline_run  # noqa: E402  (benchmarks/pipeline_run.py)

REPO = pipeline_run.REPO
RESULTS = REPO / "benchmarks" / "results" / "memory_wall.json"
DATASET = "wall"
GROUP = "gnnflow-memory-wall"
LIMITED = ("canonical_graph", "compressed_graph", "trained_model")
MAX_LIMIT_SHARE = 0.8  # the limit is at most this share of the float32 feature matrix
SETTINGS = """\
# The memory-wall run (benchmarks/memory_wall.py): no DistDGL export (the disk), one rank (Dagster's
# processes and each rank's feature cache are anonymous memory inside the wall), one sampled epoch
# replayed, a 10 % degree-ordered feature cache, evaluation after the last epoch, streamed in chunks of
# 20,000 rows (a chunk holds the features of all its rows' neighbours: ~0.5 GB here).
ops:
  metis_partitions: {config: {write_distdgl: false}}
  minibatch_shards: {config: {epochs: 1, world_size: 1}}
  trained_model: {config: {training: {epochs: EPOCHS, eval_every: EPOCHS, feature_cache: 0.1, eval_batch_size: 20000}}}
"""
_PAGE = 4096


# ------------------------------------------------------------------------------- the wall


class MemoryGroup:
    """A memory cgroup with a hard limit and no swap (v1 or v2, whichever holds the memory
    controller); `enter` is what a child runs before its command (`preexec_fn`)."""

    def __init__(self, limit: int, name: str = GROUP):
        v1 = Path("/sys/fs/cgroup/memory")
        v2 = next((p for p in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")) if _has_memory_v2(p)), None)
        if v1.is_dir() and (v1 / "cgroup.procs").exists():
            self.path, self.v2 = v1 / name, False
        elif v2 is not None:
            self.path, self.v2 = v2 / name, True
        else:
            raise SystemExit("no memory cgroup hierarchy under /sys/fs/cgroup: the wall needs Linux cgroups")
        try:
            self.path.mkdir(exist_ok=True)
            self.set_limit(limit)
        except PermissionError:
            raise SystemExit(f"cannot create or limit {self.path}: run the memory wall as root") from None
        self.limit = limit
        self._procs = str(self.path / "cgroup.procs")

    def set_limit(self, limit: int) -> None:
        """The group's hard limit, with no swap beyond it."""
        if self.v2:
            (self.path / "memory.max").write_text(str(limit))
            _write_if_there(self.path / "memory.swap.max", "0")
            return
        # v1 keeps memory + swap >= memory: the order depends on which way the limit moves
        files = [self.path / "memory.limit_in_bytes", self.path / "memory.memsw.limit_in_bytes"]
        if int(files[0].read_text()) < limit:
            files.reverse()
        for f in files:
            _write_if_there(f, str(limit))

    def enter(self) -> None:
        with open(self._procs, "w") as f:
            f.write(str(os.getpid()))

    def reset_peak(self) -> None:
        if not self.v2:
            (self.path / "memory.max_usage_in_bytes").write_text("0")
            (self.path / "memory.failcnt").write_text("0")

    def counters(self) -> dict:
        """The group's peak charge since `reset_peak` (v2 kernels without a reset: since it was
        made), the times its charge reached the limit, and the processes its OOM killer killed."""
        if self.v2:
            events = dict(line.split() for line in (self.path / "memory.events").read_text().splitlines())
            peak = self.path / "memory.peak"
            return {
                "group_peak_bytes": int(peak.read_text()) if peak.exists() else None,
                "limit_hits": int(events.get("max", 0)),
                "oom_kills": int(events.get("oom_kill", 0)),
            }
        oom = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
        return {
            "group_peak_bytes": int((self.path / "memory.max_usage_in_bytes").read_text()),
            "limit_hits": int((self.path / "memory.failcnt").read_text()),
            "oom_kills": int(oom.get("oom_kill", 0)),
        }


def _has_memory_v2(root: Path) -> bool:
    controllers = root / "cgroup.controllers"
    return controllers.is_file() and "memory" in controllers.read_text().split()


def _write_if_there(path: Path, value: str) -> None:
    if path.exists():
        path.write_text(value)


def drop_cached(paths: list[Path]) -> None:
    """Drop `paths` from the page cache (`graphs.infra.storage.drop_page_cache`)."""
    from graphs.infra.storage import drop_page_cache

    for path in paths:
        drop_page_cache(path)


# ---------------------------------------------------------------------------- the disk


def direct_read_rate(path: Path, runs: int, pages_per_run: int, threads: int, seconds: float, seed: int = 0) -> dict:
    """Bytes per second of `runs` O_DIRECT reads of `pages_per_run` pages at random page offsets
    of `path` (stopped after `seconds`), by `threads` threads."""
    size = path.stat().st_size
    span = max(1, size // _PAGE - pages_per_run)
    offsets = np.random.default_rng(seed).integers(0, span, size=runs) * _PAGE
    length = pages_per_run * _PAGE
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    done = [0] * threads
    deadline = time.perf_counter() + seconds

    def reader(k: int) -> None:
        buf = mmap.mmap(-1, length)  # page-aligned, as O_DIRECT needs
        for off in offsets[k::threads].tolist():
            done[k] += os.preadv(fd, [buf], off)
            if time.perf_counter() > deadline:
                return

    t0 = time.perf_counter()
    try:
        workers = [threading.Thread(target=reader, args=(k,)) for k in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - t0
    return {"bytes": sum(done), "seconds": elapsed, "bytes_per_s": sum(done) / elapsed, "pages_per_run": pages_per_run}


# ------------------------------------------------------------------------------- the run


def prepare(root: Path, args) -> Path:
    """ROOT/landing/wall, generated unless there at these sizes, with its settings."""
    landing = root / "landing" / DATASET
    wanted = {"nodes": args.nodes, "edges": args.edges, "feature_dim": args.feature_dim}
    made = root / "generated.json"
    if made.is_file() and json.loads(made.read_text()) != wanted:  # another size: its outputs go too
        shutil.rmtree(landing, ignore_errors=True)
        shutil.rmtree(root / "home" / DATASET, ignore_errors=True)
    if not (landing / "nodes.parquet").is_file() or not made.is_file():
        shutil.rmtree(landing, ignore_errors=True)
        cmd = [str(Path(sys.executable).with_name("gnnflow")), "generate", "--quiet", "--out", str(landing)]
        cmd += ["--num-nodes", str(args.nodes), "--num-edges", str(args.edges), "--feature-dim", str(args.feature_dim)]
        cmd += ["--num-edge-files", "8", "--train-fraction", "0.01", "--val-fraction", "0.01"]
        t = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, check=True)
        print(f"generate: {time.perf_counter() - t:.1f} s", flush=True)
        made.write_text(json.dumps(wanted))
    (landing / "gnnflow.yaml").write_text(SETTINGS.replace("EPOCHS", str(args.epochs)))
    return landing


def feature_files(root: Path) -> list[Path]:
    """The feature files of the landing dataset and of canonical_graph, where they exist."""
    from graphs.stages.canonical import CanonicalGraph

    found = sorted((root / "landing" / DATASET).glob("features*"))
    can = root / "home" / DATASET / "canonical_graph"
    if can.is_dir():
        found.append(CanonicalGraph.open(can).features_path)
    return [p for p in found if p.is_file()]


def check_wall(nodes: int, feature_dim: int, limit: int) -> int:
    """The float32 feature matrix's bytes, once the limit is at most `MAX_LIMIT_SHARE` of them."""
    matrix = nodes * feature_dim * 4
    if limit > MAX_LIMIT_SHARE * matrix:
        raise SystemExit(
            f"--limit-gib {limit / 2**30:.2f} is {limit / matrix:.2f}x the {matrix / 2**30:.2f} GiB float32 "
            f"feature matrix: the wall needs at most {MAX_LIMIT_SHARE}x (more nodes or features, or a lower limit)"
        )
    return matrix


def run_stages(root: Path, group: MemoryGroup, stages: list[str]) -> list[dict]:
    """Every stage through pipeline_run, the limited ones inside the group; stops at a failure."""
    log_dir = root / "logs" / DATASET
    log_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for stage in stages:
        limited = stage in LIMITED
        if limited:
            drop_cached(feature_files(root))
            group.reset_peak()
            kills_before = group.counters()["oom_kills"]
        lift = LiftAfterTraining(group, root / "home" / DATASET) if stage == "trained_model" else None
        record = pipeline_run.run_stage(stage, DATASET, root, log_dir, preexec_fn=group.enter if limited else None)
        record["in_wall"] = limited
        if limited:
            record.update(group.counters())
            record["oom_kills"] -= kills_before
        if lift is not None:
            record.update(lift.stop())
            if "training_oom_kills" in record:  # the kernel's count is the group's since it was made
                record["training_oom_kills"] -= kills_before
            group.set_limit(group.limit)
        records.append(record)
        peak = pipeline_run._peak(record) / 2**30
        wall = f", group peak {record['group_peak_bytes'] / 2**30:.2f} GiB" if record.get("group_peak_bytes") else ""
        print(f"{stage}: rc {record['rc']}, {record['command_s']:.1f} s, peak RSS {peak:.2f} GiB{wall}", flush=True)
        if record["rc"] != 0:
            print(f"{stage} failed: see {record['log']}", file=sys.stderr)
            break
    return records


class LiftAfterTraining:
    """Watches trained_model's work folders; once the final evaluation starts writing its input
    (``eval/input.npy``: `training.evaluate.StreamingEval`; the settings evaluate after the last
    epoch only), keeps the group's counters as the training's own and lifts the limit to the
    machine's memory for that evaluation (module docstring: inside the wall, streamed full-graph
    inference reads every node's neighbourhood at random)."""

    def __init__(self, group: MemoryGroup, home: Path):
        self.group, self.home, self.found = group, home, {}
        self.started = time.time()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _evaluating(self) -> bool:
        return any(p.stat().st_mtime >= self.started for p in self.home.glob(".trained_model.work-*/eval/input.npy"))

    def _watch(self) -> None:
        while not self._done.wait(0.5):
            if self._evaluating():
                self.found = {"training_" + k: v for k, v in self.group.counters().items()}
                self.group.set_limit(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
                self.found["limit_lifted_after_s"] = round(time.time() - self.started, 1)
                return

    def stop(self) -> dict:
        self._done.set()
        self._thread.join()
        return self.found


def merged_stages(out: Path, result: dict, ran: list[dict]) -> list[dict]:
    """`ran`, after the other stages' records of an earlier run of the same sizes and limit in `out`
    (a run of some stages, e.g. ``--stages trained_model,evaluation``, keeps the rest), in stage order."""
    same = ("nodes", "edge_rows", "feature_bytes", "limit_bytes")
    earlier = json.loads(out.read_text()) if out.is_file() else {}
    by_stage = (
        {r["stage"]: r for r in earlier.get("stages", [])} if all(earlier.get(k) == result[k] for k in same) else {}
    )
    by_stage |= {r["stage"]: r for r in ran}
    return [by_stage[s] for s in pipeline_run.STAGES if s in by_stage]


def epochs_and_disk(root: Path, args) -> dict:
    """trained_model's per-epoch figures and the O_DIRECT rate of the same reads."""
    import pyarrow.parquet as pq

    from graphs.stages.canonical import CanonicalGraph
    from training.outputs import METRICS, SUMMARY

    model = root / "home" / DATASET / "trained_model"
    summary = json.loads((model / SUMMARY).read_text())
    metrics = pq.read_table(model / METRICS).to_pandas()
    per_epoch = (
        metrics.groupby("epoch")
        .agg(
            train_seconds=("train_seconds", "max"),
            disk_read_bytes=("disk_read_bytes", "sum"),
            data_wait_share=("data_wait_share", "mean"),
            val_acc=("val_acc", "max"),
        )
        .reset_index()
    )
    epochs = max(1, int(summary["epochs_trained"]))
    runs, pages = summary.get("feature_cold_page_runs", 0), summary.get("feature_cold_pages", 0)
    run_pages = max(1, round(pages / runs)) if runs else 1
    features = CanonicalGraph.open(root / "home" / DATASET / "canonical_graph").features_path
    disk = direct_read_rate(features, max(1, runs // epochs), run_pages, args.io_threads, args.io_seconds)
    per_epoch["disk_bound_seconds"] = per_epoch["disk_read_bytes"] / disk["bytes_per_s"]
    return {
        "epochs": per_epoch.to_dict(orient="records"),
        "disk": disk | {"threads": args.io_threads, "file_bytes": features.stat().st_size},
        "summary": {
            k: summary.get(k)
            for k in (
                "final_test_acc",
                "best_val_acc",
                "feature_cache_rows",
                "feature_cache_hit_rate",
                "feature_cold_rows",
                "feature_cold_page_runs",
                "feature_cold_pages",
                "peak_memory_mb",
                "world_size",
                "nodes",
            )
        },
    }


def tables(result: dict) -> str:
    """The stage table and the epoch table, Markdown."""
    lines = [
        "| stage | in the wall | step s | command s | peak RSS GiB | group peak GiB | limit hits | OOM kills |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["stages"]:
        step = f"{r['asset_s']:.1f}" if r.get("asset_s") is not None else "—"
        c = {k[len("training_") :]: v for k, v in r.items() if k.startswith("training_")} or r  # lifted: training's
        group = f"{c['group_peak_bytes'] / 2**30:.2f}" if c.get("group_peak_bytes") else "—"
        hits, kills = (str(c.get(k, "—")) if r["in_wall"] else "—" for k in ("limit_hits", "oom_kills"))
        failed = "" if r["rc"] == 0 else f" (failed, rc {r['rc']})"
        inside = "training only" if "limit_lifted_after_s" in r else "yes" if r["in_wall"] else "no"
        lines.append(
            f"| {r['stage']}{failed} | {inside} | {step} | {r['command_s']:.1f} | "
            f"{pipeline_run._peak(r) / 2**30:.2f} | {group} | {hits} | {kills} |"
        )
    if "training" not in result:
        return "\n".join(lines)
    t, disk = result["training"], result["training"]["disk"]
    lines += [
        "",
        "| epoch | seconds | read from disk GB | GB/s | waiting for data | disk bound s | seconds / disk bound |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in t["epochs"]:
        gb = e["disk_read_bytes"] / 1e9
        lines.append(
            f"| {int(e['epoch'])} | {e['train_seconds']:.1f} | {gb:.2f} | {gb / e['train_seconds']:.3f} | "
            f"{e['data_wait_share']:.0%} | {e['disk_bound_seconds']:.1f} | "
            f"{e['train_seconds'] / e['disk_bound_seconds']:.2f} |"
        )
    s = t["summary"]
    lines += [
        "",
        f"O_DIRECT reads of the feature file ({disk['file_bytes'] / 1e9:.2f} GB), {disk['pages_per_run']} page(s) "
        f"per read at random offsets, {disk['threads']} threads: {disk['bytes_per_s'] / 1e9:.3f} GB/s "
        f"({disk['bytes'] / 1e9:.2f} GB in {disk['seconds']:.1f} s). Feature cache: {s['feature_cache_rows']:,} rows, "
        f"hit rate {s['feature_cache_hit_rate']:.3f}; test accuracy {s['final_test_acc']:.4f}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=REPO / "bench_out" / "memory_wall")
    ap.add_argument("--nodes", type=int, default=8_000_000)
    ap.add_argument("--edges", type=int, default=80_000_000, help="edge rows generated")
    ap.add_argument("--feature-dim", type=int, default=256)
    ap.add_argument("--limit-gib", type=float, default=6.0, help="the memory cgroup's limit")
    ap.add_argument("--epochs", type=int, default=3, help="training epochs (one sampled epoch, replayed)")
    ap.add_argument("--stages", default=",".join(pipeline_run.STAGES), help="comma-separated, in order")
    ap.add_argument("--io-threads", type=int, default=32, help="threads of the O_DIRECT reads")
    ap.add_argument("--io-seconds", type=float, default=30.0, help="at most this long reading with O_DIRECT")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--table", action="store_true", help="print --out's tables, run nothing")
    args = ap.parse_args(argv)
    if args.table:
        print(tables(json.loads(args.out.read_text())))
        return 0
    limit = int(args.limit_gib * 2**30)
    matrix = check_wall(args.nodes, args.feature_dim, limit)
    root = args.root.resolve()
    group = MemoryGroup(limit)
    prepare(root, args)
    pipeline_run.prepare_home(root)
    result = {
        "machine": pipeline_run.machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "nodes": args.nodes,
        "edge_rows": args.edges,
        "feature_bytes": matrix,
        "limit_bytes": limit,
        "cgroup": str(group.path),
    }
    ran = run_stages(root, group, args.stages.split(","))
    result["stages"] = merged_stages(args.out, result, ran)
    if all(r["rc"] == 0 for r in result["stages"]) and any(r["stage"] == "trained_model" for r in ran):
        result["training"] = epochs_and_disk(root, args)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(tables(result), flush=True)
    return 0 if all(r["rc"] == 0 for r in result["stages"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
