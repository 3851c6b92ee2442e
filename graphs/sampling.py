"""Minibatch sampling written once as shard files: one stream of sampled blocks per DDP rank.

Four samplers (``ShardConfig.sampler``), each producing, per minibatch, one block per GNN
layer in the CSC layout of `training.blocks.Block` (destination nodes are the first
``num_dst`` source nodes; block ``l``'s destination nodes are block ``l + 1``'s source
nodes, so one array ``input_nodes`` of global ids names the nodes of every block):

``neighbor``
    DGL's neighbour sampling with ``fanouts`` (``fanouts[0]`` is the input layer, DGL's
    order; -1 takes every neighbour): the fused C++ path that
    ``dgl.dataloading.NeighborSampler.sample_blocks`` takes on a multi-threaded CPU
    (``DGLGraph.sample_neighbors_fused``, see `dgl_neighbor_blocks`), run with one thread.
    With one thread it draws exactly the blocks ``NeighborSampler`` draws for the same
    ``dgl.seed`` (tests/test_sampling.py checks this). Seeds are the training nodes.
``importance``
    Layer-wise importance sampling (LADIES, Zou et al. 2019; FastGCN's estimator on the
    neighbourhood of the layer's nodes): for the destination set S of a layer, every
    neighbour u of S has probability ``q_u ∝ Σ_{v∈S, v≠u} Â_vu²``; ``importance_nodes``
    nodes are drawn *with replacement*, and the sampled edge v <- u gets the weight
    ``Â_vu · c_u / (s · q_u)`` (``c_u`` = times u was drawn, ``s`` = draws); with the self
    loop added exactly (below), the block's aggregation ``Σ_u w_vu x_u`` is an unbiased
    estimate of the exact row ``(Â X)_v``. The next layer's destinations are S plus the
    drawn nodes.
``cluster_gcn``
    Cluster-GCN: each minibatch is the subgraph of Â induced by ``cluster_batch`` METIS
    clusters (``cluster_id.npy`` of metis_partitions); every layer uses that one block
    (stored once: ``shared_block`` in the manifest). The loss nodes are its training nodes.
``saint``
    DGL's ``SAINTSampler`` (node, edge or random-walk mode). DGL 2.1 computes no
    normalization, so it is estimated as in GraphSAINT (Zeng et al. 2020, §3.2) from
    ``N`` pre-sampled subgraphs: ``C_v``, ``C_uv`` = how many contain node v / edge u->v.
    Aggregation normalization ``α_uv = C_uv / C_v``: the edge weight is ``Â_vu / α_uv``.
    Loss normalization: ``loss_weight_v = N / (C_v · T)`` (T = training nodes), so
    ``Σ_v loss_weight_v · loss_v`` over a subgraph is an unbiased estimate of the mean
    training loss. Counts are clamped at 1.

Edges and weights. Sampling runs on the graph of Â *without* its diagonal (a DGL graph
built from the normalized CSR minus the self loops: edge ``u -> v`` for each entry
``Â[v, u]``, so DGL's in-neighbours of v are row v of Â and a sampled edge id is a
position in those off-diagonal arrays). Each block then gets every destination's self
loop ``v -> v`` with weight ``Â_vv`` (first edge of each destination's segment) when
``self_loops`` is on and Â has a diagonal: the fanout counts real neighbours only, and
a GCN layer over the block computes what full-graph inference over Â computes.
Edge weights: ``neighbor`` multiplies the sampled neighbour weights of v by
``deg(v) / sampled(v)`` when ``neighbor_rescale`` (uniform sampling without replacement,
so again an unbiased estimate of the row of Â·X); ``importance`` and ``saint`` apply their
corrections above; ``cluster_gcn`` uses Â restricted to the subgraph. With
``weights="int8"`` the final weights are stored as per-destination symmetric INT8
(`graphs.quantize.quantize_int8_rows_csr`: ``q`` int8 per edge, ``scale`` float32 per
destination; weight = q * scale[dst]).

Seeds per epoch (``neighbor`` and ``importance``): the training nodes (split "train",
label >= 0) are permuted with a seed per epoch and cut into W contiguous, disjoint parts
of ceil(T/W) or floor(T/W) nodes, so every training node is a seed exactly once per
epoch. Each rank's part is cut into the same number ``B = ceil(ceil(T/W) / batch_size)``
of minibatches whose sizes differ by at most one (none larger than ``batch_size``): equal
step counts across ranks (unequal counts hang DDP) with nothing dropped or repeated.
``cluster_gcn``: the clusters are permuted per epoch and cut into W·B groups of near-equal
size (B = ceil(K / (cluster_batch · W)) per rank), so every cluster is used once per
epoch. ``saint``: W·B independent subgraphs per epoch, B = ``saint_subgraphs`` or, when 0,
ceil(n / (W · mean nodes of a pre-sampled subgraph)). A ``cluster_gcn``/``saint``
minibatch may hold no training node (its loss is 0, but the rank still steps).

Determinism: every random draw comes from a seed derived from (``seed``, epoch, rank,
minibatch) through NumPy's SeedSequence; DGL's samplers run with one OpenMP thread (DGL
2.1's multi-threaded sampling is not reproducible) and are re-seeded (``dgl.seed`` and
``torch.manual_seed``) before each minibatch. The same inputs and config give identical
shard files.

Files written (format version 1) into ``<out_dir>/`` (replaced atomically as a whole):

``epoch={e}/rank={r}/shard-{k:05d}.npz``  uncompressed ``.npz`` (`graphs.npzio.write_npz`:
streamed, 64-byte aligned, readable by ``np.load(..., allow_pickle=False)``) holding
``minibatches_per_shard`` minibatches each (the last shard of a stream may hold fewer). Scalars ``format_version``, ``minibatches``;
then per minibatch ``i`` (0-based within the file), keys prefixed ``mb{i}_``:

    input_nodes      int32 [num_src(l0)]  global ids of block 0's source nodes (features
                                          rows); its first num_dst(l) entries are block
                                          l's destination nodes (int64 if an id >= 2^31)
    seeds            int64 [S]            global ids of the loss nodes
    seed_pos         int64 [S]            their positions among the last block's
                                          destination nodes (arange(S) for neighbor and
                                          importance)
    labels           int64 [S]
    loss_weight      float32 [S]          only for saint (see above)
    l{l}_num_src     int64 scalar
    l{l}_num_dst     int64 scalar
    l{l}_indptr      int32 [num_dst + 1]  CSC over the destination nodes (int64 if nnz >= 2^31)
    l{l}_indices     int32 [nnz]          local source index (int64 if num_src >= 2^31)
    l{l}_weight      float32 [nnz]        with weights="fp32", or
    l{l}_weight_q    int8 [nnz]  and  l{l}_weight_scale float32 [num_dst]  with "int8"

Blocks ``l = 0 .. num_layers-1``; with ``shared_block`` (cluster_gcn, saint) only ``l0``
is stored and stands for every layer.

``manifest.json``: see `MANIFEST_KEYS`; per (epoch, rank) stream the files in order with
their byte size, SHA-256 and minibatch count.
``features_scale.npy``/``features_zero_point.npy`` float32 [D]: only with ``features="int8"``;
the INT8 matrix is compressed_graph's ``features_int8.npy`` when that asset holds INT8
features (referenced, not copied), else ``features_int8.npy`` int8 [n, D] here (per-column
INT8 of the canonical features, `graphs.quantize.quantize_int8_columns`).

Edge weights with ``weights="int8"`` are quantized per block row here, from Â's FP32
weights times the sampler's correction; compressed_graph's per-row INT8 of Â is not the
source because the corrections change each row's scale anyway.

Usage::

    inputs = load_shard_inputs(home / "cora/canonical_graph", home / "cora/normalized_adjacency",
                               home / "cora/metis_partitions")
    manifest = write_minibatch_shards(inputs, home / "cora/minibatch_shards", ShardConfig())
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow.parquet as pq

from graphs.canonical import read_summary
from graphs.npzio import write_npz
from graphs.storage import atomic_output_dir, peak_rss_bytes

FORMAT_VERSION = 1
# the automatic per-rank batch size (ShardConfig.batch_size = 0): see `auto_batch_size`
AUTO_BATCH_MAX = 1024
AUTO_MINIBATCHES = 4
SAMPLERS = ("neighbor", "importance", "cluster_gcn", "saint")
SAINT_MODES = ("node", "edge", "walk")
WEIGHT_ENCODINGS = ("fp32", "int8")
FEATURE_ENCODINGS = ("fp32", "int8")

MANIFEST_KEYS = {
    "format_version": "int, FORMAT_VERSION of the shard files",
    "sampler": "neighbor | importance | cluster_gcn | saint",
    "settings": "every ShardConfig field",
    "num_layers": "blocks per minibatch (the model's number of layers)",
    "shared_block": "true when only block l0 is stored and stands for every layer",
    "world_size": "W, ranks the shards were cut for",
    "batch_size": "seeds per minibatch per rank (upper bound; neighbor/importance)",
    "epochs": "E",
    "n": "nodes of the graph",
    "num_classes": "classes of the labels",
    "feature_dim": "D, 0 without features",
    "train_nodes": "T, training nodes (split train, label >= 0)",
    "weights": "fp32 | int8 edge-weight encoding in the shards",
    "self_loops": "whether every block holds each destination's self loop",
    "features": "null, or {encoding: fp32, path} or {encoding: int8, q, scale, zero_point}"
    " with paths relative to the manifest's folder, plus shape [n, D]",
    "minibatches_per_epoch_per_rank": "M, equal for every epoch and rank",
    "streams": "list of {epoch, rank, minibatches, seeds, sampled_edges, bytes, files:"
    " [{path, bytes, sha256, minibatches}]}",
    "sampled_edges": "edges of all stored blocks of all minibatches (self loops included; a shared block counts once)",
    "seeds": "loss nodes over all minibatches",
    "bytes": "bytes of all shard files",
    "bytes_per_sampled_edge": "bytes / sampled_edges",
    "seconds": "wall time of sampling and writing",
    "seeds_per_second": "seeds / seconds",
    "sampled_edges_per_second": "sampled_edges / seconds",
    "saint": "saint only: presamples N, mean subgraph nodes",
    "inputs": "paths (relative) of the canonical, adjacency and partition folders used",
}


# ----------------------------------------------------------------------------- config


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in str(text).replace(" ", "").split(",") if v != ""]
    except ValueError as exc:
        raise ValueError(f"{what}={text!r}: expected comma-separated integers, e.g. '15,10,5'") from exc
    return values


@dataclass(kw_only=True)
class ShardConfig:
    """Settings of the minibatch_shards stage (sampler, batch geometry, epochs, ranks)."""

    sampler: str = field(default="neighbor", metadata={"help": f"Sampler, one of {SAMPLERS}."})
    fanouts: str = field(
        default="10,10",
        metadata={
            "help": "Neighbours sampled per node for each layer, input layer first (DGL's order); "
            "-1 = all. Its length is the number of layers for every sampler (and the model's, by default)."
        },
    )
    batch_size: int = field(
        default=0,
        metadata={
            "help": "Seeds per minibatch per rank (upper bound), neighbor and importance samplers; "
            f"0 = automatic: min({AUTO_BATCH_MAX}, ceil(T / (W x {AUTO_MINIBATCHES}))) for T training nodes "
            f"and W ranks, so a small graph still gets {AUTO_MINIBATCHES} optimizer steps per sampled epoch "
            "and a large one minibatches of at most "
            f"{AUTO_BATCH_MAX}. The manifest records the resolved value."
        },
    )
    epochs: int = field(default=3, metadata={"help": "Epochs of shards to write."})
    world_size: int = field(default=2, metadata={"help": "DDP ranks W; one shard stream per rank and epoch."})
    seed: int = field(default=0, metadata={"help": "Seed of every random draw (shards are deterministic)."})
    minibatches_per_shard: int = field(default=8, metadata={"help": "Minibatches per shard file."})
    weights: str = field(
        default="fp32", metadata={"help": "Edge-weight encoding in the shards: 'fp32' or 'int8' (+ scale per row)."}
    )
    features: str = field(
        default="fp32",
        metadata={"help": "Feature source named in the manifest: 'fp32' (canonical features.npy) or 'int8'."},
    )
    self_loops: bool = field(
        default=True,
        metadata={"help": "Add each destination's self loop with weight Â_vv to every block (when Â has them)."},
    )
    neighbor_rescale: bool = field(
        default=True,
        metadata={"help": "neighbor: scale sampled weights by deg/sampled so the aggregation is unbiased."},
    )
    importance_nodes: int = field(
        default=2048, metadata={"help": "importance: nodes drawn (with replacement) per layer."}
    )
    cluster_batch: int = field(default=20, metadata={"help": "cluster_gcn: METIS clusters per minibatch."})
    saint_mode: str = field(default="node", metadata={"help": f"saint: sampler mode, one of {SAINT_MODES}."})
    saint_budget: int = field(
        default=6000,
        metadata={"help": "saint: nodes (node mode), edges (edge mode) or walk roots (walk mode) per subgraph."},
    )
    saint_walk_length: int = field(default=2, metadata={"help": "saint walk mode: random-walk length."})
    saint_coverage: float = field(
        default=20.0,
        metadata={"help": "saint: pre-sample until each node is expected in this many subgraphs (normalization)."},
    )
    saint_subgraphs: int = field(
        default=0, metadata={"help": "saint: subgraphs per epoch per rank; 0 = about n / (W * subgraph nodes)."}
    )

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler={self.sampler!r} is not one of {SAMPLERS}")
        fanouts = _ints(self.fanouts, "fanouts")
        if not fanouts or any(f == 0 or f < -1 for f in fanouts):
            raise ValueError(f"fanouts={self.fanouts!r}: need at least one layer, each > 0 or -1 (all)")
        if self.batch_size < 0:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1, or 0 (automatic)")
        for name in (
            "epochs",
            "world_size",
            "minibatches_per_shard",
            "importance_nodes",
            "cluster_batch",
            "saint_budget",
            "saint_walk_length",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} must be >= 0")
        if self.weights not in WEIGHT_ENCODINGS:
            raise ValueError(f"weights={self.weights!r} is not one of {WEIGHT_ENCODINGS}")
        if self.features not in FEATURE_ENCODINGS:
            raise ValueError(f"features={self.features!r} is not one of {FEATURE_ENCODINGS}")
        if self.saint_mode not in SAINT_MODES:
            raise ValueError(f"saint_mode={self.saint_mode!r} is not one of {SAINT_MODES}")
        if self.saint_coverage <= 0:
            raise ValueError(f"saint_coverage={self.saint_coverage} must be > 0")
        if self.saint_subgraphs < 0:
            raise ValueError(f"saint_subgraphs={self.saint_subgraphs} must be >= 0 (0 = automatic)")

    @property
    def fanout_list(self) -> list[int]:
        return _ints(self.fanouts, "fanouts")

    @property
    def num_layers(self) -> int:
        return len(self.fanout_list)


def auto_batch_size(train_nodes: int, world_size: int) -> int:
    """``min(AUTO_BATCH_MAX, ceil(T / (W * AUTO_MINIBATCHES)))`` (at least 1): the per-rank
    batch of ``ShardConfig.batch_size = 0``, giving a small graph several steps per epoch."""
    return max(1, min(AUTO_BATCH_MAX, math.ceil(train_nodes / (world_size * AUTO_MINIBATCHES))))


def resolve_batch_size(cfg: ShardConfig, train_nodes: int) -> ShardConfig:
    """``cfg`` with ``batch_size`` resolved (0 = `auto_batch_size`)."""
    if cfg.batch_size:
        return cfg
    return replace(cfg, batch_size=auto_batch_size(train_nodes, cfg.world_size))


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
    canonical_dir: Path | None = None
    adjacency_dir: Path | None = None
    partitions_dir: Path | None = None
    compressed_dir: Path | None = None


def train_nodes_of(labels: np.ndarray, split: np.ndarray) -> np.ndarray:
    """Ascending ids of the nodes with split 'train' and a known label (>= 0)."""
    return np.flatnonzero((split == "train") & (labels >= 0)).astype(np.int64)


def load_shard_inputs(
    canonical_dir: str | os.PathLike,
    adjacency_dir: str | os.PathLike,
    partitions_dir: str | os.PathLike | None = None,
    compressed_dir: str | os.PathLike | None = None,
) -> ShardInputs:
    """Read the canonical graph's labels/splits, Â's CSR and (if given) the METIS clusters;
    `compressed_dir` (compressed_graph, optional) supplies INT8 features for features='int8'."""
    canonical, adjacency = Path(canonical_dir), Path(adjacency_dir)
    summary = read_summary(canonical)
    n = int(summary["nodes"])
    table = pq.read_table(canonical / "nodes.parquet", columns=["node_id", "label", "split"])
    node_id = table.column("node_id").to_numpy()
    if len(node_id) != n or (node_id != np.arange(n)).any():
        raise ValueError(f"{canonical / 'nodes.parquet'}: column 'node_id' is not 0..{n - 1} in order")
    labels = table.column("label").to_numpy().astype(np.int64)
    split = table.column("split").to_numpy(zero_copy_only=False).astype(str)
    arrays = {}
    for name in ("indptr", "indices", "weights"):
        path = adjacency / f"{name}.npy"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; materialize normalized_adjacency first")
        arrays[name] = np.load(path, mmap_mode="r", allow_pickle=False)
    if len(arrays["indptr"]) != n + 1:
        raise ValueError(
            f"{adjacency / 'indptr.npy'}: {len(arrays['indptr']) - 1} rows but the canonical graph has {n} nodes; "
            "re-materialize normalized_adjacency"
        )
    cluster_id = None
    if partitions_dir is not None and (Path(partitions_dir) / "cluster_id.npy").is_file():
        cluster_id = np.load(Path(partitions_dir) / "cluster_id.npy", allow_pickle=False)
        if len(cluster_id) != n:
            raise ValueError(f"{Path(partitions_dir) / 'cluster_id.npy'}: {len(cluster_id)} entries, expected {n}")
    feats = canonical / "features.npy"
    return ShardInputs(
        n=n,
        indptr=arrays["indptr"],
        indices=arrays["indices"],
        weights=arrays["weights"],
        labels=labels,
        train_nodes=train_nodes_of(labels, split),
        num_classes=int(summary.get("num_classes", int(labels.max()) + 1 if n else 0)),
        feature_dim=int(summary.get("feature_dim", 0)),
        features_path=feats if feats.is_file() else None,
        cluster_id=cluster_id,
        canonical_dir=canonical,
        adjacency_dir=adjacency,
        partitions_dir=Path(partitions_dir) if partitions_dir is not None else None,
        compressed_dir=Path(compressed_dir) if compressed_dir is not None else None,
    )


# ----------------------------------------------------------------------------- seeds


def derive_seed(seed: int, *key: int) -> int:
    """A 31-bit seed for one random stream, from (seed, *key) through SeedSequence."""
    return int(np.random.SeedSequence([seed, *key]).generate_state(1)[0] & 0x7FFFFFFF)


# stream tags of derive_seed, so different uses never share a stream
_TAG_EPOCH, _TAG_MINIBATCH, _TAG_PRESAMPLE = 1, 2, 3


def minibatch_seed(seed: int, epoch: int, rank: int, index: int) -> int:
    """The seed of minibatch `index` of (`epoch`, `rank`)."""
    return derive_seed(seed, _TAG_MINIBATCH, epoch, rank, index)


def epoch_seed_batches(train_nodes: np.ndarray, epoch: int, cfg: ShardConfig) -> list[list[np.ndarray]]:
    """[rank][minibatch] seed arrays of one epoch (see the module docstring).

    Disjoint across ranks, covering every training node exactly once; every rank gets the
    same number of minibatches, sizes within one of each other and at most batch_size.
    """
    w, t = cfg.world_size, len(train_nodes)
    if t < w:
        raise ValueError(f"{t} training nodes cannot be split over world_size={w} ranks; lower world_size")
    cfg = resolve_batch_size(cfg, t)
    rng = np.random.default_rng(derive_seed(cfg.seed, _TAG_EPOCH, epoch))
    perm = rng.permutation(np.asarray(train_nodes, dtype=np.int64))
    parts = np.array_split(perm, w)
    batches = math.ceil(len(parts[0]) / cfg.batch_size)
    if len(parts[-1]) < batches:
        raise ValueError(
            f"batch_size={cfg.batch_size} leaves a rank with fewer seeds ({len(parts[-1])}) than minibatches "
            f"({batches}); raise batch_size"
        )
    return [np.array_split(p, batches) for p in parts]


def epoch_cluster_groups(cluster_ids: np.ndarray, epoch: int, cfg: ShardConfig) -> list[list[np.ndarray]]:
    """[rank][minibatch] arrays of cluster ids for cluster_gcn: each cluster once per epoch."""
    k = len(cluster_ids)
    if k < cfg.world_size:
        raise ValueError(f"{k} clusters cannot be split over world_size={cfg.world_size} ranks")
    batches = math.ceil(k / (cfg.cluster_batch * cfg.world_size))
    batches = min(batches, k // cfg.world_size)
    rng = np.random.default_rng(derive_seed(cfg.seed, _TAG_EPOCH, epoch))
    groups = np.array_split(rng.permutation(cluster_ids), cfg.world_size * batches)
    return [groups[r * batches : (r + 1) * batches] for r in range(cfg.world_size)]


# ----------------------------------------------------------------------------- minibatches


@dataclass
class SampledBlock:
    """One layer of a sampled minibatch, NumPy CSC over the destination nodes."""

    indptr: np.ndarray  # int64 [num_dst + 1]
    indices: np.ndarray  # int32/int64 [nnz], local source index
    num_src: int
    num_dst: int
    weight: np.ndarray  # float32 [nnz]

    @property
    def num_edges(self) -> int:
        return len(self.indices)


@dataclass
class SampledMinibatch:
    """A minibatch before it is written: blocks (input layer first) and the loss nodes."""

    input_nodes: np.ndarray  # int64 [num_src of block 0]
    blocks: list[SampledBlock]  # num_layers blocks, or one when shared
    seeds: np.ndarray  # int64 [S]
    seed_pos: np.ndarray  # int64 [S]
    labels: np.ndarray  # int64 [S]
    loss_weight: np.ndarray | None = None  # float32 [S]

    @property
    def num_edges(self) -> int:
        return sum(b.num_edges for b in self.blocks)


def segment_positions(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of arange(starts[i], starts[i] + counts[i]) over i, vectorised."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    offsets = np.repeat(np.asarray(starts, dtype=np.int64) - (np.cumsum(counts) - counts), counts)
    return offsets + np.arange(total, dtype=np.int64)


def _index_dtype(num_src: int):
    return np.int32 if num_src < 2**31 else np.int64


def _indptr(counts: np.ndarray) -> np.ndarray:
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr


def insert_self_loops(
    indptr: np.ndarray, src: np.ndarray, weight: np.ndarray, loop_weight: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSC (indptr, indices, weight) with an extra first edge v -> v in each destination's segment.

    `indptr` int64 [num_dst + 1] over `src` (local source ids) and `weight`;
    `loop_weight` float32 [num_dst] is the weight of each new self loop.
    """
    num_dst = len(indptr) - 1
    new_indptr = indptr + np.arange(num_dst + 1, dtype=np.int64)
    total = int(new_indptr[-1])
    loops = new_indptr[:-1]
    rest = np.ones(total, dtype=bool)
    rest[loops] = False
    out_src = np.empty(total, dtype=src.dtype)
    out_src[loops] = np.arange(num_dst, dtype=src.dtype)
    out_src[rest] = src
    out_w = np.empty(total, dtype=np.float32)
    out_w[loops] = loop_weight
    out_w[rest] = weight
    return new_indptr, out_src, out_w


