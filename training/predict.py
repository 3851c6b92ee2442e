"""Scoring a dataset with a trained model, without retraining.

The model file (``model_best.safetensors`` of a trained_model, model_versions or promoted
folder, see `training.outputs`) holds the weights, the model config and the preprocessing it
was trained with. :func:`predict` rebuilds the model's input for the dataset as it is now
(canonical_graph and normalized_adjacency re-materialized from the updated landing files, so
nodes that arrived since training are scored too), applies the stored preprocessing (the
same feature normalization statistics, not new ones) and runs full-graph layer-wise
inference. Every file it reads is first checked against the ``hashes.json`` its stage wrote
when it published the folder (`graphs.infra.storage.verify_files`): a damaged model, node table,
feature or adjacency file fails naming the file and the stage to re-materialize, instead of
changing predictions silently. From the command line::

    python -m training.predict --model .gnnflow/mydata/trained_model/model_best.safetensors \\
        --canonical .gnnflow/mydata/canonical_graph --adjacency .gnnflow/mydata/normalized_adjacency \\
        --out /tmp/mydata-predictions

Files written into ``out`` (atomically): ``predictions.parquet`` and ``summary.json`` (the
model file used and its version, node and class counts, seconds). predictions.parquet has the
trained_model layout plus ``predicted_index``: ``node_id`` = the user's id, ``predicted`` = the
user's label value when the model folder holds a ``label_classes.json`` (labels given as
strings, booleans or other categorical values; `graphs.formats.label_classes`), of that value's type,
else the class index (int32, as ``predicted_index``), ``predicted_index`` int32,
``probabilities`` (one per class index), ``index`` (gnnflow's internal node index).

Features come from canonical_graph's FP32 ``features.npy`` (a model trained from
compressed_graph's codes saw their decoded approximation of the same values).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.label_classes import LABEL_CLASSES, label_values, read_label_classes
from graphs.infra.storage import atomic_output_dir, verify_files
from graphs.stages.normalize import Adjacency, load_csr
from training.evaluate import load_full_block
from training.features import degree_features, read_node_table
from training.outputs import MODEL_BEST, MODEL_FINAL, PREDICTIONS, SUMMARY, load_model, read_version, write_json
from training.outputs import STAGE as TRAINED_MODEL

__all__ = ["predict", "verify_inputs"]

ADJACENCY_FILES = (Adjacency.SUMMARY, *Adjacency.CSR_FILES)


def verify_inputs(canonical: Path, adjacency: Path, feature_input: str) -> None:
    """`graphs.infra.storage.CorruptFileError` naming the file and the stage to re-materialize unless
    the canonical_graph and normalized_adjacency files scoring reads are as their stage published them."""
    verify_files(adjacency, ADJACENCY_FILES, stage=Adjacency.STAGE)
    graph = CanonicalGraph.open(canonical)
    names = [graph.NODES] + ([graph.FEATURES] if feature_input == "features" and graph.has_features else [])
    verify_files(canonical, names, stage=graph.STAGE)


def model_input(preprocessing, canonical: Path, adjacency: Path, in_feats: int) -> torch.Tensor:
    """The float32 [n, in_feats] input the stored preprocessing builds from these folders."""
    if preprocessing.input == "degree":
        x = degree_features(load_csr(adjacency).indptr, preprocessing.degree_buckets)
    else:
        path = CanonicalGraph.open(canonical).features_path
        if not path.is_file():
            raise ValueError(
                f"{path}: missing, but the model was trained on node features; give the dataset a "
                "features.parquet with the same columns as at training time"
            )
        x = torch.from_numpy(np.array(np.load(path, mmap_mode="r", allow_pickle=False), dtype=np.float32))
    if x.shape[1] != in_feats:
        raise ValueError(
            f"{canonical}: the dataset's model input has {x.shape[1]} columns, the model was trained on {in_feats}"
        )
    return preprocessing.transform()(x)


def predict(
    model_path: str | os.PathLike,
    canonical_dir: str | os.PathLike,
    adjacency_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    batch_size: int = 0,
) -> dict:
    """Predictions of the model file for every node of the dataset; returns the summary.

    The model file must lie in a published model folder (trained_model, model_versions/<v>,
    promoted): it is checked against that folder's hashes.json before it is loaded."""
    t0 = time.perf_counter()
    canonical, adjacency, model_path = Path(canonical_dir), Path(adjacency_dir), Path(model_path)
    verify_files(model_path.parent, [model_path.name], stage=TRAINED_MODEL)
    loaded = load_model(model_path)
    classes = model_label_classes(model_path.parent, loaded.num_classes)
    verify_inputs(canonical, adjacency, loaded.preprocessing.input)
    adj_norm = Adjacency.open(adjacency).summary.get("degree_norm", "both")
    if adj_norm != loaded.preprocessing.degree_norm:
        raise ValueError(
            f"{adjacency}: degree_norm={adj_norm!r}, the model was trained over degree_norm="
            f"{loaded.preprocessing.degree_norm!r}; re-materialize normalized_adjacency with that setting"
        )
    nodes = read_node_table(canonical)
    block = loaded.preprocessing.graph(load_full_block(adjacency))
    if block.num_dst != nodes.n:
        raise ValueError(
            f"node counts differ: canonical_graph {nodes.n}, normalized_adjacency {block.num_dst}; "
            "re-materialize normalized_adjacency"
        )
    x = model_input(loaded.preprocessing, canonical, adjacency, loaded.in_feats)
    logits = loaded.model.inference(block, x, batch_size or None).float()
    scored = logits if nodes.predicted is None else logits[torch.from_numpy(nodes.predicted)]
    counts = np.bincount(scored.argmax(1).numpy(), minlength=loaded.num_classes)
    summary = {
        "model": str(model_path.resolve()),
        "model_version": read_version(model_path.parent),
        "model_epoch": loaded.epoch,
        "nodes": int(nodes.n if nodes.predicted is None else len(nodes.predicted)),
        "num_classes": loaded.num_classes,
        "predicted_per_class": [int(c) for c in counts],
        "feature_input": loaded.preprocessing.input,
        "feature_norm": loaded.preprocessing.feature_norm,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    with atomic_output_dir(out_dir) as tmp:
        write_scored(tmp / PREDICTIONS, nodes.original_id, logits, classes, nodes.predicted)
        write_json(tmp / SUMMARY, summary)
    return summary


def model_label_classes(model_dir: Path, num_classes: int) -> list | None:
    """The user's label value of each class of a model folder (None without label_classes.json),
    checked against the folder's hashes.json and the model's class count."""
    if not (model_dir / LABEL_CLASSES).is_file():
        return None
    verify_files(model_dir, [LABEL_CLASSES], stage=TRAINED_MODEL)
    classes = read_label_classes(model_dir)
    if len(classes) != num_classes:
        raise ValueError(
            f"{model_dir / LABEL_CLASSES}: {len(classes)} label values for a model of {num_classes} classes; "
            "re-materialize trained_model"
        )
    return classes


def write_scored(
    path: Path, original_id: pa.Array, logits: torch.Tensor, classes: list | None, rows: np.ndarray | None = None
) -> None:
    """predictions.parquet (see the module docstring) for these logits, of every node or of the
    nodes `rows` (a typed graph's target type)."""
    rows = np.arange(len(logits), dtype=np.int64) if rows is None else rows
    probs = torch.softmax(logits.float()[torch.from_numpy(rows)], dim=1).cpu().numpy().astype(np.float32)
    index = probs.argmax(1).astype(np.int32)
    table = pa.table(
        {
            "node_id": original_id.take(pa.array(rows)),
            "predicted": pa.array(index) if classes is None else label_values(classes, index),
            "predicted_index": pa.array(index),
            "probabilities": pa.FixedSizeListArray.from_arrays(pa.array(probs.reshape(-1)), probs.shape[1]),
            "index": pa.array(rows),
        }
    )
    pq.write_table(table, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.predict", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", required=True, help=f"{MODEL_BEST} or {MODEL_FINAL} of a trained_model (or model_versions) folder"
    )
    parser.add_argument("--canonical", required=True, help="the dataset's canonical_graph folder")
    parser.add_argument("--adjacency", required=True, help="the dataset's normalized_adjacency folder")
    parser.add_argument("--out", required=True, help="folder to write predictions.parquet and summary.json into")
    parser.add_argument("--batch-size", type=int, default=0, help="destination nodes per inference chunk (0: all)")
    args = parser.parse_args(argv)
    summary = predict(args.model, args.canonical, args.adjacency, args.out, batch_size=args.batch_size)
    print(f"{summary['nodes']} nodes scored with {summary['model']}: {Path(args.out) / PREDICTIONS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
