"""The state of one node-classification training run (`Run`) and `setup_run`, which builds it once.

`setup_run` resolves the input folders (`resolve_inputs`), opens the shards' manifest and plans
this rank's streams, epochs and steps (`training.run_plan`), fits the feature transform, builds
the model, its DDP wrapper, optimizer (`make_optimizer`) and AMP scaler, derives the checkpoint
identity (run key and work folder), restores the progress of a checkpoint (`resume`) and, on
rank 0, loads the evaluator (`load_eval_graph`: `InMemoryEval`, or `StreamedEval` when
``eval_batch_size`` > 0). The epoch loop (`training.epoch_loop`), the evaluation and
checkpoints (`training.train`) and the outputs (`training.publish`) then read and update the
`Run`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.shard_format import MANIFEST_NAME
from graphs.formats.shard_manifest import ShardManifest
from graphs.stages.normalize import Adjacency, load_csr
from training.blocks import remove_self_loops
from training.checkpoint import CHECKPOINT_NAME, code_version, data_version, resume_state, run_key, work_dir_for
from training.comm_hooks import CommCounter, setup_comm_hook
from training.compensation import VRGCN, GradientEMA, check_vrgcn_supports
from training.config import OptimizerConfig, RunConfig, TrainingConfig
from training.data import FeatureRows
from training.distributed import DistInfo
from training.evaluate import EvalGraph, StreamingEval, load_full_block
from training.feature_cache import CacheSpec
from training.features import FeatureTransform, degree_features, feature_chunks, full_features, read_node_table
from training.imbalance import class_weights
from training.layer_registry import layer_kind
from training.layers import build_model
from training.node_stats import NodeGradStats
from training.precision import Precision, grad_scaler, resolve_precision
from training.report import Reporter
from training.run_plan import StepPlan, check_sampler_supports, resolve_num_layers
from training.typed_blocks import TypedBlock

__all__ = [
    "InMemoryEval",
    "Run",
    "StreamedEval",
    "load_eval_graph",
    "make_optimizer",
    "resolve_inputs",
    "resume",
    "setup_run",
]


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
    plan: StepPlan
    # features
    stream_features: str | torch.Tensor  # "manifest": the shards' features; else degree one-hots
    in_feats: int
    num_classes: int
    transform: FeatureTransform
    # model, DDP, optimizer, AMP
    model: torch.nn.Module
    net: torch.nn.Module
    optimizer: torch.optim.Optimizer
    precision: Precision
    scaler: torch.cuda.amp.GradScaler  # torch.amp.GradScaler from torch 2.3 (training.precision.grad_scaler_class)
    # checkpoint identity: the data version, the run key and the work folder the key names
    data_version: str
    key: str
    work: Path
    eval_graph: "InMemoryEval | StreamedEval | None" = None
    feature_rows: FeatureRows | None = None  # shared by the streams when training.feature_cache > 0
    # imbalanced classes and adaptive sampling (None when off; training.imbalance, training.node_stats)
    class_weight: torch.Tensor | None = None
    grad_stats: NodeGradStats | None = None
    # options (training.comm, training.compensation): None when off
    comm_counter: CommCounter | None = None
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

    @property
    def epochs(self) -> int:
        return self.plan.epochs

    @property
    def checkpoint_path(self) -> Path:
        return self.work / CHECKPOINT_NAME

    def now(self) -> float:
        """perf_counter after a CUDA sync: accurate stage timings on GPUs."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def setup_run(cfg: RunConfig, info: DistInfo, report: Reporter) -> Run:
    """The run state: shards' plan, features, model/DDP/optimizer/AMP, resume, evaluation graph."""
    tcfg, device = cfg.training, info.device
    t_start = time.perf_counter()

    # ------------------------------------------------------------------ inputs and shards
    shards, canonical, adjacency = resolve_inputs(cfg)
    # with verify_shards, also every upstream file the shards were cut from: a stage re-run
    # since then (same shapes, new values) is refused, naming it, instead of trained on silently
    manifest = ShardManifest.open(shards, verify_upstream_files=tcfg.verify_shards)
    plan = StepPlan.of(manifest, shards, info.rank, info.world_size, tcfg)

    # The shards own the layer count (one block per layer); the resolved count is what is
    # trained, checkpointed and written to run.yaml. The run key (work folder) stays that of
    # the config as given, which the launcher computes too.
    given = cfg
    cfg = replace(cfg, model=replace(cfg.model, num_layers=resolve_num_layers(cfg.model.num_layers, manifest, shards)))
    check_sampler_supports(cfg.model.conv, manifest.non_uniform_draws, shards)

    # ------------------------------------------------------------------ features
    features = _stream_features(manifest, shards, adjacency, tcfg)
    hot = max(tcfg.feature_cache_hot, manifest.replicated_share)  # hybrid shards' replicated rows stay hot

    # ------------------------------------------------------------------ model, DDP, optimizer, AMP
    typed = manifest.doc.get("typed")
    trained = _model_and_optimizer(cfg, info, features["in_feats"], features["num_classes"], adjacency, typed)

    # ------------------------------------------------------------------ checkpoint identity
    version = data_version(shards, canonical, adjacency)
    key = run_key(given.to_dict(), version)
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
        plan=plan,
        **features,
        **trained,
        data_version=version,
        key=key,
        work=work,
        feature_rows=(
            FeatureRows("manifest", manifest.doc, shards, cache=_cache_spec(tcfg, adjacency, device, hot))
            if (tcfg.feature_cache > 0 or hot > 0) and isinstance(features["stream_features"], str)
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


def _stream_features(manifest: ShardManifest, shards: Path, adjacency: Path, tcfg: TrainingConfig) -> dict:
    """The `Run` fields of the features: their source, width, class count and fitted transform."""
    if manifest.has_features:
        stream_features = "manifest"
        in_feats = manifest.feature_dim
        stats = feature_chunks(manifest.doc, shards) if tcfg.feature_norm == "standard" else iter(())
        transform = FeatureTransform.fit(tcfg.feature_norm, stats)
    else:  # no features: one-hot log-degree buckets, from the adjacency's row lengths
        stream_features = degree_features(load_csr(adjacency).indptr, tcfg.degree_buckets)
        in_feats = tcfg.degree_buckets
        transform = FeatureTransform.fit(tcfg.feature_norm, iter([stream_features]))
    return {
        "stream_features": stream_features,
        "in_feats": in_feats,
        "num_classes": manifest.num_classes,
        "transform": transform,
    }


def _model_and_optimizer(
    cfg: RunConfig, info: DistInfo, in_feats: int, num_classes: int, adjacency: Path, typed: dict | None = None
) -> dict:
    """The `Run` fields of the model, its DDP wrapper and communication hook, optimizer, VR-GCN and AMP.
    A typed graph's model (`typed`: its schema) keeps its learned node vectors sparse except under
    NCCL, whose collectives take no sparse gradients."""
    tcfg, device = cfg.training, info.device
    torch.manual_seed(tcfg.seed)  # the same initial parameters on every rank
    sparse = not (info.initialized and device.type == "cuda")
    model = build_model(cfg.model, in_feats, num_classes, typed, sparse_embeddings=sparse).to(device)
    net, comm_counter = model, None
    if info.initialized:
        net = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=tcfg.comm.bucket_cap_mb,
            # a relation without edges in a minibatch leaves its layer unused where layers run per
            # relation; a relational layer (rgcn) reads every relation's weight in every step
            find_unused_parameters=typed is not None and not layer_kind(cfg.model.conv).relational,
        )
        comm_counter = setup_comm_hook(net, tcfg.comm, timeout_s=tcfg.dist_timeout_s)
    optimizer = make_optimizer(tcfg.optimizer, model)
    if tcfg.compensation.grad_ema:
        if isinstance(optimizer, WithSparse):
            raise ValueError(
                "training.compensation.grad_ema averages dense gradients; this typed graph's model learns "
                "vectors with sparse ones (a node type without features): turn grad_ema off"
            )
        optimizer = GradientEMA(optimizer, tcfg.compensation.grad_ema)
    vrgcn = None
    if tcfg.compensation.vrgcn:
        if typed is not None:
            raise ValueError(
                "training.compensation.vrgcn keeps one history per layer of a homogeneous model; a typed graph's relational model has none"
            )
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
        f"{run.device} with {run.info.world_size} process(es) x {len(run.plan.my_streams)} stream(s) of W={W}, "
        f"{run.plan.per_stream} minibatches of <= {manifest.batch_size} seeds per stream and epoch, accumulate "
        f"{tcfg.accumulate}: global batch {manifest.batch_size * W * tcfg.accumulate} seeds; "
        f"{run.epochs} epochs (shards hold {run.plan.shard_epochs}); precision {tcfg.precision} -> "
        f"{run.precision.note}; backend {run.info.backend or 'none'}; work folder {run.work}"
    )
    if run.epochs > run.plan.shard_epochs:
        run.report.info(
            f"{run.epochs} epochs over {run.plan.shard_epochs} sampled epochs: epoch e replays sampled epoch e % "
            f"{run.plan.shard_epochs} with its minibatches in a new seeded order per pass"
        )


