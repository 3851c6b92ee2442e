"""Link-prediction training and evaluation from edge-seed shards (plain torch, no DGL).

The same encoders as node classification (`training.layers.GNN`, output width = the
embedding width), a scorer over pairs of embeddings, binary cross-entropy on each
minibatch's positive and negative pairs (`graphs.sampling.link`), and evaluation of
full-graph embeddings over the message-passing graph against the fixed evaluation
negatives of `graphs.edge_split` (`training.metrics.link_prediction_report`: ROC-AUC, MRR,
Hits@10/50/100).

Scorers (``LinkTrainConfig.scorer``): ``dot`` = ``<h_u, h_v>``; ``mlp`` = DGL's
link_pred.py predictor ``Linear-ReLU-Linear-ReLU-Linear`` on ``h_u * h_v``.

One process reads every rank's stream of an epoch in turn (each minibatch one optimizer
step); link prediction is not launched under torchrun/DDP (node classification is).

Files written into ``out_dir`` (`train_link`): ``model.safetensors`` (`training.outputs.LINK_MODEL`:
a `training.state_file` of kind ``link_model``, format ``LINK_MODEL_FORMAT``, holding
{"state_dict"}; loading it never runs code), ``metrics.parquet`` (one row per evaluated epoch
and split: epoch, split, auc, mrr, hits@10, hits@50, hits@100, loss), ``summary.json``
(config, final val/test metrics, epoch times).

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

from graphs.config_checks import MAX_EPOCHS, MAX_PREFETCH, MAX_ROWS, MAX_SEED, MAX_STEPS, bounded_repr, check_fields
from training.blocks import remove_self_loops
from training.data import ShardStream, read_manifest
from training.evaluate import load_full_block
from training.layers import GNN, ModelConfig, build_model
from training.loss_check import NonFiniteLossError, non_finite_loss
from training.metrics import LINK_HITS_AT, link_prediction_report
from training.outputs import LINK_MODEL
from training.state_file import read_state_file, write_state_file

__all__ = ["SCORERS", "LinkModel", "LinkTrainConfig", "evaluate_link", "evaluate_saved", "pair_scores", "train_link"]

SCORERS = ("dot", "mlp")
LINK_MODEL_FORMAT = 1  # the model file's format version (training.state_file, kind "link_model")
_LINK_KIND = "link_model"


@dataclass(kw_only=True)
class LinkTrainConfig:
    """How a link-prediction model is trained (the encoder's architecture is a ModelConfig)."""

    scorer: str = field(default="dot", metadata={"help": f"pair scorer, one of {SCORERS}"})
    lr: float = field(default=5e-4, metadata={"help": "Adam learning rate (DGL's link_pred.py: 0.0005)"})
    epochs: int = field(
        default=0, metadata={"max": MAX_EPOCHS, "help": "training epochs; 0 = the shards' epochs (replayed in order)"}
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
        for name in ("epochs", "eval_batch_size", "prefetch", "max_steps_per_epoch"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        for name in ("eval_every", "degree_buckets"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")


class LinkModel(nn.Module):
    """A GNN encoder and a pair scorer."""

    def __init__(self, encoder: GNN, width: int, scorer: str):
        super().__init__()
        self.encoder = encoder
        self.scorer = scorer
        if scorer == "mlp":
            self.predictor = nn.Sequential(
                nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
            )

    def score(self, h: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
        """Logits of the pairs (int64 [2, P] row indices of `h`)."""
        return pair_scores(self, h[pairs[0]], h[pairs[1]])

    def forward(self, blocks, x, pos_pairs, neg_pairs) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(blocks, x)
        return self.score(h, pos_pairs), self.score(h, neg_pairs)


def pair_scores(model: LinkModel, hu: torch.Tensor, hv: torch.Tensor) -> torch.Tensor:
    if model.scorer == "dot":
        return (hu * hv).sum(-1)
    return model.predictor(hu * hv).squeeze(-1)


def _features(manifest: dict, shards: Path, adjacency_block, buckets: int) -> torch.Tensor:
    """The input features: the manifest's, else one-hot log2-degree buckets of the message-passing Â."""
    from training.features import degree_features, full_features

    x = full_features(manifest, shards)
    if x is None:
        x = degree_features(adjacency_block.indptr.numpy(), buckets)
    return x


@torch.no_grad()
def evaluate_link(model: LinkModel, full_block, x: torch.Tensor, split, which: str, batch_size: int = 0) -> dict:
    """`link_prediction_report` of split `which` ("val" or "test") of an `EdgeSplit`, from
    full-graph embeddings over `full_block`."""
    model.eval()
    h = model.encoder.inference(full_block, x, batch_size or None)
    pos = torch.from_numpy(getattr(split, which)).T.contiguous()
    neg = torch.from_numpy(getattr(split, f"{which}_negatives")).T.contiguous()
    out = link_prediction_report(model.score(h, pos).numpy(), model.score(h, neg).numpy())
    model.train()
    return out


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
    from graphs.edge_split import load_edge_split

    cfg = cfg or LinkTrainConfig()
    shards = Path(shards_dir)
    manifest = read_manifest(shards)
    if manifest.get("task") != "link_prediction":
        raise ValueError(f"{shards / 'manifest.json'}: not link-prediction shards; materialize minibatch_shards")
    layers = int(manifest["num_layers"])
    model_cfg = model_cfg or ModelConfig(dropout=0.0)
    if model_cfg.num_layers not in (0, layers):
        raise ValueError(f"model.num_layers={model_cfg.num_layers}, but the shards hold {layers} blocks")
    model_cfg = ModelConfig(**{**asdict(model_cfg), "num_layers": layers})
    split = load_edge_split(split_dir)
    full_block = load_full_block(adjacency_dir)
    x = _features(manifest, shards, full_block, cfg.degree_buckets)
    if not manifest["self_loops"]:  # evaluate over the graph the blocks were sampled from
        full_block = remove_self_loops(full_block)

    torch.manual_seed(cfg.seed)
    model = LinkModel(build_model(model_cfg, x.shape[1], model_cfg.hidden), model_cfg.hidden, cfg.scorer)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    epochs = cfg.epochs or int(manifest["epochs"])
    ranks = list(range(int(manifest["world_size"])))
    rows, epoch_seconds, losses = [], [], []
    model.train()
    for epoch in range(epochs):
        t0 = time.perf_counter()
        total, steps = 0.0, 0
        for r in ranks:
            if cfg.max_steps_per_epoch and steps >= cfg.max_steps_per_epoch:
                break
            stream = ShardStream(
                shards, r, epoch % int(manifest["epochs"]), "cpu", cfg.prefetch, features=x, manifest=manifest
            )
            with stream:
                for mb in stream:
                    pos, neg = model(mb.blocks, mb.x, mb.extra["pos_pairs"], mb.extra["neg_pairs"])
                    scores = torch.cat([pos, neg])
                    labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
                    loss = F.binary_cross_entropy_with_logits(scores, labels)
                    value = float(loss.detach())
                    if not math.isfinite(value):
                        raise _non_finite_loss(value, cfg, manifest, epoch, steps)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    total += value
                    steps += 1
                    if cfg.max_steps_per_epoch and steps >= cfg.max_steps_per_epoch:
                        break
        epoch_seconds.append(time.perf_counter() - t0)
        losses.append(total / max(steps, 1))
        if (epoch + 1) % cfg.eval_every == 0 or epoch == epochs - 1:
            val = evaluate_link(model, full_block, x, split, "val", cfg.eval_batch_size)
            rows.append({"epoch": epoch, "split": "val", "loss": losses[-1], **val})
            log(
                f"epoch {epoch}: loss {losses[-1]:.4f} val auc {val['auc']:.4f} mrr {val['mrr']:.4f} "
                f"hits@50 {val['hits@50']:.4f} ({epoch_seconds[-1]:.2f} s)"
            )
    test = evaluate_link(model, full_block, x, split, "test", cfg.eval_batch_size)
    rows.append({"epoch": epochs - 1, "split": "test", "loss": losses[-1], **test})
    summary = {
        "task": "link_prediction",
        "epochs": epochs,
        "epoch_seconds": epoch_seconds,
        "losses": losses,
        "val": {k: v for k, v in rows[-2].items() if k not in ("epoch", "split")},
        "test": test,
        "config": asdict(cfg),
        "model_config": asdict(model_cfg),
        "in_feats": int(x.shape[1]),
        "hits_at": list(LINK_HITS_AT),
    }
    if out_dir is not None:
        _write_outputs(Path(out_dir), model, rows, summary)
    summary["trained"] = model  # not written: the state_dict is LINK_MODEL
    return summary


def _non_finite_loss(value: float, cfg: LinkTrainConfig, manifest: dict, epoch: int, step: int) -> NonFiniteLossError:
    """The error stopping `train_link` at `step` of `epoch` (from 0; `training.loss_check`); each
    minibatch of every rank's stream is one optimizer step."""
    steps = int(manifest["minibatches_per_epoch_per_rank"]) * int(manifest["world_size"])
    return non_finite_loss(
        value,
        epoch=epoch + 1,
        step=step + 1,
        steps=min(steps, cfg.max_steps_per_epoch or steps),
        causes=[
            f"a learning rate too high: link.lr={cfg.lr:g}",
            "features on scales far apart, or a NaN, infinite or huge value in the dataset's features "
            f"(features.parquet; a graph without them gets {cfg.degree_buckets} one-hot degree buckets)",
            "a corrupted input: check the landing files, then re-materialize canonical_graph and the stages after it",
        ],
    )


def evaluate_saved(
    model_dir: str | os.PathLike, shards_dir: str | os.PathLike, split_dir: str | os.PathLike, adjacency_dir
) -> dict:
    """{"val": report, "test": report} of the model `train_link` wrote into `model_dir`,
    recomputed from its LINK_MODEL file and summary.json (`training.state_file.StateFileError`
    naming the file when it is not a usable link model; nothing in it is run)."""
    from graphs.edge_split import load_edge_split

    model_dir, shards = Path(model_dir), Path(shards_dir)
    s = json.loads((model_dir / "summary.json").read_text())
    cfg, model_cfg = LinkTrainConfig(**s["config"]), ModelConfig(**s["model_config"])
    manifest = read_manifest(shards)
    full_block = load_full_block(adjacency_dir)
    x = _features(manifest, shards, full_block, cfg.degree_buckets)
    if not manifest["self_loops"]:
        full_block = remove_self_loops(full_block)
    model = LinkModel(build_model(model_cfg, x.shape[1], model_cfg.hidden), model_cfg.hidden, cfg.scorer)
    remedy = "re-materialize trained_model (retrain) to write it in this format"
    state = read_state_file(model_dir / LINK_MODEL, kind=_LINK_KIND, format_version=LINK_MODEL_FORMAT, remedy=remedy)
    model.load_state_dict(state["state_dict"])
    split = load_edge_split(split_dir)
    return {w: evaluate_link(model, full_block, x, split, w, cfg.eval_batch_size) for w in ("val", "test")}


def _write_outputs(out: Path, model: LinkModel, rows: list[dict], summary: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    state = {"state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}}
    write_state_file(out / LINK_MODEL, state, kind=_LINK_KIND, format_version=LINK_MODEL_FORMAT)
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, out / "metrics.parquet")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