class _Adjacency:
    """Â split into its diagonal and its off-diagonal CSR (the graph that is sampled)."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, chunk: int = 1 << 23):
        n = len(indptr) - 1
        self.n = n
        self.diag = np.zeros(n, dtype=np.float32)
        has_diag = np.zeros(n, dtype=bool)
        parts_i, parts_w, counts = [], [], np.diff(np.asarray(indptr)).astype(np.int64)
        r0 = 0
        while r0 < n:
            r1 = int(np.searchsorted(indptr, indptr[r0] + chunk, side="right")) - 1
            r1 = min(n, max(r0 + 1, r1))
            a, b = int(indptr[r0]), int(indptr[r1])
            idx = np.asarray(indices[a:b], dtype=np.int64)
            w = np.asarray(weights[a:b], dtype=np.float32)
            rows = np.repeat(np.arange(r0, r1, dtype=np.int64), counts[r0:r1])
            loop = idx == rows
            self.diag[rows[loop]] = w[loop]
            has_diag[rows[loop]] = True
            parts_i.append(idx[~loop])
            parts_w.append(w[~loop])
            r0 = r1
        self.indices = np.concatenate(parts_i) if parts_i else np.empty(0, np.int64)
        self.weights = np.concatenate(parts_w) if parts_w else np.empty(0, np.float32)
        self.degree = counts - has_diag  # off-diagonal entries per row
        self.indptr = _indptr(self.degree)
        self.has_self_loops = bool(has_diag.any())
        # Â with its diagonal, for induced subgraphs (cluster_gcn)
        self.full_indptr = np.asarray(indptr, dtype=np.int64)
        self.full_indices = indices
        self.full_weights = weights
        self._dgl_graph = None

    @property
    def num_edges(self) -> int:
        return len(self.indices)

    def dgl_graph(self):
        """DGL graph with edge u -> v per off-diagonal entry Â[v, u]; edge id = off-diagonal position."""
        if self._dgl_graph is None:
            import dgl
            import torch

            self._dgl_graph = dgl.graph(
                (
                    "csc",
                    (torch.from_numpy(self.indptr), torch.from_numpy(self.indices), torch.empty(0, dtype=torch.int64)),
                ),
                num_nodes=self.n,
            )
        return self._dgl_graph

    def neighbours(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row position per entry, column ids, weights) of the off-diagonal entries of `rows`."""
        counts = self.degree[rows]
        pos = segment_positions(self.indptr[rows], counts)
        owner = np.repeat(np.arange(len(rows), dtype=np.int64), counts)
        return owner, self.indices[pos], self.weights[pos]


