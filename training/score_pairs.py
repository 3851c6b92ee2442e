"""Score candidate node pairs with a dataset's link-prediction model (plain torch; no DGL, no Dagster).

    from training.score_pairs import score_dataset_pairs
    score_dataset_pairs(".gnnflow", "ego-facebook", "candidates.parquet", "scores.parquet")

or from the shell ``gnnflow score-pairs --dataset ego-facebook --pairs candidates.parquet
--out scores.parquet`` (`pipelines.score_pairs_cli`).

Input: a Parquet file of candidate pairs with columns ``src`` and ``dst`` in the user's own node
ids (those of the dataset's edge files: integers or strings); other columns are ignored. The ids
are mapped through canonical_graph's ``nodes.parquet`` (``original_id`` -> ``node_id``; on a
typed graph ``src`` among the target relation's source type and ``dst`` among its destination
type, so a user and an item may share an id); an id
the graph does not hold (or a null) fails with a `PairsError` naming the file, the column, how
many and a bounded sample of them.

Model: ``<home>/<dataset>/promoted/`` when it holds a link model (`training.outputs.LINK_MODEL`),
else ``<home>/<dataset>/trained_model/``, loaded with `training.link.load_saved` over the
message-passing graph (normalized_adjacency) and the features (minibatch_shards) it was trained
on: embeddings and pair features are computed exactly as evaluation computes them.

Output: a Parquet file with ``src`` and ``dst`` as given (the user's values and type) and
``score`` float32, the probability that the pair is an edge, one row per input row in the
input's order; written to a temporary sibling and renamed into place. The output path must
not be the pairs file nor lie inside the dataset's gnnflow folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.graph_schema import Relation
from graphs.formats.shard_format import STAGE as MINIBATCH_SHARDS
from graphs.infra.config_checks import bounded_repr
from graphs.infra.dataset_names import validate_dataset_name
from graphs.stages.normalize import Adjacency
from training.link import load_saved
from training.outputs import LINK_MODEL
from training.outputs import STAGE as TRAINED_MODEL

__all__ = ["PairsError", "link_model_dir", "map_original_ids", "score_dataset_pairs", "score_pairs"]

PAIR_COLUMNS = ("src", "dst")
_SAMPLE = 5  # unknown ids named in an error


class PairsError(ValueError):
    """A pairs file, output path or dataset folder that cannot be scored; the message says why and what to do."""


def link_model_dir(dataset_dir: str | os.PathLike) -> Path:
    """``promoted/`` when it holds a link model, else ``trained_model/``; PairsError naming both when neither does."""
    dataset_dir = Path(dataset_dir)
    for name in ("promoted", TRAINED_MODEL):
        if (dataset_dir / name / LINK_MODEL).is_file():
            return dataset_dir / name
    raise PairsError(
        f"no link-prediction model in {dataset_dir / 'promoted'} nor {dataset_dir / TRAINED_MODEL}; "
        "materialize trained_model for this dataset (task: link_prediction in its gnnflow.yaml) first"
    )


def map_original_ids(
    values: pa.Array, nodes_file: str | os.PathLike, where: str, node_type: str | None = None
) -> np.ndarray:
    """int64 node ids of the user's ids `values` (nodes_file's ``original_id`` -> ``node_id``),
    among the nodes of `node_type` when given (a typed graph: ids are unique within a type);
    PairsError naming `where` (file and column) when an id is null or not a node (of that type)."""
    if node_type is None:
        nodes = pq.read_table(nodes_file, columns=["node_id", "original_id"])
    else:
        nodes = pq.read_table(nodes_file, columns=["node_id", "original_id", "node_type"])
        nodes = nodes.filter(pc.equal(nodes.column("node_type"), node_type))
    original = nodes.column("original_id").combine_chunks()
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    try:
        values = values.cast(original.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise PairsError(
            f"{where}: ids of type {values.type} cannot be read as the dataset's node ids ({original.type}); "
            "give the ids as they appear in the dataset's edge files"
        ) from None
    at = pc.index_in(values, value_set=original)
    missing = pc.is_null(at)
    count = pc.sum(missing).as_py() or 0
    if count:
        sample = pc.filter(values, missing).slice(0, _SAMPLE).to_pylist()
        kind = "nodes" if node_type is None else f"{node_type!r} nodes"
        raise PairsError(
            f"{where}: {count} ids are not {kind} of the dataset ({nodes_file}), e.g. "
            f"{bounded_repr(sample)}; score pairs of nodes the graph holds (or re-ingest the dataset with them)"
        )
    node_ids = nodes.column("node_id").combine_chunks().to_numpy()
    return node_ids[at.to_numpy(zero_copy_only=False).astype(np.int64)]


def score_pairs(pairs_file, out_file, *, model_dir, canonical_dir, shards_dir, adjacency_dir) -> dict:
    """Score `pairs_file` with the link model in `model_dir` into `out_file` (module docstring);
    {"pairs", "model_dir", "out"}."""
    pairs_file, out_file = Path(pairs_file), Path(out_file)
    table = _read_pairs(pairs_file)
    nodes_file = CanonicalGraph.open(canonical_dir).nodes_path
    saved = load_saved(model_dir, shards_dir, adjacency_dir)
    target = saved.graph.target  # a typed graph: src ids are the relation's source type's, dst ids its destination's
    types = (
        (None, None)
        if target is None
        else (Relation.from_key(target.key).src_type, Relation.from_key(target.key).dst_type)
    )
    ids = [
        map_original_ids(table.column(c), nodes_file, f"{pairs_file}: column '{c}'", t)
        for c, t in zip(PAIR_COLUMNS, types)
    ]
    pairs = torch.from_numpy(np.stack(ids)) if len(table) else torch.zeros(2, 0, dtype=torch.int64)
    scores = saved.probabilities(pairs).numpy().astype(np.float32)
    out = pa.table({"src": table.column("src"), "dst": table.column("dst"), "score": scores})
    _write_atomically(out, out_file)
    return {"pairs": len(table), "model_dir": str(model_dir), "out": str(out_file)}


def score_dataset_pairs(home, dataset: str, pairs_file, out_file) -> dict:
    """`score_pairs` with the folders of `dataset` under the gnnflow home `home` and its
    promoted (else trained) link model; the paths checked first (`check_paths`)."""
    dataset_dir = Path(home) / validate_dataset_name(dataset)
    check_paths(pairs_file, out_file, dataset_dir)
    return score_pairs(
        pairs_file,
        out_file,
        model_dir=link_model_dir(dataset_dir),
        canonical_dir=dataset_dir / CanonicalGraph.STAGE,
        shards_dir=dataset_dir / MINIBATCH_SHARDS,
        adjacency_dir=dataset_dir / Adjacency.STAGE,
    )


def check_paths(pairs_file, out_file, dataset_dir) -> None:
    """PairsError unless `pairs_file` is a file and `out_file` a new or replaceable ``.parquet``
    path that is neither the pairs file nor inside `dataset_dir` (the pipeline's files)."""
    pairs, out = Path(pairs_file), Path(out_file)
    if not pairs.is_file():
        raise PairsError(f"pairs file {bounded_repr(str(pairs))} does not exist or is not a file")
    if out.suffix != ".parquet":
        raise PairsError(f"output {bounded_repr(str(out))}: name it *.parquet (a Parquet file is written)")
    if not out.parent.is_dir():
        raise PairsError(f"output {bounded_repr(str(out))}: its folder does not exist; create it first")
    if out.is_dir():
        raise PairsError(f"output {bounded_repr(str(out))} is a folder; give a file path ending in .parquet")
    resolved, home = out.resolve(), Path(dataset_dir).resolve()
    if resolved == pairs.resolve() or (out.exists() and out.samefile(pairs)):
        raise PairsError(f"output {bounded_repr(str(out))} is the pairs file; choose another output path")
    if resolved.is_relative_to(home):
        raise PairsError(
            f"output {bounded_repr(str(out))} lies among the pipeline's files under {home}; choose a path outside it"
        )


def _read_pairs(path: Path) -> pa.Table:
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise PairsError(f"{path}: not a readable Parquet file ({bounded_repr(str(exc))})") from None
    missing = [c for c in PAIR_COLUMNS if c not in schema.names]
    if missing:
        raise PairsError(
            f"{path}: no column {missing[0]!r}; a pairs file has columns 'src' and 'dst' (the user's node ids); "
            f"it has {bounded_repr(schema.names)}"
        )
    return pq.read_table(path, columns=list(PAIR_COLUMNS))


def _write_atomically(table: pa.Table, out: Path) -> None:
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
