"""Node-classification training from minibatch shards: DDP, AMP, checkpoints, metrics.

Run it (``run.yaml``: see `training.config`; world size and batch size come from the
shards' manifest, so ``--nproc-per-node`` must divide the manifest's ``world_size``)::

    # one machine, 2 processes: gloo on CPU, nccl on GPUs (one GPU per process); torchrun's
    # launcher with nothing listening beyond loopback (training.launch)
    python -m training.launch --nproc-per-node 2 -m training --config run.yaml

    # several machines: the same command on every node, with a c10d rendezvous
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        --rdzv-id myrun -m training --config run.yaml

    # one process, no torchrun (reads every rank's stream itself, see below)
    python -m training --config run.yaml

What one epoch does, on every rank r of R processes:

1. Read the shard streams of ranks r, r+R, ... of the manifest's W (one stream when R = W)
   with `training.data.ShardStream`: a background thread reads, checks and decodes the
   next minibatches while the current one trains.
2. For each optimizer step, run ``accumulate`` minibatches per stream forward and
   backward under autocast (``training.precision``), scaling each loss by
   1 / (minibatches in the step); DDP averages the gradients over the R processes
   during the backward of the step's last minibatch (``no_sync`` before it). So every
   update is the mean gradient over ``batch_size x W x accumulate`` seeds, whatever R:
   one process reading both streams of W = 2 shards makes the same update as 2 DDP ranks
   (up to dropout randomness and BatchNorm statistics).
3. Set the scheduled learning rate, unscale (fp16 loss scaling), clip the gradient norm,
   step the optimizer (AdamW by default).
4. Rank 0 evaluates by full-graph layer-wise inference over the normalized adjacency every
   ``eval_every`` epochs, tracks the best validation accuracy, decides on early stopping
   and broadcasts the decision; every rank's timings are gathered to rank 0, which
   checkpoints (`training.checkpoint`).

When the last epoch is done (or early stopping fired), rank 0 writes the outputs
(`training.outputs`) into the trained_model folder atomically and removes the work folder.
A re-run with the same config and data resumes from the last checkpoint instead.

Reading order (top to bottom): `train` sets up the process group; `_train` is the loop:
`setup_run` builds the `Run` state once (shards' plan, features, model/DDP/optimizer/AMP,
`resume` from a checkpoint, rank 0's `load_eval_graph`), then per epoch `train_epoch`
(steps 1-3, `forward_backward` per minibatch), `evaluate_epoch` (step 4, rank 0),
`save_run_checkpoint`; `finish_run` writes the outputs.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.label_classes import copy_label_classes
from graphs.formats.shard_format import MANIFEST_NAME
from graphs.formats.shard_manifest import ShardManifest
from graphs.infra.host_memory import reuse_freed_memory
from graphs.infra.progress import Progress
from graphs.infra.storage import atomic_output_dir, dataset_lock, peak_rss_bytes, verify_lock_held
from graphs.stages.normalize import Adjacency
from training.blocks import remove_self_loops
from training.checkpoint import (
    CHECKPOINT_NAME,
    code_version,
    data_version,
    resume_state,
    run_key,
    save_checkpoint,
    work_dir_for,
)
from training.comm_hooks import setup_comm_hook
from training.compensation import VRGCN, GradientEMA, check_vrgcn_supports
from training.config import LRScheduleConfig, OptimizerConfig, RunConfig, TrainingConfig
from training.data import FeatureRows, ShardStream, cross_entropy
from training.distributed import (
    DistInfo,
    all_gather_objects,
    broadcast_flag,
    init_distributed,
    shutdown,
    state_digest,
)
from training.evaluate import EvalGraph, StreamingEval, accuracies, load_full_block
from training.feature_cache import CacheSpec
from training.features import FeatureTransform, degree_features, feature_chunks, full_features, read_node_table
from training.imbalance import class_weights, selection_score
from training.layer_registry import layer_kind, linear_layer_names
from training.layers import build_model, use_aggregation
from training.loss_check import NonFiniteLossError, non_finite_loss
from training.node_stats import NodeGradStats
from training.outputs import (
    CURVES,
    EMBEDDINGS,
    METRICS,
    MODEL_BEST,
    MODEL_FINAL,
    PREDICTIONS,
    SUMMARY,
    Preprocessing,
    model_file_state,
    plot_curves,
    save_model_file,
    write_json,
    write_metrics,
    write_predictions,
    write_version_file,
)
from training.precision import grad_scaler, resolve_precision
from training.profiling import PROFILE_DIR, StepProfiler, nvtx_context
from training.report import Reporter, open_reporter

__all__ = [
    "EpochHook",
    "check_sampler_supports",
    "epoch_passes",
    "learning_rate",
    "make_optimizer",
    "replay_order_seed",
    "resolve_inputs",
    "resolve_num_layers",
    "train",
    "training_epochs",
]

EpochHook = Callable[[int, list], None]


def train(cfg: RunConfig, *, on_epoch_end: EpochHook | None = None) -> dict | None:
    """Train (or resume) the run ``cfg``; returns the summary dict on rank 0, None elsewhere.

    ``on_epoch_end(epoch, rows)`` is called on every rank after each epoch's checkpoint
    (rows: every rank's metric rows of that epoch); an exception it raises ends the run
    like a kill would, leaving the checkpoint to resume from.
    """
    # Rank 0 holds the dataset's write lock (the folder holding paths.out) for the whole run,
    # before anything is read; the other ranks wait for it in the process group's rendezvous.
    # Launched by the trained_model asset, rank 0 runs under the step's lock and checks after
    # every epoch and before publishing that the step still holds it (`_check_lock`).
    is_rank0 = int(os.environ.get("RANK", "0")) == 0
    with dataset_lock(_dataset_folder(cfg)) if is_rank0 else contextlib.nullcontext():
        info = init_distributed(cfg.training.device, cfg.training.dist_timeout_s)
        try:
            with open_reporter(info.is_main) as report:
                summary = _train(cfg, info, report, on_epoch_end)
        except BaseException:
            shutdown(info, clean=False)
            raise
        shutdown(info)
    return summary


def _dataset_folder(cfg: RunConfig) -> Path:
    """The dataset's folder (holding paths.out and its lock)."""
    return Path(cfg.paths.out).resolve().parent


def _check_lock(cfg: RunConfig) -> None:
    """Rank 0, before it writes: DatasetLockLost when the dataset lock is no longer held for this
    run (its step was killed), so an orphan never writes beside the step's next run."""
    verify_lock_held(_dataset_folder(cfg))


@dataclass(eq=False)
class Run:
    """Everything one training run holds, built once by `setup_run` (then read by every step).

    Fixed for the run: the settings, the inputs and the shards' plan, the feature source
    and transform, the model (``net`` is its DDP wrapper, or the model itself), optimizer,
    precision and loss scaler, the checkpoint identity and rank 0's evaluation graph.
    Changed as it goes: ``epoch`` progress (``start_epoch``, ``step``), ``history``,
    ``best`` and ``stopped_early`` — exactly what a checkpoint stores.
    """

    cfg: RunConfig
    info: DistInfo
    report: Reporter
    t_start: float
    # inputs and the shards' plan
    shards: Path
    canonical: Path
    adjacency: Path
    manifest: ShardManifest
    my_streams: list[int]
    shard_epochs: int
    epochs: int
    per_stream: int
    steps_per_epoch: int
    total_steps: int
    num_blocks: int
    # features
    stream_features: object
    in_feats: int
    num_classes: int
    transform: FeatureTransform
    # model, DDP, optimizer, AMP
    model: torch.nn.Module
    net: torch.nn.Module
    optimizer: torch.optim.Optimizer
    precision: object
    scaler: object
    # checkpoint identity
    dver: str
    key: str
    work: Path
    ckpt_path: Path
    eval_graph: "InMemoryEval | StreamedEval | None" = None
    feature_rows: FeatureRows | None = None  # shared by the streams when training.feature_cache > 0
    # imbalanced classes and adaptive sampling (None when off; training.imbalance, training.node_stats)
    class_weight: torch.Tensor | None = None
    grad_stats: NodeGradStats | None = None
    # options (training.comm, training.compensation): None when off
    comm_counter: object = None
    vrgcn: VRGCN | None = None
    # progress (restored from a checkpoint)
    start_epoch: int = 0
    step: int = 0
    stopped_early: bool = False
    history: list[dict] = field(default_factory=list)
    # best["epoch"] counts from 1 like every epoch number a user sees (0 = not evaluated yet)
    best: dict = field(default_factory=lambda: {"epoch": 0, "val_acc": -1.0, "test_acc": float("nan"), "model": None})
    # (embeddings, logits) of the last epoch's evaluation when that epoch is the best: the final
    # outputs need no second full-graph pass (a streamed one reads back its layer files)
    best_outputs: tuple | None = None

    @property
    def device(self) -> torch.device:
        return self.info.device

    def now(self) -> float:
        """perf_counter after a CUDA sync: accurate stage timings on GPUs."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def _train(cfg: RunConfig, info: DistInfo, report: Reporter, on_epoch_end: EpochHook | None) -> dict | None:
    run = setup_run(cfg, info, report)
    tcfg = cfg.training
    profiling = info.is_main and tcfg.profiler == "torch" and run.start_epoch < run.epochs
    profiler = StepProfiler(profiling, run.work / PROFILE_DIR, run.device)
    # percent of the epochs and time left, with the latest epoch's figures, every few seconds (and at the
    # end; early stopping may end sooner)
    progress = Progress("epoch", run.epochs, report.info, start=run.start_epoch)

    # ------------------------------------------------------------------ the loop
    # the steps reuse the host memory their predecessors freed (and the evaluation between epochs
    # the steps' memory); handed back to the system after the last epoch
    with nvtx_context(tcfg.profiler, run.device), reuse_freed_memory(tcfg.reuse_host_memory):
        for epoch in range(run.start_epoch, run.epochs):
            if run.stopped_early:
                break
            t_epoch = run.now()
            row = train_epoch(run, epoch, profiler)
            stop = evaluate_epoch(run, epoch, row) if info.is_main else False
            run.stopped_early = broadcast_flag(info, stop) and epoch < run.epochs - 1
            row["epoch_seconds"] = run.now() - t_epoch
            rows = all_gather_objects(info, row)
            run.history.extend(rows)
            if info.is_main:
                _check_lock(cfg)
                progress.advance(detail=_epoch_line(rows))
                if run.stopped_early:
                    report.info(f"early stopping: validation accuracy last improved at epoch {run.best['epoch']}")
                if (epoch + 1) % tcfg.checkpoint_every == 0 or epoch == run.epochs - 1 or run.stopped_early:
                    save_run_checkpoint(run, epoch)
            if on_epoch_end is not None:
                on_epoch_end(epoch, rows)
    profiler.close()
    if run.grad_stats is not None:  # every rank's counts, summed (rank 0 writes them)
        run.grad_stats.all_reduce(info.initialized, info.backend, run.device)
    # every rank's final model state: DDP keeps the replicas identical, on one node or many
    replicas = all_gather_objects(info, state_digest(run.model))

    # ------------------------------------------------------------------ outputs (rank 0)
    if not info.is_main:
        return None
    _check_lock(cfg)
    summary = finish_run(run, replicas)
    report.materialization(_pipes_metadata(summary))
    report.info(
        f"done: best val {summary['best_val_acc']:.4f} (epoch {summary['best_epoch']}), "
        f"test {summary['test_acc_at_best_val']:.4f}; outputs in {cfg.paths.out}"
    )
    return summary


def setup_run(cfg: RunConfig, info: DistInfo, report: Reporter) -> Run:
    """The run state: shards' plan, features, model/DDP/optimizer/AMP, resume, evaluation graph."""
    tcfg, device = cfg.training, info.device
    t_start = time.perf_counter()

    # ------------------------------------------------------------------ inputs and shards
    shards, canonical, adjacency = resolve_inputs(cfg)
    # with verify_shards, also every upstream file the shards were cut from: a stage re-run
    # since then (same shapes, new values) is refused, naming it, instead of trained on silently
    manifest = ShardManifest.open(shards, verify_upstream_files=tcfg.verify_shards)
    plan = _shard_plan(manifest, shards, info, tcfg)

    # The shards own the layer count (one block per layer); the resolved count is what is
    # trained, checkpointed and written to run.yaml. The run key (work folder) stays that of
    # the config as given, which the launcher computes too.
    given = cfg
    num_blocks = manifest.num_layers
    cfg = replace(cfg, model=replace(cfg.model, num_layers=resolve_num_layers(cfg.model.num_layers, manifest, shards)))
    check_sampler_supports(cfg.model.conv, manifest.non_uniform_draws, shards)

    # ------------------------------------------------------------------ features
    features = _stream_features(manifest, shards, adjacency, tcfg)

    # ------------------------------------------------------------------ model, DDP, optimizer, AMP
    trained = _model_and_optimizer(cfg, info, features["in_feats"], features["num_classes"], adjacency)

    # ------------------------------------------------------------------ checkpoint identity
    dver = data_version(shards, canonical, adjacency)
    key = run_key(given.to_dict(), dver)
    work = work_dir_for(cfg.paths.out, key, cfg.paths.work)
    run = Run(
        cfg=cfg,
        info=info,
        report=report,
        t_start=t_start,
        shards=shards,
        canonical=canonical,
        adjacency=adjacency,
        manifest=manifest,
        num_blocks=num_blocks,
        **plan,
        **features,
        **trained,
        dver=dver,
        key=key,
        work=work,
        ckpt_path=work / CHECKPOINT_NAME,
        feature_rows=(
            FeatureRows("manifest", manifest.doc, shards, cache=_cache_spec(tcfg, adjacency, device))
            if (tcfg.feature_cache > 0 or tcfg.feature_cache_hot > 0) and isinstance(features["stream_features"], str)
            else None
        ),
    )
    if tcfg.class_weighted_loss:
        nodes = read_node_table(canonical)
        run.class_weight = class_weights(nodes.labels, nodes.masks["train"], run.num_classes).to(device)
    if tcfg.node_grad_stats:
        run.grad_stats = NodeGradStats(manifest.n)
    resume(run)

    if info.is_main:
        _log_run_start(run)
        run.eval_graph = load_eval_graph(run)
    return run


def _shard_plan(manifest: ShardManifest, shards: Path, info: DistInfo, tcfg: TrainingConfig) -> dict:
    """The `Run` fields of the shards' plan: this rank's streams, epochs and steps."""
    W = manifest.world_size
    if W % info.world_size:
        raise ValueError(
            f"{shards}: the shards were cut for world_size={W}; launch a number of processes that divides it "
            f"(got {info.world_size}), e.g. torchrun --nproc-per-node {W}, or re-materialize minibatch_shards "
            f"with world_size={info.world_size}"
        )
    shard_epochs = manifest.epochs
    per_stream = manifest.minibatches_per_epoch_per_rank
    steps_per_epoch = math.ceil(per_stream / tcfg.accumulate)
    epochs = training_epochs(tcfg, shard_epochs, steps_per_epoch)
    return {
        "my_streams": list(range(info.rank, W, info.world_size)),
        "shard_epochs": shard_epochs,
        "epochs": epochs,
        "per_stream": per_stream,
        "steps_per_epoch": steps_per_epoch,
        "total_steps": epochs * steps_per_epoch,
    }


def _stream_features(manifest: ShardManifest, shards: Path, adjacency: Path, tcfg: TrainingConfig) -> dict:
    """The `Run` fields of the features: their source, width, class count and fitted transform."""
    if manifest.has_features:
        stream_features = "manifest"
        in_feats = manifest.feature_dim
        stats = feature_chunks(manifest.doc, shards) if tcfg.feature_norm == "standard" else iter(())
        transform = FeatureTransform.fit(tcfg.feature_norm, stats)
    else:  # no features: one-hot log-degree buckets, from the adjacency's row lengths
        from graphs.stages.normalize import load_csr

        stream_features = degree_features(load_csr(adjacency).indptr, tcfg.degree_buckets)
        in_feats = tcfg.degree_buckets
        transform = FeatureTransform.fit(tcfg.feature_norm, iter([stream_features]))
    return {
        "stream_features": stream_features,
        "in_feats": in_feats,
        "num_classes": manifest.num_classes,
        "transform": transform,
    }


def _model_and_optimizer(cfg: RunConfig, info: DistInfo, in_feats: int, num_classes: int, adjacency: Path) -> dict:
    """The `Run` fields of the model, its DDP wrapper and communication hook, optimizer, VR-GCN and AMP."""
    tcfg, device = cfg.training, info.device
    torch.manual_seed(tcfg.seed)  # the same initial parameters on every rank
    model = build_model(cfg.model, in_feats, num_classes).to(device)
    net, comm_counter = model, None
    if info.initialized:
        net = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=tcfg.comm.bucket_cap_mb,
        )
        comm_counter = setup_comm_hook(net, tcfg.comm, timeout_s=tcfg.dist_timeout_s)
    optimizer = make_optimizer(tcfg.optimizer, model)
    if tcfg.compensation.grad_ema:
        optimizer = GradientEMA(optimizer, tcfg.compensation.grad_ema)
    vrgcn = None
    if tcfg.compensation.vrgcn:
        check_vrgcn_supports(cfg.model)
        vrgcn = VRGCN.from_adjacency(adjacency, device)
    precision = resolve_precision(tcfg.precision, device)
    scaler = grad_scaler(enabled=precision.loss_scaling)
    return {
        "model": model,
        "net": net,
        "optimizer": optimizer,
        "precision": precision,
        "scaler": scaler,
        "comm_counter": comm_counter,
        "vrgcn": vrgcn,
    }


