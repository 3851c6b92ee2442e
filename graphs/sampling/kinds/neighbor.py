"""neighbor: DGL's fused neighbour sampling, fanouts per layer, uniform without replacement or
in proportion to Â's entries / adaptive scores with replacement (`graphs.sampling` docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphs.infra.config_checks import bounded_repr, check_fields
from graphs.infra.storage import file_sha256
from graphs.sampling.base import (
    MinibatchSampler,
    SampledMinibatch,
    dgl_csc_graph,
    dgl_neighbor_blocks,
    single_threaded_dgl,
)
from graphs.sampling.config import ShardConfig
from graphs.sampling.registry import SamplerTraits, register_sampler
from graphs.sampling.relations import RelationDraws
from graphs.sampling.weighting import adaptive_edge_probs, adaptive_node_probs

PROBS = ("uniform", "weight", "adaptive")
# the `prob` settings that draw with replacement in proportion to a weight
WEIGHTED_PROBS = ("weight", "adaptive")

# DGL (and torch) are imported where a sampler samples, not at module top: the registry imports
# every sampler module whenever a ShardConfig is validated, which the Dagster code server and
# the CLI do at start, and importing DGL there adds about 0.7 s (1.7 s against torch's 1.0 s).


@dataclass(kw_only=True)
class NeighborSettings:
    """The neighbor sampler's settings (``samplers: {neighbor: {...}}``)."""

    rescale: bool = field(
        default=True,
        metadata={
            "help": "store the correction deg/sampled per sampled edge (1 when off), so each layer type's "
            "aggregation is unbiased (training.layers.sampled_edge_weight)."
        },
    )
    prob: str = field(
        default="uniform",
        metadata={
            "help": f"one of {PROBS}: 'uniform' (without replacement) or 'weight' (with replacement, in proportion "
            "to Â's entries, so heavy edges of a weighted graph are drawn more often; unbiased by S_v / draws) "
            "or 'adaptive' (with replacement, in proportion to p(u) = α·deg(u)/Σdeg + (1−α)·g(u)/Σg with g the "
            "previous training run's per-node gradient norms, trained_model's node_grad_norm.npz written with "
            "training.node_grad_stats; degree only until that file exists; unbiased by P_v / (p(u) · draws), "
            "graphs.sampling.weighting)."
        },
    )
    adaptive_alpha: float = field(
        default=0.5,
        metadata={"help": "prob 'adaptive': α, the weight of the degree term (1 = degree only), in [0, 1]."},
    )
    per_relation: bool = field(
        default=False,
        metadata={
            "help": "typed graphs: draw the fanout from each relation's in-edges of a node (DGL's fanout per "
            "edge type on a heterograph), so a relation with few edges is not crowded out by one with many; "
            "off: the fanout counts a node's in-edges of every relation together. Uniform draws only "
            "(graphs.sampling.relations)."
        },
    )

    def __post_init__(self) -> None:
        check_fields(self, "samplers.neighbor")
        if self.prob not in PROBS:
            raise ValueError(f"samplers.neighbor.prob={bounded_repr(self.prob)} is not one of {PROBS}")
        if not 0.0 <= self.adaptive_alpha <= 1.0:
            raise ValueError(f"samplers.neighbor.adaptive_alpha={self.adaptive_alpha} must lie in [0, 1]")
        if self.per_relation and self.prob != "uniform":
            raise ValueError(f"samplers.neighbor.per_relation draws uniformly; prob={self.prob!r} is not 'uniform'")


