"""Memory techniques (issue 14, item 5): mixed precision and activation checkpointing, peak memory
per training step and its time cost.

    .venv/bin/python benchmarks/techniques_memory.py [--quick] [--nodes N]

A generated graph (default 20,000 nodes, 200,000 edge rows, 256-dim features, 8 classes),
minibatch_shards with fanouts 10,10,10 and 1,024 seeds per minibatch; GraphSAGE 3 x 256,
AdamW. Each variant runs the same minibatches (rank 0's first epoch) in its own spawned
process, one thread: ``training.precision`` fp32 vs ``mixed_float16`` (on CPU: bf16 autocast,
`training.precision`; on CUDA: fp16 with loss scaling) and ``model.activation_checkpointing``
off vs on, and both. Memory per step: on CUDA ``torch.cuda.max_memory_allocated`` above what
was allocated before the steps (model, optimizer state, the minibatches); on CPU the process's
peak RSS above its RSS just before the first step (the same baseline), so it counts the
activations, gradients and optimizer state a step creates; glibc is told to map every
allocation above 64 KB on its own and return it when freed (``MALLOC_MMAP_THRESHOLD_``), so
the RSS follows the live tensors rather than the heap's high-water mark. Time: mean seconds per step after one warm-up step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _technique_runs import build, generated, markdown, run_in_child, shards  # noqa: E402

VARIANTS = {
    "fp32": ("fp32", False),
    "mixed precision": ("mixed_float16", False),
    "activation checkpointing": ("fp32", True),
    "mixed precision + activation checkpointing": ("mixed_float16", True),
}


def _rss_bytes() -> int:
    """Current resident set size (Linux /proc/self/statm, in pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _steps_child(shard_dir: str, precision: str, checkpointing: bool, steps: int, q) -> None:
    """Train `steps` minibatches with one variant; put {mb_per_step, seconds_per_step, final_loss}."""
    import gc
    import itertools

    import torch

    from graphs.infra.storage import peak_rss_bytes
    from training.data import ShardStream, cross_entropy, read_manifest
    from training.layers import ModelConfig, build_model
    from training.precision import grad_scaler, resolve_precision

    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    manifest = read_manifest(Path(shard_dir))
    batches = list(itertools.islice(ShardStream(shard_dir, 0, 0, device, prefetch=0), steps + 1))
    torch.manual_seed(0)
    cfg = ModelConfig(hidden=256, num_layers=len(batches[0].blocks), activation_checkpointing=checkpointing)
    model = build_model(cfg, int(manifest["feature_dim"]), int(manifest["num_classes"])).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    prec = resolve_precision(precision, device)
    scaler = grad_scaler(enabled=prec.loss_scaling)

    def step(mb) -> float:
        with prec.autocast():
            loss = cross_entropy(mb, model(mb.blocks, mb.x[: mb.blocks[0].num_src]).float())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_bytes()
    seconds = []
    for mb in batches:
        t0 = time.perf_counter()
        loss = step(mb)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else peak_rss_bytes()
    q.put(
        {
            "mb_per_step": (peak - base) / 2**20,
            "seconds_per_step": sum(seconds[1:]) / max(len(seconds) - 1, 1),
            "final_loss": loss,
            "device": device.type,
            "note": prec.note,
        }
    )


def rows(args: argparse.Namespace) -> list[dict]:
    nodes = int(getattr(args, "nodes", 0) or (3000 if args.quick else 20_000))
    work = Path(args.work) / f"memory-{nodes}"
    landing = generated(
        work / "landing", num_nodes=nodes, num_edges=10 * nodes, feature_dim=256, num_classes=8, num_edge_files=1
    )
    build(landing, work)
    shard_dir = shards(work, "shards", fanouts="10,10,10", batch_size=1024, epochs=1, world_size=1)
    steps = 3 if args.quick else 8
    # glibc malloc keeps freed blocks of up to its (dynamic, up to 32 MB) mmap threshold in the
    # heap, so RSS would remember every transient tensor; with a fixed 64 KB threshold and no trim
    # delay every tensor above 64 KB is its own mapping, returned when freed, and the peak RSS
    # tracks the peak of live tensors (read by the spawned children at their start)
    os.environ.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    result = {}
    for label, (precision, ckpt) in VARIANTS.items():
        result[label] = run_in_child(_steps_child, str(shard_dir), precision, ckpt, steps)
        r = result[label]
        print(f"  {label}: {r['mb_per_step']:.1f} MB per step, {r['seconds_per_step']:.3f} s per step", flush=True)
    off = result["fp32"]
    out = []
    for label in list(VARIANTS)[1:]:
        on = result[label]
        out.append(
            {
                "technique": label,
                "dataset": f"generated {nodes // 1000}k nodes",
                "metric": "final loss (8 steps)",
                "acc_on": f"{on['final_loss']:.4f}",
                "acc_off": f"{off['final_loss']:.4f}",
                "time_on": on["seconds_per_step"],
                "time_off": off["seconds_per_step"],
                "mem_on": on["mb_per_step"],
                "mem_off": off["mb_per_step"],
                "verdict": f"memory per step {on['mb_per_step'] / off['mb_per_step'] - 1:+.0%}, time per step "
                f"{on['seconds_per_step'] / off['seconds_per_step'] - 1:+.0%} ({on['device']})",
                "notes": f"peak MB = {'CUDA allocated' if on['device'] == 'cuda' else 'RSS'} above the pre-step "
                f"baseline; time = seconds per step; {on['note']}",
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--nodes", type=int, default=0)
    p.add_argument("--work", default="bench_out/techniques")
    print(markdown(rows(p.parse_args(argv))))


if __name__ == "__main__":
    main()
