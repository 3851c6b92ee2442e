"""Adaptive neighbour sampling vs fixed (uniform) neighbour sampling: time to a target accuracy.

Row of benchmarks/techniques.py (``--only adaptive``). Per dataset (Cora, CiteSeer from
datasets/; ``--quick``: a generated 600-node graph):

1. shards with uniform neighbour sampling at small fanouts (2,2: where the sampler's variance
   matters; W = 1, 10 sampled epochs, the automatic batch size), "off";
2. a training run on them with ``training.node_grad_stats`` on: the previous model of a
   retrain, whose per-node gradient norms g(v) the next round reads;
3. shards with ``samplers.neighbor.prob: adaptive`` (α = 0.5) from those statistics, "on";
4. --seeds training seeds (default 5) of the default model on each set of shards (one child
   process per run): test accuracy of the best-on-validation model, and the training seconds
   (evaluation excluded) and epochs until validation accuracy first reaches the target = 97 %
   of the off runs' mean best validation accuracy.

Time on/off in the table = mean seconds to the target (runs that never reach it count as the
whole run); the statistics run of step 2 is the previous round's cost and is not added.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from _techniques import DATASETS, build, generated, seconds_to_target, shards, train_run
from techniques import mean_std, verdict

FANOUTS = "2,2"
ALPHA = 0.5
TARGET_SHARE = 0.97


def _datasets(args) -> list[tuple[str, Path]]:
    if args.quick:
        landing = generated(
            Path(args.work) / "adaptive" / "landing-quick",
            num_nodes=600,
            num_edges=4000,
            feature_dim=16,
            num_classes=4,
            num_edge_files=1,
            feature_noise=1.0,
        )
        return [("generated-600", landing)]
    return [("cora", DATASETS / "cora"), ("citeseer", DATASETS / "citeseer")]


def rows(args) -> list[dict]:
    seeds = args.seeds or (2 if args.quick else 5)
    shard_epochs = 2 if args.quick else 10
    training = {"epochs": 6} if args.quick else {}
    out = []
    for name, landing in _datasets(args):
        home = Path(args.work) / "adaptive" / name
        graph = build(landing, home)
        base = dict(fanouts=FANOUTS, world_size=1, epochs=shard_epochs)
        off_dir, _ = shards(graph, "shards-uniform", **base)
        stats = train_run(off_dir, home / "runs" / "stats", {}, {**training, "node_grad_stats": True})
        scores = home / "runs" / "stats" / stats["summary"]["node_grad_stats"]
        on_dir, manifest = shards(
            graph,
            "shards-adaptive",
            node_scores=scores,
            samplers={"neighbor": {"prob": "adaptive", "adaptive_alpha": ALPHA}},
            **base,
        )
        runs = {"off": [], "on": []}
        for arm, shard_dir in (("off", off_dir), ("on", on_dir)):
            for seed in range(seeds):
                r = train_run(shard_dir, home / "runs" / f"{arm}-{seed}", {}, {**training, "seed": seed})
                runs[arm].append(r)
                s = r["summary"]
                print(
                    f"  adaptive {name} {arm} seed {seed}: test {s['test_acc_at_best_val']:.4f} "
                    f"(val {s['best_val_acc']:.4f}, epoch {s['best_epoch']}/{s['epochs_trained']}), "
                    f"{sum(r['train_seconds']):.1f} s training",
                    flush=True,
                )
        target = TARGET_SHARE * float(np.mean([r["summary"]["best_val_acc"] for r in runs["off"]]))
        reach = {
            arm: [seconds_to_target(r["val_acc"], r["train_seconds"], target) for r in rs] for arm, rs in runs.items()
        }
        secs = {
            arm: [t if np.isfinite(t) else sum(r["train_seconds"]) for (t, _), r in zip(reach[arm], runs[arm])]
            for arm in runs
        }
        epochs = {arm: [e for _, e in reach[arm] if e] for arm in runs}
        acc = {arm: [r["summary"]["test_acc_at_best_val"] for r in rs] for arm, rs in runs.items()}
        mem = {arm: max(r["peak_rss_mb"] for r in rs) for arm, rs in runs.items()}
        reached = {arm: sum(1 for t, _ in reach[arm] if np.isfinite(t)) for arm in runs}
        ratio = np.mean(secs["on"]) / np.mean(secs["off"])
        out.append(
            {
                "technique": f"adaptive sampling (α={ALPHA}) vs uniform, fanouts {FANOUTS}",
                "dataset": name,
                "acc_on": acc["on"],
                "acc_off": acc["off"],
                "time_on": float(np.mean(secs["on"])),
                "time_off": float(np.mean(secs["off"])),
                "mem_on": mem["on"],
                "mem_off": mem["off"],
                "verdict": f"accuracy: {verdict(acc['on'], acc['off'])}; time to target {ratio:.2f}x "
                f"({verdict(secs['on'], secs['off'], higher_is_better=False, what='s')})",
                "notes": f"target val acc {target:.4f} (97 % of uniform's best); reached by {reached['on']}/{seeds} "
                f"adaptive and {reached['off']}/{seeds} uniform runs, after "
                f"{mean_std(epochs['on'])[0] if epochs['on'] else float('nan'):.1f} vs "
                f"{mean_std(epochs['off'])[0] if epochs['off'] else float('nan'):.1f} epochs; adaptive draws with "
                f"replacement (p max/mean {manifest['adaptive']['p_max_over_mean']}), uniform without",
            }
        )
    return out
