"""What the samplers read: Â as CSR arrays, labels, splits, clusters (`load_shard_inputs`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.graph_schema import TypedSchema
from graphs.formats.graph_table import GraphTable, read_graph_table
from graphs.formats.node_scores import mean_grad_norm, read_node_scores
from graphs.formats.partition_files import Partitions
from graphs.infra.storage import verify_inputs
from graphs.stages.normalize import ScaleFactors, load_csr, load_relational_csr, load_scale_factors

# ----------------------------------------------------------------------------- inputs


@dataclass
class ShardInputs:
    """What the samplers read: Â as CSR arrays (memory-mapped), labels, splits, clusters."""

    n: int
    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray
    labels: np.ndarray
    train_nodes: np.ndarray
    num_classes: int
    feature_dim: int
    features_path: Path | None = None
    cluster_id: np.ndarray | None = None
    part_id: np.ndarray | None = None  # METIS part of every node (metis_partitions), when given
    canonical_dir: Path | None = None
    adjacency_dir: Path | None = None
    partitions_dir: Path | None = None
    compressed_dir: Path | None = None
    node_scores: np.ndarray | None = (
        None  # g(v) float64 [n] of adaptive sampling (graphs.formats.node_scores), when given
    )
    node_scores_path: Path | None = None
    scale_factors: ScaleFactors | None = None  # Â's row / column scales when it factors (graphs.stages.normalize)
    rank_shares: np.ndarray | None = None  # each rank's share of an epoch's seeds (graphs.sampling.rebalance)
    graphs: GraphTable | None = None  # a graph collection's graphs (graphs.formats.graph_table)
    typed: TypedSchema | None = None  # a typed graph's schema: Â is then its relational Â
    etypes: np.ndarray | None = None  # int16 [nnz] typed graphs: each entry's relation index


def train_nodes_of(labels: np.ndarray, split: np.ndarray) -> np.ndarray:
    """Ascending ids of the nodes with split 'train' and a known label (>= 0)."""
    return np.flatnonzero((split == "train") & (labels >= 0)).astype(np.int64)


def load_shard_inputs(
    canonical_dir: str | os.PathLike,
    adjacency_dir: str | os.PathLike,
    partitions_dir: str | os.PathLike | None = None,
    compressed_dir: str | os.PathLike | None = None,
    node_scores: str | os.PathLike | None = None,
    rank_shares: np.ndarray | None = None,
) -> ShardInputs:
    """Read the canonical graph's labels/splits, Â's CSR and (if given) the METIS parts and clusters;
    `compressed_dir` (compressed_graph, optional) supplies the features for feature_encoding='compressed';
    `node_scores` (optional) a training run's `graphs.formats.node_scores` file, read as g(v) for adaptive sampling;
    `rank_shares` (optional, float [W] summing to 1) each rank's share of an epoch's seeds (`graphs.sampling.rebalance`).

    Every file read from the canonical, adjacency and partition folders, and the features the
    shards will reference, is checked against its folder's hashes.json first
    (`graphs.infra.storage.verified`): the shards record the SHA-256 of the files they depend on, and
    must not record a damaged one as good."""
    canonical, adjacency = Path(canonical_dir), Path(adjacency_dir)
    graph = CanonicalGraph.open(canonical, verify=True)
    summary, n = graph.summary, graph.num_nodes
    table = pq.read_table(graph.verified(graph.NODES), columns=["node_id", "label", "split"])
    node_id = table.column("node_id").to_numpy()
    if len(node_id) != n or (node_id != np.arange(n)).any():
        raise ValueError(f"{graph.nodes_path}: column 'node_id' is not 0..{n - 1} in order")
    labels = table.column("label").to_numpy().astype(np.int64)
    split = table.column("split").to_numpy(zero_copy_only=False).astype(str)
    graphs = read_graph_table(canonical) if "collection" in summary else None
    # a collection's loss reaches every node of its training graphs (through the readout)
    train = train_nodes_of(labels, split) if graphs is None else graphs.node_ranges(graphs.of_split("train"))[0]
    typed = TypedSchema.read(graph.root)
    csr = load_csr(adjacency, n=n) if typed is None else load_relational_csr(adjacency)
    if csr.n != n:
        raise ValueError(f"{adjacency}: Â has {csr.n} rows, the canonical graph {n} nodes; re-run normalized_adjacency")
    cluster_id = part_id = None
    parts = Partitions.open(partitions_dir) if partitions_dir is not None else None
    if parts is not None and parts.has(parts.CLUSTER_ID):
        cluster_id = np.load(parts.verified(parts.CLUSTER_ID), allow_pickle=False)
        if len(cluster_id) != n:
            raise ValueError(f"{parts.path(parts.CLUSTER_ID)}: {len(cluster_id)} entries, expected {n}")
    if parts is not None and parts.has(parts.PART_ID):
        part_id = np.load(parts.verified(parts.PART_ID), allow_pickle=False)
        if len(part_id) != n:
            raise ValueError(f"{parts.path(parts.PART_ID)}: {len(part_id)} entries, expected {n}")
    feats = graph.features_path
    verify_inputs(canonical, [graph.FEATURES])
    scores = None
    if node_scores is not None:
        scores = mean_grad_norm(*read_node_scores(node_scores, n))
    return ShardInputs(
        n=n,
        indptr=csr.indptr,
        indices=csr.indices,
        weights=csr.weights,
        labels=labels,
        train_nodes=train,
        num_classes=int(summary.get("num_classes", int(labels.max()) + 1 if n else 0)),
        feature_dim=int(summary.get("feature_dim", 0)),
        features_path=feats if feats.is_file() else None,
        cluster_id=cluster_id,
        part_id=part_id,
        canonical_dir=canonical,
        adjacency_dir=adjacency,
        partitions_dir=Path(partitions_dir) if partitions_dir is not None else None,
        compressed_dir=Path(compressed_dir) if compressed_dir is not None else None,
        node_scores=scores,
        node_scores_path=Path(node_scores) if node_scores is not None else None,
        scale_factors=load_scale_factors(adjacency, n=n) if typed is None else None,
        rank_shares=None if rank_shares is None else np.asarray(rank_shares, dtype=np.float64),
        graphs=graphs,
        typed=typed,
        etypes=None if typed is None else csr.etypes,
    )
