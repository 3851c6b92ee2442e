"""Graph-level training (task graph_property): a `training.graph_model.GraphModel` trained in this
process on the whole-graph shards, on the loop every task shares (`training.loop.run_epochs`).

Each epoch reads every rank's stream of sampled epoch ``epoch % E`` in turn, each minibatch one
optimizer step: cross-entropy on the graphs' classes, binary cross-entropy on the present labels
of every task (list labels; a missing label adds nothing), or the squared error of standardized
values (the training graphs' mean and standard deviation). Every ``eval_every`` epochs the
validation graphs are scored whole (`GraphTable.induced` over Â, in chunks of
``eval_graphs_per_batch``); the model of the best validation metric (`key_metric`: ROC-AUC for
two classes and for tasks, accuracy for more classes, MAE for values) is kept, and early
stopping ends the run after ``early_stopping_patience`` evaluations without a better one.

Checkpoints. Given ``checkpoint_beside`` (the folder the outputs will end up in: the graph task
passes trained_model's), the run checkpoints after every epoch into
``<its parent>/.<its name>.work-<key>/checkpoint.safetensors`` (``key`` hashes the settings that
change the result and the data version of the shards, the canonical graph and Â), a
`training.state_file` of kind ``graph_checkpoint`` holding `training.checkpoint.loop_state`.
A rerun with the same settings on the same data continues after the last completed epoch and
gives the figures of an uninterrupted run; a finished run removes the folder; a checkpoint that
cannot be read is set aside and the run starts over.

Written into the output folder: ``model.safetensors`` (`training.state_file`, kind
``graph_model``: the state dict, the config, the data's shape and the value standardization),
``metrics.parquet`` (one row per evaluation, and the test row of the best epoch),
``predictions.parquet`` (every graph: the user's graph_id, its split, label and prediction in
the user's label values and, for classes and tasks, the probability of each) and ``summary.json``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.graph_table import SPLITS, GraphTable, read_categories, read_graph_table
from graphs.formats.shard_format import MANIFEST_NAME
from graphs.formats.shard_manifest import GRAPH_PROPERTY, ShardManifest
from graphs.infra.config_checks import check_fields
from graphs.stages.normalize import Adjacency, load_csr
from training.blocks import block_from_csr
from training.checkpoint import (
    CHECKPOINT_NAME,
    data_version,
    loop_state,
    restore_loop_state,
    resume_state,
    run_key,
    save_checkpoint,
    work_dir_for,
)
from training.config import TrainingConfig
from training.data import FeatureRows, ShardStream
from training.distributed import DistInfo
from training.graph_model import CATEGORICAL, READOUTS, GraphModel, GraphShape
from training.layers import ModelConfig
from training.loop import EpochHook, TaskHead, run_epochs
from training.loss_check import non_finite_loss
from training.metrics import accuracy, average_precision, one_vs_rest_auc, roc_auc
from training.outputs import GRAPH_MODEL, METRICS, PREDICTIONS, SUMMARY
from training.run_plan import training_epochs
from training.run_setup import make_optimizer
from training.state_file import read_state_file, write_state_file

__all__ = [
    "GRAPH_DEFAULTS",
    "GRAPH_MODEL",
    "GraphConfig",
    "evaluate_graph_model",
    "key_metric",
    "task_report",
    "train_graphs",
]

GRAPH_MODEL_KIND = "graph_model"
GRAPH_MODEL_FORMAT = 1
_CHECKPOINT_KIND, _CHECKPOINT_FORMAT = "graph_checkpoint", 1
_ONE_PROCESS = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


GRAPH_DEFAULTS = {
    "model.conv": "gin",
    "model.hidden": 64,
    "model.num_layers": 3,
    "model.dropout": 0.2,
    "model.heads": 1,
    "training.optimizer.type": "Adam",
    "training.optimizer.lr": 1e-3,
    "training.epochs": 100,
    "training.early_stopping_patience": 20,
}
"""Graph property's own defaults of shared settings (`training.task_settings`): 3 GIN layers of
width 64, dropout 0.2, Adam at 1e-3, 100 epochs, early stopping after 20 evaluations."""
MODEL_SETTINGS = ("conv", "hidden", "num_layers", "dropout", "heads")
"""The ``model`` settings a graph model reads (the rest are node classification's)."""


@dataclass(kw_only=True)
class GraphConfig:
    """Graph property's own settings (the run config's ``graph`` block). The node encoder's
    layers are the ``model`` block (conv, hidden, num_layers, dropout, heads) and how it is
    trained the ``training`` block, with graph property's defaults where they differ
    (`GRAPH_DEFAULTS`)."""

    readout: str = field(
        default="mean", metadata={"help": f"per-graph readout of every layer's node states, one of {READOUTS}"}
    )
    categorical: str = field(
        default="one_hot_standardized",
        metadata={"help": f"integer node columns (e.g. atom types) as one of {CATEGORICAL}: a learned vector per value, "
                  "the one-hot code, or the one-hot code standardized over the training graphs' nodes"},
    )  # fmt: skip
    virtual_node: bool = field(
        default=False, metadata={"help": "one extra state per graph, linked to all its nodes, updated between layers"}
    )
    eval_graphs_per_batch: int = field(default=512, metadata={"max": 1 << 24, "help": "graphs per evaluation chunk"})

    MOVED_SETTINGS: ClassVar[dict[str, str]] = {
        **{k: f"model.{k}" for k in MODEL_SETTINGS},
        "lr": "training.optimizer.lr",
        **{k: f"training.{k}" for k in ("epochs", "early_stopping_patience", "eval_every", "seed", "prefetch")},
    }

    def __post_init__(self) -> None:
        check_fields(self, "graph")
        if self.readout not in READOUTS:
            raise ValueError(f"graph.readout={self.readout!r} is not one of {READOUTS}")
        if self.categorical not in CATEGORICAL:
            raise ValueError(f"graph.categorical={self.categorical!r} is not one of {CATEGORICAL}")
        if self.eval_graphs_per_batch < 1:
            raise ValueError(f"graph.eval_graphs_per_batch={self.eval_graphs_per_batch} must be at least 1")


GRAPH_FIELDS = tuple(f.name for f in fields(GraphConfig))


@dataclass(eq=False)
class GraphData:
    """What every step and evaluation reads besides the shards: the graph table, the nodes'
    categorical codes and features, Â, and the targets as trained."""

    table: GraphTable
    categories: torch.Tensor | None  # int64 [n, K]
    features: FeatureRows
    csr: object  # graphs.stages.normalize.CSR
    shape: GraphShape
    mean: float = 0.0  # values: the training graphs' mean and standard deviation
    std: float = 1.0

    @classmethod
    def load(cls, manifest: ShardManifest, shards: Path) -> "GraphData":
        canonical = shards / manifest.doc["inputs"][CanonicalGraph.STAGE]
        adjacency = shards / manifest.doc["inputs"][Adjacency.STAGE]
        table = read_graph_table(canonical)
        codes = read_categories(canonical)
        outputs = {"class": table.num_classes, "multi_label": table.num_tasks}.get(table.label_kind, 1)
        shape = GraphShape(int(manifest.doc["feature_dim"]), tuple(table.categorical.values()), outputs)
        data = cls(
            table,
            None if codes is None else torch.from_numpy(codes),
            FeatureRows("manifest", manifest.doc, shards),
            load_csr(adjacency),
            shape,
        )
        if table.label_kind == "value":
            y = table.labels[table.of_split("train")]
            data.mean, data.std = float(y.mean()), float(y.std()) or 1.0
        return data

    def inputs(self, nodes: np.ndarray, x: torch.Tensor | None = None):
        """(float features, categorical codes) of `nodes` (`x`: the features already read)."""
        if x is None and self.shape.feature_dim:
            x = self.features.gather_host(nodes, decode=True)
        codes = None if self.categories is None else self.categories[torch.from_numpy(np.asarray(nodes))]
        return x, codes

    def target(self, graphs: torch.Tensor) -> torch.Tensor:
        """The training target of `graphs`: the class index, the 0 / 1 label per task (NaN
        missing), or the standardized value."""
        y = torch.from_numpy(self.table.labels)[graphs]
        if self.table.label_kind == "value":
            return ((y - self.mean) / self.std).to(torch.float32)
        return y if self.table.label_kind == "class" else y.to(torch.float32)


@dataclass(eq=False)
class GraphRun:
    """One `train_graphs` run: fixed inputs and model, and what the loop and the head advance."""

    cfg: GraphConfig
    model_cfg: ModelConfig
    training: TrainingConfig
    manifest: ShardManifest
    shards: Path
    data: GraphData
    model: GraphModel
    opt: torch.optim.Optimizer
    epochs: int
    log: object
    key: str = ""
    work: Path | None = None  # the checkpoint folder; None: no checkpoints
    info: DistInfo = _ONE_PROCESS
    start_epoch: int = 0
    stopped_early: bool = False
    history: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    best: dict = field(default_factory=lambda: {"epoch": 0, "val": None, "loss": math.nan, "state": None})
    stale: int = 0


def _loss(data: GraphData, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of classes, binary cross-entropy of the present labels of every task, or
    the squared error of standardized values."""
    if data.table.label_kind == "class":
        return F.cross_entropy(out, y)
    if data.table.label_kind == "multi_label":
        present = ~torch.isnan(y)
        return F.binary_cross_entropy_with_logits(out[present], y[present])
    return F.mse_loss(out.squeeze(1), y)


class GraphHead(TaskHead):
    """The graph-level head of `training.loop.run_epochs`."""

    rows_agree = True

    def train_epoch(self, run: GraphRun, epoch: int) -> dict:
        m, data = run.manifest, run.data
        t0 = time.perf_counter()
        total, steps, graphs = 0.0, 0, 0
        run.model.train()
        for r in range(m.world_size):
            stream = ShardStream(
                run.shards, r, epoch % m.epochs, "cpu", run.training.prefetch, features=data.features, manifest=m.doc
            )
            with stream:
                for mb in stream:
                    block = mb.blocks[0]
                    x, codes = data.inputs(mb.input_nodes.numpy(), mb.x)
                    ptr = torch.cat([mb.seed_pos, torch.tensor([block.num_dst])])
                    loss = _loss(data, run.model(block, x, codes, ptr), data.target(mb.seeds))
                    value = float(loss.detach())
                    if not math.isfinite(value):
                        raise non_finite_loss(
                            value, epoch=epoch + 1, step=steps + 1, steps=len(stream), causes=_CAUSES(run.training)
                        )
                    run.opt.zero_grad()
                    loss.backward()
                    run.opt.step()
                    total, steps, graphs = total + value, steps + 1, graphs + mb.num_seeds
        seconds = time.perf_counter() - t0
        return {"epoch": epoch + 1, "rank": 0, "loss": total / max(steps, 1), "steps": steps,
                "graphs": graphs, "train_seconds": seconds}  # fmt: skip

    def evaluate(self, run: GraphRun, epoch: int, row: dict) -> bool:
        if (epoch + 1) % run.training.eval_every and epoch != run.epochs - 1:
            return False
        val = score_split(run.model, run.data, "val", run.cfg.eval_graphs_per_batch)[0]
        run.rows.append({"epoch": epoch + 1, "split": "val", "loss": row["loss"], **val})
        if run.best["val"] is None or _better(val, run.best["val"]):
            state = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
            run.best, run.stale = {"epoch": epoch + 1, "val": val, "loss": row["loss"], "state": state}, 0
        else:
            run.stale += 1
        shown = ", ".join(f"{k} {v:.4f}" for k, v in val.items() if k != "graphs")
        run.log(
            f"epoch {epoch + 1}/{run.epochs}: loss {row['loss']:.4f} val {shown} ({row['train_seconds']:.2f} s); "
            f"best epoch {run.best['epoch']}"
        )
        patience = run.training.early_stopping_patience
        return bool(patience and run.stale >= patience)

    def checkpoint(self, run: GraphRun, epoch: int) -> None:
        if run.work is not None:
            state = loop_state(run, epoch)
            save_checkpoint(run.work / CHECKPOINT_NAME, state, kind=_CHECKPOINT_KIND, format_version=_CHECKPOINT_FORMAT)


def _CAUSES(training: TrainingConfig) -> list[str]:
    return [
        f"a learning rate too high: training.optimizer.lr={training.optimizer.lr:g}",
        "a NaN, infinite or huge value in nodes.parquet's feat or graphs.parquet's label",
    ]


def key_metric(report: dict) -> tuple[str, float]:
    """(name, value as 'higher is better') of the metric that picks the best model."""
    if "mae" in report:
        return "mae", -report["mae"]
    if "roc_auc" in report and math.isfinite(report["roc_auc"]):
        return "roc_auc", report["roc_auc"]
    return "accuracy", report["accuracy"]


def _better(a: dict, b: dict) -> bool:
    return key_metric(a)[1] > key_metric(b)[1]


@torch.no_grad()
def predict(model: GraphModel, data: GraphData, graphs: np.ndarray, chunk: int) -> torch.Tensor:
    """[len(graphs), outputs] model outputs of whole `graphs` (values de-standardized)."""
    model.eval()
    outs = []
    for start in range(0, len(graphs), chunk):
        part = graphs[start : start + chunk]
        indptr, local, entry, ptr = data.table.induced(data.csr.indptr, data.csr.indices, part)
        weights = torch.from_numpy(np.asarray(data.csr.weights[entry], dtype=np.float32))
        block = block_from_csr(torch.from_numpy(indptr), torch.from_numpy(local), weights)
        nodes, _ = data.table.node_ranges(part)
        x, codes = data.inputs(nodes)
        outs.append(model(block, x, codes, torch.from_numpy(ptr)))
    out = torch.cat(outs) if outs else torch.zeros(0, data.shape.outputs)
    return out * data.std + data.mean if data.table.label_kind == "value" else out


def report(data: GraphData, graphs: np.ndarray, out: torch.Tensor) -> dict:
    """The metrics of outputs `out` of `graphs` against their labels: accuracy, ROC-AUC and PR-AUC
    (two classes; macro one-vs-rest ROC-AUC for more; per task over its present labels, averaged
    over the tasks whose test labels hold both classes, for multi_label) or MAE and RMSE."""
    y = data.table.labels[graphs]
    if data.table.label_kind == "multi_label":
        return task_report(y, torch.sigmoid(out).numpy().astype(np.float64))
    if data.table.label_kind == "value":
        err = out.squeeze(1).numpy().astype(np.float64) - y
        return {"graphs": len(graphs), "mae": float(np.abs(err).mean()), "rmse": float(np.sqrt((err**2).mean()))}
    probs = torch.softmax(out, 1).numpy()
    rep = {"graphs": len(graphs), "accuracy": accuracy(y, probs.argmax(1))}
    if data.shape.outputs == 2:
        rep["roc_auc"], rep["pr_auc"] = roc_auc(y == 1, probs[:, 1]), average_precision(y == 1, probs[:, 1])
    else:
        aucs = one_vs_rest_auc(y, probs)["auc"]
        rep["roc_auc"] = float(np.nanmean(aucs)) if np.isfinite(aucs).any() else math.nan
    return rep


def task_report(y: np.ndarray, probs: np.ndarray) -> dict:
    """Metrics of binary labels per task (`y` [graphs, tasks], NaN missing) scored by `probs`."""
    present = ~np.isnan(y)
    aucs, aps = [], []
    for task in range(y.shape[1]):  # a loop over tasks, not rows
        keep = present[:, task]
        truth = y[keep, task] == 1.0
        if truth.any() and not truth.all():
            aucs.append(roc_auc(truth, probs[keep, task]))
            aps.append(average_precision(truth, probs[keep, task]))
    hits = (probs >= 0.5) == (y == 1.0)
    return {
        "graphs": len(y),
        "accuracy": float(hits[present].mean()) if present.any() else math.nan,
        "roc_auc": float(np.mean(aucs)) if aucs else math.nan,
        "pr_auc": float(np.mean(aps)) if aps else math.nan,
        "tasks_scored": len(aucs),
    }


def score_split(model: GraphModel, data: GraphData, split: str, chunk: int) -> tuple[dict, torch.Tensor]:
    """(the report, the outputs) of the labelled graphs of `split`."""
    graphs = data.table.of_split(split)
    out = predict(model, data, graphs, chunk)
    return report(data, graphs, out), out


def _model_doc(model: ModelConfig) -> dict:
    """The model settings a graph model reads, as saved with it."""
    return {k: getattr(model, k) for k in MODEL_SETTINGS}


def _new_model(cfg: GraphConfig, model: ModelConfig, shape: GraphShape) -> GraphModel:
    if model.num_layers < 1:
        raise ValueError(f"model.num_layers={model.num_layers}: a graph model needs at least 1 layer")
    return GraphModel(
        shape, conv=model.conv, hidden=model.hidden, num_layers=model.num_layers, dropout=model.dropout,
        readout=cfg.readout, categorical=cfg.categorical, heads=model.heads, virtual_node=cfg.virtual_node,
    )  # fmt: skip


def train_graphs(
    shards_dir: str | os.PathLike,
    out_dir: str | os.PathLike | None,
    cfg: GraphConfig,
    model_cfg: ModelConfig,
    training: TrainingConfig,
    log=print,
    *,
    checkpoint_beside: str | os.PathLike | None = None,
    on_epoch_end: EpochHook | None = None,
) -> dict:
    """Train on the graph shards of `shards_dir` (the graph block `cfg`, the node encoder's
    `model_cfg`, the ``training`` block `training`); write `out_dir` (module docstring) unless None;
    checkpoint beside `checkpoint_beside` when given (and continue from its checkpoint).
    ``on_epoch_end(epoch, rows)`` as in `training.loop.run_epochs`. Returns the summary."""
    shards = Path(shards_dir)
    manifest = ShardManifest.open(shards)
    if manifest.task != GRAPH_PROPERTY:
        raise ValueError(
            f"{shards / MANIFEST_NAME}: not whole-graph shards of a collection; materialize minibatch_shards"
        )
    data = GraphData.load(manifest, shards)
    if not len(data.table.of_split("val")):
        raise ValueError("the collection has no labelled validation graphs (split 'val' in graphs.parquet)")
    torch.manual_seed(training.seed)
    model = _new_model(cfg, model_cfg, data.shape)
    if data.categories is not None:
        nodes, _ = data.table.node_ranges(data.table.of_split("train"))
        model.standardize(data.categories[torch.from_numpy(nodes)])
    epochs = training_epochs(training, manifest.epochs, manifest.minibatches_per_epoch_per_rank * manifest.world_size)
    opt = make_optimizer(training.optimizer, model)
    run = GraphRun(cfg, model_cfg, training, manifest, shards, data, model, opt, epochs, log)
    if checkpoint_beside is not None:
        canonical, adjacency = (shards / manifest.doc["inputs"][s] for s in (CanonicalGraph.STAGE, Adjacency.STAGE))
        settings = {"model": _model_doc(model_cfg), "graph": asdict(cfg), "training": asdict(training)}
        run.key = run_key(settings, data_version(shards, canonical, adjacency))
        run.work = work_dir_for(checkpoint_beside, run.key)
        path = run.work / CHECKPOINT_NAME
        state = resume_state(path, log, kind=_CHECKPOINT_KIND, format_version=_CHECKPOINT_FORMAT)
        if state is not None:
            restore_loop_state(run, state, path)
    run_epochs(run, GraphHead(), log, progress=False, on_epoch_end=on_epoch_end)
    summary = _finish(run, out_dir)
    if run.work is not None:
        shutil.rmtree(run.work, ignore_errors=True)
    return summary


def _finish(run: GraphRun, out_dir) -> dict:
    """Restore the best validation model, test it, write the outputs; the summary."""
    best, data = run.best, run.data
    run.model.load_state_dict(best["state"])
    test = score_split(run.model, data, "test", run.cfg.eval_graphs_per_batch)[0]
    run.rows.append({"epoch": best["epoch"], "split": "test", "loss": best["loss"], **test})
    shown = ", ".join(f"{k} {v:.4f}" for k, v in test.items() if k != "graphs")
    run.log(f"best epoch {best['epoch']} of {len(run.history)}: test {shown}")
    summary = {
        "task": GRAPH_PROPERTY,
        "label_kind": data.table.label_kind,
        "epochs": len(run.history),
        "best_epoch": best["epoch"],
        "epoch_seconds": [r["train_seconds"] for r in run.history],
        "losses": [r["loss"] for r in run.history],
        "val": best["val"],
        "test": test,
        "baseline": baseline(data),
        "config": asdict(run.cfg),
        "model_config": _model_doc(run.model_cfg),
        "training": asdict(run.training),
        "shape": asdict(data.shape),
        "standardization": {"mean": data.mean, "std": data.std},
    }
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {
            "state_dict": {k: v.detach().cpu() for k, v in run.model.state_dict().items()},
            **{k: summary[k] for k in ("config", "model_config", "shape", "standardization")},
        }
        write_state_file(out / GRAPH_MODEL, state, kind=GRAPH_MODEL_KIND, format_version=GRAPH_MODEL_FORMAT)
        pq.write_table(pa.Table.from_pylist(run.rows), out / METRICS)
        write_predictions(run.model, data, out / PREDICTIONS, run.cfg.eval_graphs_per_batch)
        (out / SUMMARY).write_text(json.dumps(summary, indent=2, default=float))
    return summary


def baseline(data: GraphData) -> dict:
    """The test metrics of a model that ignores the graphs: the training graphs' most common
    class (ROC-AUC 0.5) or mean value."""
    test, train = data.table.of_split("test"), data.table.of_split("train")
    y = data.table.labels
    if data.table.label_kind == "multi_label":
        common = np.nanmean(y[train], axis=0) >= 0.5  # each task's most common training label
        present = ~np.isnan(y[test])
        hits = (y[test] == 1.0) == common
        return {"accuracy": float(hits[present].mean()) if present.any() else math.nan, "roc_auc": 0.5}
    if data.table.label_kind == "value":
        err = y[test] - y[train].mean()
        return {"mae": float(np.abs(err).mean()), "rmse": float(np.sqrt((err**2).mean()))}
    common = int(np.bincount(y[train]).argmax())
    return {"accuracy": float((y[test] == common).mean()) if len(test) else math.nan, "roc_auc": 0.5}


def write_predictions(model: GraphModel, data: GraphData, path: Path, chunk: int) -> None:
    """predictions.parquet: every graph's id, split, label and prediction, as the user gave them
    (class values, not indices), and the probability of each class index (``prob_<c>``, c indexing
    the sorted class values) or task (``prob_<t>``, the label list's position t)."""
    table = data.table
    graphs = np.arange(table.num_graphs)
    out = predict(model, data, graphs, chunk)
    cols = {
        "graph_id": pa.array(table.graph_id),
        "split": np.array(SPLITS)[table.split].tolist(),
    }
    if table.label_kind == "value":
        cols["label"] = pa.array(table.labels)
        cols["prediction"] = out.squeeze(1).numpy().astype(np.float64)
    elif table.label_kind == "multi_label":
        probs = torch.sigmoid(out).numpy()
        labels = np.where(np.isnan(table.labels), None, table.labels).tolist()
        cols["label"] = pa.array(labels, type=pa.list_(pa.float64(), table.num_tasks))
        cols["prediction"] = pa.array((probs >= 0.5).astype(np.int8).tolist(), type=pa.list_(pa.int8()))
    else:
        probs = torch.softmax(out, 1).numpy()
        values = table.classes if table.classes is not None else list(range(probs.shape[1]))
        cols["label"] = pa.array([values[c] if c >= 0 else None for c in table.labels.tolist()])
        cols["prediction"] = pa.array([values[c] for c in probs.argmax(1).tolist()])
    if table.label_kind != "value":
        for c in range(probs.shape[1]):
            cols[f"prob_{c}"] = probs[:, c].astype(np.float32)
    pq.write_table(pa.table(cols), path)


def evaluate_graph_model(model_dir: str | os.PathLike, shards_dir: str | os.PathLike) -> dict:
    """{val, test, baseline} reports of the saved model in `model_dir` on the collection the
    shards of `shards_dir` were cut from, recomputed."""
    shards = Path(shards_dir)
    manifest = ShardManifest.open(shards)
    data = GraphData.load(manifest, shards)
    state = read_state_file(
        Path(model_dir) / GRAPH_MODEL, kind=GRAPH_MODEL_KIND, format_version=GRAPH_MODEL_FORMAT,
        remedy="re-materialize trained_model",
    )  # fmt: skip
    if GraphShape(**{**state["shape"], "categorical": tuple(state["shape"]["categorical"])}) != data.shape:
        raise ValueError(
            f"{Path(model_dir) / GRAPH_MODEL}: trained on data of another shape; re-materialize trained_model"
        )
    doc = state["config"]  # the graph block; files written before the model block was shared hold all in it
    cfg = GraphConfig(**{k: doc[k] for k in GRAPH_FIELDS if k in doc})
    model_cfg = ModelConfig(
        **(state["model_config"] if "model_config" in state else {k: doc[k] for k in MODEL_SETTINGS})
    )
    model = _new_model(cfg, model_cfg, data.shape)
    model.load_state_dict(state["state_dict"])
    data.mean, data.std = float(state["standardization"]["mean"]), float(state["standardization"]["std"])
    chunk = cfg.eval_graphs_per_batch
    reports = {split: score_split(model, data, split, chunk)[0] for split in ("val", "test")}
    return reports | {"baseline": baseline(data)}
