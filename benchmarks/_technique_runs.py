"""Shared steps of the issue-14b technique benchmarks (techniques_compensation, _comm, _memory,
_depth): the pipeline's own functions (canonical_graph -> normalized_adjacency ->
minibatch_shards -> training) cached under a work folder, one training run per spawned child
(its peak RSS its own), and the figures a row needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _child import run_in_child  # noqa: E402  (benchmarks/_child.py)
from accuracy import build, shards  # noqa: E402, F401  (the cached pipeline steps of benchmarks/accuracy.py)

DATASETS = ROOT / "datasets"  # Cora, CiteSeer in the landing layout (datasets/README.md)


def generated(landing: Path, **cfg) -> Path:
    """A generated dataset (`graphs.generate`) written once into `landing`."""
    from graphs.generate import GenerateConfig, generate_dataset

    if not (landing / "nodes.parquet").exists():
        generate_dataset(GenerateConfig(**cfg), landing, progress=False)
    return landing


def _train_child(cfg: dict, q) -> None:
    import torch

    torch.set_num_threads(int(os.environ.get("GNNFLOW_BENCH_THREADS", "1")))
    from training.config import RunConfig
    from training.train import train

    q.put(train(RunConfig.from_dict(cfg)))


def run_config(shard_dir: Path, out: Path, model: dict, training: dict) -> dict:
    return {
        "model": model,
        "training": {"profiler": "none", "checkpoint_every": 1000, **training},
        "paths": {"shards": str(shard_dir), "out": str(out)},
    }


def train_child(shard_dir: Path, out: Path, model: dict, training: dict) -> dict:
    """One single-process training run in a fresh child; its summary (peak_memory_mb = the child's peak RSS)."""
    return run_in_child(_train_child, run_config(shard_dir, out, model, training))


def train_torchrun(shard_dir: Path, out: Path, model: dict, training: dict, nproc: int = 2) -> dict:
    """One DDP run (`torchrun --standalone`, gloo on CPU); rank 0's summary."""
    from training.config import RunConfig

    out.parent.mkdir(parents=True, exist_ok=True)
    run_yaml = out.parent / f"{out.name}.yaml"
    RunConfig.from_dict(run_config(shard_dir, out, model, training)).to_yaml(run_yaml)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [str(torchrun), "--standalone", f"--nproc-per-node={nproc}", "-m", "training", "--config", str(run_yaml)]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())


def seeds_of(args, default: int) -> int:
    return int(getattr(args, "seeds", 0) or default)


def mean(values) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def verdict(on: list[float], off: list[float]) -> str:
    """'helps' / 'hurts' when the mean accuracy difference exceeds twice its standard error
    over seeds (Welch), else 'no measurable effect'; one seed per side: the difference only."""
    a, b = np.asarray(on, dtype=np.float64), np.asarray(off, dtype=np.float64)
    diff = 100 * (a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return f"{diff:+.2f} points (single seed)"
    se = 100 * float(np.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size))
    if abs(diff) <= 2 * se:
        return f"no measurable effect ({diff:+.2f} points, 2 SE = {2 * se:.2f})"
    return f"{'helps' if diff > 0 else 'hurts'} ({diff:+.2f} points, 2 SE = {2 * se:.2f})"


def markdown(rows: list[dict]) -> str:
    """The rows as the issue-14 table (benchmarks/techniques.py prints the same columns)."""

    def acc(v):
        if isinstance(v, str):
            return v
        if isinstance(v, (list, tuple)):
            a = np.asarray(v, dtype=np.float64)
            std = a.std(ddof=1) if a.size > 1 else 0.0
            return f"{100 * a.mean():.2f} ± {100 * std:.2f} (n={a.size})"
        return "-" if v is None else f"{100 * v:.2f}"

    def num(v, d):
        return "-" if v is None else (v if isinstance(v, str) else f"{v:.{d}f}")

    cols = ["technique", "dataset", "metric", "on", "off", "time on (s)", "time off (s)", "peak MB on", "peak MB off"]
    lines = ["| " + " | ".join(cols + ["verdict"]) + " |", "|" + " --- |" * (len(cols) + 1)]
    notes = []
    for r in rows:
        cells = [r["technique"], r["dataset"], r.get("metric", "test acc"), acc(r["acc_on"]), acc(r["acc_off"])]
        cells += [num(r["time_on"], 2), num(r["time_off"], 2), num(r["mem_on"], 0), num(r["mem_off"], 0)]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells + [r["verdict"]]) + " |")
        if r.get("notes"):
            notes.append(f"- {r['technique']} / {r['dataset']}: {r['notes']}")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"