def _log_run_start(run: Run) -> None:
    """Rank 0's opening lines: the model, processes, batch, epochs, precision and work folder."""
    tcfg, manifest, W = run.cfg.training, run.manifest, run.manifest.world_size
    run.report.info(
        f"training {run.cfg.model.conv} ({sum(p.numel() for p in run.model.parameters())} parameters) on "
        f"{run.device} with {run.info.world_size} process(es) x {len(run.my_streams)} stream(s) of W={W}, "
        f"{run.per_stream} minibatches of <= {manifest.batch_size} seeds per stream and epoch, accumulate "
        f"{tcfg.accumulate}: global batch {manifest.batch_size * W * tcfg.accumulate} seeds; "
        f"{run.epochs} epochs (shards hold {run.shard_epochs}); precision {tcfg.precision} -> "
        f"{run.precision.note}; backend {run.info.backend or 'none'}; work folder {run.work}"
    )
    if run.epochs > run.shard_epochs:
        run.report.info(
            f"{run.epochs} epochs over {run.shard_epochs} sampled epochs: epoch e replays sampled epoch e % "
            f"{run.shard_epochs} with its minibatches in a new seeded order per pass"
        )


def resume(run: Run) -> None:
    """Restore the model, optimizer, scaler and progress from the run's checkpoint, if any (one
    that cannot be used is set aside by rank 0, with a warning, and the run starts over)."""
    state = resume_state(run.ckpt_path, run.report.warning if run.info.is_main else None)
    if state is None:
        return
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    if state["scaler"]:
        run.scaler.load_state_dict(state["scaler"])
    run.history, run.best = list(state["history"]), dict(state["best"])
    run.start_epoch, run.step, run.stopped_early = state["epoch"] + 1, state["step"], state["stopped_early"]
    if run.info.is_main:
        run.report.info(f"resuming from {run.ckpt_path}: epochs 1..{state['epoch'] + 1} done, {run.step} steps")
        if state["code_version"] != code_version():
            run.report.warning(f"checkpoint written by {state['code_version']}, running {code_version()}")


