"""The four samplers (neighbor, importance, cluster_gcn, saint), each producing `SampledMinibatch`
objects (algorithms and edge weights in the `graphs.sampling` docstring)."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from graphs.quantize import csr_row_blocks
from graphs.sampling.config import ShardConfig, stored_weight_encoding
from graphs.sampling.inputs import ShardInputs
from graphs.sampling.schedule import (
    epoch_cluster_groups,
    epoch_seed_batches,
    minibatch_seed,
    presample_seed,
    ranks_of_parts,
)
from graphs.sampling.weighting import adaptive_edge_probs, adaptive_node_probs, class_balanced_probs
from graphs.shard_format import canonical_correction, expand_correction, index_dtype

# ----------------------------------------------------------------------------- minibatches


@dataclass
class SampledBlock:
    """One layer of a sampled minibatch, NumPy CSC over the destination nodes."""

    indptr: np.ndarray  # int64 [num_dst + 1]
    indices: np.ndarray  # int32/int64 [nnz], local source index
    num_src: int
    num_dst: int
    weight: np.ndarray | None  # float32 [nnz], Â's entries; None where the shards store them as Â's factors
    correction_edges: np.ndarray | None = None  # float32 [nnz], the sampling correction (1 for self loops)
    # or (first, rest) float32 [num_dst], its stored per-destination form (`graphs.shard_format`)
    correction_compact: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def correction(self) -> np.ndarray:
        """float32 [nnz]: the sampling correction per edge."""
        if self.correction_edges is not None:
            return self.correction_edges
        return expand_correction(self.indptr, *self.correction_compact)

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


def _indptr(counts: np.ndarray) -> np.ndarray:
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr


def insert_self_loops(
    indptr: np.ndarray, src: np.ndarray, weight: np.ndarray | None, loop_weight: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """CSC (indptr, indices, weight) with an extra first edge v -> v in each destination's segment.

    `indptr` int64 [num_dst + 1] over `src` (local source ids) and `weight`;
    `loop_weight` float32 [num_dst] is the weight of each new self loop. Without `weight`
    (None) only the structure is built, and the weight returned is None.
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
    if weight is None:
        return new_indptr, out_src, None
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
        for r0, r1 in csr_row_blocks(indptr, chunk):
            a, b = int(indptr[r0]), int(indptr[r1])
            idx = np.asarray(indices[a:b], dtype=np.int64)
            w = np.asarray(weights[a:b], dtype=np.float32)
            rows = np.repeat(np.arange(r0, r1, dtype=np.int64), counts[r0:r1])
            loop = idx == rows
            self.diag[rows[loop]] = w[loop]
            has_diag[rows[loop]] = True
            parts_i.append(idx[~loop])
            parts_w.append(w[~loop])
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

    @property
    def row_sums(self) -> np.ndarray:
        """float64 [n]: the sum of each row's off-diagonal entries of Â (S_v)."""
        cum = np.concatenate([[0.0], np.cumsum(self.weights, dtype=np.float64)])
        return cum[self.indptr[1:]] - cum[self.indptr[:-1]]

    def dgl_graph(self, prob: np.ndarray | None = None):
        """DGL graph with edge u -> v per off-diagonal entry Â[v, u]; edge id = off-diagonal position.

        With `prob` (float32 per off-diagonal entry), edge feature ``"prob"`` holds it (DGL's
        sampling probabilities; one sampler uses one kind)."""
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
        if prob is not None and "prob" not in self._dgl_graph.edata:
            import torch

            self._dgl_graph.edata["prob"] = torch.from_numpy(np.ascontiguousarray(prob, dtype=np.float32))
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


