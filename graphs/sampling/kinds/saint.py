"""saint: GraphSAINT (node, edge or random-walk subgraphs, DGL's SAINTSampler), normalized by
presampling: each edge's aggregation weight Â_vu / α_uv with α_uv = C_uv / C_v, each loss node's
weight N / (C_v · T), from C counts over presampled subgraphs (`graphs.sampling` docstring)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from graphs.infra.config_checks import MAX_BATCH, bounded_repr, check_fields
from graphs.sampling.base import MinibatchSampler, SampledMinibatch, csc_indptr, single_threaded_dgl
from graphs.sampling.registry import SamplerTraits, register_sampler
from graphs.sampling.schedule import presample_seed

MODES = ("node", "edge", "walk")


@dataclass(kw_only=True)
class SaintSettings:
    """The saint sampler's settings (``samplers: {saint: {...}}``)."""

    mode: str = field(default="node", metadata={"help": f"sampler mode, one of {MODES}."})
    budget: int = field(
        default=6000,
        metadata={
            "max": MAX_BATCH,
            "help": "nodes (node mode), edges (edge mode) or walk roots (walk mode) per subgraph.",
        },
    )
    walk_length: int = field(default=2, metadata={"max": 1024, "help": "walk mode: random-walk length."})
    coverage: float = field(
        default=20.0,
        metadata={
            "max": 1000.0,
            "help": "pre-sample until each node is expected in this many subgraphs (normalization).",
        },
    )
    subgraphs: int = field(
        default=0,
        metadata={"max": 1 << 20, "help": "subgraphs per epoch per rank; 0 = about n / (W * subgraph nodes)."},
    )

    def __post_init__(self) -> None:
        check_fields(self, "samplers.saint")
        if self.mode not in MODES:
            raise ValueError(f"samplers.saint.mode={bounded_repr(self.mode)} is not one of {MODES}")
        for name in ("budget", "walk_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"samplers.saint.{name}={getattr(self, name)} must be at least 1")
        if self.coverage <= 0:
            raise ValueError(f"samplers.saint.coverage={self.coverage} must be > 0")
        if self.subgraphs < 0:
            raise ValueError(f"samplers.saint.subgraphs={self.subgraphs} must be >= 0 (0 = automatic)")


@register_sampler
class SaintSampler(MinibatchSampler):
    """``subgraphs`` subgraphs per rank and epoch (or about n / (W · subgraph nodes))."""

    name = "saint"
    traits = SamplerTraits(seeds=False, shares_block=True, non_uniform=True)
    Settings = SaintSettings

    def schedule(self, epoch: int) -> list[list]:
        """One None per subgraph: each is drawn from its minibatch seed alone."""
        return [[None] * self._saint_per_rank for _ in range(self.cfg.world_size)]

    def manifest_facts(self) -> dict:
        return {"saint": self.saint_info}

    def _saint_dgl(self):
        import dgl

        o = self.cfg.options
        budget = (o.budget, o.walk_length) if o.mode == "walk" else o.budget
        return dgl.dataloading.SAINTSampler(mode=o.mode, budget=budget)

    def _saint_subgraph(self, seed: int):
        """(node ids ascending, local src, local dst, edge ids) of one DGL SAINT subgraph."""
        import dgl
        import torch

        with single_threaded_dgl():
            dgl.seed(seed)
            torch.manual_seed(seed)
            sg = self._saint.sample(self.adj.dgl_graph(), None)
        nodes = sg.ndata[dgl.NID].numpy()
        src, dst = (t.numpy() for t in sg.edges())
        return nodes, src, dst, sg.edata[dgl.EID].numpy()

    def setup(self) -> None:
        cfg, o, n = self.cfg, self.cfg.options, self.inputs.n
        self._saint = self._saint_dgl()
        expected = {"node": o.budget, "edge": 2 * o.budget, "walk": o.budget * (o.walk_length + 1)}[o.mode]
        presamples = max(1, math.ceil(o.coverage * n / min(expected, n)))
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
        self._saint_per_rank = o.subgraphs or max(1, math.ceil(n / (cfg.world_size * mean_nodes)))
        self.saint_info = {
            "presamples": presamples,
            "mean_subgraph_nodes": round(mean_nodes, 1),
            "nodes_never_presampled": int(np.count_nonzero(node_count == 0)),
            "presample_seconds": round(time.perf_counter() - t0, 3),
        }
        self.log(f"saint: {presamples} presampled subgraphs, {mean_nodes:.0f} nodes each on average")

    def sample(self, item: None, seed: int) -> SampledMinibatch:
        nodes, src, dst, eid = self._saint_subgraph(seed)
        if len(dst) > 1 and (np.diff(dst) < 0).any():
            order = np.argsort(dst, kind="stable")
            src, dst, eid = src[order], dst[order], eid[order]
        nodes = nodes.astype(np.int64)
        # Â_vu / α_uv with α_uv = C_uv / C_v
        weight = self.adj.weights[eid].astype(np.float32)
        correction = (self._node_count[nodes[dst]] / self._edge_count[eid]).astype(np.float32)
        block = self.block(
            csc_indptr(np.bincount(dst, minlength=len(nodes))), src, weight, len(nodes), nodes, correction
        )
        seeds, pos, labels = self.labelled(nodes, seeds_only=False)
        loss_weight = (self._presamples / (self._node_count[seeds] * len(self.inputs.train_nodes))).astype(np.float32)
        return SampledMinibatch(nodes, [block], seeds, pos, labels, loss_weight)