class InMemoryEval:
    """Full-graph evaluation with Â and the transformed features held on rank 0 (moved once)."""

    def __init__(self, graph: EvalGraph, device: torch.device, batch_size: int):
        self.graph, self.device, self.batch_size = graph, device, batch_size
        self.labels, self.masks = graph.labels, graph.masks

    def forward(self, model) -> tuple[torch.Tensor, torch.Tensor]:
        """(embeddings, logits) of every node (the model left in eval mode)."""
        block, x = self.graph.on(self.device)
        model.eval()
        emb, logits = model.inference_with_embeddings(block, x, self.batch_size)
        return emb.float(), logits.float()

    def save_embeddings(self, emb: torch.Tensor, path: Path) -> None:
        np.save(path, emb.cpu().numpy())


class StreamedEval:
    """Full-graph evaluation streamed from the memory-mapped files (`training.evaluate.StreamingEval`)."""

    def __init__(self, stream: StreamingEval, labels: torch.Tensor, masks: dict):
        self.stream, self.labels, self.masks = stream, labels, masks

    def forward(self, model) -> tuple[torch.Tensor, torch.Tensor]:
        return self.stream.forward(model)

    def save_embeddings(self, emb: torch.Tensor, path: Path) -> None:
        """The embeddings file of the last forward, moved: never read through this process."""
        self.stream.save_embeddings(path)


