"""DGL's side of `benchmarks/typed_vs_dgl.py --conv sage`: a heterograph and ``HeteroGraphConv``.

The typed canonical graph as a ``dgl.heterograph`` (one canonical edge type per relation, named by
its key; type-local node ids), read by ``dgl.dataloading.DataLoader`` + ``NeighborSampler`` (on a
heterograph: the fanout of every edge type) from the target type's training nodes; the network is
a linear map per featured type and a sparse learned vector per node of a featureless type, then
``HeteroGraphConv({relation: SAGEConv(mean)}, aggregate="sum")`` layers, dropout before each,
ReLU between: what DGL's heterogeneous examples build, and what gnnflow's ``model.conv: sage`` on a
typed graph computes (one SAGE layer per relation, summed) over shards drawn per relation.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def optimizers(model, lr: float) -> list:
    """Adam over the dense parameters, SparseAdam over the learned vectors (``embed.*``), as both
    sides of the typed benchmark step them."""
    import torch

    dense = [p for n, p in model.named_parameters() if not n.startswith("embed.")]
    sparse = [p for n, p in model.named_parameters() if n.startswith("embed.")]
    return [torch.optim.Adam(dense, lr=lr)] + ([torch.optim.SparseAdam(sparse, lr=lr)] if sparse else [])


def timed_epochs(model, opts: list, loader, epochs: int, loss_of) -> list[float]:
    """Seconds of each of `epochs` passes over `loader`, each minibatch's ``loss_of(*batch)``
    stepped by every optimizer of `opts`."""
    seconds = []
    for _ in range(epochs):
        model.train()
        t0 = time.perf_counter()
        for batch in loader:
            loss = loss_of(*batch)
            for opt in opts:
                opt.zero_grad()
            loss.backward()
            for opt in opts:
                opt.step()
        seconds.append(time.perf_counter() - t0)
    return seconds


def hetero_inputs(can: Path):
    """(heterograph with feat / label, training ids of the target type, val / test masks of it, schema)."""
    import dgl
    import pyarrow.parquet as pq
    import torch

    from graphs.formats.canonical_files import CanonicalGraph
    from graphs.formats.graph_schema import TypedSchema

    graph = CanonicalGraph.open(can)
    typed = TypedSchema.read(can)
    schema, offsets = typed.schema, typed.offsets
    edges = pq.read_table(graph.path(graph.TYPED_EDGES)).to_pandas()
    data = {}
    for r, rel in enumerate(schema.relations):
        part = edges[edges.etype == r]
        s, d = schema.node_types.index(rel.src_type), schema.node_types.index(rel.dst_type)
        src = torch.from_numpy(part.src.to_numpy() - offsets[s])
        dst = torch.from_numpy(part.dst.to_numpy() - offsets[d])
        data[(rel.src_type, rel.key, rel.dst_type)] = (src, dst)
    hg = dgl.heterograph(data, num_nodes_dict=dict(zip(schema.node_types, typed.counts)))
    feats = np.load(graph.features_path) if graph.has_features else None
    for t, (name, width) in enumerate(zip(schema.node_types, typed.feat_widths)):
        if width:
            hg.nodes[name].data["feat"] = torch.from_numpy(
                np.ascontiguousarray(feats[offsets[t] : offsets[t + 1], :width])
            )
    target = schema.node_types.index(typed.target)
    nodes = (
        pq.read_table(graph.nodes_path, columns=["label", "split"])
        .to_pandas()
        .iloc[offsets[target] : offsets[target + 1]]
    )
    labels = nodes.label.to_numpy().astype(np.int64)
    hg.nodes[typed.target].data["label"] = torch.from_numpy(labels)
    split, labelled = nodes.split.to_numpy(), labels >= 0
    train = torch.from_numpy(np.flatnonzero((split == "train") & labelled))
    masks = {name: torch.from_numpy((split == name) & labelled) for name in ("val", "test")}
    return hg, train, masks, typed


def hetero_model(args, typed, classes: int):
    """Per-type inputs and len(args.fanout_list) HeteroGraphConv layers of SAGEConv(mean); its optimizers."""
    import dgl.nn as dglnn
    import torch.nn.functional as F
    from torch import nn

    schema, layers = typed.schema, len(args.fanout_list)
    dims = [args.hidden] * layers + [classes]
    keys = [r.key for r in schema.relations]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            widths = dict(zip(schema.node_types, typed.feat_widths))
            counts = dict(zip(schema.node_types, typed.counts))
            self.proj = nn.ModuleDict({t: nn.Linear(w, args.hidden) for t, w in widths.items() if w})
            self.embed = nn.ModuleDict(
                {t: nn.Embedding(counts[t], args.hidden, sparse=True) for t, w in widths.items() if not w}
            )
            for e in self.embed.values():
                nn.init.normal_(e.weight, std=args.hidden**-0.5)
            self.convs = nn.ModuleList(
                dglnn.HeteroGraphConv({k: dglnn.SAGEConv(dims[i], dims[i + 1], "mean") for k in keys}, aggregate="sum")
                for i in range(layers)
            )
            self.dropout = nn.Dropout(args.dropout)

        def inputs(self, nids: dict, feats: dict) -> dict:
            return {t: self.proj[t](feats[t]) if t in self.proj else self.embed[t](nids[t]) for t in nids}

        def forward(self, blocks, h: dict) -> dict:
            for i, (block, conv) in enumerate(zip(blocks, self.convs)):
                h = conv(block, {t: self.dropout(x) for t, x in h.items()})
                if i < layers - 1:
                    h = {t: F.relu(x) for t, x in h.items()}
            return h

    model = Net()
    return model, optimizers(model, args.lr)


def run_dgl_hetero(can: Path, args) -> dict:
    """Seconds of each epoch and the final model's test accuracy (full-graph inference)."""
    import dgl
    import torch
    import torch.nn.functional as F

    hg, train, masks, typed = hetero_inputs(can)
    target = typed.target
    torch.manual_seed(args.seed)
    dgl.seed(args.seed)
    classes = int(hg.nodes[target].data["label"].max()) + 1
    model, opts = hetero_model(args, typed, classes)
    sampler = dgl.dataloading.NeighborSampler(args.fanout_list, prefetch_node_feats={t: ["feat"] for t in model.proj})
    loader = dgl.dataloading.DataLoader(hg, {target: train}, sampler, batch_size=args.batch_size, shuffle=True)

    def loss_of(input_nodes, output_nodes, blocks):
        feats = {t: blocks[0].srcnodes[t].data["feat"] for t in model.proj}
        logits = model(blocks, model.inputs(input_nodes, feats))[target]
        return F.cross_entropy(logits, hg.nodes[target].data["label"][output_nodes[target]])

    seconds = timed_epochs(model, opts, loader, args.epochs, loss_of)
    model.eval()
    with torch.no_grad():
        nids = {t: torch.arange(hg.num_nodes(t)) for t in hg.ntypes}
        feats = {t: hg.nodes[t].data["feat"] for t in model.proj}
        pred = model([hg] * len(args.fanout_list), model.inputs(nids, feats))[target].argmax(1)
    test = masks["test"]
    acc = float((pred[test] == hg.nodes[target].data["label"][test]).float().mean())
    return {"epoch_seconds": seconds, "test_acc": acc}
