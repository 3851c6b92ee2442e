"""Depth ablation (issue 14, item 6): 2, 3 and 4 layers, with and without residuals, normalization
and DropEdge; where depth over-smooths and what residuals and DropEdge recover.

    .venv/bin/python benchmarks/techniques_depth.py [--seeds 2] [--quick] [--nodes N]

A generated graph (default 5,000 nodes, 50,000 edge rows, homophily 0.85, 8 classes, 32-dim
features with noise 1.5, so a node's own features are weak and its neighbourhood matters),
minibatch_shards with fanout 5 per layer (as many layers as the model), GCN (the layer that
over-smooths most plainly: a weighted mean over Â with no separate self term) with hidden 128,
dropout 0.5, 30 epochs, the best-on-validation model. Variants per depth: plain; residual
(``model.residual``); batch norm (``model.hidden_norm: batch``); DropEdge 0.3
(``model.drop_edge``); residual + DropEdge. Over-smoothing is measured on the final
embeddings (the last layer's input, full-graph inference, ``embeddings.npy``): the mean cosine
similarity of 20,000 random node pairs, the closer to 1 the less the nodes can be told apart.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _technique_runs import build, generated, markdown, mean, seeds_of, shards, train_child, verdict  # noqa: E402

DEPTHS = (2, 3, 4)
VARIANTS = {
    "plain": {},
    "residual": {"residual": True},
    "batch norm": {"hidden_norm": "batch"},
    "DropEdge 0.3": {"drop_edge": 0.3},
    "residual + DropEdge 0.3": {"residual": True, "drop_edge": 0.3},
}


def mean_pair_cosine(embeddings: np.ndarray, pairs: int = 20_000, seed: int = 0) -> float:
    """Mean cosine similarity of `pairs` random pairs of distinct rows."""
    rng = np.random.default_rng(seed)
    n = embeddings.shape[0]
    a, b = rng.integers(0, n, pairs), rng.integers(0, n, pairs)
    keep = a != b
    x = embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
    return float(np.mean(np.sum(x[a[keep]] * x[b[keep]], axis=1)))


def ablation_runs(args: argparse.Namespace) -> tuple[dict, str]:
    """{(depth, variant): [summary + "cosine"]}, the dataset label."""
    from training.outputs import EMBEDDINGS

    nodes = int(getattr(args, "nodes", 0) or (1500 if args.quick else 5000))
    seeds = seeds_of(args, 1 if args.quick else 2)
    work = Path(args.work) / f"depth-{nodes}"
    landing = generated(
        work / "landing", num_nodes=nodes, num_edges=10 * nodes, feature_noise=1.5, num_edge_files=1, num_classes=8
    )
    build(landing, work)
    training = {"epochs": int(getattr(args, "epochs", 0) or (4 if args.quick else 30)), "eval_every": 1}
    results: dict[tuple[int, str], list[dict]] = {}
    for depth in DEPTHS:
        shard_dir = shards(work, f"shards-{depth}", fanouts=",".join(["5"] * depth), epochs=3)
        for label, extra in VARIANTS.items():
            model = {"conv": "gcn", "hidden": 128, **extra}
            for seed in range(seeds):
                out = work / "runs" / f"d{depth}-{label.replace(' ', '_')}-{seed}" / "trained_model"
                s = train_child(shard_dir, out, model, {**training, "seed": seed})
                s["cosine"] = mean_pair_cosine(np.load(out / EMBEDDINGS))
                results.setdefault((depth, label), []).append(s)
                print(
                    f"  {depth} layers {label} seed {seed}: test {s['test_acc_at_best_val']:.4f}, "
                    f"cosine {s['cosine']:.3f}",
                    flush=True,
                )
    return results, f"generated {nodes // 1000}k nodes"


def ablation_table(results: dict) -> str:
    """Depth x variant: test accuracy (mean over seeds) and mean pair cosine of the embeddings."""
    lines = ["| layers | " + " | ".join(VARIANTS) + " |", "|" + " --- |" * (len(VARIANTS) + 1)]
    for depth in DEPTHS:
        cells = []
        for label in VARIANTS:
            runs = results[(depth, label)]
            acc = 100 * mean([s["test_acc_at_best_val"] for s in runs])
            cells.append(f"{acc:.2f} (cos {mean([s['cosine'] for s in runs]):.2f})")
        lines.append(f"| {depth} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def rows(args: argparse.Namespace) -> list[dict]:
    results, dataset = ablation_runs(args)
    print(ablation_table(results))
    out = []

    def row(technique: str, on: list[dict], off: list[dict]) -> dict:
        acc_on, acc_off = [s["test_acc_at_best_val"] for s in on], [s["test_acc_at_best_val"] for s in off]
        return {
            "technique": technique,
            "dataset": dataset,
            "acc_on": acc_on,
            "acc_off": acc_off,
            "time_on": mean([s["mean_train_seconds"] for s in on]),
            "time_off": mean([s["mean_train_seconds"] for s in off]),
            "mem_on": max(s["peak_memory_mb"] for s in on),
            "mem_off": max(s["peak_memory_mb"] for s in off),
            "verdict": f"{verdict(acc_on, acc_off)}; embedding cosine {mean([s['cosine'] for s in on]):.2f} vs "
            f"{mean([s['cosine'] for s in off]):.2f}",
        }

    for depth in DEPTHS[1:]:
        out.append(row(f"GCN depth {depth} vs 2 (plain)", results[(depth, "plain")], results[(2, "plain")]))
    for depth in DEPTHS:
        for label in list(VARIANTS)[1:]:
            out.append(row(f"{label} @ {depth} layers", results[(depth, label)], results[(depth, "plain")]))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--nodes", type=int, default=0)
    p.add_argument("--epochs", type=int, default=0, help="training epochs per run; 0 = 30")
    p.add_argument("--work", default="bench_out/techniques")
    print(markdown(rows(p.parse_args(argv))))


if __name__ == "__main__":
    main()
