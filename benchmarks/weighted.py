"""Weighted vs unweighted pipeline on a graph whose class signal lies in its heavy edges.

    .venv/bin/python benchmarks/weighted.py                       # 3 seeds
    .venv/bin/python benchmarks/weighted.py --nodes 20000 --edges 200000 --seeds 3

One DC-SBM graph (`graphs.synthetic.generate`, low homophily) is written three times, with the same
edge rows, nodes and features: without a weight column (the unweighted pipeline), with
``heavy_weight`` on intra-class rows and 1.0 on the others (the weighted pipeline: light
edges are heterophilous noise), and with every weight 1.0. Each goes through the
pipeline's own functions (canonical_graph -> normalized_adjacency -> minibatch_shards ->
training), and the test accuracy of the best-on-validation model is reported for every
training seed:

gcn   GCN (2 x 64) on full neighbourhoods (fanouts -1,-1, one minibatch of every
      training node: the full-batch GCN step over Â); weighted Â = D^-1/2 (A_w + I) D^-1/2.
sage  GraphSAGE (2 x 64) on sampled neighbourhoods (fanouts 10,5): unweighted with uniform
      sampling and the plain mean; weighted with ``samplers.neighbor.prob: weight`` and
      ``edge_weights`` (weighted mean over weight-proportional draws).

The all-ones graph is ingested with ``weight_combine="max"`` (duplicate and reverse rows
keep weight 1; 'sum' would give them 2 by design) and must give the unweighted pipeline's
Â bit for bit, hence the same shards and the same accuracies; the script checks both.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import harness  # noqa: E402  (benchmarks/harness.py)
import numpy as np  # noqa: E402

from benchmarks.accuracy import fmt, seeds_runs  # noqa: E402

GCN = {"conv": "gcn", "hidden": 64, "num_layers": 2, "dropout": 0.5}
SAGE = {"conv": "sage", "hidden": 64, "num_layers": 2, "dropout": 0.5}
GCN_TRAINING = {"epochs": 100, "profiler": "none", "optimizer": {"type": "Adam", "lr": 0.01, "weight_decay": 5e-4}}
SAGE_TRAINING = {"profiler": "none", "optimizer": {"type": "Adam", "lr": 0.005}}


def build(landing: Path, home: Path, combine: str = "sum") -> None:
    from graphs.stages.canonical import CanonicalConfig, build_canonical_graph
    from graphs.stages.normalize import Adjacency, build_normalized_adjacency

    if not (home / "normalized_adjacency" / Adjacency.SUMMARY).exists():
        build_canonical_graph(landing, home / "canonical_graph", CanonicalConfig(weight_combine=combine))
        build_normalized_adjacency(home / "canonical_graph", home / "normalized_adjacency")


def shards(home: Path, name: str, **cfg) -> Path:
    from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards

    out = home / name
    if not harness.shards_current(out):
        inputs = load_shard_inputs(home / "canonical_graph", home / "normalized_adjacency")
        write_minibatch_shards(inputs, out, ShardConfig(world_size=1, **cfg))
    return out


def digest(folder: Path, pattern: str) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob(pattern)):
        h.update(path.relative_to(folder).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=20_000)
    ap.add_argument("--edges", type=int, default=200_000)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--homophily", type=float, default=0.25)
    ap.add_argument("--heavy-weight", type=float, default=10.0)
    ap.add_argument("--feature-noise", type=float, default=1.5)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--parts", default="gcn,sage")
    ap.add_argument("--work", default="bench_out/weighted")
    ap.add_argument("--record", help="append result records here (benchmarks/harness.py)")
    args = ap.parse_args()

    from graphs.stages.canonical import CanonicalGraph
    from graphs.synthetic.generate import GenerateConfig, generate_dataset

    work = Path(args.work).resolve()
    base = GenerateConfig(
        num_nodes=args.nodes,
        num_edges=args.edges,
        num_classes=args.classes,
        homophily=args.homophily,
        feature_noise=args.feature_noise,
        num_edge_files=2,
    )
    graphs = {"unweighted": 0.0, "weighted": args.heavy_weight, "ones": 1.0}
    for name, heavy in graphs.items():
        landing = work / f"landing-{name}"
        if not landing.exists():
            generate_dataset(dataclasses.replace(base, heavy_weight=heavy), landing, progress=False)
        build(landing, work / name, combine="max" if name == "ones" else "sum")
    train_nodes = CanonicalGraph.open(work / "unweighted" / "canonical_graph").summary["train_nodes"]
    adj = {name: digest(work / name / "normalized_adjacency", "*.npy") for name in graphs}
    print(f"Â digests: {adj}; all-ones == unweighted: {adj['ones'] == adj['unweighted']}", flush=True)

    rows, results = [], {}
    parts = set(args.parts.split(","))
    if "gcn" in parts:
        for name in graphs:
            sh = shards(work / name, "shards-gcn", fanouts="-1,-1", batch_size=train_nodes, epochs=1)
            print(f"GCN, {name} graph", flush=True)
            results[f"gcn_{name}"] = seeds_runs(f"gcn-{name}", sh, work / "runs", GCN, GCN_TRAINING, args.seeds)
        same = digest(work / "ones" / "shards-gcn", "*.npz") == digest(work / "unweighted" / "shards-gcn", "*.npz")
        gap = 100 * (np.mean(results["gcn_weighted"]) - np.mean(results["gcn_unweighted"]))
        rows += [
            ("GCN unweighted", results["gcn_unweighted"], ""),
            ("GCN weighted", results["gcn_weighted"], f"{gap:+.2f} vs unweighted"),
            ("GCN all weights 1", results["gcn_ones"], f"shards identical to unweighted: {same}"),
        ]
    if "sage" in parts:
        plain = shards(work / "unweighted", "shards-sage", fanouts="10,5", batch_size=1024, epochs=5)
        weighted = shards(
            work / "weighted",
            "shards-sage-prob",
            fanouts="10,5",
            batch_size=1024,
            epochs=5,
            samplers={"neighbor": {"prob": "weight"}},
        )
        print("GraphSAGE, unweighted graph, uniform sampling, mean", flush=True)
        results["sage_unweighted"] = seeds_runs("sage-u", plain, work / "runs", SAGE, SAGE_TRAINING, args.seeds)
        print("GraphSAGE, weighted graph, weight-proportional sampling, weighted mean", flush=True)
        results["sage_weighted"] = seeds_runs(
            "sage-w", weighted, work / "runs", {**SAGE, "edge_weights": True}, SAGE_TRAINING, args.seeds
        )
        gap = 100 * (np.mean(results["sage_weighted"]) - np.mean(results["sage_unweighted"]))
        rows += [
            ("SAGE unweighted (uniform, mean)", results["sage_unweighted"], ""),
            ("SAGE weighted (prob, weighted mean)", results["sage_weighted"], f"{gap:+.2f} vs unweighted"),
        ]

    print(
        f"\n{args.nodes} nodes, {args.edges} edge rows, {args.classes} classes, homophily {args.homophily} "
        f"(intra-class rows weigh {args.heavy_weight}, others 1), feature noise {args.feature_noise}"
    )
    print(f"{'':38s} {'runs':>4s}  {'test acc % (mean ± std)':>24s}  per seed")
    for label, accs, note in rows:
        per_seed = " ".join(f"{100 * a:.2f}" for a in accs)
        print(f"{label:38s} {len(accs):4d}  {fmt(accs):>24s}  [{per_seed}]  {note}")
    work.mkdir(parents=True, exist_ok=True)
    (work / "results.json").write_text(json.dumps({**results, "adjacency_digests": adj, "at": time.time()}, indent=1))
    harness.emit(
        args.record,
        [
            harness.Record(
                benchmark="weighted",
                stage=f"{conv.upper()} on a graph whose classes show in heavy edges, weighted pipeline",
                metric=f"test accuracy % (mean of {args.seeds} seeds)",
                ours=100 * float(np.mean(results[f"{conv}_weighted"])),
                peer=100 * float(np.mean(results[f"{conv}_unweighted"])),
                peer_name="the unweighted pipeline",
                nodes=args.nodes,
                edges=args.edges,
            )
            for conv in ("gcn", "sage")
            if f"{conv}_weighted" in results
        ],
    )


if __name__ == "__main__":
    main()