def resume(run: Run) -> None:
    """Restore the model, optimizer, scaler and progress from the run's checkpoint, if any (one
    that cannot be used is set aside by rank 0, with a warning, and the run starts over)."""
    state = resume_state(run.checkpoint_path, run.report.warning if run.info.is_main else None)
    if state is None:
        return
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    if state["scaler"]:
        run.scaler.load_state_dict(state["scaler"])
    run.history, run.best = list(state["history"]), dict(state["best"])
    run.start_epoch, run.step, run.stopped_early = state["epoch"] + 1, state["step"], state["stopped_early"]
    if run.info.is_main:
        run.report.info(f"resuming from {run.checkpoint_path}: epochs 1..{state['epoch'] + 1} done, {run.step} steps")
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
    if tcfg.eval_batch_size and manifest.doc.get("typed"):
        raise ValueError(
            "training.eval_batch_size streams a homogeneous Â; a typed graph is evaluated in memory (set it to 0)"
        )
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
        block = block if self_loops or isinstance(block, TypedBlock) else remove_self_loops(block)
        graph = EvalGraph(block, run.transform(x_full), nodes.labels, nodes.masks)
        graph_n, evaluator = graph.block.num_dst, InMemoryEval(graph, run.device, tcfg.eval_batch_size)
    if not nodes.n == graph_n == manifest.n:
        raise ValueError(
            f"node counts differ: canonical_graph {nodes.n}, normalized_adjacency {graph_n}, "
            f"shards {manifest.n}; re-materialize the stale stage"
        )
    return evaluator


