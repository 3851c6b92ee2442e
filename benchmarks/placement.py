"""Seed placement: METIS parts place each rank's seeds (placement='partition') vs random seeds.

    .venv/bin/python benchmarks/placement.py                     # Cora + a generated graph, 2 seeds
    .venv/bin/python benchmarks/placement.py --graphs cora --seeds 2

For each graph: canonical_graph -> normalized_adjacency -> metis_partitions (METIS, k parts)
-> minibatch_shards for W ranks twice, once per placement (same seed, fanouts, batch size)
-> training (`training.train`, one process reading the W streams: the same DDP-averaged
gradient as W processes). Printed per placement: the share of each step's gathered feature
rows (the minibatch's input nodes) that live in another rank's parts, mean and max over
steps and overall (the remote traffic a partition-per-machine feature store would serve);
and test accuracy (best-on-validation model, mean ± std over --seeds training seeds). The
random placement is the baseline, measured in the same run on the same parts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import harness  # noqa: E402  (benchmarks/harness.py)
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

GRAPHS = {
    # name: (shard settings, model, training)
    "cora": (
        {"fanouts": "10,10", "batch_size": 16, "epochs": 4},
        {"conv": "gcn", "hidden": 64, "num_layers": 2, "dropout": 0.5},
        {"epochs": 30, "feature_norm": "row", "optimizer": {"type": "Adam", "lr": 0.01, "weight_decay": 5e-4}},
    ),
    "generated": (
        {"fanouts": "10,5", "batch_size": 256, "epochs": 3},
        {"conv": "sage", "hidden": 64, "num_layers": 2, "dropout": 0.5},
        {"epochs": 3, "optimizer": {"type": "Adam", "lr": 0.003}},
    ),
}


def prepare(name: str, work: Path, parts: int, nodes: int) -> Path:
    from graphs.stages.canonical import CanonicalGraph, build_canonical_graph
    from graphs.stages.normalize import Adjacency, build_normalized_adjacency
    from graphs.stages.partition import PartitionConfig, Partitions, build_partitions

    home = work / name
    if name == "cora":
        landing = ROOT / "datasets" / "cora"
    else:
        from graphs.synthetic.generate import GenerateConfig, generate_dataset

        landing = home / "landing"
        if not landing.exists():
            cfg = GenerateConfig(num_nodes=nodes, num_edges=8 * nodes, feature_dim=32, num_classes=8)
            generate_dataset(cfg, landing, progress=False)
    if not (home / "canonical_graph" / CanonicalGraph.SUMMARY).exists():
        build_canonical_graph(landing, home / "canonical_graph")
    if not (home / "normalized_adjacency" / Adjacency.SUMMARY).exists():
        build_normalized_adjacency(home / "canonical_graph", home / "normalized_adjacency")
    part = home / f"metis_partitions-k{parts}"
    if not (part / Partitions.SUMMARY).exists():
        build_partitions(home / "canonical_graph", part, PartitionConfig(num_parts=parts, write_distdgl=False))
    return home


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default="cora,generated")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--parts", type=int, default=0, help="METIS parts k (0 = world size)")
    ap.add_argument("--nodes", type=int, default=10000, help="nodes of the generated graph (8 edges per node)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--work", default="bench_out/placement")
    ap.add_argument("--record", help="append result records here (benchmarks/harness.py)")
    args = ap.parse_args()

    from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
    from training.config import RunConfig
    from training.train import train

    work = Path(args.work).resolve()
    w, k = args.world_size, args.parts or args.world_size
    rows = []
    for name in args.graphs.split(","):
        shard_kw, model, training = GRAPHS[name]
        home = prepare(name, work, k, args.nodes)
        part = home / f"metis_partitions-k{k}"
        inputs = load_shard_inputs(home / "canonical_graph", home / "normalized_adjacency", part)
        accs = {}
        for placement in ("random", "partition"):
            out = home / f"shards-w{w}-k{k}-{placement}"
            t = time.perf_counter()
            m = write_minibatch_shards(inputs, out, ShardConfig(world_size=w, placement=placement, **shard_kw))
            sample_s = time.perf_counter() - t
            accs[placement] = []
            for seed in range(args.seeds):
                cfg = RunConfig.from_dict(
                    {
                        "model": model,
                        "training": {**training, "seed": seed, "profiler": "none"},
                        "paths": {"shards": str(out), "out": str(home / "runs" / f"{placement}-seed{seed}")},
                    }
                )
                accs[placement].append(float(train(cfg)["test_acc_at_best_val"]))
            p = m["placement"]
            rows.append(
                (
                    name,
                    inputs.n,
                    placement,
                    m["minibatches_per_epoch_per_rank"],
                    p["remote_row_share_mean"],
                    p["remote_row_share_max"],
                    p["remote_row_share_total"],
                    accs[placement],
                    sample_s,
                )
            )
            print(
                f"{name} {placement}: remote share {p['remote_row_share_mean']:.3f}, acc {accs[placement]}", flush=True
            )
        rows.append((name, None, "partition - random", None, None, None, None, accs, None))

    print(f"\nW = {w} ranks, k = {k} METIS parts, {args.seeds} training seeds; shared 2-core machine\n")
    print("| graph | nodes | placement | steps/epoch/rank | remote rows per step (mean) | max | overall | test acc |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, n, placement, steps, mean, mx, total, acc, _ in rows:
        if n is None:
            diff = 100 * (np.mean(acc["partition"]) - np.mean(acc["random"]))
            print(f"| {name} | | {placement} | | | | | {diff:+.2f} points |")
            continue
        a = 100 * np.asarray(acc)
        print(
            f"| {name} | {n} | {placement} | {steps} | {mean:.3f} | {mx:.3f} | {total:.3f} | "
            f"{a.mean():.2f} ± {a.std():.2f} |"
        )
    (work / "results.json").write_text(json.dumps([list(map(str, r)) for r in rows], indent=1))
    records = []
    for name in args.graphs.split(","):
        by = {r[2]: r for r in rows if r[0] == name}
        rand, part = by["random"], by["partition"]
        common = {"benchmark": "placement", "nodes": part[1], "peer_name": "random placement"}
        records += [
            harness.Record(
                **common,
                stage=f"{name}: remote feature rows per step, seeds by METIS part (W = {w}, k = {k})",
                metric="remote row share",
                ours=part[6],
                peer=rand[6],
            ),
            harness.Record(
                **common,
                stage=f"{name}: test accuracy, seeds by METIS part (W = {w}, k = {k})",
                metric=f"test accuracy % (mean of {args.seeds} seeds)",
                ours=100 * float(np.mean(part[7])),
                peer=100 * float(np.mean(rand[7])),
            ),
        ]
    harness.emit(args.record, records)


if __name__ == "__main__":
    main()
