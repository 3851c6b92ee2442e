"""Cluster-GCN and GraphSAINT against neighbour sampling: accuracy, time per epoch, peak memory.

Rows of benchmarks/techniques.py (``--only subgraph``). A generated DC-SBM (``--nodes`` nodes,
default 100,000, and 10 edge rows per node; 8 classes, the generator's defaults otherwise;
``--quick``: 3,000 nodes), made canonical, normalized and METIS-partitioned (4 parts x 32
Cluster-GCN clusters) by the pipeline's functions. Three sets of shards (W = 1, 3 sampled
epochs), each trained with the default model (GraphSAGE-mean 2 x 256, whose aggregation applies
each sampler's correction) and the default budget (at least 400 optimizer steps, early
stopping; ``--quick``: 3 epochs), --seeds seeds (default 1), one child process per run:

- neighbour (off, the default sampler): fanouts 10,10, batch 1024 seeds;
- Cluster-GCN: ``samplers.cluster_gcn.clusters`` 8 of the 128 clusters per minibatch (the induced subgraph);
- GraphSAINT (node mode): 6,000-node subgraphs with the normalizations of `graphs.sampling`.

One epoch = one pass over the data (every training node a seed once; every cluster once;
n / subgraph-size subgraphs). Time = mean training seconds per epoch (evaluation excluded),
memory = the run's peak RSS (VmHWM of its own process; it includes torch and rank 0's
full-graph evaluation, the same for every sampler), accuracy = test accuracy of the best-on-validation
model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from _techniques import build, generated, shards, train_run
from techniques import verdict

SAMPLERS = {
    "neighbor": dict(sampler="neighbor", fanouts="10,10", batch_size=1024),
    "cluster_gcn": dict(sampler="cluster_gcn", fanouts="10,10", samplers={"cluster_gcn": {"clusters": 8}}),
    "saint": dict(sampler="saint", fanouts="10,10", samplers={"saint": {"mode": "node", "budget": 6000}}),
}


def _epochs(runs: list[dict]) -> str:
    return "/".join(str(r["summary"]["epochs_trained"]) for r in runs)


def _total(runs: list[dict]) -> float:
    return float(np.mean([sum(r["train_seconds"]) for r in runs]))


def rows(args) -> list[dict]:
    nodes = 3000 if args.quick else (args.nodes or 100_000)
    seeds = args.seeds or 1
    epochs = 3 if args.quick else 0  # 0: the default budget (>= 400 optimizer steps, early stopping)
    name = f"generated-{nodes}"
    landing = generated(
        Path(args.work) / "subgraph" / f"landing-{name}", num_nodes=nodes, num_edges=10 * nodes, num_edge_files=1
    )
    graph = build(landing, Path(args.work) / "subgraph" / name, partitions=True)
    results, steps = {}, {}
    for label, cfg in SAMPLERS.items():
        extra = {}
        if label == "saint":  # at most a fifth of the graph per subgraph
            extra = {"samplers": {"saint": {"mode": "node", "budget": min(6000, nodes // 5)}}}
        shard_dir, manifest = shards(graph, f"shards-{label}", world_size=1, epochs=3, **{**cfg, **extra})
        results[label], steps[label] = [], manifest["minibatches_per_epoch_per_rank"]
        for seed in range(seeds):
            run = train_run(
                shard_dir,
                graph["home"] / "runs" / f"{label}-{seed}",
                {},
                {"epochs": epochs, "seed": seed},
            )
            results[label].append(run)
            s = run["summary"]
            print(
                f"  subgraph {label} seed {seed}: test {s['test_acc_at_best_val']:.4f}, "
                f"{s['mean_train_seconds']:.2f} s/epoch x {s['epochs_trained']}, peak {run['peak_rss_mb']:.0f} MB, "
                f"{manifest['minibatches_per_epoch_per_rank']} minibatches/epoch",
                flush=True,
            )
    off = results["neighbor"]
    out = []
    for label in ("cluster_gcn", "saint"):
        on = results[label]
        t_on = float(np.mean([r["summary"]["mean_train_seconds"] for r in on]))
        t_off = float(np.mean([r["summary"]["mean_train_seconds"] for r in off]))
        acc_on = [r["summary"]["test_acc_at_best_val"] for r in on]
        acc_off = [r["summary"]["test_acc_at_best_val"] for r in off]
        out.append(
            {
                "technique": f"{'Cluster-GCN' if label == 'cluster_gcn' else 'GraphSAINT (node)'} vs neighbour sampling",
                "dataset": name,
                "acc_on": acc_on,
                "acc_off": acc_off,
                "time_on": t_on,
                "time_off": t_off,
                "mem_on": max(r["peak_rss_mb"] for r in on),
                "mem_off": max(r["peak_rss_mb"] for r in off),
                "verdict": f"accuracy {verdict(acc_on, acc_off)}; epoch time {t_on / t_off:.2f}x",
                "notes": f"time = training seconds per epoch (one pass over the data); {seeds} seed(s); epochs "
                f"trained {_epochs(on)} vs {_epochs(off)}, total training seconds {_total(on):.0f} vs {_total(off):.0f}; "
                f"minibatches per epoch {steps[label]} vs {steps['neighbor']}",
            }
        )
    return out