def _cache_spec(tcfg: TrainingConfig, adjacency: Path, device: torch.device, hot_share: float) -> CacheSpec:
    """The feature cache's tiers; nodes are ranked by their row lengths in Â (degree, + 1 with
    the self loop) for the hot tier (`hot_share` of the rows) and the ``degree`` policy."""
    return CacheSpec(
        warm_share=tcfg.feature_cache,
        warm_policy=tcfg.feature_cache_policy,
        hot_share=hot_share,
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


class WithSparse:
    """An optimizer for a model with sparse parameters (learned node vectors): `dense` steps the
    others, ``torch.optim.SparseAdam`` the sparse ones, updating only the rows a step touched.
    Forwards ``param_groups`` (both, so setting the learning rate sets it for both), ``state``,
    ``zero_grad``, ``step``, ``state_dict`` as one optimizer, as `GradScaler` and the loop use it."""

    def __init__(self, dense: torch.optim.Optimizer, sparse: torch.optim.Optimizer):
        self.dense, self.sparse = dense, sparse

    @property
    def param_groups(self) -> list[dict]:
        return self.dense.param_groups + self.sparse.param_groups

    @property
    def state(self):
        return {**self.dense.state, **self.sparse.state}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.dense.zero_grad(set_to_none=set_to_none)
        self.sparse.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        loss = self.dense.step(closure)
        self.sparse.step()
        return loss

    def state_dict(self) -> dict:
        return {"dense": self.dense.state_dict(), "sparse": self.sparse.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"dense", "sparse"}:
            raise ValueError("the checkpoint's optimizer state was written for a model without sparse parameters")
        self.dense.load_state_dict(state["dense"])
        self.sparse.load_state_dict(state["sparse"])


def make_optimizer(cfg: OptimizerConfig, model: torch.nn.Module) -> torch.optim.Optimizer | WithSparse:
    """AdamW / Adam / SGD over all parameters (one group); a model's sparse parameters
    (``sparse_parameters()``, learned node vectors) go to SparseAdam at the same learning rate."""
    sparse = list(getattr(model, "sparse_parameters", list)())
    if sparse:
        sparse_ids = {id(p) for p in sparse}
        dense = _optimizer(cfg, [p for p in model.parameters() if id(p) not in sparse_ids])
        return WithSparse(dense, torch.optim.SparseAdam(sparse, lr=cfg.lr, betas=tuple(cfg.betas)))
    return _optimizer(cfg, model.parameters())


def _optimizer(cfg: OptimizerConfig, params) -> torch.optim.Optimizer:
    """AdamW / Adam / SGD over `params` (one group)."""
    if cfg.type == "AdamW":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas))
    if cfg.type == "Adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas))
    return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum)