def load_eval_graph(run: Run) -> InMemoryEval | StreamedEval:
    """Rank 0's evaluator: Â, the transformed features, labels and split masks in memory, or
    (``eval_batch_size`` > 0) streamed in row chunks from the memory-mapped files."""
    nodes = read_node_table(run.canonical)
    manifest, tcfg = run.manifest, run.cfg.training
    self_loops = manifest.self_loops  # evaluate over the graph the blocks were sampled from
    if tcfg.eval_batch_size:
        features = FeatureRows(run.stream_features, manifest.doc, run.shards)

        def rows(ids: np.ndarray) -> torch.Tensor:  # compact codes decoded per chunk, then the run's transform
            return run.transform(features.gather_host(ids, decode=True, release=True))

        # every core on rank 0 while the other ranks wait for its evaluation
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        stream = StreamingEval(
            run.adjacency, rows, tcfg.eval_batch_size, run.work / "eval", run.device, threads, self_loops=self_loops
        )
        graph_n, evaluator = stream.n, StreamedEval(stream, nodes.labels, nodes.masks)
    else:
        x_full = full_features(manifest.doc, run.shards) if manifest.has_features else run.stream_features
        block = load_full_block(run.adjacency)
        block = block if self_loops else remove_self_loops(block)
        graph = EvalGraph(block, run.transform(x_full), nodes.labels, nodes.masks)
        graph_n, evaluator = graph.block.num_dst, InMemoryEval(graph, run.device, tcfg.eval_batch_size)
    if not nodes.n == graph_n == manifest.n:
        raise ValueError(
            f"node counts differ: canonical_graph {nodes.n}, normalized_adjacency {graph_n}, "
            f"shards {manifest.n}; re-materialize the stale stage"
        )
    return evaluator