@contextlib.contextmanager
def _single_threaded_dgl():
    """DGL with one OpenMP thread: DGL 2.1's multi-threaded sampling is not reproducible
    (and on a busy 2-core machine one thread was also 3-6x faster)."""
    from dgl.utils import get_num_threads, set_num_threads

    old = get_num_threads()
    set_num_threads(1)
    try:
        yield
    finally:
        set_num_threads(old)


def dgl_neighbor_blocks(g, seeds, fanouts: list[int], mapping: dict):
    """DGL's fused neighbour sampling, layer by layer from the seeds outwards.

    The same loop as ``dgl.dataloading.NeighborSampler.sample_blocks`` runs on a CPU graph
    when DGL has more than one thread (``g.sample_neighbors_fused``: sampling and block
    construction in one C++ call); called here with one thread, where it is reproducible.
    `mapping` is DGL's reusable global-to-local id buffer. Returns (input_nodes, blocks).
    """
    import dgl

    blocks = []
    for fanout in reversed(fanouts):
        block = g.sample_neighbors_fused(seeds, fanout, edge_dir="in", mapping=mapping)
        seeds = block.srcdata[dgl.NID]
        blocks.insert(0, block)
    return seeds, blocks


class MinibatchSampler:
    """Samples the minibatches of every (epoch, rank) for one ShardConfig, in memory.

    `epoch(e)` yields ``(rank, index, SampledMinibatch)`` rank by rank, minibatch by
    minibatch; `write_minibatch_shards` writes exactly this sequence.
    """

    def __init__(self, inputs: ShardInputs, cfg: ShardConfig, log: Callable[[str], None] | None = None):
        self.inputs, self.cfg = inputs, cfg
        self.log = log or (lambda msg: None)
        if len(inputs.train_nodes) == 0:
            raise ValueError("the graph has no training nodes (split 'train' with a label >= 0)")
        self.adj = _Adjacency(inputs.indptr, inputs.indices, inputs.weights)
        self.add_loops = cfg.self_loops and self.adj.has_self_loops
        self.is_train = np.zeros(inputs.n, dtype=bool)
        self.is_train[inputs.train_nodes] = True
        self._scratch = np.full(inputs.n, -1, dtype=np.int64)  # global -> local id, reset after use
        self.saint_info: dict = {}
        self._dgl_mapping: dict = {}
        if cfg.sampler == "cluster_gcn":
            if inputs.cluster_id is None:
                raise ValueError("sampler='cluster_gcn' needs cluster_id.npy from metis_partitions")
            order = np.argsort(inputs.cluster_id, kind="stable")
            ids, starts, counts = np.unique(inputs.cluster_id[order], return_index=True, return_counts=True)
            self._cluster_order, self._cluster_ids = order, ids.astype(np.int64)
            self._cluster_start = dict(zip(ids.tolist(), zip(starts.tolist(), counts.tolist())))
        elif cfg.sampler == "saint":
            self._init_saint()

    # ---- schedule

    @property
    def shared_block(self) -> bool:
        return self.cfg.sampler in ("cluster_gcn", "saint")

    def minibatches_per_rank(self) -> int:
        cfg = self.cfg
        if cfg.sampler in ("neighbor", "importance"):
            return len(epoch_seed_batches(self.inputs.train_nodes, 0, cfg)[0])
        if cfg.sampler == "cluster_gcn":
            return len(epoch_cluster_groups(self._cluster_ids, 0, cfg)[0])
        return self._saint_per_rank

    def epoch(self, epoch: int) -> Iterator[tuple[int, int, SampledMinibatch]]:
        cfg = self.cfg
        if cfg.sampler in ("neighbor", "importance"):
            schedule = epoch_seed_batches(self.inputs.train_nodes, epoch, cfg)
            fn = self.sample_neighbor if cfg.sampler == "neighbor" else self.sample_importance
        elif cfg.sampler == "cluster_gcn":
            schedule = epoch_cluster_groups(self._cluster_ids, epoch, cfg)
            fn = lambda groups, seed: self.sample_clusters(groups)  # noqa: E731
        else:
            schedule = [[None] * self._saint_per_rank for _ in range(cfg.world_size)]
            fn = lambda _, seed: self.sample_saint(seed)  # noqa: E731
        for rank, items in enumerate(schedule):
            for index, item in enumerate(items):
                yield rank, index, fn(item, minibatch_seed(cfg.seed, epoch, rank, index))

    # ---- helpers

    def _local_ids(self, nodes: np.ndarray) -> None:
        self._scratch[nodes] = np.arange(len(nodes), dtype=np.int64)

    def _reset_local(self, nodes: np.ndarray) -> None:
        self._scratch[nodes] = -1

    def _labelled(self, output_nodes: np.ndarray, seeds_only: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if seeds_only:
            pos = np.arange(len(output_nodes), dtype=np.int64)
        else:
            pos = np.flatnonzero(self.is_train[output_nodes]).astype(np.int64)
        seeds = output_nodes[pos]
        return seeds, pos, self.inputs.labels[seeds].astype(np.int64)

    def _block(
        self, indptr: np.ndarray, src: np.ndarray, weight: np.ndarray, num_src: int, dst_global: np.ndarray
    ) -> SampledBlock:
        """Block from a CSC over the destinations (`dst_global` = their global ids), plus
        self loops when configured."""
        src = src.astype(_index_dtype(num_src), copy=False)
        weight = weight.astype(np.float32, copy=False)
        if self.add_loops:
            indptr, src, weight = insert_self_loops(indptr, src, weight, self.adj.diag[dst_global])
        return SampledBlock(indptr, src, int(num_src), len(indptr) - 1, weight)

    # ---- neighbor

    def sample_neighbor(self, seeds: np.ndarray, seed: int) -> SampledMinibatch:
        """DGL's neighbour-sampled blocks for `seeds`, with Â's weights (and rescaling)."""
        import dgl
        import torch

        with _single_threaded_dgl():
            dgl.seed(seed)
            input_nodes, dgl_blocks = dgl_neighbor_blocks(
                self.adj.dgl_graph(), torch.from_numpy(seeds), self.cfg.fanout_list, self._dgl_mapping
            )
        input_nodes = input_nodes.numpy()
        blocks = []
        for b in dgl_blocks:
            indptr, src, local_eid = (t.numpy() for t in b.adj_tensors("csc"))
            eid = b.edata[dgl.EID].numpy()[local_eid]  # positions in the off-diagonal CSR of Â
            dst_global = input_nodes[: b.num_dst_nodes()]
            weight = self.adj.weights[eid]
            if self.cfg.neighbor_rescale:  # deg(v) / sampled(v): unbiased for the row of Â·X
                sampled = np.diff(indptr)
                factor = (self.adj.degree[dst_global] / np.maximum(sampled, 1)).astype(np.float32)
                weight *= np.repeat(factor, sampled)
            blocks.append(self._block(indptr, src, weight, b.num_src_nodes(), dst_global))
        out_seeds, pos, labels = self._labelled(input_nodes[: blocks[-1].num_dst], seeds_only=True)
        return SampledMinibatch(input_nodes.astype(np.int64), blocks, out_seeds, pos, labels)

    # ---- importance (LADIES)

    def sample_importance(self, seeds: np.ndarray, seed: int) -> SampledMinibatch:
        """Layer-wise importance sampling with unbiasing weights (module docstring)."""
        rng = np.random.default_rng(seed)
        s = self.cfg.importance_nodes
        dst_nodes = np.asarray(seeds, dtype=np.int64)
        blocks = []
        for _ in range(self.cfg.num_layers):
            owner, nbr, w = self.adj.neighbours(dst_nodes)
            if len(nbr):
                cand, inv = np.unique(nbr, return_inverse=True)
                q = np.bincount(inv, weights=np.square(w, dtype=np.float64), minlength=len(cand))
                q /= q.sum()
                draws = np.bincount(rng.choice(len(cand), size=s, p=q), minlength=len(cand))
                keep = draws[inv] > 0
                weight = (w[keep] * (draws[inv[keep]] / (s * q[inv[keep]]))).astype(np.float32)
                picked = cand[draws > 0]
            else:
                keep = np.zeros(0, dtype=bool)
                weight = np.empty(0, dtype=np.float32)
                picked = np.empty(0, dtype=np.int64)
            self._local_ids(dst_nodes)
            new = picked[self._scratch[picked] < 0]
            src_nodes = np.concatenate([dst_nodes, new])
            self._scratch[new] = np.arange(len(dst_nodes), len(src_nodes), dtype=np.int64)
            src_local = self._scratch[nbr[keep]]
            self._reset_local(src_nodes)
            indptr = _indptr(np.bincount(owner[keep], minlength=len(dst_nodes)))  # owner is ascending
            blocks.append(self._block(indptr, src_local, weight, len(src_nodes), dst_nodes))
            dst_nodes = src_nodes
        blocks.reverse()
        out_seeds, pos, labels = self._labelled(np.asarray(seeds, dtype=np.int64), seeds_only=True)
        return SampledMinibatch(dst_nodes, blocks, out_seeds, pos, labels)

    # ---- cluster_gcn

    def induced_block(self, nodes: np.ndarray) -> SampledBlock:
        """The block of Â restricted to `nodes` (num_src == num_dst == len(nodes))."""
        adj = self.adj
        counts = np.diff(adj.full_indptr)[nodes]
        pos = segment_positions(adj.full_indptr[nodes], counts)
        owner = np.repeat(np.arange(len(nodes), dtype=np.int64), counts)
        col = np.asarray(adj.full_indices[pos], dtype=np.int64)
        self._local_ids(nodes)
        local = self._scratch[col]
        self._reset_local(nodes)
        keep = local >= 0
        if not self.cfg.self_loops:
            keep &= col != nodes[owner]
        m = len(nodes)
        itype = _index_dtype(m)
        return SampledBlock(
            _indptr(np.bincount(owner[keep], minlength=m)),
            local[keep].astype(itype),
            m,
            m,
            np.asarray(adj.full_weights[pos[keep]], dtype=np.float32),
        )

    def sample_clusters(self, cluster_group: np.ndarray) -> SampledMinibatch:
        parts = []
        for c in np.asarray(cluster_group).tolist():
            start, count = self._cluster_start[c]
            parts.append(self._cluster_order[start : start + count])
        nodes = np.sort(np.concatenate(parts)).astype(np.int64)
        block = self.induced_block(nodes)
        seeds, pos, labels = self._labelled(nodes, seeds_only=False)
        return SampledMinibatch(nodes, [block], seeds, pos, labels)

    # ---- saint

    def _saint_dgl(self):
        import dgl

        budget = (
            (self.cfg.saint_budget, self.cfg.saint_walk_length)
            if self.cfg.saint_mode == "walk"
            else self.cfg.saint_budget
        )
        return dgl.dataloading.SAINTSampler(mode=self.cfg.saint_mode, budget=budget)

    def _saint_subgraph(self, seed: int):
        """(node ids ascending, local src, local dst, edge ids) of one DGL SAINT subgraph."""
        import dgl
        import torch

        with _single_threaded_dgl():
            dgl.seed(seed)
            torch.manual_seed(seed)
            sg = self._saint.sample(self.adj.dgl_graph(), None)
        nodes = sg.ndata[dgl.NID].numpy()
        src, dst = (t.numpy() for t in sg.edges())
        return nodes, src, dst, sg.edata[dgl.EID].numpy()

    def _init_saint(self) -> None:
        cfg, n = self.cfg, self.inputs.n
        self._saint = self._saint_dgl()
        expected = {
            "node": cfg.saint_budget,
            "edge": 2 * cfg.saint_budget,
            "walk": cfg.saint_budget * (cfg.saint_walk_length + 1),
        }[cfg.saint_mode]
        presamples = max(1, math.ceil(cfg.saint_coverage * n / min(expected, n)))
        t0 = time.perf_counter()
        node_count = np.zeros(n, dtype=np.int64)
        edge_count = np.zeros(self.adj.num_edges, dtype=np.int64)
        pending_nodes, pending_edges, pending = [], [], 0
        sizes = 0

        def flush():
            nonlocal pending
            if pending_nodes:
                node_count[:] += np.bincount(np.concatenate(pending_nodes), minlength=n)
                edge_count[:] += np.bincount(np.concatenate(pending_edges), minlength=self.adj.num_edges)
            pending_nodes.clear()
            pending_edges.clear()
            pending = 0

        for i in range(presamples):
            nodes, _, _, eid = self._saint_subgraph(derive_seed(cfg.seed, _TAG_PRESAMPLE, i))
            sizes += len(nodes)
            pending_nodes.append(nodes)
            pending_edges.append(eid)
            pending += len(nodes) + len(eid)
            if pending > 1 << 25:
                flush()
        flush()
        self._node_count = np.maximum(node_count, 1)
        self._edge_count = np.maximum(edge_count, 1)
        self._presamples = presamples
        mean_nodes = sizes / presamples
        self._saint_per_rank = cfg.saint_subgraphs or max(1, math.ceil(n / (cfg.world_size * mean_nodes)))
        self.saint_info = {
            "presamples": presamples,
            "mean_subgraph_nodes": round(mean_nodes, 1),
            "nodes_never_presampled": int(np.count_nonzero(node_count == 0)),
            "presample_seconds": round(time.perf_counter() - t0, 3),
        }
        self.log(f"saint: {presamples} presampled subgraphs, {mean_nodes:.0f} nodes each on average")

    def sample_saint(self, seed: int) -> SampledMinibatch:
        nodes, src, dst, eid = self._saint_subgraph(seed)
        if len(dst) > 1 and (np.diff(dst) < 0).any():
            order = np.argsort(dst, kind="stable")
            src, dst, eid = src[order], dst[order], eid[order]
        nodes = nodes.astype(np.int64)
        # Â_vu / α_uv with α_uv = C_uv / C_v
        weight = (self.adj.weights[eid] * (self._node_count[nodes[dst]] / self._edge_count[eid])).astype(np.float32)
        block = self._block(_indptr(np.bincount(dst, minlength=len(nodes))), src, weight, len(nodes), nodes)
        seeds, pos, labels = self._labelled(nodes, seeds_only=False)
        loss_weight = (self._presamples / (self._node_count[seeds] * len(self.inputs.train_nodes))).astype(np.float32)
        return SampledMinibatch(nodes, [block], seeds, pos, labels, loss_weight)


# ----------------------------------------------------------------------------- shard files


def minibatch_arrays(mb: SampledMinibatch, i: int, weights: str) -> dict[str, np.ndarray]:
    """The npz entries of minibatch `i` of a shard file (layout in the module docstring)."""
    from graphs.quantize import quantize_int8_rows_csr

    p = f"mb{i}_"
    nodes = np.asarray(mb.input_nodes)
    out = {
        p + "input_nodes": nodes.astype(_index_dtype(int(nodes.max()) + 1 if len(nodes) else 0), copy=False),
        p + "seeds": np.asarray(mb.seeds, dtype=np.int64),
        p + "seed_pos": np.asarray(mb.seed_pos, dtype=np.int64),
        p + "labels": np.asarray(mb.labels, dtype=np.int64),
    }
    if mb.loss_weight is not None:
        out[p + "loss_weight"] = np.asarray(mb.loss_weight, dtype=np.float32)
    for layer, b in enumerate(mb.blocks):
        q = f"{p}l{layer}_"
        out[q + "num_src"] = np.int64(b.num_src)
        out[q + "num_dst"] = np.int64(b.num_dst)
        out[q + "indptr"] = b.indptr.astype(_index_dtype(int(b.indptr[-1]) + 1), copy=False)
        out[q + "indices"] = b.indices
        if weights == "int8":
            qw, scale = quantize_int8_rows_csr(b.indptr, b.weight)
            out[q + "weight_q"] = qw
            out[q + "weight_scale"] = scale
        else:
            out[q + "weight"] = b.weight
    return out


class _ShardWriter:
    """Writes shard files in a background thread (`graphs.npzio.write_npz`: CRC-32 and
    SHA-256 computed while streaming, no in-memory copy), overlapping the sampling."""

    def __init__(self, root: Path):
        self.root = root
        self.records: dict[str, dict] = {}
        self._queue: queue.Queue = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="shard-writer", daemon=True)
        self._thread.start()

    def submit(self, relpath: str, arrays: dict[str, np.ndarray], minibatches: int) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put((relpath, arrays, minibatches))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue
            relpath, arrays, minibatches = item
            try:
                path = self.root / relpath
                path.parent.mkdir(parents=True, exist_ok=True)
                size, digest = write_npz(path, arrays)
                self.records[relpath] = {"path": relpath, "bytes": size, "sha256": digest, "minibatches": minibatches}
            except BaseException as exc:  # re-raised in the sampling thread
                self._error = exc

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


