"""Imbalanced classes: class-balanced seeds and the class-weighted loss, on vs off.

Row of benchmarks/techniques.py (``--only imbalanced``). A generated DC-SBM with a 1 %
minority class (``gnnflow generate --minority-fraction 0.01``; 2 classes, the fraud case:
20,000 nodes / 200,000 edge rows, homophily 0.9, feature noise 1.0; ``--quick``: 3,000 nodes
with a 3 % minority). Shards: the default neighbour sampler (fanouts 10,10, W = 1, 3 sampled
epochs), uniform seeds ("off") or ``seed_weighting: class_balanced``; training: the default
model and budget. Every run, off included, keeps the model of the best validation macro-F1
(``select_by: val_macro_f1``), so the rows isolate each technique; a last row compares that
selection with the default (validation accuracy). Metrics of the test split from
`training.metrics` (`node_classification_report`): ROC-AUC and PR-AUC of the minority class,
its recall, and macro-F1; --seeds training seeds (default 1). Verdict on PR-AUC, the measure
an imbalanced task is judged by (ROC-AUC is insensitive to the 99 % of easy negatives).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from _techniques import build, generated, shards, train_run
from techniques import verdict

VARIANTS = {
    # name: (seed_weighting, training settings)
    "off": ("uniform", {"select_by": "val_macro_f1"}),
    "class-balanced seeds": ("class_balanced", {"select_by": "val_macro_f1"}),
    "class-weighted loss": ("uniform", {"select_by": "val_macro_f1", "class_weighted_loss": True}),
    "both": ("class_balanced", {"select_by": "val_macro_f1", "class_weighted_loss": True}),
    "select by val accuracy (default)": ("uniform", {}),
}


def _graph(args) -> tuple[str, Path]:
    if args.quick:
        cfg = dict(num_nodes=3000, num_edges=24_000, minority_fraction=0.03)
    else:
        cfg = dict(num_nodes=20_000, num_edges=200_000, minority_fraction=0.01)
    cfg.update(num_classes=2, homophily=0.9, feature_noise=1.0, feature_dim=16, num_edge_files=1)
    name = f"generated-{cfg['num_nodes']}-minority{cfg['minority_fraction']:g}-noise{cfg['feature_noise']:g}"
    return name, generated(Path(args.work) / "imbalanced" / f"landing-{name}", **cfg)


def _metrics(run: dict) -> dict:
    r = run["report"]
    return {
        "roc": r["per_class"]["roc_auc"][1],
        "pr": r["per_class"]["pr_auc"][1],
        "recall": r["per_class"]["recall"][1],
        "f1": r["macro_f1"],
    }


def _fmt(ms: list[dict]) -> str:
    mean = {k: float(np.mean([m[k] for m in ms])) for k in ms[0]}
    return f"ROC {mean['roc']:.3f} / PR {mean['pr']:.3f} / recall {mean['recall']:.3f} / macro-F1 {mean['f1']:.3f}"


def rows(args) -> list[dict]:
    seeds = args.seeds or 1
    training = {"epochs": 8} if args.quick else {}
    name, landing = _graph(args)
    home = Path(args.work) / "imbalanced" / name
    graph = build(landing, home)
    results = {}
    for variant, (weighting, settings) in VARIANTS.items():
        shard_dir, _ = shards(
            graph, f"shards-{weighting}", fanouts="10,10", world_size=1, epochs=3, seed_weighting=weighting
        )
        results[variant] = []
        for seed in range(seeds):
            run = train_run(
                shard_dir,
                home / "runs" / f"{variant.replace(' ', '_')}-{seed}",
                {},
                {**training, **settings, "seed": seed},
                canonical=graph["canonical"],
            )
            results[variant].append(run)
            print(f"  imbalanced {variant} seed {seed}: {_fmt([_metrics(run)])}", flush=True)
    out = []
    for variant in VARIANTS:
        if variant == "off":
            continue
        if variant.startswith("select"):  # on = macro-F1 selection (every other row's 'off'), off = the default
            on, base, variant = results["off"], results[variant], "select the best model by val macro-F1"
        else:
            on, base = results[variant], results["off"]
        m_on, m_off = [_metrics(r) for r in on], [_metrics(r) for r in base]
        pr_on, pr_off = [m["pr"] for m in m_on], [m["pr"] for m in m_off]
        roc_on, roc_off = [m["roc"] for m in m_on], [m["roc"] for m in m_off]
        out.append(
            {
                "technique": variant,
                "dataset": name,
                "metric": "minority test ROC-AUC / PR-AUC / recall, macro-F1",
                "acc_on": _fmt(m_on),
                "acc_off": _fmt(m_off),
                "time_on": float(np.mean([r["summary"]["seconds"] for r in on])),
                "time_off": float(np.mean([r["summary"]["seconds"] for r in base])),
                "mem_on": max(r["peak_rss_mb"] for r in on),
                "mem_off": max(r["peak_rss_mb"] for r in base),
                "verdict": f"PR-AUC {verdict(pr_on, pr_off)}; ROC-AUC {verdict(roc_on, roc_off)}",
                "notes": f"mean of {seeds} seeds; 'off' = uniform seeds, unweighted loss, best model by validation "
                "macro-F1 (the last row: that selection against the default, by validation accuracy)",
            }
        )
    return out
