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
from _child import run_in_child  # noqa: E402, F401  (benchmarks/_child.py)
from _techniques import generated  # noqa: E402, F401  (issue 14a's shared steps)
from accuracy import build, shards  # noqa: E402, F401  (the cached pipeline steps of benchmarks/accuracy.py)
from techniques import markdown_table as markdown  # noqa: E402, F401  (the harness's table and verdict)
from techniques import verdict  # noqa: E402, F401

DATASETS = ROOT / "datasets"  # Cora, CiteSeer in the landing layout (datasets/README.md)


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
    from training.outputs import SUMMARY

    out.parent.mkdir(parents=True, exist_ok=True)
    run_yaml = out.parent / f"{out.name}.yaml"
    RunConfig.from_dict(run_config(shard_dir, out, model, training)).to_yaml(run_yaml)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [str(torchrun), "--standalone", f"--nproc-per-node={nproc}", "-m", "training", "--config", str(run_yaml)]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((out / SUMMARY).read_text())


def seeds_of(args, default: int) -> int:
    return int(getattr(args, "seeds", 0) or default)


def mean(values) -> float:
    return float(np.mean(values)) if len(values) else float("nan")