def _features_entry(inputs: ShardInputs, cfg: ShardConfig, tmp: Path, final: Path) -> dict | None:
    """The manifest's `features` entry; with features='int8' also the small scale files."""
    if inputs.features_path is None:
        return None
    shape = [inputs.n, inputs.feature_dim]
    if cfg.features == "fp32":
        return {"encoding": "fp32", "path": os.path.relpath(inputs.features_path, final), "shape": shape}
    q_path = _compressed_int8_features(inputs)
    if q_path is not None:  # compressed_graph's INT8 matrix, referenced rather than copied
        from graphs.compress import load_features

        enc = load_features(inputs.compressed_dir)
        scale, zero = enc.arrays["scale"], enc.arrays["zero_point"]
        q_rel = os.path.relpath(q_path, final)
    else:  # quantized here with the same per-column scheme
        from graphs.quantize import quantize_int8_columns

        x = np.load(inputs.features_path, mmap_mode="r", allow_pickle=False)
        q = np.lib.format.open_memmap(tmp / "features_int8.npy", mode="w+", dtype=np.int8, shape=x.shape)
        _, scale, zero = quantize_int8_columns(x, out=q)
        q.flush()
        del q
        q_rel = "features_int8.npy"
    np.save(tmp / "features_scale.npy", np.asarray(scale, dtype=np.float32))
    np.save(tmp / "features_zero_point.npy", np.asarray(zero, dtype=np.float32))
    return {
        "encoding": "int8",
        "q": q_rel,
        "scale": "features_scale.npy",
        "zero_point": "features_zero_point.npy",
        "shape": shape,
    }