def forward_backward(run: Run, mb, minibatches_in_step: int, timing: dict):
    """Loss of one minibatch (a float; NonFiniteLossError when NaN or infinite) and its logits,
    its gradient accumulated (scaled for fp16, averaged over the step)."""
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
        run.scaler.scale(loss / minibatches_in_step).backward()
    if run.grad_stats is not None:  # the minibatch loss's own gradient: undo the loss scale and the 1/M
        run.grad_stats.record(x, mb.input_nodes, run.scaler.get_scale() / minibatches_in_step)
    t2 = run.now()
    timing["forward"] += t1 - t0
    timing["backward"] += t2 - t1
    return value, logits


def _non_finite_loss(run: Run, value: float) -> NonFiniteLossError:
    """The error stopping the run at its current step (`training.loss_check`), with its settings."""
    tcfg = run.cfg.training
    epoch, step = divmod(run.step, run.steps_per_epoch)
    norm = tcfg.feature_norm
    return non_finite_loss(
        value,
        epoch=epoch + 1,
        step=step + 1,
        steps=run.steps_per_epoch,
        causes=[
            f"feature normalization: training.feature_norm={norm!r}"
            + (" leaves features on their own scales; try 'standard'" if norm == "none" else ""),
            f"a learning rate too high: training.optimizer.lr={tcfg.optimizer.lr:g} "
            f"(training.gradient_clipping={tcfg.gradient_clipping:g}; 0 = off)",
            "a corrupted input: a NaN, infinite or huge value in the dataset's features or edge weights "
            "(check the landing files, then re-materialize canonical_graph and the stages after it)",
        ],
    )


def train_epoch(run: Run, epoch: int, profiler: StepProfiler) -> dict:
    """One epoch of optimizer steps over this rank's streams; this rank's metric row."""
    tcfg, info, device, model, optimizer = run.cfg.training, run.info, run.device, run.model, run.optimizer
    t_epoch = run.now()
    # dropout/DropEdge randomness: a function of (seed, epoch, rank), so a resumed
    # run draws exactly what an uninterrupted one would
    torch.manual_seed(tcfg.seed * 1_000_003 + epoch * 1009 + info.rank)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model.train()
    streams = _epoch_streams(run, epoch)
    iters = [iter(s) for s in streams]
    timing = dict.fromkeys(("data", "forward", "backward", "update"), 0.0)
    loss_sum = correct = seeds = minibatches = 0
    lr = optimizer.param_groups[0]["lr"]
    if run.comm_counter is not None:
        run.comm_counter.take()  # count this epoch's steps only
    try:
        with use_aggregation(model, tcfg.aggregation):  # evaluation keeps `auto`
            for s in range(run.steps_per_epoch):
                # one optimizer step: `accumulate` minibatches (fewer at the epoch's end) per stream
                micro = min(tcfg.accumulate, run.per_stream - s * tcfg.accumulate)
                sources = [it for _ in range(micro) for it in iters]
                for i, it in enumerate(sources):
                    t0 = run.now()
                    with record_function("data"):
                        mb = next(it)
                    timing["data"] += run.now() - t0
                    # DDP all-reduces the gradients in the step's last backward only
                    last = i == len(sources) - 1
                    with contextlib.nullcontext() if last or run.net is model else run.net.no_sync():
                        loss, logits = forward_backward(run, mb, len(sources), timing)
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
    return _epoch_row(run, epoch, streams, timing, train_seconds, loss=loss, acc=acc, lr=lr, seeds=seeds)


def _epoch_streams(run: Run, epoch: int) -> list[ShardStream]:
    """This rank's shard streams of `epoch` (a replayed sampled epoch in its own seeded order)."""
    tcfg = run.cfg.training
    return [
        ShardStream(
            run.shards,
            r,
            epoch % run.shard_epochs,
            run.device,
            tcfg.prefetch,
            features=run.feature_rows if run.feature_rows is not None else run.stream_features,
            verify=tcfg.verify_shards,
            manifest=run.manifest.doc,
            order_seed=replay_order_seed(tcfg.seed, epoch, run.shard_epochs, r),
        )
        for r in run.my_streams
    ]


