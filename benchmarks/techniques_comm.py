"""Gradient communication compression under DDP (issue 14, item 3): bytes sent and accuracy per hook.

    .venv/bin/python benchmarks/techniques_comm.py [--seeds 2] [--quick]

Cora (Planetoid split, datasets/), minibatch_shards at the defaults (fanouts 10,10, world size 2),
GraphSAGE 2 x 256 trained by ``torchrun --nproc-per-node 2`` (gloo on CPU) with
``training.comm.hook`` = fp16, bf16, powersgd (rank 1, compressing from step 10) and int8
against none (fp32 all-reduce), each with ``count_bytes`` on, so every hook's collectives are
counted the same way (`training.comm_hooks.CountingGroup`): bytes each rank sends per optimizer
step (ring estimate; with W = 2 equal to the payload), averaged over the run. Accuracy: test
accuracy of the best-on-validation model; the automatic epoch budget with ``min_steps`` 200
(about 50 epochs here) to keep a 2-process run short on a shared machine. Communication *time*
over loopback on 2 shared cores means little, so the table reports bytes; the time columns are
training seconds per epoch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _technique_runs import DATASETS, build, markdown, mean, seeds_of, shards, train_torchrun, verdict  # noqa: E402

HOOKS = ("fp16", "bf16", "powersgd", "int8")


def hook_runs(work: Path, seeds: int, training: dict) -> dict[str, list[dict]]:
    """hook -> rank 0's summaries of its runs ("none" included)."""
    home = work / "cora"
    build(DATASETS / "cora", home)
    shard_dir = shards(home, "shards-default")
    runs: dict[str, list[dict]] = {hook: [] for hook in ("none", *HOOKS)}
    for seed in range(seeds):
        for hook in runs:
            comm = {"hook": hook, "count_bytes": True}
            out = work / "runs" / f"cora-{hook}-{seed}" / "trained_model"
            s = train_torchrun(shard_dir, out, {}, {**training, "seed": seed, "comm": comm})
            runs[hook].append(s)
            print(
                f"  cora {hook} seed {seed}: test {s['test_acc_at_best_val']:.4f}, "
                f"{s['comm_bytes_per_step']:.0f} bytes/step",
                flush=True,
            )
    return runs


def rows(args: argparse.Namespace) -> list[dict]:
    seeds = seeds_of(args, 1 if args.quick else 2)
    training = {"max_epochs": 3} if args.quick else {"min_steps": 200}
    runs = hook_runs(Path(args.work) / "comm", seeds, training)
    acc = {h: [s["test_acc_at_best_val"] for s in r] for h, r in runs.items()}
    sent = {h: mean([s["comm_bytes_per_step"] for s in r]) for h, r in runs.items()}
    out = []
    for hook in HOOKS:
        ratio = sent[hook] / sent["none"]
        out.append(
            {
                "technique": f"DDP comm hook {hook} (2 ranks, gloo)",
                "dataset": "cora",
                "acc_on": acc[hook],
                "acc_off": acc["none"],
                "time_on": mean([s["mean_train_seconds"] for s in runs[hook]]),
                "time_off": mean([s["mean_train_seconds"] for s in runs["none"]]),
                "mem_on": max(s["peak_memory_mb"] for s in runs[hook]),
                "mem_off": max(s["peak_memory_mb"] for s in runs["none"]),
                "verdict": f"{ratio:.3f}x bytes ({sent[hook]:,.0f} vs {sent['none']:,.0f} per rank and step); "
                f"accuracy: {verdict(acc[hook], acc['none'])}",
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
