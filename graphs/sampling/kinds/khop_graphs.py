"""khop_graphs: minibatches of k-hop subgraphs of a graph collection's training graphs, for graphs
too large to train whole. The graphs are grouped as by ``whole_graphs``; in each graph with more
than ``max_nodes`` nodes, ``roots`` nodes are drawn uniformly (with replacement) and the graph
stands in the minibatch by the nodes within ``hops`` edges of them, with the block of Â they
induce; a graph of at most ``max_nodes`` nodes stays whole. The loss items are the graphs, as for
``whole_graphs`` (``seed_pos`` each graph's first kept position; its kept nodes are contiguous).
Evaluation and predictions read whole graphs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from graphs.infra.config_checks import check_fields
from graphs.sampling.base import SampledMinibatch
from graphs.sampling.kinds.whole_graphs import WholeGraphsSampler, WholeGraphsSettings
from graphs.sampling.registry import register_sampler


@dataclass(kw_only=True)
class KHopGraphsSettings(WholeGraphsSettings):
    """The khop_graphs sampler's settings (``samplers: {khop_graphs: {...}}``)."""

    hops: int = field(default=3, metadata={"max": 64, "help": "Edges from a root a kept node may be."})
    roots: int = field(default=1, metadata={"max": 1 << 20, "help": "Root nodes drawn per sampled graph."})
    max_nodes: int = field(
        default=0, metadata={"max": 1 << 40, "help": "Graphs of at most this many nodes stay whole (0: none)."}
    )

    def __post_init__(self) -> None:
        check_fields(self, "samplers.khop_graphs")
        for name in ("graphs_per_batch", "roots"):
            if getattr(self, name) < 1:
                raise ValueError(f"samplers.khop_graphs.{name}={getattr(self, name)} must be at least 1")
        for name in ("hops", "max_nodes"):
            if getattr(self, name) < 0:
                raise ValueError(f"samplers.khop_graphs.{name}={getattr(self, name)} must be at least 0")


@register_sampler
class KHopGraphsSampler(WholeGraphsSampler):
    """Groups of training graphs per minibatch, each graph larger than ``max_nodes`` cut to the
    k-hop neighbourhood of its roots; the loss items are the graphs."""

    name = "khop_graphs"
    Settings = KHopGraphsSettings

    def sample(self, item: np.ndarray, seed: int) -> SampledMinibatch:
        o = self.cfg.options
        graphs = np.sort(np.asarray(item, dtype=np.int64))
        nodes, ptr = self.table.node_ranges(graphs)
        sizes = np.diff(ptr)
        kept = np.repeat(sizes <= o.max_nodes, sizes)
        cut = np.flatnonzero(sizes > o.max_nodes)
        if len(cut) and o.hops:
            kept |= self._reached(nodes, ptr, cut, np.random.default_rng(seed))
        elif len(cut):
            kept[self._roots(ptr, cut, np.random.default_rng(seed))] = True
        nodes = nodes[kept]
        first = np.searchsorted(np.flatnonzero(kept), ptr[:-1])  # each graph's first kept position
        return SampledMinibatch(nodes, [self.induced_block(nodes)], graphs, first, self.class_labels[graphs])

    def _roots(self, ptr: np.ndarray, cut: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Positions (among the minibatch's nodes) of ``roots`` uniform draws in each graph of `cut`."""
        o = self.cfg.options
        owner = np.repeat(cut, o.roots)
        return ptr[owner] + (rng.random(len(owner)) * (ptr[owner + 1] - ptr[owner])).astype(np.int64)

    def _reached(self, nodes: np.ndarray, ptr: np.ndarray, cut: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Mask over `nodes`: within ``hops`` edges of the roots drawn in the graphs of `cut`."""
        block = self.induced_block(nodes)
        m = len(nodes)
        adj = sp.csc_matrix(
            (np.ones(len(block.indices), dtype=np.float32), block.indices, block.indptr), shape=(m, m)
        ).T.tocsr()  # row = destination, its sources by column; Â is symmetric, either direction reaches
        reached = np.zeros(m, dtype=np.float32)
        reached[self._roots(ptr, cut, rng)] = 1.0
        for _hop in range(self.cfg.options.hops):
            reached = np.minimum(reached + adj @ reached, 1.0)
        return reached > 0

    def manifest_facts(self) -> dict:
        facts = super().manifest_facts()
        o = self.cfg.options
        facts["graphs"].update(hops=o.hops, roots=o.roots, max_nodes=o.max_nodes)
        return facts
