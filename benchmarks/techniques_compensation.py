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


def rows(args: argparse.Namespace) -> list[dict]:
    seeds = seeds_of(args, 2 if args.quick else 5)
    work = Path(args.work) / "compensation"
    datasets = ["cora"] if args.quick else ["cora", "citeseer"]
    training = {"max_epochs": 5} if args.quick else {}
    out = []
    for name in datasets:
        home = work / name
        build(DATASETS / name, home)
        small = shards(home, "shards-2-2", fanouts="2,2")
        default = shards(home, "shards-10-10", fanouts="10,10")
        runs: dict[str, list[dict]] = {}

        def run(label: str, shard_dir: Path, comp: dict, seed: int) -> None:
            s = train_child(
                shard_dir,
                work / "runs" / f"{name}-{label}-{seed}",
                {},
                {**training, "seed": seed, "compensation": comp},
            )
            runs.setdefault(label, []).append(s)
            print(f"  {name} {label} seed {seed}: test {s['test_acc_at_best_val']:.4f}", flush=True)

        for seed in range(seeds):
            run("off", small, {}, seed)
            for label, comp in VARIANTS.items():
                run(label, small, comp, seed)
            if seed < REFERENCE_SEEDS:
                run("10,10", default, {}, seed)

        def acc(label):
            return [s["test_acc_at_best_val"] for s in runs[label]]

        def secs(label):
            return mean([s["mean_train_seconds"] for s in runs[label]])

        def mem(label):
            return max(s["peak_memory_mb"] for s in runs[label])

        reference = acc("10,10")
        for label in VARIANTS:
            out.append(
                {
                    "technique": f"{label} @ fanouts 2,2",
                    "dataset": name,
                    "acc_on": acc(label),
                    "acc_off": acc("off"),
                    "time_on": secs(label),
                    "time_off": secs("off"),
                    "mem_on": mem(label),
                    "mem_off": mem("off"),
                    "verdict": verdict(acc(label), acc("off")),
                    "notes": f"reference: fanouts 10,10 without compensation {100 * mean(reference):.2f} "
                    f"({verdict(acc(label), reference)} against it); time = training seconds per epoch",
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
