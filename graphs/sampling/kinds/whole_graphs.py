"""whole_graphs: minibatches of whole graphs of a graph collection (`graphs.formats.graph_table`),
about ``graphs_per_batch`` training graphs each, cut at equal shares of the nodes; the block of Â
induced by their nodes (Â has no edge between graphs) stands for every layer. The loss items
are the graphs: the seeds are graph indices, ``seed_pos`` each graph's first position among the
minibatch's nodes (its nodes are contiguous, graphs in index order), the labels their classes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphs.formats.shard_manifest import GRAPH_PROPERTY
from graphs.infra.config_checks import check_fields
from graphs.sampling.base import MinibatchSampler, SampledMinibatch
from graphs.sampling.registry import SamplerTraits, register_sampler
from graphs.sampling.schedule import epoch_graph_batches


@dataclass(kw_only=True)
class WholeGraphsSettings:
    """The whole_graphs sampler's settings (``samplers: {whole_graphs: {...}}``)."""

    graphs_per_batch: int = field(
        default=32, metadata={"max": 1 << 20, "help": "Training graphs per minibatch (about; cut by node count)."}
    )

    def __post_init__(self) -> None:
        check_fields(self, "samplers.whole_graphs")
        if self.graphs_per_batch < 1:
            raise ValueError(f"samplers.whole_graphs.graphs_per_batch={self.graphs_per_batch} must be at least 1")


@register_sampler
class WholeGraphsSampler(MinibatchSampler):
    """Groups of whole training graphs per minibatch; the loss items are the graphs."""

    name = "whole_graphs"
    traits = SamplerTraits(seeds=False, shares_block=True, whole_graphs=True)
    Settings = WholeGraphsSettings

    def setup(self) -> None:
        table = self.inputs.graphs
        if table is None:
            raise ValueError(
                "sampler 'whole_graphs' batches the graphs of a graph collection (a landing folder with "
                "graphs.parquet); this dataset is one graph"
            )
        self.table, self.train = table, table.of_split("train")
        if table.labels is None or len(self.train) == 0:
            raise ValueError("the collection has no training graphs (split 'train' with a label in graphs.parquet)")
        self.class_labels = table.labels if table.label_kind == "class" else np.full(table.num_graphs, -1, np.int64)

    def schedule(self, epoch: int) -> list[list]:
        """Epoch `epoch`'s groups of training graphs, one list per rank."""
        return epoch_graph_batches(self.train, self.table.num_nodes, epoch, self.cfg, self.cfg.options.graphs_per_batch)

    def sample(self, item: np.ndarray, seed: int) -> SampledMinibatch:
        graphs = np.sort(np.asarray(item, dtype=np.int64))
        nodes, ptr = self.table.node_ranges(graphs)
        block = self.induced_block(nodes)
        return SampledMinibatch(nodes, [block], graphs, ptr[:-1].copy(), self.class_labels[graphs])

    def manifest_facts(self) -> dict:
        return {
            "task": GRAPH_PROPERTY,
            "graphs": {
                "train_graphs": int(len(self.train)),
                "graphs_per_batch": self.cfg.options.graphs_per_batch,
                "label_kind": self.table.label_kind,
            },
        }