def _optimizer_step(run: Run) -> float:
    """Set the scheduled learning rate, clip, step the optimizer through the loss scaler; the rate."""
    tcfg, optimizer = run.cfg.training, run.optimizer
    lr = learning_rate(tcfg.lr_schedule, tcfg.optimizer.lr, run.step, run.steps_per_epoch, run.total_steps)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if tcfg.gradient_clipping > 0:
        run.scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), tcfg.gradient_clipping)
    run.scaler.step(optimizer)  # skips the step if fp16 gradients overflowed
    run.scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return lr


def _epoch_row(run: Run, epoch: int, streams, timing: dict, train_seconds: float, *, loss, acc, lr, seeds) -> dict:
    """This rank's metric row of one epoch."""
    comm = {}
    if run.comm_counter is not None:
        comm = {"comm_bytes_per_step": run.comm_counter.take()["sent"] / max(run.steps_per_epoch, 1)}
    return {
        **comm,
        "epoch": epoch + 1,  # numbered from 1 in metrics, logs, summaries and plots
        "rank": run.info.rank,
        "loss": loss,
        "minibatch_acc": acc,
        "lr": lr,
        "steps": run.steps_per_epoch,
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


def evaluate_epoch(run: Run, epoch: int, row: dict) -> bool:
    """Rank 0: full-graph evaluation when due (accuracies into `row`), the best model so far;
    returns whether early stopping should fire."""
    tcfg = run.cfg.training
    if (epoch + 1) % tcfg.eval_every == 0 or epoch == run.epochs - 1:
        t0 = run.now()
        emb, logits = run.eval_graph.forward(run.model)  # eval mode: the next epoch's model.train() ends it
        row.update(accuracies(logits, run.eval_graph.labels, run.eval_graph.masks))
        score = selection_score(tcfg.select_by, row, logits, run.eval_graph.labels, run.eval_graph.masks["val"])
        row["eval_seconds"] = run.now() - t0
        if score > run.best.get("score", run.best["val_acc"]):
            run.best = {
                "score": score,
                "epoch": epoch + 1,
                "val_acc": row["val_acc"],
                "test_acc": row["test_acc"],
                "model": {k: v.detach().cpu().clone() for k, v in run.model.state_dict().items()},
            }
            # kept only after the last scheduled epoch: no copy is held while training goes on
            run.best_outputs = (epoch + 1, emb, logits) if epoch == run.epochs - 1 else None
    return bool(
        tcfg.early_stopping_patience
        and run.best["epoch"] >= 1
        and epoch + 1 - run.best["epoch"] >= tcfg.early_stopping_patience
    )


def save_run_checkpoint(run: Run, epoch: int) -> None:
    """Rank 0: the checkpoint a resumed run continues from after `epoch`."""
    save_checkpoint(
        run.ckpt_path,
        {
            "epoch": epoch,
            "step": run.step,
            "model": run.model.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "scaler": run.scaler.state_dict() if run.precision.loss_scaling else {},
            "best": run.best,
            "history": run.history,
            "stopped_early": run.stopped_early,
            "config": run.cfg.to_dict(),
            "run_key": run.key,
            "data_version": run.dver,
            "code_version": code_version(),
        },
    )


def finish_run(run: Run, replicas: list[str] | None = None) -> dict:
    """Rank 0: write the trained_model folder atomically (models, predictions, embeddings,
    metrics, curves, summary), then drop the work folder; returns the summary.
    `replicas`: every rank's `state_digest` of its final model, in rank order."""
    cfg, model, history = run.cfg, run.model, run.history
    in_feats, num_classes, work = run.in_feats, run.num_classes, run.work
    best = run.best
    if best["model"] is None:  # never evaluated (cannot happen with eval after the last epoch)
        best = {**best, "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}
    last_epoch = max((r["epoch"] for r in history), default=0)  # from 1
    original_id = read_node_table(run.canonical).original_id
    seconds = time.perf_counter() - run.t_start
    out = Path(cfg.paths.out)
    model_cfg = asdict(cfg.model)
    preprocessing = model_preprocessing(run)
    final_state = model_file_state(model, model_cfg, in_feats, num_classes, last_epoch, preprocessing)
    model.load_state_dict(best["model"])
    best_state = model_file_state(model, model_cfg, in_feats, num_classes, best["epoch"], preprocessing)
    if run.best_outputs is not None and run.best_outputs[0] == best["epoch"]:
        emb, logits = run.best_outputs[1:]  # the best model is the last one evaluated: its outputs
    else:
        emb, logits = run.eval_graph.forward(model)
    summary = _run_summary(run, best, last_epoch, seconds, replicas)
    with atomic_output_dir(out) as tmp:
        save_model_file(tmp / MODEL_FINAL, final_state)
        save_model_file(tmp / MODEL_BEST, best_state)
        summary["version"] = write_version_file(tmp)  # before the swap: a kill after it leaves a named model
        write_predictions(tmp / PREDICTIONS, original_id, logits)
        copy_label_classes(run.canonical, tmp)  # the user's label values, in every model version
        run.eval_graph.save_embeddings(emb, tmp / EMBEDDINGS)
        write_metrics(history, tmp / METRICS)
        plot_curves(history, tmp / CURVES)
        cfg_out = replace(cfg, paths=replace(cfg.paths, work=str(work)))
        cfg_out.to_yaml(tmp / "run.yaml")
        if (work / PROFILE_DIR).is_dir():
            shutil.copytree(work / PROFILE_DIR, tmp / PROFILE_DIR)
            summary["profile"] = sorted(p.name for p in (tmp / PROFILE_DIR).iterdir())
        if run.grad_stats is not None:
            summary["node_grad_stats"] = run.grad_stats.write(tmp)
        write_json(tmp / SUMMARY, summary)
    shutil.rmtree(work, ignore_errors=True)
    return summary


def _run_summary(run: Run, best: dict, last_epoch: int, seconds: float, replicas: list[str] | None) -> dict:
    """The summary's accuracies, epochs, timings, batch and setup facts and identities."""
    cfg, info, manifest, history = run.cfg, run.info, run.manifest, run.history
    final_row = next(r for r in reversed(history) if r["rank"] == 0 and "val_acc" in r)
    main_rows = [r for r in history if r["rank"] == 0]
    return {
        "best_epoch": best["epoch"],
        "best_val_acc": best["val_acc"],
        "test_acc_at_best_val": best["test_acc"],
        "final_epoch": last_epoch,
        "final_train_acc": final_row["train_acc"],
        "final_val_acc": final_row["val_acc"],
        "final_test_acc": final_row["test_acc"],
        "final_loss": float(np.mean([r["loss"] for r in history if r["epoch"] == last_epoch])),
        "epochs_trained": last_epoch,
        "epochs_planned": run.epochs,
        "sampled_epochs": run.shard_epochs,
        "sampled_epoch_passes": epoch_passes(last_epoch, run.shard_epochs),
        "optimizer_steps": run.step,
        "stopped_early": run.stopped_early,
        "mean_epoch_seconds": float(np.mean([r["epoch_seconds"] for r in main_rows])),
        "mean_train_seconds": float(np.mean([r["train_seconds"] for r in main_rows])),
        "seeds_per_s": float(
            np.mean([sum(r["seeds_per_s"] for r in history if r["epoch"] == e) for e in {r["epoch"] for r in history}])
        ),
        "data_wait_share": float(np.mean([r["data_wait_share"] for r in history])),
        "peak_memory_mb": float(max(r["peak_memory_mb"] for r in history)),
        **_comm_summary(history),
        **_feature_cache_summary(run.feature_rows),
        "world_size": manifest.world_size,
        "processes": info.world_size,
        "batch_size": manifest.batch_size,
        "accumulate": cfg.training.accumulate,
        "global_batch": manifest.batch_size * manifest.world_size * cfg.training.accumulate,
        "precision": run.precision.note,
        "backend": info.backend or "none",
        "device": str(info.device),
        "nodes": manifest.n,
        "num_classes": run.num_classes,
        "in_feats": run.in_feats,
        "seconds": seconds,
        "run_key": run.key,
        "data_version": run.dver,
        "replica_sha256": list(replicas or []),
        "replicas_identical": len(set(replicas or [])) <= 1,
        "code_version": code_version(),
    }


# ---------------------------------------------------------------------------- helpers


def model_preprocessing(run: Run) -> Preprocessing:
    """How this run built the model's input (stored in the model files for inference on new data)."""
    adjacency_summary = Adjacency.open(run.adjacency).summary
    return Preprocessing(
        input="features" if run.stream_features == "manifest" else "degree",
        feature_norm=run.transform.kind,
        degree_buckets=run.cfg.training.degree_buckets,
        degree_norm=str(adjacency_summary.get("degree_norm", "both")),
        mean=run.transform.mean,
        std=run.transform.std,
        self_loops=run.manifest.self_loops,
    )


def training_epochs(tcfg: TrainingConfig, shard_epochs: int, steps_per_epoch: int) -> int:
    """Epochs to run: ``training.epochs``, or when 0 the automatic budget
    ``min(max_epochs, max(shard_epochs, ceil(min_steps / steps_per_epoch)))`` (see its help)."""
    if tcfg.epochs:
        return tcfg.epochs
    return min(tcfg.max_epochs, max(shard_epochs, math.ceil(tcfg.min_steps / max(steps_per_epoch, 1))))


def epoch_passes(epochs: int, shard_epochs: int) -> list[int]:
    """How often each sampled epoch is read when ``epochs`` epochs run (epoch e reads e % E)."""
    return [len(range(k, epochs, shard_epochs)) for k in range(shard_epochs)]


def replay_order_seed(seed: int, epoch: int, shard_epochs: int, stream: int) -> int | None:
    """The minibatch-order seed of ``epoch``'s read of ``stream``: None (stored order) on the
    first pass over the sampled epochs, a seed derived from (seed, epoch, stream) on replays."""
    if epoch < shard_epochs:
        return None
    return int(np.random.SeedSequence([seed, epoch, stream, 0x5EED]).generate_state(1)[0])


def resolve_num_layers(num_layers: int, manifest: ShardManifest, shards: Path) -> int:
    """The model's layer count: ``num_layers``, or the shards' block count when 0.

    Neighbour-sampled shards hold one block per layer, so a different count is an error;
    cluster_gcn / saint shards hold one block that serves any number of layers.
    """
    num_blocks = manifest.num_layers
    if num_layers == 0:
        return num_blocks
    if not manifest.shared_block and num_layers != num_blocks:
        raise ValueError(
            f"model.num_layers={num_layers} but {shards / MANIFEST_NAME} holds {num_blocks} sampled blocks per "
            f"minibatch (fanouts {manifest.settings.get('fanouts')!r}, one per layer); set model.num_layers to 0 "
            f"(follow the shards) or re-materialize minibatch_shards with {num_layers} fanouts"
        )
    return num_layers


def check_sampler_supports(conv: str, draws: str | None, shards: Path) -> None:
    """Refuse a layer whose aggregation cannot use the sampler's correction weights.

    A layer that is not ``linear`` (`training.layer_registry`: GAT's softmax ratio of
    attention scores, SAGE-pool's element-wise max) has no unbiased form over the draws the
    shards' manifest records as non-uniform (`draws`: its ``non_uniform_draws``, declared by
    the sampler): its result would silently differ from the full-graph one the model is
    evaluated with.
    """
    kind = layer_kind(conv)
    if draws and not kind.linear:
        raise ValueError(
            f"model.conv={conv!r} cannot be trained on shards cut with {draws} ({shards / MANIFEST_NAME}): a "
            f"{kind.aggregates_by} aggregation has no correction for non-uniform draws; re-materialize "
            "minibatch_shards with sampler neighbor (neighbor_prob uniform) or cluster_gcn, or use a layer whose "
            f"aggregation is linear ({', '.join(linear_layer_names())})"
        )


def model_blocks(blocks: list, num_layers: int, shared_block: bool) -> list:
    """The blocks a ``num_layers``-layer model runs on: the stored ones, or the shared one repeated."""
    return [blocks[0]] * num_layers if shared_block else blocks


def _cache_spec(tcfg: TrainingConfig, adjacency: Path, device: torch.device) -> CacheSpec:
    """The feature cache's tiers; nodes are ranked by their row lengths in Â (degree, + 1 with
    the self loop) for the hot tier and the ``degree`` policy."""
    from graphs.stages.normalize import load_csr

    return CacheSpec(
        warm_share=tcfg.feature_cache,
        warm_policy=tcfg.feature_cache_policy,
        hot_share=tcfg.feature_cache_hot,
        device=device,
        degree=np.diff(load_csr(adjacency).indptr),
    )


def resolve_inputs(cfg: RunConfig) -> tuple[Path, Path, Path]:
    """(shards, canonical, adjacency) folders: from ``paths`` or as the manifest names them."""
    shards = Path(cfg.paths.shards).resolve()
    named = ShardManifest.open(shards).inputs

    def pick(setting: str, name: str) -> Path:
        if setting:
            return Path(setting).resolve()
        if name not in named:
            raise ValueError(
                f"paths.{'canonical' if 'canonical' in name else 'adjacency'} is not set and "
                f"{shards / MANIFEST_NAME} does not name a {name} folder"
            )
        return (shards / named[name]).resolve()

    return shards, pick(cfg.paths.canonical, CanonicalGraph.STAGE), pick(cfg.paths.adjacency, Adjacency.STAGE)


def make_optimizer(cfg: OptimizerConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW / Adam / SGD over all parameters (one group)."""
    params = model.parameters()
    if cfg.type == "AdamW":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas))
    if cfg.type == "Adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas))
    return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum)


def learning_rate(sched: LRScheduleConfig, base_lr: float, step: int, steps_per_epoch: int, total_steps: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based): linear warmup, then the schedule."""
    warmup = sched.warmup_epochs * steps_per_epoch
    if step < warmup:
        return base_lr * (step + 1) / warmup
    if sched.type == "constant":
        return base_lr
    if sched.type == "cosine":
        progress = min(1.0, (step - warmup) / max(1.0, total_steps - warmup))
        return base_lr * (sched.min_lr_ratio + (1 - sched.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
    return base_lr * sched.gamma ** ((step // steps_per_epoch) // sched.step_epochs)


def _comm_summary(history: list[dict]) -> dict:
    """Mean gradient bytes sent per rank and optimizer step (training.comm.count_bytes), if counted."""
    counted = [r["comm_bytes_per_step"] for r in history if "comm_bytes_per_step" in r]
    return {"comm_bytes_per_step": float(np.mean(counted))} if counted else {}


def _feature_cache_summary(rows: FeatureRows | None) -> dict:
    """Rank 0's feature cache (training.feature_cache or feature_cache_hot > 0): the rows of its
    tiers, and the share of the minibatches' unique rows they served in this process."""
    if rows is None or rows.cache is None:
        return {}
    cache = rows.cache
    return {
        "feature_cache_rows": cache.capacity,
        "feature_cache_hot_rows": len(cache.hot_nodes),
        "feature_cache_hit_rate": cache.stats.hit_rate,
        "feature_cache_hot_hit_rate": cache.stats.hot_hits / max(1, cache.stats.requested),
    }


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_bytes() / 2**20


def _epoch_line(rows: list[dict]) -> str:
    """An epoch's figures over every rank (after the progress part, `graphs.infra.progress`)."""
    main = rows[0]
    line = (
        f"loss {np.mean([r['loss'] for r in rows]):.4f}, "
        f"{sum(r['seeds_per_s'] for r in rows):.0f} seeds/s, {max(r['train_seconds'] for r in rows):.2f} s "
        f"(data wait {max(r['data_wait_share'] for r in rows):.0%})"
    )
    if "val_acc" in main:
        line += f", train {main['train_acc']:.4f} val {main['val_acc']:.4f} test {main['test_acc']:.4f}"
    return line


def _pipes_metadata(summary: dict) -> dict:
    """The summary's numbers and strings (what dagster-pipes reports as metadata); lists of
    numbers (``sampled_epoch_passes``) as comma-separated text."""
    out = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool))}
    out.update({k: ",".join(map(str, v)) for k, v in summary.items() if isinstance(v, list) and k != "profile"})
    return out
