"""One training epoch on one rank: the optimizer steps over its shard streams (steps 1-3 of `training.train`).

`train_epoch` opens this rank's shard streams of the epoch (`training.data.ShardStream`; a
replayed sampled epoch in its own seeded order), runs ``accumulate`` minibatches per stream and
optimizer step through `forward_backward` (autocast, the loss scaled by 1 / minibatches in the
step, DDP's all-reduce in the step's last backward only), then the update (scheduled learning
rate, unscale, clip, step), and returns this rank's metric row of the epoch with its time split
into data / forward / backward / update. A loss that is not finite stops the run
(`training.loss_check`).
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch.profiler import record_function

from graphs.infra.storage import disk_read_bytes, peak_rss_bytes
from training.data import ShardStream, cross_entropy
from training.layers import use_aggregation
from training.loss_check import NonFiniteLossError, non_finite_loss
from training.profiling import StepProfiler
from training.run_plan import learning_rate, replay_order_seed
from training.run_setup import Run

__all__ = ["forward_backward", "model_blocks", "train_epoch"]


def train_epoch(run: Run, epoch: int, profiler: StepProfiler) -> dict:
    """One epoch of optimizer steps over this rank's streams; this rank's metric row."""
    tcfg, info, device, model, optimizer = run.cfg.training, run.info, run.device, run.model, run.optimizer
    t_epoch, read_before = run.now(), disk_read_bytes()
    # dropout/DropEdge randomness: a function of (seed, epoch, rank), so a resumed
    # run draws exactly what an uninterrupted one would
    torch.manual_seed(tcfg.seed * 1_000_003 + epoch * 1009 + info.rank)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model.train()
    streams = _epoch_streams(run, epoch)
    iters = [iter(s) for s in streams]
    # rebalanced shards: each stream's loss weighted by W x its share of the seeds (graphs.sampling.rebalance)
    scales = [run.manifest.loss_scales[r] for r in run.plan.my_streams]
    timing = dict.fromkeys(("data", "forward", "backward", "update"), 0.0)
    loss_sum = correct = seeds = minibatches = 0
    lr = optimizer.param_groups[0]["lr"]
    if run.comm_counter is not None:
        run.comm_counter.take()  # count this epoch's steps only
    try:
        with use_aggregation(model, tcfg.aggregation):  # evaluation keeps `auto`
            for s in range(run.plan.steps_per_epoch):
                # one optimizer step: `accumulate` minibatches (fewer at the epoch's end) per stream
                micro = min(tcfg.accumulate, run.plan.per_stream - s * tcfg.accumulate)
                sources = [(it, scale) for _ in range(micro) for it, scale in zip(iters, scales)]
                for i, (it, scale) in enumerate(sources):
                    t0 = run.now()
                    with record_function("data"):
                        mb = next(it)
                    timing["data"] += run.now() - t0
                    # DDP all-reduces the gradients in the step's last backward only
                    last = i == len(sources) - 1
                    with contextlib.nullcontext() if last or run.net is model else run.net.no_sync():
                        loss, logits = forward_backward(run, mb, len(sources), timing, scale)
                    loss_sum += loss
                    minibatches += 1
                    seeds += mb.num_seeds
                    if mb.num_seeds:
                        correct += int((logits.detach()[mb.seed_pos].argmax(1) == mb.labels).sum())
                t0 = run.now()
                with record_function("update"):
                    lr = _optimizer_step(run)
                timing["update"] += run.now() - t0
                run.step += 1
                profiler.step()
    finally:
        for stream in streams:
            stream.close()
    train_seconds = run.now() - t_epoch
    loss, acc = loss_sum / max(minibatches, 1), correct / seeds if seeds else float("nan")
    row = _epoch_row(run, epoch, streams, timing, train_seconds, loss=loss, acc=acc, lr=lr, seeds=seeds)
    read_after = disk_read_bytes()
    row["disk_read_bytes"] = float("nan") if None in (read_before, read_after) else float(read_after - read_before)
    return row


def forward_backward(run: Run, mb, minibatches_in_step: int, timing: dict, scale: float = 1.0):
    """Loss of one minibatch (a float; NonFiniteLossError when NaN or infinite) and its logits,
    its gradient accumulated (scaled for fp16, averaged over the step, times `scale`: a
    rebalanced stream's weight)."""
    t0 = run.now()
    with record_function("forward"), run.precision.autocast():
        blocks = model_blocks(mb.blocks, run.cfg.model.num_layers, run.manifest.shared_block)
        x = run.transform(mb.x)[: blocks[0].num_src]
        if run.grad_stats is not None:
            x = run.grad_stats.watch(x)
        with run.vrgcn.attach(run.model, blocks, mb.input_nodes) if run.vrgcn else contextlib.nullcontext():
            logits = run.net(blocks, x).float()
        loss = cross_entropy(mb, logits, run.class_weight)
    t1 = run.now()
    value = float(loss.detach())  # read for the epoch's loss anyway; checked outside backward's collectives
    if not math.isfinite(value):
        raise _non_finite_loss(run, value)
    with record_function("backward"):
        run.scaler.scale(loss * scale / minibatches_in_step).backward()
    if run.grad_stats is not None:  # the minibatch loss's own gradient: undo the loss scale and the 1/M
        run.grad_stats.record(x, mb.input_nodes, run.scaler.get_scale() * scale / minibatches_in_step)
    t2 = run.now()
    timing["forward"] += t1 - t0
    timing["backward"] += t2 - t1
    return value, logits


def _non_finite_loss(run: Run, value: float) -> NonFiniteLossError:
    """The error stopping the run at its current step (`training.loss_check`), with its settings."""
    tcfg = run.cfg.training
    epoch, step = divmod(run.step, run.plan.steps_per_epoch)
    norm = tcfg.feature_norm
    return non_finite_loss(
        value,
        epoch=epoch + 1,
        step=step + 1,
        steps=run.plan.steps_per_epoch,
        causes=[
            f"feature normalization: training.feature_norm={norm!r}"
            + (" leaves features on their own scales; try 'standard'" if norm == "none" else ""),
            f"a learning rate too high: training.optimizer.lr={tcfg.optimizer.lr:g} "
            f"(training.gradient_clipping={tcfg.gradient_clipping:g}; 0 = off)",
            "a corrupted input: a NaN, infinite or huge value in the dataset's features or edge weights "
            "(check the landing files, then re-materialize canonical_graph and the stages after it)",
        ],
    )


def _epoch_streams(run: Run, epoch: int) -> list[ShardStream]:
    """This rank's shard streams of `epoch` (a replayed sampled epoch in its own seeded order)."""
    tcfg = run.cfg.training
    return [
        ShardStream(
            run.shards,
            r,
            epoch % run.plan.shard_epochs,
            run.device,
            tcfg.prefetch,
            features=run.feature_rows if run.feature_rows is not None else run.stream_features,
            verify=tcfg.verify_shards,
            manifest=run.manifest.doc,
            order_seed=replay_order_seed(tcfg.seed, epoch, run.plan.shard_epochs, r),
        )
        for r in run.plan.my_streams
    ]


def _optimizer_step(run: Run) -> float:
    """Set the scheduled learning rate, clip, step the optimizer through the loss scaler; the rate."""
    tcfg, optimizer = run.cfg.training, run.optimizer
    lr = learning_rate(tcfg.lr_schedule, tcfg.optimizer.lr, run.step, run.plan.steps_per_epoch, run.plan.total_steps)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if tcfg.gradient_clipping > 0:
        run.scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        clip_gradients(run.model, tcfg.gradient_clipping)
    run.scaler.step(optimizer)  # skips the step if fp16 gradients overflowed
    run.scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return lr


def clip_gradients(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_`` over every gradient, sparse ones (a typed graph's learned node vectors)
    included by the norm of their coalesced values, which torch's own does not take."""
    params = [p for p in model.parameters() if p.grad is not None]
    sparse = [p for p in params if p.grad.is_sparse]
    if not sparse:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    for p in sparse:
        p.grad = p.grad.coalesce()
    norms = [torch.linalg.vector_norm(p.grad._values() if p.grad.is_sparse else p.grad) for p in params]
    total = torch.linalg.vector_norm(torch.stack(norms))
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in params:
        p.grad = p.grad * scale
    return total


def _epoch_row(run: Run, epoch: int, streams, timing: dict, train_seconds: float, *, loss, acc, lr, seeds) -> dict:
    """This rank's metric row of one epoch."""
    comm = {}
    if run.comm_counter is not None:
        comm = {"comm_bytes_per_step": run.comm_counter.take()["sent"] / max(run.plan.steps_per_epoch, 1)}
    return {
        **comm,
        "epoch": epoch + 1,  # numbered from 1 in metrics, logs, summaries and plots
        "rank": run.info.rank,
        "loss": loss,
        "minibatch_acc": acc,
        "lr": lr,
        "steps": run.plan.steps_per_epoch,
        "seeds": seeds,
        "seeds_per_s": seeds / train_seconds if train_seconds > 0 else float("nan"),
        "train_seconds": train_seconds,
        "data_seconds": timing["data"],
        "data_wait_share": timing["data"] / train_seconds if train_seconds > 0 else float("nan"),
        "forward_seconds": timing["forward"],
        "backward_seconds": timing["backward"],
        "update_seconds": timing["update"],
        "queue_wait_seconds": sum(s.wait_seconds for s in streams),
        "peak_memory_mb": _peak_memory_mb(run.device),
    }


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_bytes() / 2**20


def model_blocks(blocks: list, num_layers: int, shared_block: bool) -> list:
    """The blocks a ``num_layers``-layer model runs on: the stored ones, or the shared one repeated."""
    return [blocks[0]] * num_layers if shared_block else blocks
