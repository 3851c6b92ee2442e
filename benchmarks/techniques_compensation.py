"""Historical compensation at small fanouts (issue 14, item 2): gradient moving average and VR-GCN.

    .venv/bin/python benchmarks/techniques_compensation.py [--seeds 5] [--quick]

On Cora and CiteSeer (Planetoid split, datasets/), minibatch_shards at fanouts 2,2 (sampling
variance is high: two neighbours per node and layer) and otherwise at the pipeline's defaults
(GraphSAGE 2 x 256, the automatic batch and epoch budget, world size 2 read by one process).
Per seed, in the same run: plain training on the 2,2 shards (off), with
``training.compensation.grad_ema: 0.8`` (the brief's g̃_t = η·g_t + (1−η)·g̃_{t−1}) and with
``vrgcn: true`` (historical activations as a control variate); for the first two seeds also
the default fanouts 10,10, the reference the compensation tries to reach. Test accuracy of the
best-on-validation model, mean ± std over the seeds; time = mean training seconds per epoch
(evaluation excluded); memory = the run's peak RSS (each run in its own process).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _technique_runs import DATASETS, build, markdown, mean, seeds_of, shards, train_child, verdict  # noqa: E402

VARIANTS = {
    "grad EMA η=0.8": {"grad_ema": 0.8},
    "VR-GCN": {"vrgcn": True},
}
REFERENCE_SEEDS = 2  # the fanouts 10,10 reference: fewer seeds (a shared 2-core machine)


def dataset_runs(name: str, work: Path, seeds: int, training: dict) -> dict[str, list[dict]]:
    """label -> the summaries of its runs on dataset `name` ("off", each of VARIANTS, "10,10")."""
    home = work / name
    build(DATASETS / name, home)
    plan = {"off": (shards(home, "shards-2-2", fanouts="2,2"), {})}
    plan.update({label: (plan["off"][0], comp) for label, comp in VARIANTS.items()})
    plan["10,10"] = (shards(home, "shards-10-10", fanouts="10,10"), {})
    runs: dict[str, list[dict]] = {label: [] for label in plan}
    for seed in range(seeds):
        for label, (shard_dir, comp) in plan.items():
            if label == "10,10" and seed >= REFERENCE_SEEDS:
                continue
            out = work / "runs" / f"{name}-{label}-{seed}"
            s = train_child(shard_dir, out, {}, {**training, "seed": seed, "compensation": comp})
            runs[label].append(s)
            print(f"  {name} {label} seed {seed}: test {s['test_acc_at_best_val']:.4f}", flush=True)
    return runs


def rows(args: argparse.Namespace) -> list[dict]:
    seeds = seeds_of(args, 2 if args.quick else 5)
    work = Path(args.work) / "compensation"
    datasets = ["cora"] if args.quick else ["cora", "citeseer"]
    training = {"max_epochs": 5} if args.quick else {}
    out = []
    for name in datasets:
        runs = dataset_runs(name, work, seeds, training)
        acc = {label: [s["test_acc_at_best_val"] for s in r] for label, r in runs.items()}
        secs = {label: mean([s["mean_train_seconds"] for s in r]) for label, r in runs.items()}
        mem = {label: max(s["peak_memory_mb"] for s in r) for label, r in runs.items()}
        for label in VARIANTS:
            out.append(
                {
                    "technique": f"{label} @ fanouts 2,2",
                    "dataset": name,
                    "acc_on": acc[label],
                    "acc_off": acc["off"],
                    "time_on": secs[label],
                    "time_off": secs["off"],
                    "mem_on": mem[label],
                    "mem_off": mem["off"],
                    "verdict": verdict(acc[label], acc["off"]),
                    "notes": f"reference: fanouts 10,10 without compensation {100 * mean(acc['10,10']):.2f} "
                    f"(n={len(acc['10,10'])}); time = training seconds per epoch",
                }
            )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--work", default="bench_out/techniques")
    print(markdown(rows(p.parse_args(argv))))


if __name__ == "__main__":
    main()
