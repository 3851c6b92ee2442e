"""What every sampler shares: the minibatch it produces (`SampledMinibatch` of `SampledBlock`),
Â split for sampling (`Adjacency`), DGL's fused neighbour sampling, and `MinibatchSampler`, the
base class of the registered samplers (`graphs.sampling.registry`; one module each in
`graphs.sampling.kinds`, algorithms and edge weights in the `graphs.sampling` docstring)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterator

import numpy as np

from graphs.formats.shard_codec import canonical_correction, expand_correction
from graphs.formats.shard_format import index_dtype
from graphs.kernels.degree import top_degree_nodes
from graphs.kernels.quantize_csr import csr_row_blocks
from graphs.sampling.config import ShardConfig, stored_weight_encoding
from graphs.sampling.inputs import ShardInputs
from graphs.sampling.placement import OwnEdges, placement_class
from graphs.sampling.registry import SamplerTraits, sampler_class, sampler_names
from graphs.sampling.schedule import epoch_seed_batches, minibatch_seed, remote_rows
from graphs.sampling.weighting import class_balanced_probs

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
    # or (first, rest) float32 [num_dst], its stored per-destination form (`graphs.formats.shard_format`)
    correction_compact: tuple[np.ndarray, np.ndarray] | None = None
    etype: np.ndarray | None = None  # int16 [nnz] typed graphs: each edge's relation index

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


def csc_indptr(counts: np.ndarray) -> np.ndarray:
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr


def insert_self_loops(
    indptr: np.ndarray,
    src: np.ndarray,
    weight: np.ndarray | None,
    loop_weight: np.ndarray | None,
    index_dtype: np.dtype | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """CSC (indptr, indices, weight) with an extra first edge v -> v in each destination's segment.

    `indptr` int64 [num_dst + 1] over `src` (local source ids) and `weight`;
    `loop_weight` float32 [num_dst] is the weight of each new self loop. Without `weight`
    (None) only the structure is built, and the weight returned is None. The indices come
    back as `index_dtype` (default: `src`'s), cast on the way.
    """
    num_dst = len(indptr) - 1
    new_indptr = indptr + np.arange(num_dst + 1, dtype=np.int64)
    total = int(new_indptr[-1])
    loops = new_indptr[:-1]
    rest = np.ones(total, dtype=bool)
    rest[loops] = False
    out_src = np.empty(total, dtype=index_dtype or src.dtype)
    out_src[loops] = np.arange(num_dst, dtype=out_src.dtype)
    out_src[rest] = src
    if weight is None:
        return new_indptr, out_src, None
    out_w = np.empty(total, dtype=np.float32)
    out_w[loops] = loop_weight
    out_w[rest] = weight
    return new_indptr, out_src, out_w


class Adjacency:
    """Â split into its diagonal and its off-diagonal CSR (the graph that is sampled)."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, chunk: int = 1 << 23):
        n = len(indptr) - 1
        self.n = n
        self.diag = np.zeros(n, dtype=np.float32)
        has_diag = np.zeros(n, dtype=bool)
        counts = np.diff(np.asarray(indptr)).astype(np.int64)
        nnz = int(indptr[-1])
        # written in place, row block by row block; the entries past the last off-diagonal one
        # (one per diagonal entry) are never touched, and the views below leave them out
        out_i, out_w, kept = np.empty(nnz, dtype=np.int64), np.empty(nnz, dtype=np.float32), 0
        row_dtype = indices.dtype if indices.dtype.kind in "iu" and n < np.iinfo(indices.dtype).max else np.int64
        for r0, r1 in csr_row_blocks(indptr, chunk):
            a, b = int(indptr[r0]), int(indptr[r1])
            idx = np.asarray(indices[a:b])  # as stored: compared without widening
            loop = idx == np.repeat(np.arange(r0, r1, dtype=row_dtype), counts[r0:r1])
            at = np.flatnonzero(loop)
            self.diag[idx[at]] = weights[a + at]  # a loop's column is its row
            has_diag[idx[at]] = True
            off = np.logical_not(loop, out=loop)
            m = (b - a) - len(at)
            out_i[kept : kept + m] = idx[off]
            out_w[kept : kept + m] = np.asarray(weights[a:b])[off]
            kept += m
        self.indices, self.weights = out_i[:kept], out_w[:kept]
        self.degree = counts - has_diag  # off-diagonal entries per row
        self.indptr = csc_indptr(self.degree)
        self.has_self_loops = bool(has_diag.any())
        # Â with its diagonal, for induced subgraphs (cluster_gcn)
        self.full_indptr = np.asarray(indptr, dtype=np.int64)
        self.full_indices = indices
        self.full_weights = weights
        self._dgl_graphs: dict = {}  # compact_ids -> the DGL graph, built on first use

    @property
    def num_edges(self) -> int:
        return len(self.indices)

    @property
    def row_sums(self) -> np.ndarray:
        """float64 [n]: the sum of each row's off-diagonal entries of Â (S_v)."""
        cum = np.concatenate([[0.0], np.cumsum(self.weights, dtype=np.float64)])
        return cum[self.indptr[1:]] - cum[self.indptr[:-1]]

    def dgl_graph(self, prob: np.ndarray | None = None, compact_ids: bool = False):
        """DGL graph with edge u -> v per off-diagonal entry Â[v, u]; edge id = off-diagonal position.

        With `prob` (float32 per off-diagonal entry), edge feature ``"prob"`` holds it (DGL's
        sampling probabilities; one sampler uses one kind). `compact_ids`: node and edge ids
        int32 where they fit (`dgl_csc_graph`), for `dgl_neighbor_blocks`."""
        graph = self._dgl_graphs.get(compact_ids)
        if graph is None:
            graph = self._dgl_graphs[compact_ids] = dgl_csc_graph(self.indptr, self.indices, self.n, compact_ids)
        if prob is not None and "prob" not in graph.edata:
            import torch

            graph.edata["prob"] = torch.from_numpy(np.ascontiguousarray(prob, dtype=np.float32))
        return graph

    def neighbours(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row position per entry, column ids, weights) of the off-diagonal entries of `rows`."""
        counts = self.degree[rows]
        pos = segment_positions(self.indptr[rows], counts)
        owner = np.repeat(np.arange(len(rows), dtype=np.int64), counts)
        return owner, self.indices[pos], self.weights[pos]


@contextlib.contextmanager
def single_threaded_dgl():
    """DGL with one OpenMP thread: DGL 2.1's multi-threaded sampling is not reproducible
    (and on a busy machine one thread is also faster: no OpenMP pool contends with torch's)."""
    from dgl.utils import get_num_threads, set_num_threads

    old = get_num_threads()
    set_num_threads(1)
    try:
        yield
    finally:
        set_num_threads(old)


def dgl_csc_graph(indptr: np.ndarray, indices: np.ndarray, n: int, compact_ids: bool):
    """DGL graph of the CSC (`indptr`, `indices`) over `n` nodes, edge id = entry position: with
    int32 ids when `compact_ids` and the nodes and entries fit (DGL's fused sampling then moves
    half the bytes per drawn edge and id lookup), else int64."""
    import dgl
    import torch

    limit = np.iinfo(np.int32).max
    idtype = torch.int32 if compact_ids and n < limit and len(indices) < limit else torch.int64
    dtype = np.int32 if idtype == torch.int32 else np.int64
    arrays = (np.asarray(indptr, dtype=dtype), np.asarray(indices, dtype=dtype), np.empty(0, dtype=dtype))
    return dgl.graph(("csc", tuple(torch.from_numpy(a) for a in arrays)), num_nodes=n, idtype=idtype)


def dgl_neighbor_blocks(g, seeds, fanouts: list[int], mapping: dict, prob: str | None = None, exclude=None):
    """DGL's fused neighbour sampling, layer by layer from the seeds outwards.

    The same loop as ``dgl.dataloading.NeighborSampler.sample_blocks`` runs on a CPU graph
    when DGL has more than one thread (``g.sample_neighbors_fused``: sampling and block
    construction in one C++ call); called here with one thread, where it is reproducible.
    `mapping` is DGL's reusable global-to-local id buffer. With `prob` (an edge feature
    name) neighbours are drawn with replacement in proportion to it, except in layers with
    fanout -1 (every neighbour). `exclude` (edge ids of `g`, a tensor) are never sampled
    (link prediction leaves its seed edges and their reverses out, as DGL's
    ``as_edge_prediction_sampler(exclude="reverse_id")``). Returns (input_nodes, blocks), in
    the graph's id type.
    """
    import os

    import dgl
    import torch

    # DGL keys the buffer by process and makes it int64, but its C++ reads it as the graph's id
    # type: an int32 graph needs an int32 buffer, or ids left in it from one call corrupt the next
    buffer = f"__mapping{os.getpid()}"
    if buffer not in mapping:
        mapping[buffer] = [torch.full((g.num_nodes(),), -1, dtype=g.idtype)]
    seeds = seeds.to(g.idtype)
    exclude = None if exclude is None else exclude.to(g.idtype)
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


@dataclass(kw_only=True)
class NoSettings:
    """The settings of a sampler that has none of its own."""


class MinibatchSampler:
    """Samples the minibatches of every (epoch, rank) for one ShardConfig, in memory.

    A sampler subclasses this, names itself (``name``), declares its `SamplerTraits`
    (``traits``) and its own settings (``Settings``: a keyword-only dataclass whose fields have
    defaults, help texts and bounds, checked in its ``__post_init__``; users set them under
    ``samplers: {<name>: {...}}`` and the sampler reads them as ``self.cfg.options``) and is
    registered with `graphs.sampling.registry.register_sampler`; build one
    with `make_sampler`. `epoch(e)` yields ``(rank, index, SampledMinibatch)`` rank by rank,
    minibatch by minibatch; `write_minibatch_shards` writes exactly this sequence.

    A subclass implements `sample` (one `schedule` item -> its `SampledMinibatch`, drawn from
    the given seed alone). A seed sampler (``traits.seeds``) inherits `schedule`: batches of
    training nodes, placed and weighted as the settings say. A subgraph sampler overrides
    `schedule` (one list of items per rank, equally many each). `setup` (after the shared state
    is built), `prepare`, `manifest_facts`, `non_uniform_draws` and `reads_node_scores` have
    defaults.
    """

    name: ClassVar[str]
    traits: ClassVar[SamplerTraits]
    Settings: ClassVar[type] = NoSettings
    rank_edges: OwnEdges | None = None  # each rank's own edges and held rows (an ``own_edges`` placement)
    rank: int = 0  # the rank whose minibatches `sample` draws (`at_rank`)

    def __init__(self, inputs: ShardInputs, cfg: ShardConfig, log: Callable[[str], None] | None = None):
        self.inputs, self.cfg = inputs, cfg
        self.log = log or (lambda msg: None)
        if inputs.typed is not None and not self.traits.typed:
            typed = ", ".join(n for n in sampler_names() if sampler_class(n).traits.typed)
            raise ValueError(
                f"sampler {self.name!r} does not draw a typed graph's blocks (with each edge's relation); "
                f"typed graphs sample with: {typed}"
            )
        if len(inputs.train_nodes) == 0:
            raise ValueError("the graph has no training nodes (split 'train' with a label >= 0)")
        self._init_adjacency(inputs, cfg)
        self.is_train = np.zeros(inputs.n, dtype=bool)
        self.is_train[inputs.train_nodes] = True
        self._scratch = np.full(inputs.n, -1, dtype=np.int64)  # global -> local id, reset after use
        # seed_weighting 'class_balanced': the draw probability of each training node
        self.seed_probs = (
            class_balanced_probs(inputs.labels[inputs.train_nodes]) if cfg.seed_weighting == "class_balanced" else None
        )
        self._init_placement(inputs, cfg)
        self.setup()

    def _init_adjacency(self, inputs: ShardInputs, cfg: ShardConfig) -> None:
        """Â split for sampling, and how the blocks carry its entries."""
        self.adj = Adjacency(inputs.indptr, inputs.indices, inputs.weights)
        self.add_loops = cfg.self_loops and self.adj.has_self_loops
        # 'factors': the blocks carry no per-edge weights, training recomputes them from Â's scales
        self.weight_encoding = stored_weight_encoding(cfg.weight_encoding, inputs.scale_factors is not None)
        self.edge_weights = self.weight_encoding != "factors"

    def _init_placement(self, inputs: ShardInputs, cfg: ShardConfig) -> None:
        """The rank owning each node under the registered placement (`graphs.sampling.placement`):
        places seeds when the placement does (``places_seeds``) and measures remote feature rows
        under any (None where no rank owns nodes: no parts, or fewer parts than ranks)."""
        self.placement = placement_class(cfg.placement)
        owned = self.placement.owners(inputs, cfg)
        self.rank_of_part, self.rank_of_node = owned if owned is not None else (None, None)
        if self.placement.traits.own_edges:
            if not self.traits.own_edges:
                raise ValueError(
                    f"placement={cfg.placement!r} samples each rank's own edges; sampler {self.name!r} does not "
                    "(samplers that do declare own_edges, graphs/sampling/registry.py)"
                )
            self.rank_edges = self.placement.own_edges(inputs, cfg, self.rank_of_part, self.adj)
        self.replicated: np.ndarray | None = None  # bool [n]: rows every rank holds (``replicate``)
        if cfg.replicate > 0:
            if self.rank_of_node is None:
                raise ValueError(
                    f"replicate={cfg.replicate:g} replicates rows besides each rank's own parts; materialize "
                    f"metis_partitions with at least world_size={cfg.world_size} parts first"
                )
            self.replicated = np.zeros(inputs.n, dtype=bool)
            self.replicated[top_degree_nodes(np.diff(inputs.indptr), round(cfg.replicate * inputs.n))] = True

    def setup(self) -> None:
        """A sampler's own state, built once after the shared state (nothing by default)."""

    # ---- what a sampler declares

    @property
    def shared_block(self) -> bool:
        return self.traits.shares_block

    @classmethod
    def non_uniform_draws(cls, cfg: ShardConfig) -> str | None:
        """The settings that make this sampler's draws non-uniform (e.g. "sampler 'saint'"), or
        None: the manifest records it, and training refuses layers that cannot correct them."""
        return f"sampler {cls.name!r}" if cls.traits.non_uniform else None

    @classmethod
    def reads_node_scores(cls, cfg: ShardConfig) -> bool:
        """Whether these settings draw by the last training run's per-node scores (trained_model's
        node_grad_norm.npz, `graphs.formats.node_scores`); False by default."""
        return False

    def manifest_facts(self) -> dict:
        """Facts of this sampler's run the manifest records (none by default)."""
        return {}

    # ---- schedule

    def schedule(self, epoch: int) -> list[list]:
        """Epoch `epoch`'s minibatch items, one list per rank: here batches of seed ids (the
        training nodes, placed and weighted per the settings); `sample` turns one into its minibatch."""
        placed = self.rank_of_node if self.placement.traits.places_seeds else None
        return epoch_seed_batches(
            self.inputs.train_nodes, epoch, self.cfg, placed, self.seed_probs, self.inputs.rank_shares
        )

    def at_rank(self, rank: int) -> None:
        """Draw the next minibatches for `rank` (under an ``own_edges`` placement, from its edges)."""
        self.rank = rank

    def remote_rows(self, input_nodes: np.ndarray) -> int:
        """How many of a minibatch's gathered feature rows the current rank does not hold."""
        if self.rank_edges is not None:
            held = (self.rank_edges.holders[input_nodes] >> np.uint64(self.rank)) & np.uint64(1)
            return int(np.count_nonzero(held == 0))
        return remote_rows(input_nodes, self.rank_of_node, self.rank, self.replicated)

    def minibatches_per_rank(self) -> int:
        return len(self.schedule(0)[0])

    def sample(self, item, seed: int) -> SampledMinibatch:
        """The minibatch of one `schedule` item, drawn from `seed` alone (`minibatch_seed`)."""
        raise NotImplementedError(f"sampler {self.name!r} ({type(self).__qualname__}) implements no sample()")

    def epoch(self, epoch: int) -> Iterator[tuple[int, int, SampledMinibatch]]:
        """``(rank, index, minibatch)`` of epoch `epoch`, rank by rank: the order of the shard files."""
        for rank, items in enumerate(self.schedule(epoch)):
            self.at_rank(rank)
            for index, item in enumerate(items):
                yield rank, index, self.sample(item, minibatch_seed(self.cfg.seed, epoch, rank, index))

    def prepare(self) -> None:
        """Build here what `sample` would build on first use (a DGL graph, draw probabilities
        and the manifest facts they set), so that processes forked afterwards share it."""

    def counters(self) -> dict[str, float]:
        """Additive run counts that `sample` accumulates in this object (none here), which a
        forked shard-writing process sends back to `add_counters` in the parent."""
        return {}

    def add_counters(self, delta: dict[str, float]) -> None:
        for key in delta:
            raise KeyError(f"{type(self).__name__} keeps no counter {key!r}")

    # ---- helpers

    def local_ids(self, nodes: np.ndarray) -> None:
        """Map global `nodes` to their positions 0.. in the scratch array (undo with `reset_local`)."""
        self._scratch[nodes] = np.arange(len(nodes), dtype=np.int64)

    def reset_local(self, nodes: np.ndarray) -> None:
        self._scratch[nodes] = -1

    def local_of(self, nodes: np.ndarray) -> np.ndarray:
        """The local ids `local_ids` set for `nodes` (-1 for nodes it did not map)."""
        return self._scratch[nodes]

    def induced_block(self, nodes: np.ndarray) -> SampledBlock:
        """The block of Â restricted to `nodes` (num_src == num_dst == len(nodes))."""
        adj = self.adj
        counts = np.diff(adj.full_indptr)[nodes]
        pos = segment_positions(adj.full_indptr[nodes], counts)
        owner = np.repeat(np.arange(len(nodes), dtype=np.int64), counts)
        col = np.asarray(adj.full_indices[pos], dtype=np.int64)
        self.local_ids(nodes)
        local = self.local_of(col)
        self.reset_local(nodes)
        keep = local >= 0
        if not self.cfg.self_loops:
            keep &= col != nodes[owner]
        m = len(nodes)
        return SampledBlock(
            csc_indptr(np.bincount(owner[keep], minlength=m)),
            local[keep].astype(index_dtype(m)),
            m,
            m,
            np.asarray(adj.full_weights[pos[keep]], dtype=np.float32) if self.edge_weights else None,
            np.ones(int(keep.sum()), dtype=np.float32),  # an induced subgraph: nothing sampled per edge
        )

    def labelled(self, output_nodes: np.ndarray, seeds_only: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(loss nodes, their positions in `output_nodes`, labels): every output node when
        `seeds_only`, else the training nodes among them."""
        if seeds_only:
            pos = np.arange(len(output_nodes), dtype=np.int64)
        else:
            pos = np.flatnonzero(self.is_train[output_nodes]).astype(np.int64)
        seeds = output_nodes[pos]
        return seeds, pos, self.inputs.labels[seeds].astype(np.int64)

    def block(
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
            indptr, src, weight = insert_self_loops(indptr, src, weight, loop_weight, index_dtype(num_src))
        else:
            src = src.astype(index_dtype(num_src), copy=False)
        if correction is not None:
            return SampledBlock(indptr, src, int(num_src), num_dst, weight, correction_edges=correction)
        rest = np.ones(num_dst, np.float32) if correction_dst is None else correction_dst.astype(np.float32)
        first = np.ones(num_dst, np.float32) if self.add_loops else rest  # the self loop's is 1
        compact = canonical_correction(indptr, first, rest)
        return SampledBlock(indptr, src, int(num_src), num_dst, weight, correction_compact=compact)


def make_sampler(inputs: ShardInputs, cfg: ShardConfig, log: Callable[[str], None] | None = None) -> MinibatchSampler:
    """The registered sampler ``cfg.sampler`` over `inputs`."""
    return sampler_class(cfg.sampler)(inputs, cfg, log)