@register_sampler
class NeighborSampler(MinibatchSampler):
    """Per layer, ``fanout`` neighbours of each destination (all for -1), seeds outwards."""

    name = "neighbor"
    traits = SamplerTraits(seeds=True, own_edges=True, typed=True)
    Settings = NeighborSettings

    def setup(self) -> None:
        self._dgl_mapping: dict = {}  # DGL's reusable global-to-local id buffer
        self._row_sums: np.ndarray | None = None
        self._edge_prob: np.ndarray | None = None
        self.adaptive_info: dict = {}
        self._rank_graphs: dict[int, tuple] = {}  # rank -> (its DGL graph, Â position of each of its edges)
        self._relation_draws: RelationDraws | None = None
        if self.cfg.options.per_relation and (self.inputs.typed is None or self.rank_edges is not None):
            raise ValueError(
                "samplers.neighbor.per_relation draws each relation of a typed graph (a landing folder with nodes/), "
                "and not with a placement that samples each rank's own edges"
            )
        if self.rank_edges is not None and self.cfg.options.prob != "uniform":
            raise ValueError(
                f"placement={self.cfg.placement!r} samples each rank's own edges uniformly; "
                f"samplers.neighbor.prob={self.cfg.options.prob!r} draws over all of a node's edges (set it to 'uniform')"
            )

    @classmethod
    def non_uniform_draws(cls, cfg: ShardConfig) -> str | None:
        if cfg.options.prob in WEIGHTED_PROBS:
            return f"sampler 'neighbor' with samplers.neighbor.prob {cfg.options.prob!r}"
        return None

    @classmethod
    def reads_node_scores(cls, cfg: ShardConfig) -> bool:
        return cfg.options.prob == "adaptive"

    def prepare(self) -> None:
        with single_threaded_dgl():
            self._draws() if self.cfg.options.per_relation else self._neighbor_graph()
            for rank in range(self.cfg.world_size if self.rank_edges is not None else 0):
                self._rank_graph(rank)

    def manifest_facts(self) -> dict:
        if not self.adaptive_info:
            return {}
        facts = dict(self.adaptive_info)
        if self.inputs.node_scores_path is not None:
            facts["node_scores_sha256"] = file_sha256(self.inputs.node_scores_path)
        return {"adaptive": facts}

    def sample(self, item: np.ndarray, seed: int) -> SampledMinibatch:
        return self.sample_neighbor(item, seed)

    def sample_neighbor(self, seeds: np.ndarray, seed: int, exclude: np.ndarray | None = None) -> SampledMinibatch:
        """DGL's neighbour-sampled blocks for `seeds`, with Â's weights (and rescaling); edges
        `exclude` (positions in the off-diagonal CSR of Â) are never sampled."""
        import dgl
        import torch

        by_weight = self.cfg.options.prob in WEIGHTED_PROBS
        with single_threaded_dgl():
            dgl.seed(seed)
            if self.cfg.options.per_relation:
                if exclude is not None:
                    raise ValueError("samplers.neighbor.per_relation cannot leave seed edges out (link prediction)")
                input_nodes, dgl_blocks = self._draws().blocks(seeds, self.cfg.fanout_list)
            else:
                input_nodes, dgl_blocks = dgl_neighbor_blocks(
                    self._neighbor_graph(),
                    torch.from_numpy(seeds),
                    self.cfg.fanout_list,
                    self._dgl_mapping,
                    prob="prob" if by_weight else None,
                    exclude=None if exclude is None else torch.from_numpy(np.asarray(exclude, dtype=np.int64)),
                )
        input_nodes = input_nodes.numpy().astype(np.int64)
        blocks = [
            self._stored_block(b, fanout, input_nodes, by_weight) for b, fanout in zip(dgl_blocks, self.cfg.fanout_list)
        ]
        out_seeds, pos, labels = self.labelled(input_nodes[: blocks[-1].num_dst], seeds_only=True)
        return SampledMinibatch(input_nodes, blocks, out_seeds, pos, labels)

    def _stored_block(self, b, fanout: int, input_nodes: np.ndarray, by_weight: bool):
        """One DGL block as stored: Â's entries of its edges and the sampling correction."""
        import dgl

        indptr, src, local_eid = (t.numpy() for t in b.adj_tensors("csc"))  # the graph's id type
        indptr = indptr.astype(np.int64, copy=False)
        eid = None
        etypes = self.inputs.etypes
        if self.edge_weights or by_weight or etypes is not None:
            eid = b.edata[dgl.EID].numpy()  # positions in the off-diagonal CSR of Â
            if not np.array_equal(local_eid, np.arange(len(local_eid))):  # DGL's fused blocks: in order
                eid = eid[local_eid]
            if self.rank_edges is not None:  # positions in the rank's own edges
                eid = self._rank_graph(self.rank)[1][eid]
        if etypes is not None:  # each destination's edges by relation: the rows training aggregates over
            order = np.lexsort((np.take(etypes, eid), np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))))
            src, eid = src[order], eid[order]
        dst_global = input_nodes[: b.num_dst_nodes()]
        # Â's entries (np.take: ~25 % faster than fancy indexing here), unless stored as its factors
        weight = np.take(self.adj.weights, eid) if self.edge_weights else None
        correction = per_dst = None
        if by_weight and fanout != -1:
            if self.cfg.options.rescale:  # S_v / (q_vu · draws(v)) per drawn edge (Hansen-Hurwitz)
                sampled = np.diff(indptr)
                factor = (self._row_sums[dst_global] / np.maximum(sampled, 1)).astype(np.float32)
                correction = np.repeat(factor, sampled) / np.maximum(self._edge_prob[eid], np.float32(1e-30))
        elif self.cfg.options.rescale and self._relation_draws is not None:  # deg_r(v) / sampled_r(v)
            correction = self._relation_draws.correction(indptr, np.take(etypes, eid), dst_global)
        elif self.cfg.options.rescale:  # deg(v) / sampled(v): the inverse inclusion probability
            sampled = np.diff(indptr)
            per_dst = (self.adj.degree[dst_global] / np.maximum(sampled, 1)).astype(np.float32)
        block = self.block(indptr, src, weight, b.num_src_nodes(), dst_global, correction, per_dst)
        if etypes is not None:  # the relational Â has no self loops: the block's edges are the sampled ones
            block.etype = np.take(etypes, eid)
        return block

    def _draws(self) -> RelationDraws:
        """The per-relation draws over the relational Â, built on first use."""
        if self._relation_draws is None:
            relations = len(self.inputs.typed.schema.relations)
            self._relation_draws = RelationDraws(self.adj, self.inputs.etypes, relations)
        return self._relation_draws

    def _neighbor_graph(self):
        """The DGL graph neighbour sampling draws from, built on first use, with the draw
        probabilities (and their manifest facts) for prob 'weight' / 'adaptive'."""
        if self.rank_edges is not None:
            return self._rank_graph(self.rank)[0]
        by_weight = self.cfg.options.prob in WEIGHTED_PROBS
        if by_weight and self._row_sums is None:
            self._edge_prob, self._row_sums = self._draw_probs()
        return self.adj.dgl_graph(prob=self._edge_prob if by_weight else None, compact_ids=True)

    def _rank_graph(self, rank: int) -> tuple:
        """(DGL graph, int64 Â position of each edge) of `rank`'s own edges (``rank_edges``), built
        on first use: the off-diagonal CSR of Â keeping the entries of that rank."""
        if rank not in self._rank_graphs:
            adj = self.adj
            mine = self.rank_edges.rank_of_edge == rank
            kept = np.concatenate([[0], np.cumsum(mine, dtype=np.int64)])
            positions = np.flatnonzero(mine).astype(np.int64)
            indptr = kept[adj.indptr]  # each row's kept entries are contiguous in the kept order
            graph = dgl_csc_graph(indptr, adj.indices[positions], adj.n, compact_ids=True)
            self._rank_graphs[rank] = (graph, positions)
        return self._rank_graphs[rank]

    def _draw_probs(self) -> tuple[np.ndarray, np.ndarray]:
        """(q float32 per off-diagonal entry, its row sums S_v float64): Â's entries for
        prob 'weight', p(u) of `graphs.sampling.weighting` for 'adaptive'."""
        if self.cfg.options.prob == "weight":
            return self.adj.weights, self.adj.row_sums
        scores = self.inputs.node_scores
        p = adaptive_node_probs(self.adj.degree, scores, self.cfg.options.adaptive_alpha)
        edge_p, sums = adaptive_edge_probs(self.adj.indptr, self.adj.indices, p)
        self.adaptive_info = {
            "alpha": self.cfg.options.adaptive_alpha if scores is not None else 1.0,
            "node_scores": self.inputs.node_scores_path is not None,
            "p_max_over_mean": round(float(p.max()), 3) if len(p) else 0.0,
        }
        return edge_p, sums
