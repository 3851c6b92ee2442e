"""Shared steps of the technique benchmarks (benchmarks/techniques_*.py): the pipeline's own
functions (canonical_graph -> normalized_adjacency -> metis_partitions -> minibatch_shards ->
training), cached under a work folder, and one training run per spawned child so that its
peak RSS is its own (`_child.run_in_child`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402  (benchmarks/harness.py)
import numpy as np  # noqa: E402
from _child import run_in_child  # noqa: E402  (benchmarks/_child.py)
from accuracy import build as build_graph  # noqa: E402  (canonical_graph and normalized_adjacency, cached)

DATASETS = ROOT / "datasets"  # Cora, CiteSeer in the landing layout (datasets/README.md)


def build(landing: Path, home: Path, partitions: bool = False) -> dict:
    """canonical_graph, normalized_adjacency (`accuracy.build`) and metis_partitions' clusters of
    `landing`, once."""
    can, adj = build_graph(landing, home)
    from graphs.stages.partition import PartitionConfig, Partitions, build_partitions

    part = home / "metis_partitions"
    if partitions and not (part / Partitions.CLUSTER_ID).exists():
        build_partitions(can, part, PartitionConfig(num_parts=4, clusters_per_part=32, write_distdgl=False))
    return {"canonical": can, "adjacency": adj, "partitions": part if partitions else None, "home": home}


def generated(landing: Path, **cfg) -> Path:
    """A generated dataset (`graphs.synthetic.generate`) written once into `landing`."""
    from graphs.synthetic.generate import GenerateConfig, generate_dataset

    if not (landing / "nodes.parquet").exists():
        generate_dataset(GenerateConfig(**cfg), landing, progress=False)
    return landing


def shards(graph: dict, name: str, node_scores: Path | None = None, **cfg) -> tuple[Path, dict]:
    """minibatch_shards with ShardConfig(**cfg) into <home>/<name>, once; (folder, manifest)."""
    from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards

    out = graph["home"] / name
    if not harness.shards_current(out):
        inputs = load_shard_inputs(graph["canonical"], graph["adjacency"], graph["partitions"], node_scores=node_scores)
        write_minibatch_shards(inputs, out, ShardConfig(**cfg))
    return out, json.loads((out / "manifest.json").read_text())


def _train_child(cfg: dict, canonical: str, q) -> None:
    # one intra-op thread (torch and DGL's OpenMP): on a machine shared by many jobs, threads
    # spinning for a core they do not get made every step ~10x slower, for both arms alike
    os.environ["OMP_NUM_THREADS"] = "1"
    import pyarrow.parquet as pq
    import torch

    torch.set_num_threads(1)

    from graphs.infra.storage import peak_rss_bytes
    from graphs.stages.canonical import CanonicalGraph
    from training.config import RunConfig
    from training.metrics import node_classification_report
    from training.outputs import METRICS, PREDICTIONS
    from training.train import train

    summary = train(RunConfig.from_dict(cfg))
    out = Path(cfg["paths"]["out"])
    hist = pq.read_table(out / METRICS).to_pandas()
    hist = hist[hist["rank"] == 0]
    report = None
    if canonical:
        nodes = pq.read_table(CanonicalGraph.open(canonical).nodes_path)
        report = node_classification_report(nodes, pq.read_table(out / PREDICTIONS))
    q.put(
        {
            "peak_rss_mb": peak_rss_bytes() / 2**20,
            "summary": summary,
            "val_acc": [float(v) for v in hist["val_acc"]],
            "train_seconds": [float(v) for v in hist["train_seconds"]],
            "report": report,
        }
    )


def train_run(shard_dir: Path, out: Path, model: dict, training: dict, canonical: Path | None = None) -> dict:
    """One training run in a fresh child: {peak_rss_mb (`graphs.infra.storage.peak_rss_bytes`), summary, val_acc per epoch,
    train_seconds per epoch, report (training.metrics.node_classification_report of the test
    split, when `canonical`)}."""
    from training.outputs import SUMMARY

    cfg = {
        "model": model,
        "training": {"profiler": "none", "checkpoint_every": 100_000, **training},  # no per-epoch checkpoint I/O
        "paths": {"shards": str(shard_dir), "out": str(out)},
    }
    done = out.parent / f"{out.name}.result.json"  # a finished run of the same config is reused
    if done.is_file() and (out / SUMMARY).is_file():
        cached = json.loads(done.read_text())
        if cached.get("config") == cfg:
            return cached["result"]
    result = run_in_child(_train_child, cfg, str(canonical) if canonical is not None else "")
    done.write_text(json.dumps({"config": cfg, "result": result}))
    return result


def seconds_to_target(val_acc: list[float], train_seconds: list[float], target: float) -> tuple[float, int]:
    """(training seconds, epochs) until the first epoch whose validation accuracy reaches
    `target` (evaluation time excluded); (inf, 0) when never reached."""
    acc = np.asarray(val_acc, dtype=np.float64)
    hit = np.flatnonzero(acc >= target)
    if hit.size == 0:
        return float("inf"), 0
    e = int(hit[0])
    return float(np.sum(train_seconds[: e + 1])), e + 1
