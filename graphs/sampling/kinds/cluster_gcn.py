"""cluster_gcn: Cluster-GCN, minibatches of ``clusters`` METIS clusters (metis_partitions'
cluster_id.npy) with the block of Â induced by their nodes, shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphs.infra.config_checks import check_fields
from graphs.sampling.base import MinibatchSampler, SampledMinibatch
from graphs.sampling.registry import SamplerTraits, register_sampler
from graphs.sampling.schedule import epoch_cluster_groups


@dataclass(kw_only=True)
class ClusterGCNSettings:
    """The cluster_gcn sampler's settings (``samplers: {cluster_gcn: {...}}``)."""

    clusters: int = field(default=20, metadata={"max": 1 << 20, "help": "METIS clusters per minibatch."})

    def __post_init__(self) -> None:
        check_fields(self, "samplers.cluster_gcn")
        if self.clusters < 1:
            raise ValueError(f"samplers.cluster_gcn.clusters={self.clusters} must be at least 1")


@register_sampler
class ClusterGCNSampler(MinibatchSampler):
    """Groups of clusters per minibatch; the loss nodes are their training nodes."""

    name = "cluster_gcn"
    traits = SamplerTraits(seeds=False, shares_block=True, needs_clusters=True)
    Settings = ClusterGCNSettings

    def setup(self) -> None:
        cluster_id = self.inputs.cluster_id
        if cluster_id is None:
            raise ValueError("sampler='cluster_gcn' needs cluster_id.npy from metis_partitions")
        order = np.argsort(cluster_id, kind="stable")
        ids, starts, counts = np.unique(cluster_id[order], return_index=True, return_counts=True)
        self._cluster_order, self._cluster_ids = order, ids.astype(np.int64)
        self._cluster_start = dict(zip(ids.tolist(), zip(starts.tolist(), counts.tolist())))

    def schedule(self, epoch: int) -> list[list]:
        """Epoch `epoch`'s cluster groups, one list per rank."""
        return epoch_cluster_groups(self._cluster_ids, epoch, self.cfg, self.cfg.options.clusters)

    def sample(self, item: np.ndarray, seed: int) -> SampledMinibatch:
        parts = []
        for c in np.asarray(item).tolist():
            start, count = self._cluster_start[c]
            parts.append(self._cluster_order[start : start + count])
        nodes = np.sort(np.concatenate(parts)).astype(np.int64)
        block = self.induced_block(nodes)
        seeds, pos, labels = self.labelled(nodes, seeds_only=False)
        return SampledMinibatch(nodes, [block], seeds, pos, labels)
