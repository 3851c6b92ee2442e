"""Link-prediction training and evaluation from edge-seed shards (plain torch, no DGL).

The same encoders as node classification (`training.layers.GNN`, output width = the
embedding width), a scorer over pairs of embeddings, binary cross-entropy on each
minibatch's positive and negative pairs (`graphs.sampling.link`), and evaluation of
full-graph embeddings over the message-passing graph against the fixed evaluation
negatives of `graphs.stages.edge_split` (`training.metrics.link_prediction_report`: ROC-AUC, MRR,
Hits@10/50/100).

Scorers (``LinkTrainConfig.scorer``): ``dot`` = ``<h_u, h_v>``; ``mlp`` = DGL's
link_pred.py predictor ``Linear-ReLU-Linear-ReLU-Linear`` on ``h_u * h_v``; ``hybrid`` (the
default) = that predictor on ``h_u * h_v`` concatenated with the pair's structural features
on the message-passing graph (`training.pair_features`: common neighbours, Adamic-Adar,
resource allocation, log degrees), plus a linear term of those features. The features of a
training positive describe the graph without that edge, as a held-out edge is seen. Besides the
shards' uniform negatives, each step adds one hard negative per positive
(``hard_negatives``): a neighbour's neighbour of its source that is not its neighbour, drawn
among the minibatch's nodes (`training.pair_features.two_hop_negatives`), so the scorer
also learns to rank pairs that share neighbours but are no edge.

The budget follows node classification's rule (`training.config.TrainingConfig`): with
``epochs = 0`` the run trains ``min(max_epochs, max(E, ceil(min_steps / S)))`` epochs (E the
shards' sampled epochs, replayed in order; S optimizer steps per epoch), stopped early when
validation MRR has not improved for ``early_stopping_patience`` evaluations; the model of
the best validation MRR is the one kept, tested and written. Epochs are numbered from 1.
A progress line (steps, seeds/s, ETA; `graphs.infra.progress`) is logged every few seconds
within epochs and one line per evaluated epoch.

One process reads every rank's stream of an epoch in turn (each minibatch one optimizer
step); link prediction is not launched under torchrun/DDP (node classification is).

Files written into ``out_dir`` (`train_link`): ``model.safetensors`` (`training.outputs.LINK_MODEL`:
a `training.state_file` of kind ``link_model``, format ``LINK_MODEL_FORMAT``, holding
{"state_dict", "config", "model_config", "in_feats", "graph": {"nodes", "edges"}}: everything
scoring needs besides the message-passing graph and the features it was trained on; loading
it never runs code), ``metrics.parquet`` (one row per evaluated epoch and split: epoch, split,
auc, mrr, hits@10, hits@50, hits@100, loss; the test row carries the best epoch),
``summary.json`` (config, best epoch, its val/test metrics, epoch times).

Usage::

    summary = train_link(shards_dir, split_dir, adjacency_dir, out_dir, LinkTrainConfig())
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from graphs.formats.shard_format import MANIFEST_NAME
from graphs.formats.shard_manifest import ShardManifest
from graphs.infra.config_checks import (
    MAX_EPOCHS,
    MAX_PREFETCH,
    MAX_RATE,
    MAX_ROWS,
    MAX_SEED,
    MAX_STEPS,
    bounded_repr,
    check_fields,
)
from graphs.infra.progress import Progress
from graphs.infra.storage import CorruptFileError, read_file_hashes
from graphs.stages.edge_split import LINK_PREDICTION, load_edge_split
from graphs.stages.normalize import Adjacency
from training.blocks import remove_self_loops
from training.data import ShardStream
from training.evaluate import load_full_block
from training.features import degree_features, full_features
from training.layers import GNN, ModelConfig, build_model
from training.loss_check import NonFiniteLossError, non_finite_loss
from training.metrics import LINK_HITS_AT, link_prediction_report
from training.outputs import LINK_MODEL, METRICS, SUMMARY
from training.pair_features import FEATURE_NAMES, PairHeuristics, two_hop_negatives
from training.state_file import read_state_file, write_state_file

__all__ = [
    "SCORERS",
    "LinkModel",
    "LinkTrainConfig",
    "SavedLinkModel",
    "evaluate_link",
    "evaluate_saved",
    "load_saved",
    "pair_scores",
    "train_link",
]

SCORERS = ("dot", "mlp", "hybrid")
LINK_MODEL_FORMAT = 2  # the model file's format version (training.state_file, kind "link_model")
_LINK_KIND = "link_model"
_SCORE_CHUNK = 1 << 18  # pairs scored at once by SavedLinkModel.probabilities (bounds the MLP's memory)
_REMEDY = "re-materialize trained_model (retrain) to write it in this format"


@dataclass(kw_only=True)
class LinkTrainConfig:
    """How a link-prediction model is trained (the encoder's architecture is a ModelConfig)."""

    scorer: str = field(
        default="hybrid",
        metadata={
            "help": f"pair scorer, one of {SCORERS}: hybrid = an MLP on h_u*h_v and the pair's common-neighbour, "
            "Adamic-Adar, resource-allocation and degree features on the message-passing graph"
        },
    )
    lr: float = field(default=1e-3, metadata={"max": MAX_RATE, "help": "Adam learning rate"})
    epochs: int = field(
        default=0,
        metadata={
            "max": MAX_EPOCHS,
            "help": "training epochs; 0 = the automatic budget: min(max_epochs, max(E, ceil(min_steps / S))) with "
            "E the shards' epochs (replayed in order) and S optimizer steps per epoch, ended earlier by "
            "early_stopping_patience",
        },
    )
    min_steps: int = field(
        default=1000,
        metadata={"max": MAX_STEPS, "help": "automatic budget (epochs=0): train at least this many optimizer steps"},
    )
    max_epochs: int = field(
        default=100, metadata={"max": MAX_EPOCHS, "help": "automatic budget (epochs=0): at most this many epochs"}
    )
    early_stopping_patience: int = field(
        default=5,
        metadata={
            "max": MAX_EPOCHS,
            "help": "stop when validation MRR has not improved for this many evaluations (the model of the best "
            "one is kept); 0 = off",
        },
    )
    hard_negatives: bool = field(
        default=True,
        metadata={
            "help": "add one hard negative per positive seed edge: a neighbour's neighbour of its source among the "
            "minibatch's nodes that is not its neighbour (pairs with common neighbours, which uniform negatives "
            "almost never are)"
        },
    )
    eval_every: int = field(
        default=1, metadata={"max": MAX_EPOCHS, "help": "evaluate on the validation split every this many epochs"}
    )
    eval_batch_size: int = field(
        default=0, metadata={"max": MAX_ROWS, "help": "rows per chunk of full-graph inference; 0 = all"}
    )
    degree_buckets: int = field(
        default=16,
        metadata={"max": 64, "help": "a graph without features gets one-hot log2-degree buckets of this many classes"},
    )
    seed: int = field(default=0, metadata={"max": MAX_SEED, "help": "seed of the parameter initialization"})
    prefetch: int = field(default=2, metadata={"max": MAX_PREFETCH, "help": "minibatches read ahead per stream"})
    max_steps_per_epoch: int = field(
        default=0,
        metadata={
            "max": MAX_STEPS,
            "help": "stop an epoch after this many minibatches (DGL's link_pred.py stops at 1000); 0 = all",
        },
    )

    def __post_init__(self) -> None:
        check_fields(self, "link")
        if self.scorer not in SCORERS:
            raise ValueError(f"scorer={bounded_repr(self.scorer)} is not one of {SCORERS}")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be > 0")
        for name in ("epochs", "min_steps", "early_stopping_patience", "eval_batch_size", "prefetch"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if self.max_steps_per_epoch < 0:
            raise ValueError(f"max_steps_per_epoch={self.max_steps_per_epoch} must be >= 0")
        for name in ("eval_every", "degree_buckets", "max_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")


class LinkModel(nn.Module):
    """A GNN encoder and a pair scorer; ``hybrid`` also reads `heuristics` (the message-passing
    graph's `PairHeuristics`, not a parameter: rebuilt from the graph wherever the model is loaded)."""

    def __init__(self, encoder: GNN, width: int, scorer: str, heuristics: PairHeuristics | None = None):
        super().__init__()
        self.encoder = encoder
        self.scorer = scorer
        self.heuristics = heuristics
        if scorer == "hybrid" and heuristics is None:
            raise ValueError("scorer='hybrid' needs the message-passing graph's PairHeuristics")
        extra = len(FEATURE_NAMES) if scorer == "hybrid" else 0
        if scorer in ("mlp", "hybrid"):
            self.predictor = nn.Sequential(
                nn.Linear(width + extra, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
            )
        if scorer == "hybrid":
            self.wide = nn.Linear(extra, 1)

    def score(
        self, h: torch.Tensor, pairs: torch.Tensor, nodes: torch.Tensor | None = None, own_edges: bool = False
    ) -> torch.Tensor:
        """Logits of the pairs (int64 [2, P] row indices of `h`); `nodes` = the global node id of
        each row of `h` (None: row = node id); `own_edges`: the pairs are edges of the graph."""
        feats = None
        if self.scorer == "hybrid":
            ids = pairs if nodes is None else nodes[pairs]
            feats = self.heuristics(ids, exclude_own_edge=own_edges)
        return pair_scores(self, h[pairs[0]], h[pairs[1]], feats)

    def forward(self, blocks, x, pos_pairs, neg_pairs, nodes=None) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(blocks, x)
        return self.score(h, pos_pairs, nodes, own_edges=True), self.score(h, neg_pairs, nodes)


def pair_scores(model: LinkModel, hu: torch.Tensor, hv: torch.Tensor, feats: torch.Tensor | None = None):
    """Logits of pairs of embeddings (`feats`: their `PairHeuristics` features, hybrid only)."""
    if model.scorer == "dot":
        return (hu * hv).sum(-1)
    if model.scorer == "mlp":
        return model.predictor(hu * hv).squeeze(-1)
    return (model.predictor(torch.cat([hu * hv, feats], 1)) + model.wide(feats)).squeeze(-1)


def _features(manifest: ShardManifest, shards: Path, adjacency_block, buckets: int) -> torch.Tensor:
    """The input features: the manifest's, else one-hot log2-degree buckets of the message-passing Â."""
    x = full_features(manifest.doc, shards)
    if x is None:
        x = degree_features(adjacency_block.indptr.numpy(), buckets)
    return x


@torch.no_grad()
def embed(model: LinkModel, full_block, x: torch.Tensor, batch_size: int = 0) -> torch.Tensor:
    """Full-graph embeddings [n, width] of every node over `full_block`."""
    was = model.training
    model.eval()
    h = model.encoder.inference(full_block, x, batch_size or None)
    model.train(was)
    return h


@torch.no_grad()
def evaluate_link(model: LinkModel, full_block, x: torch.Tensor, split, which: str, batch_size: int = 0) -> dict:
    """`link_prediction_report` of split `which` ("val" or "test") of a `SplitPairs`, from
    full-graph embeddings over `full_block`."""
    h = embed(model, full_block, x, batch_size)
    pos = torch.from_numpy(getattr(split, which)).T.contiguous()
    neg = torch.from_numpy(getattr(split, f"{which}_negatives")).T.contiguous()
    return link_prediction_report(model.score(h, pos).numpy(), model.score(h, neg).numpy())


@dataclass
class _Graph:
    """What training and scoring read besides the shards' minibatches: the message-passing
    graph as a full block (self loops as the shards have them), its heuristics, the features."""

    block: object
    x: torch.Tensor
    heuristics: PairHeuristics
    indices_sha256: str  # of the adjacency's indices.npy as its stage published it ("" without a record)

    @classmethod
    def load(cls, manifest: ShardManifest, shards: Path, adjacency_dir, degree_buckets: int) -> "_Graph":
        block = load_full_block(adjacency_dir)
        x = _features(manifest, shards, block, degree_buckets)
        plain = remove_self_loops(block)
        if not manifest.self_loops:  # evaluate over the graph the blocks were sampled from
            block = plain
        try:
            digest = read_file_hashes(adjacency_dir, stage=Adjacency.STAGE)[Adjacency.INDICES]["sha256"]
        except (CorruptFileError, KeyError):
            digest = ""
        return cls(block, x, PairHeuristics(plain.indptr, plain.indices), digest)

    def fingerprint(self) -> dict:
        """What identifies the graph a model was trained over: its size and the published digest
        of its adjacency (a re-materialized graph of the same size is another graph)."""
        return {
            "nodes": int(self.heuristics.n),
            "edges": int(len(self.heuristics.indices)),
            "indices_sha256": self.indices_sha256,
        }


def _new_model(cfg: LinkTrainConfig, model_cfg: ModelConfig, graph: _Graph) -> LinkModel:
    encoder = build_model(model_cfg, graph.x.shape[1], model_cfg.hidden)
    return LinkModel(encoder, model_cfg.hidden, cfg.scorer, graph.heuristics)


def epoch_budget(cfg: LinkTrainConfig, sampled_epochs: int, steps_per_epoch: int) -> int:
    """Epochs to train: ``cfg.epochs``, or the automatic budget (LinkTrainConfig.epochs)."""
    if cfg.epochs:
        return cfg.epochs
    return min(cfg.max_epochs, max(sampled_epochs, math.ceil(cfg.min_steps / max(steps_per_epoch, 1))))


@dataclass
class _Run:
    """The state of one `train_link` run: what the loop reads, and what it changes as it goes."""

    cfg: LinkTrainConfig
    manifest: ShardManifest
    shards: Path
    graph: _Graph
    model: LinkModel
    opt: torch.optim.Optimizer
    epochs: int
    steps_per_epoch: int
    progress: Progress
    generator: torch.Generator
    rows: list = field(default_factory=list)
    epoch_seconds: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    best: dict | None = None  # {"epoch", "val", "state"} of the best validation MRR
    stale: int = 0  # evaluations since the best one


def _train_epoch(run: _Run, epoch: int) -> None:
    """One epoch (numbered from 1): every rank's stream of sampled epoch (epoch-1) % E in turn."""
    cfg, manifest = run.cfg, run.manifest
    t0 = time.perf_counter()
    total, steps, seeds = 0.0, 0, 0
    for r in range(manifest.world_size):
        if steps >= run.steps_per_epoch:
            break
        sampled = (epoch - 1) % manifest.epochs
        stream = ShardStream(run.shards, r, sampled, "cpu", cfg.prefetch, features=run.graph.x, manifest=manifest.doc)
        with stream:
            for mb in stream:
                value = _step(run, mb, epoch, steps)
                total, steps = total + value, steps + 1
                seeds += int(mb.extra["pos_pairs"].shape[1])
                rate = seeds / max(time.perf_counter() - t0, 1e-9)
                run.progress.advance(detail=f"epoch {epoch}/{run.epochs}, loss {total / steps:.4f}, {rate:.0f} seeds/s")
                if steps >= run.steps_per_epoch:
                    break
    run.epoch_seconds.append(time.perf_counter() - t0)
    run.losses.append(total / max(steps, 1))


def _step(run: _Run, mb, epoch: int, step: int) -> float:
    """One optimizer step on a minibatch; its loss (NonFiniteLossError when not finite)."""
    neg_pairs = mb.extra["neg_pairs"]
    if run.cfg.hard_negatives:
        hard = two_hop_negatives(run.graph.heuristics, mb.seeds, mb.extra["pos_pairs"][0], run.generator)
        neg_pairs = torch.cat([neg_pairs, hard], 1)
    pos, neg = run.model(mb.blocks, mb.x, mb.extra["pos_pairs"], neg_pairs, mb.seeds)
    scores = torch.cat([pos, neg])
    labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
    loss = F.binary_cross_entropy_with_logits(scores, labels)
    value = float(loss.detach())
    if not math.isfinite(value):
        raise _non_finite_loss(value, run.cfg, run.manifest, epoch, step)
    run.opt.zero_grad()
    loss.backward()
    run.opt.step()
    return value


def _validate(run: _Run, epoch: int, split, log) -> bool:
    """Evaluate epoch `epoch` on the validation split, keep the model when its MRR is the best so
    far; whether training goes on (early stopping)."""
    val = evaluate_link(run.model, run.graph.block, run.graph.x, split, "val", run.cfg.eval_batch_size)
    run.rows.append({"epoch": epoch, "split": "val", "loss": run.losses[-1], **val})
    improved = run.best is None or val["mrr"] > run.best["val"]["mrr"]
    if improved:
        state = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
        run.best, run.stale = {"epoch": epoch, "val": val, "loss": run.losses[-1], "state": state}, 0
    else:
        run.stale += 1
    log(
        f"epoch {epoch}/{run.epochs}: loss {run.losses[-1]:.4f} val auc {val['auc']:.4f} mrr {val['mrr']:.4f} "
        f"hits@50 {val['hits@50']:.4f} ({run.epoch_seconds[-1]:.2f} s); best epoch {run.best['epoch']}"
    )
    patience = run.cfg.early_stopping_patience
    if patience and run.stale >= patience:
        log(f"early stopping after epoch {epoch}: validation MRR has not improved for {patience} evaluations")
        return False
    return True


def train_link(
    shards_dir: str | os.PathLike,
    split_dir: str | os.PathLike,
    adjacency_dir: str | os.PathLike,
    out_dir: str | os.PathLike | None,
    cfg: LinkTrainConfig | None = None,
    model_cfg: ModelConfig | None = None,
    log=print,
) -> dict:
    """Train on the link-prediction shards, evaluate on the split; write `out_dir` (module
    docstring) unless None. Returns the summary."""
    cfg = cfg or LinkTrainConfig()
    shards = Path(shards_dir)
    manifest = ShardManifest.open(shards)
    if manifest.task != LINK_PREDICTION:
        raise ValueError(f"{shards / MANIFEST_NAME}: not link-prediction shards; materialize minibatch_shards")
    layers = manifest.num_layers
    model_cfg = model_cfg or ModelConfig(dropout=0.0)
    if model_cfg.num_layers not in (0, layers):
        raise ValueError(f"model.num_layers={model_cfg.num_layers}, but the shards hold {layers} blocks")
    model_cfg = ModelConfig(**{**asdict(model_cfg), "num_layers": layers})
    split = load_edge_split(split_dir)
    graph = _Graph.load(manifest, shards, adjacency_dir, cfg.degree_buckets)

    torch.manual_seed(cfg.seed)
    model = _new_model(cfg, model_cfg, graph)
    steps = manifest.minibatches_per_epoch_per_rank * manifest.world_size
    steps = min(steps, cfg.max_steps_per_epoch or steps)
    epochs = epoch_budget(cfg, manifest.epochs, steps)
    run = _Run(
        cfg, manifest, shards, graph, model, torch.optim.Adam(model.parameters(), lr=cfg.lr), epochs, steps,
        Progress("step", epochs * steps, log, unit="steps"), torch.Generator().manual_seed(cfg.seed),
    )  # fmt: skip
    model.train()
    for epoch in range(1, epochs + 1):
        _train_epoch(run, epoch)
        if (epoch % cfg.eval_every == 0 or epoch == epochs) and not _validate(run, epoch, split, log):
            break
    return _finish(run, split, model_cfg, out_dir, log)


def _finish(run: _Run, split, model_cfg: ModelConfig, out_dir, log) -> dict:
    """Restore the best validation model, test it, write the outputs; the summary."""
    best = run.best
    run.model.load_state_dict(best["state"])
    test = evaluate_link(run.model, run.graph.block, run.graph.x, split, "test", run.cfg.eval_batch_size)
    run.rows.append({"epoch": best["epoch"], "split": "test", "loss": best["loss"], **test})
    log(
        f"best epoch {best['epoch']} of {len(run.epoch_seconds)}: test auc {test['auc']:.4f} mrr {test['mrr']:.4f} "
        f"hits@50 {test['hits@50']:.4f}"
    )
    summary = {
        "task": "link_prediction",
        "epochs": len(run.epoch_seconds),
        "best_epoch": best["epoch"],
        "epoch_seconds": run.epoch_seconds,
        "losses": run.losses,
        "val": best["val"],
        "test": test,
        "config": asdict(run.cfg),
        "model_config": asdict(model_cfg),
        "in_feats": int(run.graph.x.shape[1]),
        "graph": run.graph.fingerprint(),
        "hits_at": list(LINK_HITS_AT),
    }
    if out_dir is not None:
        _write_outputs(Path(out_dir), run.model, run.rows, summary)
    summary["trained"] = run.model  # not written: the state_dict is LINK_MODEL
    return summary


def _non_finite_loss(
    value: float, cfg: LinkTrainConfig, manifest: ShardManifest, epoch: int, step: int
) -> NonFiniteLossError:
    """The error stopping `train_link` at `step` (from 0) of `epoch` (from 1; `training.loss_check`);
    each minibatch of every rank's stream is one optimizer step."""
    steps = manifest.minibatches_per_epoch_per_rank * manifest.world_size
    return non_finite_loss(
        value,
        epoch=epoch,
        step=step + 1,
        steps=min(steps, cfg.max_steps_per_epoch or steps),
        causes=[
            f"a learning rate too high: link.lr={cfg.lr:g}",
            "features on scales far apart, or a NaN, infinite or huge value in the dataset's features "
            f"(features.parquet; a graph without them gets {cfg.degree_buckets} one-hot degree buckets)",
            "a corrupted input: check the landing files, then re-materialize canonical_graph and the stages after it",
        ],
    )


@dataclass
class SavedLinkModel:
    """A model `train_link` wrote, loaded with the graph and features it scores over."""

    model: LinkModel
    graph: _Graph
    config: LinkTrainConfig

    def embeddings(self) -> torch.Tensor:
        return embed(self.model, self.graph.block, self.graph.x, self.config.eval_batch_size)

    @torch.no_grad()
    def probabilities(self, pairs: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        """float32 [P]: the probability that each pair (int64 [2, P] node ids) is an edge."""
        self.model.eval()
        h = self.embeddings() if h is None else h
        pairs = torch.as_tensor(pairs, dtype=torch.int64)
        chunks = [self.model.score(h, pairs[:, i : i + _SCORE_CHUNK]) for i in range(0, pairs.shape[1], _SCORE_CHUNK)]
        return torch.sigmoid(torch.cat(chunks)) if chunks else torch.zeros(0)


def load_saved(model_dir, shards_dir, adjacency_dir) -> SavedLinkModel:
    """The model `train_link` wrote into `model_dir` (its LINK_MODEL file; a StateFileError naming
    the file when it is not a usable link model, nothing in it is run), over the message-passing
    graph of `adjacency_dir` and the features of `shards_dir`; a ValueError naming the folders when
    that graph is not the one the model was trained on."""
    path = Path(model_dir) / LINK_MODEL
    state = read_state_file(path, kind=_LINK_KIND, format_version=LINK_MODEL_FORMAT, remedy=_REMEDY)
    cfg, model_cfg = LinkTrainConfig(**state["config"]), ModelConfig(**state["model_config"])
    shards = Path(shards_dir)
    graph = _Graph.load(ShardManifest.open(shards), shards, adjacency_dir, cfg.degree_buckets)
    trained, now = state["graph"], graph.fingerprint()
    if any(str(trained.get(k)) != str(v) for k, v in now.items()) or graph.x.shape[1] != int(state["in_feats"]):
        raise ValueError(
            f"{path}: trained on a graph of {trained['nodes']} nodes and {trained['edges']} message-passing edges "
            f"(adjacency indices.npy sha256 {str(trained.get('indices_sha256'))[:16] or 'unrecorded'}) with "
            f"{int(state['in_feats'])} input features, but {adjacency_dir} holds {now['nodes']} nodes and "
            f"{now['edges']} edges (sha256 {now['indices_sha256'][:16] or 'unrecorded'}) with {graph.x.shape[1]} "
            "features; re-materialize trained_model"
        )
    model = _new_model(cfg, model_cfg, graph)
    model.load_state_dict(state["state_dict"])
    model.eval()
    return SavedLinkModel(model, graph, cfg)


def evaluate_saved(
    model_dir: str | os.PathLike, shards_dir: str | os.PathLike, split_dir: str | os.PathLike, adjacency_dir
) -> dict:
    """{"val": report, "test": report} of the model `train_link` wrote into `model_dir`,
    recomputed from its LINK_MODEL file (`load_saved`)."""
    saved = load_saved(model_dir, shards_dir, adjacency_dir)
    split = load_edge_split(split_dir)
    g, cfg = saved.graph, saved.config
    return {w: evaluate_link(saved.model, g.block, g.x, split, w, cfg.eval_batch_size) for w in ("val", "test")}


def _write_outputs(out: Path, model: LinkModel, rows: list[dict], summary: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    state = {
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        **{k: summary[k] for k in ("config", "model_config", "in_feats", "graph")},
    }
    write_state_file(out / LINK_MODEL, state, kind=_LINK_KIND, format_version=LINK_MODEL_FORMAT)
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, out / METRICS)
    (out / SUMMARY).write_text(json.dumps(summary, indent=2, default=float))