def dgl_neighbor_blocks(g, seeds, fanouts: list[int], mapping: dict, prob: str | None = None, exclude=None):
    """DGL's fused neighbour sampling, layer by layer from the seeds outwards.

    The same loop as ``dgl.dataloading.NeighborSampler.sample_blocks`` runs on a CPU graph
    when DGL has more than one thread (``g.sample_neighbors_fused``: sampling and block
    construction in one C++ call); called here with one thread, where it is reproducible.
    `mapping` is DGL's reusable global-to-local id buffer. With `prob` (an edge feature
    name) neighbours are drawn with replacement in proportion to it, except in layers with
    fanout -1 (every neighbour). `exclude` (edge ids of `g`, a tensor) are never sampled
    (link prediction leaves its seed edges and their reverses out, as DGL's
    ``as_edge_prediction_sampler(exclude="reverse_id")``). Returns (input_nodes, blocks).
    """
    import dgl

    blocks = []
    for fanout in reversed(fanouts):
        weighted = prob is not None and fanout != -1
        block = g.sample_neighbors_fused(
            seeds,
            fanout,
            edge_dir="in",
            prob=prob if weighted else None,
            replace=weighted,
            exclude_edges=exclude,
            mapping=mapping,
        )
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
        self._init_adjacency(inputs, cfg)
        self.is_train = np.zeros(inputs.n, dtype=bool)
        self.is_train[inputs.train_nodes] = True
        self._scratch = np.full(inputs.n, -1, dtype=np.int64)  # global -> local id, reset after use
        self.saint_info: dict = {}
        self._dgl_mapping: dict = {}
        self._row_sums: np.ndarray | None = None
        self._edge_prob: np.ndarray | None = None
        self.adaptive_info: dict = {}
        # seed_weighting 'class_balanced': the draw probability of each training node
        self.seed_probs = (
            class_balanced_probs(inputs.labels[inputs.train_nodes]) if cfg.seed_weighting == "class_balanced" else None
        )
        # rank owning each node's METIS part: places seeds (placement='partition') and measures
        # remote feature rows under either placement (None without parts, or fewer parts than ranks)
        self.rank_of_node: np.ndarray | None = None
        self.rank_of_part: np.ndarray | None = None
        if inputs.part_id is not None and (cfg.placement == "partition" or inputs.part_id.max() + 1 >= cfg.world_size):
            part_id = np.asarray(inputs.part_id, dtype=np.int64)
            self.rank_of_part = ranks_of_parts(part_id, inputs.train_nodes, cfg.world_size)
            self.rank_of_node = self.rank_of_part[part_id]
        if cfg.placement == "partition" and self.rank_of_node is None:
            raise ValueError("placement='partition' needs part_id.npy from metis_partitions")
        if cfg.sampler == "cluster_gcn":
            if inputs.cluster_id is None:
                raise ValueError("sampler='cluster_gcn' needs cluster_id.npy from metis_partitions")
            order = np.argsort(inputs.cluster_id, kind="stable")
            ids, starts, counts = np.unique(inputs.cluster_id[order], return_index=True, return_counts=True)
            self._cluster_order, self._cluster_ids = order, ids.astype(np.int64)
            self._cluster_start = dict(zip(ids.tolist(), zip(starts.tolist(), counts.tolist())))
        elif cfg.sampler == "saint":
            self._init_saint()

    def _init_adjacency(self, inputs: ShardInputs, cfg: ShardConfig) -> None:
        """Â split for sampling, and how the blocks carry its entries."""
        self.adj = _Adjacency(inputs.indptr, inputs.indices, inputs.weights)
        self.add_loops = cfg.self_loops and self.adj.has_self_loops
        # 'factors': the blocks carry no per-edge weights, training recomputes them from Â's scales
        self.weight_encoding = stored_weight_encoding(cfg.weight_encoding, inputs.scale_factors is not None)
        self.edge_weights = self.weight_encoding != "factors"

    # ---- schedule

    @property
    def shared_block(self) -> bool:
        return self.cfg.sampler in ("cluster_gcn", "saint")

    def minibatches_per_rank(self) -> int:
        cfg = self.cfg
        if cfg.sampler in ("neighbor", "importance"):
            return len(epoch_seed_batches(self.inputs.train_nodes, 0, cfg, self._placed_ranks(), self.seed_probs)[0])
        if cfg.sampler == "cluster_gcn":
            return len(epoch_cluster_groups(self._cluster_ids, 0, cfg)[0])
        return self._saint_per_rank

    def schedule(self, epoch: int) -> list[list]:
        """Epoch `epoch`'s minibatch items, one list per rank (seed ids, cluster groups, or
        None per SAINT subgraph); `sample` turns one into its minibatch."""
        cfg = self.cfg
        if cfg.sampler in ("neighbor", "importance"):
            return epoch_seed_batches(self.inputs.train_nodes, epoch, cfg, self._placed_ranks(), self.seed_probs)
        if cfg.sampler == "cluster_gcn":
            return epoch_cluster_groups(self._cluster_ids, epoch, cfg)
        return [[None] * self._saint_per_rank for _ in range(cfg.world_size)]

    def sample(self, item, seed: int) -> SampledMinibatch:
        """The minibatch of one `schedule` item, drawn from `seed` alone (`minibatch_seed`)."""
        sampler = self.cfg.sampler
        if sampler == "neighbor":
            return self.sample_neighbor(item, seed)
        if sampler == "importance":
            return self.sample_importance(item, seed)
        if sampler == "cluster_gcn":
            return self.sample_clusters(item)
        return self.sample_saint(seed)

    def epoch(self, epoch: int) -> Iterator[tuple[int, int, SampledMinibatch]]:
        """``(rank, index, minibatch)`` of epoch `epoch`, rank by rank: the order of the shard files."""
        for rank, items in enumerate(self.schedule(epoch)):
            for index, item in enumerate(items):
                yield rank, index, self.sample(item, minibatch_seed(self.cfg.seed, epoch, rank, index))

    def prepare(self) -> None:
        """Build here what `sample` would build on first use (the DGL graph, draw probabilities
        and the manifest facts they set), so that processes forked afterwards share it."""
        if self.cfg.sampler == "neighbor":
            with _single_threaded_dgl():
                self._neighbor_graph()

    def counters(self) -> dict[str, float]:
        """Additive run counts that `sample` accumulates in this object (none here), which a
        forked shard-writing process sends back to `add_counters` in the parent."""
        return {}

    def add_counters(self, delta: dict[str, float]) -> None:
        for key in delta:
            raise KeyError(f"{type(self).__name__} keeps no counter {key!r}")

    def _placed_ranks(self) -> np.ndarray | None:
        return self.rank_of_node if self.cfg.placement == "partition" else None

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
        self,
        indptr: np.ndarray,
        src: np.ndarray,
        weight: np.ndarray | None,
        num_src: int,
        dst_global: np.ndarray,
        correction: np.ndarray | None = None,
        correction_dst: np.ndarray | None = None,
    ) -> SampledBlock:
        """Block from a CSC over the destinations (`dst_global` = their global ids), plus
        self loops (correction 1) when configured. `correction` per edge, or `correction_dst`
        one value per destination (kept in that form, as the shards store it); neither = 1.
        Â's `weight` is dropped (and may be None) when the shards store Â's factors instead."""
        src = src.astype(index_dtype(num_src), copy=False)
        num_dst = len(indptr) - 1
        if correction is not None:
            correction = correction.astype(np.float32)
            if self.add_loops:
                _, _, correction = insert_self_loops(indptr, src, correction, np.ones(num_dst, np.float32))
        if not self.edge_weights:
            weight = None
        else:
            weight = weight.astype(np.float32, copy=False)
        if self.add_loops:
            loop_weight = None if weight is None else self.adj.diag[dst_global]
            indptr, src, weight = insert_self_loops(indptr, src, weight, loop_weight)
        if correction is not None:
            return SampledBlock(indptr, src, int(num_src), num_dst, weight, correction_edges=correction)
        rest = np.ones(num_dst, np.float32) if correction_dst is None else correction_dst.astype(np.float32)
        first = np.ones(num_dst, np.float32) if self.add_loops else rest  # the self loop's is 1
        compact = canonical_correction(indptr, first, rest)
        return SampledBlock(indptr, src, int(num_src), num_dst, weight, correction_compact=compact)

    # ---- neighbor

    def sample_neighbor(self, seeds: np.ndarray, seed: int, exclude: np.ndarray | None = None) -> SampledMinibatch:
        """DGL's neighbour-sampled blocks for `seeds`, with Â's weights (and rescaling); edges
        `exclude` (positions in the off-diagonal CSR of Â) are never sampled."""
        import dgl
        import torch

        by_weight = self.cfg.neighbor_prob in ("weight", "adaptive")
        with _single_threaded_dgl():
            dgl.seed(seed)
            input_nodes, dgl_blocks = dgl_neighbor_blocks(
                self._neighbor_graph(),
                torch.from_numpy(seeds),
                self.cfg.fanout_list,
                self._dgl_mapping,
                prob="prob" if by_weight else None,
                exclude=None if exclude is None else torch.from_numpy(np.asarray(exclude, dtype=np.int64)),
            )
        input_nodes = input_nodes.numpy()
        blocks = []
        for b, fanout in zip(dgl_blocks, self.cfg.fanout_list):
            indptr, src, local_eid = (t.numpy() for t in b.adj_tensors("csc"))
            eid = None
            if self.edge_weights or by_weight:
                eid = b.edata[dgl.EID].numpy()  # positions in the off-diagonal CSR of Â
                if not np.array_equal(local_eid, np.arange(len(local_eid))):  # DGL's fused blocks: in order
                    eid = eid[local_eid]
            dst_global = input_nodes[: b.num_dst_nodes()]
            # Â's entries (np.take: ~25 % faster than fancy indexing here), unless stored as its factors
            weight = np.take(self.adj.weights, eid) if self.edge_weights else None
            correction = per_dst = None
            if by_weight and fanout != -1:
                if self.cfg.neighbor_rescale:  # S_v / (q_vu · draws(v)) per drawn edge (Hansen-Hurwitz)
                    sampled = np.diff(indptr)
                    factor = (self._row_sums[dst_global] / np.maximum(sampled, 1)).astype(np.float32)
                    correction = np.repeat(factor, sampled) / np.maximum(self._edge_prob[eid], np.float32(1e-30))
            elif self.cfg.neighbor_rescale:  # deg(v) / sampled(v): the inverse inclusion probability
                sampled = np.diff(indptr)
                per_dst = (self.adj.degree[dst_global] / np.maximum(sampled, 1)).astype(np.float32)
            blocks.append(self._block(indptr, src, weight, b.num_src_nodes(), dst_global, correction, per_dst))
        out_seeds, pos, labels = self._labelled(input_nodes[: blocks[-1].num_dst], seeds_only=True)
        return SampledMinibatch(input_nodes.astype(np.int64), blocks, out_seeds, pos, labels)

    def _neighbor_graph(self):
        """The DGL graph neighbour sampling draws from, built on first use, with the draw
        probabilities (and their manifest facts) for neighbor_prob 'weight' / 'adaptive'."""
        by_weight = self.cfg.neighbor_prob in ("weight", "adaptive")
        if by_weight and self._row_sums is None:
            self._edge_prob, self._row_sums = self._draw_probs()
        return self.adj.dgl_graph(prob=self._edge_prob if by_weight else None)

    def _draw_probs(self) -> tuple[np.ndarray, np.ndarray]:
        """(q float32 per off-diagonal entry, its row sums S_v float64): Â's entries for
        neighbor_prob 'weight', p(u) of `graphs.sampling.weighting` for 'adaptive'."""
        if self.cfg.neighbor_prob == "weight":
            return self.adj.weights, self.adj.row_sums
        scores = self.inputs.node_scores
        p = adaptive_node_probs(self.adj.degree, scores, self.cfg.adaptive_alpha)
        edge_p, sums = adaptive_edge_probs(self.adj.indptr, self.adj.indices, p)
        self.adaptive_info = {
            "alpha": self.cfg.adaptive_alpha if scores is not None else 1.0,
            "node_scores": self.inputs.node_scores_path is not None,
            "p_max_over_mean": round(float(p.max()), 3) if len(p) else 0.0,
        }
        return edge_p, sums

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
                weight = w[keep].astype(np.float32)
                correction = (draws[inv[keep]] / (s * q[inv[keep]])).astype(np.float32)
                picked = cand[draws > 0]
            else:
                keep = np.zeros(0, dtype=bool)
                weight = correction = np.empty(0, dtype=np.float32)
                picked = np.empty(0, dtype=np.int64)
            self._local_ids(dst_nodes)
            new = picked[self._scratch[picked] < 0]
            src_nodes = np.concatenate([dst_nodes, new])
            self._scratch[new] = np.arange(len(dst_nodes), len(src_nodes), dtype=np.int64)
            src_local = self._scratch[nbr[keep]]
            self._reset_local(src_nodes)
            indptr = _indptr(np.bincount(owner[keep], minlength=len(dst_nodes)))  # owner is ascending
            blocks.append(self._block(indptr, src_local, weight, len(src_nodes), dst_nodes, correction))
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
        itype = index_dtype(m)
        return SampledBlock(
            _indptr(np.bincount(owner[keep], minlength=m)),
            local[keep].astype(itype),
            m,
            m,
            np.asarray(adj.full_weights[pos[keep]], dtype=np.float32) if self.edge_weights else None,
            np.ones(int(keep.sum()), dtype=np.float32),  # an induced subgraph: nothing sampled per edge
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
            nodes, _, _, eid = self._saint_subgraph(presample_seed(cfg.seed, i))
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
        weight = self.adj.weights[eid].astype(np.float32)
        correction = (self._node_count[nodes[dst]] / self._edge_count[eid]).astype(np.float32)
        block = self._block(_indptr(np.bincount(dst, minlength=len(nodes))), src, weight, len(nodes), nodes, correction)
        seeds, pos, labels = self._labelled(nodes, seeds_only=False)
        loss_weight = (self._presamples / (self._node_count[seeds] * len(self.inputs.train_nodes))).astype(np.float32)
        return SampledMinibatch(nodes, [block], seeds, pos, labels, loss_weight)