def _compressed_int8_features(inputs: ShardInputs) -> Path | None:
    """compressed_graph's features_int8.npy when that folder holds INT8 features of the right shape."""
    d = inputs.compressed_dir
    if d is None or not (d / "manifest.json").is_file():
        return None
    if json.loads((d / "manifest.json").read_text()).get("feature_encoding") != "int8":
        return None
    path = d / "features_int8.npy"
    if not path.is_file():
        return None
    if np.load(path, mmap_mode="r", allow_pickle=False).shape != (inputs.n, inputs.feature_dim):
        return None
    return path


def write_minibatch_shards(
    inputs: ShardInputs,
    out_dir: str | os.PathLike,
    cfg: ShardConfig | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Sample every epoch for every rank and write the shards + manifest.json atomically.

    Returns the manifest (also written as manifest.json). A previous materialization in
    `out_dir` is replaced as a whole, only once everything is written.
    """
    cfg = resolve_batch_size(cfg or ShardConfig(), len(inputs.train_nodes))
    log = log or (lambda msg: None)
    t0 = time.perf_counter()
    final = Path(out_dir).resolve()
    sampler = MinibatchSampler(inputs, cfg, log)
    per_rank = sampler.minibatches_per_rank()
    streams = []
    with atomic_output_dir(final) as tmp:
        features = _features_entry(inputs, cfg, tmp, final)
        writer = _ShardWriter(tmp)
        try:
            for epoch in range(cfg.epochs):
                stats = {
                    r: {"epoch": epoch, "rank": r, "minibatches": 0, "seeds": 0, "sampled_edges": 0, "files": []}
                    for r in range(cfg.world_size)
                }
                pending: dict[int, list[SampledMinibatch]] = {r: [] for r in range(cfg.world_size)}

                def emit(rank: int) -> None:
                    batch = pending[rank]  # noqa: B023 (called only within this iteration)
                    if not batch:
                        return
                    shard = len(stats[rank]["files"])  # noqa: B023 (called only within this iteration)
                    rel = f"epoch={epoch}/rank={rank}/shard-{shard:05d}.npz"  # noqa: B023 (called only within this iteration)
                    arrays: dict[str, np.ndarray] = {
                        "format_version": np.int64(FORMAT_VERSION),
                        "minibatches": np.int64(len(batch)),
                    }
                    for i, mb in enumerate(batch):
                        arrays.update(minibatch_arrays(mb, i, cfg.weights))
                    writer.submit(rel, arrays, len(batch))
                    stats[rank]["files"].append(rel)  # noqa: B023 (called only within this iteration)
                    pending[rank] = []  # noqa: B023 (called only within this iteration)

                for rank, _, mb in sampler.epoch(epoch):
                    s = stats[rank]
                    s["minibatches"] += 1
                    s["seeds"] += len(mb.seeds)
                    s["sampled_edges"] += mb.num_edges
                    pending[rank].append(mb)
                    if len(pending[rank]) == cfg.minibatches_per_shard:
                        emit(rank)
                for rank in range(cfg.world_size):
                    emit(rank)
                streams.extend(stats.values())
                log(f"epoch {epoch}: {sum(s['minibatches'] for s in stats.values())} minibatches sampled")
        finally:
            writer.close()
        for s in streams:
            s["files"] = [writer.records[rel] for rel in s["files"]]
            s["bytes"] = sum(f["bytes"] for f in s["files"])
        counts = {s["minibatches"] for s in streams}
        if len(counts) != 1:  # unequal step counts would hang DDP
            raise AssertionError(f"ranks got different minibatch counts {sorted(counts)}")
        seconds = time.perf_counter() - t0
        total_bytes = sum(s["bytes"] for s in streams)
        edges = sum(s["sampled_edges"] for s in streams)
        seeds = sum(s["seeds"] for s in streams)
        manifest = {
            "format_version": FORMAT_VERSION,
            "sampler": cfg.sampler,
            "settings": asdict(cfg),
            "num_layers": cfg.num_layers,
            "shared_block": sampler.shared_block,
            "world_size": cfg.world_size,
            "batch_size": cfg.batch_size,
            "epochs": cfg.epochs,
            "n": inputs.n,
            "num_classes": inputs.num_classes,
            "feature_dim": inputs.feature_dim,
            "train_nodes": int(len(inputs.train_nodes)),
            "weights": cfg.weights,
            "self_loops": sampler.add_loops,
            "features": features,
            "minibatches_per_epoch_per_rank": per_rank,
            "streams": streams,
            "sampled_edges": int(edges),
            "seeds": int(seeds),
            "bytes": int(total_bytes),
            "bytes_per_sampled_edge": round(total_bytes / edges, 3) if edges else 0.0,
            "seconds": round(seconds, 3),
            "seeds_per_second": round(seeds / seconds, 1) if seconds > 0 else 0.0,
            "sampled_edges_per_second": round(edges / seconds, 1) if seconds > 0 else 0.0,
            "peak_rss_bytes": peak_rss_bytes(),
            "inputs": {
                name: os.path.relpath(path, final)
                for name, path in (
                    ("canonical_graph", inputs.canonical_dir),
                    ("normalized_adjacency", inputs.adjacency_dir),
                    ("metis_partitions", inputs.partitions_dir),
                    ("compressed_graph", inputs.compressed_dir),
                )
                if path is not None
            },
        }
        if cfg.sampler == "saint":
            manifest["saint"] = sampler.saint_info
        if per_rank != counts.pop():
            raise AssertionError(f"planned {per_rank} minibatches per rank, wrote {streams[0]['minibatches']}")
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_KEYS",
    "MinibatchSampler",
    "SAMPLERS",
    "SampledBlock",
    "SampledMinibatch",
    "ShardConfig",
    "ShardInputs",
    "derive_seed",
    "epoch_cluster_groups",
    "epoch_seed_batches",
    "insert_self_loops",
    "load_shard_inputs",
    "minibatch_arrays",
    "minibatch_seed",
    "segment_positions",
    "train_nodes_of",
    "write_minibatch_shards",
]
