"""The trained_model folder: what a finished run writes, and how to load it back.

Files (format version 3), written by rank 0 into a temporary sibling of the folder and
renamed into place as a whole (`graphs.infra.storage.atomic_output_dir`, which adds
``hashes.json``: every file's size and SHA-256, checked by the readers):

    model_final.safetensors  a `training.state_file` of kind ``model`` holding
                        {"state_dict", "model_config" (dict), "in_feats", "num_classes",
                        "epoch" (from 1), "preprocessing" (see :class:`Preprocessing`: the
                        feature input and its normalization statistics, and whether the model
                        was trained with self loops)}: the parameters after the last epoch and
                        everything inference on new data needs; tensors in safetensors, the
                        rest JSON, so loading it never runs code; rebuilt by :func:`load_model`
    model_best.safetensors   the same for the epoch with the best validation accuracy
    version.json        {"version": "<UTC time>-<8 hex>"}: the name this model is kept under in
                        ``<dataset>/model_versions/`` (:func:`write_version_file`)
    predictions.parquet node_id (the user's id, as in the landing files: int64 or string; join
                        on it), predicted int32, probabilities fixed_size_list<float32>[C]
                        (softmax of the best model's full-graph logits), index int64 (gnnflow's
                        internal 0..n-1 node index: the row of embeddings.npy), one row per node
    embeddings.npy      float32 [n, hidden]: the best model's last hidden layer (the input of
                        its output layer) for every node
    metrics.parquet     one row per epoch and rank: see ``METRIC_COLUMNS``
    curves.png          loss and accuracy per epoch
    summary.json        final/best accuracies, timings, settings, versions
    run.yaml            the effective run config (model.num_layers as trained)
    profile/trace.json, profile/key_averages.txt   torch.profiler output (profiler: torch)

A link-prediction trained_model folder holds ``model.safetensors`` instead (`training.link`).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from graphs.infra.dataset_names import is_valid_dataset_name
from graphs.infra.plotting import headless_pyplot
from graphs.infra.storage import SUMMARY_NAME
from training.blocks import Block, remove_self_loops
from training.features import FeatureTransform
from training.layers import GNN, ModelConfig, build_model
from training.state_file import StateFileError, read_state_file, write_state_file

__all__ = [
    "LINK_MODEL",
    "STAGE",
    "METRIC_COLUMNS",
    "MODEL_BEST",
    "MODEL_FINAL",
    "CURVES",
    "EMBEDDINGS",
    "METRICS",
    "OUTPUT_FORMAT",
    "PREDICTIONS",
    "SUMMARY",
    "PICKLED_MODEL_BEST",
    "VERSION_FILE",
    "LoadedModel",
    "Preprocessing",
    "load_model",
    "load_model_weights",
    "model_file_state",
    "read_version",
    "save_model_file",
    "plot_curves",
    "write_json",
    "write_metrics",
    "write_predictions",
    "write_version_file",
]

STAGE = "trained_model"  # the asset (stage) that writes these folders
OUTPUT_FORMAT = 3  # 3: model files in safetensors (training.state_file)
MODEL_FINAL = "model_final.safetensors"
MODEL_BEST = "model_best.safetensors"
LINK_MODEL = "model.safetensors"  # a link-prediction trained_model's model (training.link)
GRAPH_MODEL = "model.safetensors"  # a graph-level trained_model's model (training.graph_train)
PICKLED_MODEL_BEST = "model_best.pt"  # what format 2 and older wrote (a torch pickle): refused, never loaded
VERSION_FILE = "version.json"
SUMMARY = SUMMARY_NAME  # every stage's summary (`graphs.formats.stage_artifact.StageArtifact.SUMMARY`)
PREDICTIONS = "predictions.parquet"
RECOMMENDATIONS = "recommendations.parquet"  # a typed link model's top-k per source (the predictions asset)
METRICS = "metrics.parquet"
EMBEDDINGS = "embeddings.npy"
CURVES = "curves.png"
_MODEL_KIND = "model"
_REMEDY = "re-materialize trained_model (retrain) to write it in this format"

METRIC_COLUMNS = {
    "epoch": "epoch number, counted from 1 (as in the logs, summary.json and curves.png)",
    "rank": "DDP rank (evaluation columns are set on rank 0's rows only)",
    "loss": "mean training loss over the rank's minibatches",
    "minibatch_acc": "accuracy on the rank's seeds, from the training forward passes (dropout on)",
    "train_acc": "full-graph inference accuracy on the train split (rank 0, evaluated epochs)",
    "val_acc": "same, validation split",
    "test_acc": "same, test split",
    "val_macro_f1": "macro-F1 on the validation split (rank 0; with training.select_by: val_macro_f1)",
    "lr": "learning rate at the epoch's last step",
    "steps": "optimizer steps in the epoch",
    "seeds": "loss nodes processed by the rank",
    "seeds_per_s": "seeds / train_seconds",
    "epoch_seconds": "wall time of the epoch on the rank, evaluation included (checkpoint not)",
    "train_seconds": "wall time of the training steps",
    "data_seconds": "time the loop spent getting the next minibatch (queue wait + copy to device)",
    "data_wait_share": "data_seconds / train_seconds",
    "queue_wait_seconds": "part of data_seconds spent blocked on the shard streams' prefetch queues",
    "forward_seconds": "forward passes and loss",
    "backward_seconds": "backward passes",
    "update_seconds": "gradient unscale/clip, optimizer step, zero_grad",
    "eval_seconds": "full-graph inference (rank 0)",
    "peak_memory_mb": "peak CUDA memory allocated, or the process's peak RSS on CPU",
    "disk_read_bytes": "bytes the rank's process read from storage during the epoch's steps (page-cache "
    "hits not counted; Linux's /proc/self/io, NaN elsewhere)",
}


@dataclass
class Preprocessing:
    """What turns a dataset into the model's input, as at training time.

    ``input``: ``features`` (canonical_graph's ``features.npy``) or ``degree`` (one-hot
    log-degree buckets of the normalized adjacency, ``degree_buckets`` wide, for datasets
    without features); then ``feature_norm`` (``row`` / ``standard`` / ``none``) with the
    column ``mean`` and ``std`` computed at training time for ``standard``; ``degree_norm`` is the
    normalization of Â the model was trained over (normalized_adjacency's setting);
    ``self_loops`` whether its blocks held Â's diagonal (minibatch_shards' ``self_loops``): a model
    trained without it is evaluated and applied over Â without it (files without the key: True).
    """

    input: str
    feature_norm: str
    degree_buckets: int
    degree_norm: str
    mean: torch.Tensor | None = None
    std: torch.Tensor | None = None
    self_loops: bool = True

    def graph(self, block: "Block") -> "Block":
        """The full-graph block this model runs over: ``block`` (Â) without its self loops when
        the model was trained without them (a typed graph's relational Â has none)."""
        return block if self.self_loops or not isinstance(block, Block) else remove_self_loops(block)

    def transform(self):
        """The :class:`training.features.FeatureTransform` with the stored statistics."""
        return FeatureTransform(self.feature_norm, self.mean, self.std)

    def to_state(self) -> dict:
        """Plain values and tensors (what a `training.state_file` holds)."""
        return {
            "input": self.input,
            "feature_norm": self.feature_norm,
            "degree_buckets": int(self.degree_buckets),
            "degree_norm": self.degree_norm,
            "self_loops": bool(self.self_loops),
            "mean": None if self.mean is None else self.mean.detach().cpu().float(),
            "std": None if self.std is None else self.std.detach().cpu().float(),
        }


class LoadedModel(NamedTuple):
    """What :func:`load_model` returns: the model (eval mode), its config, its preprocessing."""

    model: GNN
    config: ModelConfig
    preprocessing: Preprocessing
    in_feats: int
    num_classes: int
    epoch: int


def model_file_state(
    model: GNN, model_cfg: dict, in_feats: int, num_classes: int, epoch: int, preprocessing: Preprocessing
) -> dict:
    """What a model file holds (tensors and plain values only)."""
    return {
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "model_config": dict(model_cfg),
        "in_feats": int(in_feats),
        "num_classes": int(num_classes),
        "epoch": int(epoch),
        "preprocessing": preprocessing.to_state(),
        **({"typed": model.typed_doc} if getattr(model, "typed_doc", None) is not None else {}),
    }


def save_model_file(path: str | os.PathLike, state: dict) -> None:
    """Write a :func:`model_file_state` as a model file (safetensors, format ``OUTPUT_FORMAT``)."""
    write_state_file(path, state, kind=_MODEL_KIND, format_version=OUTPUT_FORMAT)


def _read_model_file(path: Path) -> dict:
    return read_state_file(path, kind=_MODEL_KIND, format_version=OUTPUT_FORMAT, remedy=_REMEDY)


def load_model_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state_dict of a model file (tensors on the CPU)."""
    return _read_model_file(Path(path))["state_dict"]


def load_model(path: str | os.PathLike, map_location="cpu") -> LoadedModel:
    """A model_final / model_best file: ``model, config, preprocessing, in_feats, num_classes, epoch``.

    ``model`` is a ready :class:`GNN` in eval mode; ``config`` its :class:`ModelConfig`;
    ``preprocessing`` how to build its input from a dataset (:class:`Preprocessing`). Any file
    but a model file of this format (a pickle, a TorchScript archive, a damaged file) raises
    `training.state_file.StateFileError` naming it; nothing in the file is ever run.
    """
    path = Path(path)
    state = _read_model_file(path)
    try:
        config = ModelConfig(**state["model_config"])
        model = build_model(config, state["in_feats"], state["num_classes"], state.get("typed"))
        model.load_state_dict(state["state_dict"])
        return LoadedModel(
            model.to(map_location).eval(),
            config,
            Preprocessing(**state["preprocessing"]),
            int(state["in_feats"]),
            int(state["num_classes"]),
            int(state["epoch"]),
        )
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise StateFileError(f"{path}: not a usable model ({str(exc)[:200]}); {_REMEDY}") from None


def write_version_file(folder: str | os.PathLike, suffix: str | None = None) -> str:
    """Name the model in `folder` (``<UTC time>-<suffix>``, by default 8 random hex digits) in its
    version.json, written atomically (a temporary sibling, then a rename); the name."""
    version = f"{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%SZ}-{suffix or uuid.uuid4().hex[:8]}"
    staged = Path(folder) / f".{VERSION_FILE}.tmp-{os.getpid()}"
    write_json(staged, {"version": version})
    os.replace(staged, Path(folder) / VERSION_FILE)
    return version


def read_version(folder: str | os.PathLike) -> str | None:
    """The version named in `<folder>/version.json`, None when there is none; ValueError naming
    the file when it is unreadable or the name could not be a folder name."""
    path = Path(folder) / VERSION_FILE
    if not path.is_file():
        return None
    try:
        version = json.loads(path.read_text())["version"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: unreadable ({str(exc)[:120]}); re-materialize trained_model") from None
    if not is_valid_dataset_name(version):
        raise ValueError(
            f"{path}: the version {str(version)[:80]!r} is not a valid folder name; re-materialize trained_model"
        )
    return version


def write_metrics(rows: list[dict], path: str | os.PathLike) -> None:
    """metrics.parquet from the history rows (missing values as nulls)."""
    columns = {}
    for name in METRIC_COLUMNS:
        values = [r.get(name) for r in rows]
        values = [None if isinstance(v, float) and math.isnan(v) else v for v in values]
        kind = pa.int64() if name in ("epoch", "rank", "steps", "seeds") else pa.float64()
        columns[name] = pa.array(values, type=kind)
    pq.write_table(pa.table(columns), path)


def rank_seeds_per_second(path: str | os.PathLike) -> dict[int, float]:
    """Each rank's speed over a run's metrics.parquet: its seeds per second reading and forwarding
    its minibatches (``data_seconds + forward_seconds``; backward holds DDP's wait for the slowest
    rank) over the epochs after the first (which holds the one-off costs of first calls) when there
    are any, by rank; empty when the file has no per-rank timings (ValueError when unreadable)."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"{path}: unreadable ({str(exc)[:120]})") from None
    needed = ("epoch", "rank", "seeds", "data_seconds", "forward_seconds")
    if any(name not in table.column_names for name in needed):
        return {}
    epoch, rank, seeds, data, forward = (
        np.asarray(table.column(n).fill_null(0).to_numpy(), np.float64) for n in needed
    )
    later = epoch > epoch.min() if len(epoch) else epoch.astype(bool)
    if later.any():
        rank, seeds, data, forward = rank[later], seeds[later], data[later], forward[later]
    ranks = rank.astype(np.int64)
    busy = np.bincount(ranks, weights=data + forward)
    done = np.bincount(ranks, weights=seeds)
    return {int(r): float(done[r] / busy[r]) for r in np.unique(ranks) if busy[r] > 0 and done[r] > 0}


def write_predictions(
    path: str | os.PathLike, original_id: pa.Array, logits: torch.Tensor, rows: np.ndarray | None = None
) -> None:
    """predictions.parquet: node_id (the user's id), predicted, probabilities, index (internal),
    for every node or for the nodes `rows` (a typed graph's target type, `NodeTable.predicted`).

    The user's id keeps the name the landing layout gave it (`node_id`), so
    ``predictions.merge(nodes, on="node_id")`` joins the right rows for integer and string
    ids; the internal index is named `index`, which no input file uses."""
    index = np.arange(len(logits), dtype=np.int64) if rows is None else rows
    probs = torch.softmax(logits.float()[torch.from_numpy(index)], dim=1).cpu().numpy().astype(np.float32)
    c = probs.shape[1]
    table = pa.table(
        {
            "node_id": original_id.take(pa.array(index)),
            "predicted": pa.array(probs.argmax(1).astype(np.int32)),
            "probabilities": pa.FixedSizeListArray.from_arrays(pa.array(probs.reshape(-1)), c),
            "index": pa.array(index),
        }
    )
    pq.write_table(table, path)


def plot_curves(rows: list[dict], path: str | os.PathLike) -> None:
    """curves.png: training loss (mean over ranks) and train/val/test accuracy per epoch."""
    plt = headless_pyplot()
    from matplotlib.ticker import MaxNLocator

    epochs = sorted({r["epoch"] for r in rows})
    loss = [np.mean([r["loss"] for r in rows if r["epoch"] == e]) for e in epochs]
    main = {r["epoch"]: r for r in rows if r["rank"] == 0}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    ax1.plot(epochs, loss, marker=".")
    ax1.set_xlabel("epoch")
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole epochs, never 0.5
    ax1.set_ylabel("training loss")
    ax1.set_title("loss")
    for split in ("train", "val", "test"):
        pts = [(e, main[e].get(f"{split}_acc")) for e in epochs if e in main]
        pts = [(e, a) for e, a in pts if a is not None and not math.isnan(a)]
        if pts:
            ax2.plot(*zip(*pts), marker=".", label=split)
    ax2.set_xlabel("epoch")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_ylabel("accuracy (full-graph inference)")
    ax2.set_title("accuracy")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_json(path: str | os.PathLike, obj: dict) -> None:
    Path(path).write_text(json.dumps(obj, indent=1, default=str))
