"""importance: layer-wise importance sampling (LADIES): per layer, a fixed number of nodes drawn
with replacement in proportion to the squared Â entries into the layer's destinations."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphs.infra.config_checks import MAX_BATCH, check_fields
from graphs.sampling.base import MinibatchSampler, SampledMinibatch, csc_indptr
from graphs.sampling.registry import SamplerTraits, register_sampler


@dataclass(kw_only=True)
class ImportanceSettings:
    """The importance sampler's settings (``samplers: {importance: {...}}``)."""

    nodes: int = field(default=2048, metadata={"max": MAX_BATCH, "help": "nodes drawn (with replacement) per layer."})

    def __post_init__(self) -> None:
        check_fields(self, "samplers.importance")
        if self.nodes < 1:
            raise ValueError(f"samplers.importance.nodes={self.nodes} must be at least 1")


@register_sampler
class ImportanceSampler(MinibatchSampler):
    """``nodes`` nodes per layer, each edge unbiased by draws / (s · q)."""

    name = "importance"
    traits = SamplerTraits(seeds=True, non_uniform=True)
    Settings = ImportanceSettings

    def sample(self, item: np.ndarray, seed: int) -> SampledMinibatch:
        """Layer-wise importance sampling with unbiasing weights (`graphs.sampling` docstring)."""
        rng = np.random.default_rng(seed)
        dst_nodes = np.asarray(item, dtype=np.int64)
        blocks = []
        for _ in range(self.cfg.num_layers):
            block, dst_nodes = self._layer(dst_nodes, rng)
            blocks.append(block)
        blocks.reverse()
        out_seeds, pos, labels = self.labelled(np.asarray(item, dtype=np.int64), seeds_only=True)
        return SampledMinibatch(dst_nodes, blocks, out_seeds, pos, labels)

    def _layer(self, dst_nodes: np.ndarray, rng: np.random.Generator):
        """(the block into `dst_nodes`, its source nodes: `dst_nodes` then the new ones drawn)."""
        s = self.cfg.options.nodes
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
        self.local_ids(dst_nodes)
        new = picked[self.local_of(picked) < 0]
        src_nodes = np.concatenate([dst_nodes, new])
        self.local_ids(src_nodes)
        src_local = self.local_of(nbr[keep])
        self.reset_local(src_nodes)
        indptr = csc_indptr(np.bincount(owner[keep], minlength=len(dst_nodes)))  # owner is ascending
        return self.block(indptr, src_local, weight, len(src_nodes), dst_nodes, correction), src_nodes
