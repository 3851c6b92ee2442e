"""Graph-level training on a molecule collection: gnnflow's graph_property task beside DGL's GIN.

    .venv/bin/python benchmarks/graph_collections.py                 # BBBP, 3 seeds each, alternating
    .venv/bin/python benchmarks/graph_collections.py --seeds 2 --variants

Both sides train the same model on the same shipped copy of BBBP (datasets/bbbp: 2039 molecules,
scaffold split 1631 / 204 / 204) with the same settings: 3 GIN layers of width 64 (MLP
``Linear -> ReLU -> Linear``), batch norm, dropout 0.2, a mean readout of every layer's states
summed over the layers (DGL's GIN example's head), Adam at 1e-3, about 32 graphs per minibatch, at most 100 epochs with early stopping after 20 epochs
without a better validation ROC-AUC; the model of the best validation ROC-AUC is tested. The atom
columns enter as each side's users would have them: gnnflow's default, one-hot codes standardized
over the training atoms and mapped by a linear layer; on DGL's side learned embeddings, as its
molecule examples' atom encoders do. ``--variants`` runs each side with the other's encoding too.

- gnnflow: canonical_graph -> normalized_adjacency once, then per seed minibatch_shards
  (whole_graphs, 3 epochs of orders replayed, the stage's defaults, sampled with that seed as DGL
  reshuffles with its seed), all timed apart, then `training.graph_train.train_graphs` reading them;
- DGL: the way its users write it (its GIN example): one ``dgl.graph`` per molecule built from the
  same Parquet files, ``dgl.dataloading.GraphDataLoader`` (batch 32, shuffled), ``dgl.nn.GINConv``
  and ``dgl.nn.AvgPooling``.

Both GINs compute ``MLP((1 + eps) h_v + sum of the neighbours' h_u)`` with eps fixed at 0
(gnnflow's graph model drops Â's self loops for a layer with the ``own_term`` trait).

Each run is a fresh spawned child (its peak RSS is its own), the two sides alternate, both with
the same torch thread count. Printed: test ROC-AUC (mean ± std over seeds), the median epoch
time and peak RSS per side, and the ratio. ``--variants`` adds gnnflow rows for the settings the
brief and the issue discuss: a virtual node, an attention readout, atom columns as learned
embeddings or unscaled one-hot codes, and 2 or 4 layers (hops) instead of 3; and a DGL row with
gnnflow's standardized one-hot atoms. ``--khop 1,2,3,4`` adds gnnflow rows trained on k-hop
subgraphs (sampler khop_graphs: one random root per molecule, the atoms within k bonds of it),
tested on whole molecules: the brief's "3-hop sampling works best on molecular graphs".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _child import run_in_child  # noqa: E402

from graphs.infra.storage import peak_rss_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"hidden": 64, "num_layers": 3, "dropout": 0.2, "lr": 1e-3, "epochs": 100, "patience": 20, "batch": 32}


def prepare(work: Path, landing: Path, seeds: int, khop: tuple[int, ...] = ()) -> dict:
    """The gnnflow stages before training: the graph stages once, whole-graph shards per seed
    (``shards<seed>``) and k-hop shards per seed for each k of `khop` (``khop<k>_<seed>``); the
    seconds of the graph stages and of the whole-graph shards."""
    from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
    from graphs.stages.canonical import build_canonical_graph
    from graphs.stages.normalize import build_normalized_adjacency

    t0 = time.perf_counter()
    build_canonical_graph(landing, work / "canonical_graph")
    build_normalized_adjacency(work / "canonical_graph", work / "normalized_adjacency")
    inputs = load_shard_inputs(work / "canonical_graph", work / "normalized_adjacency")
    graph_seconds, shard_seconds = time.perf_counter() - t0, []
    for seed in range(seeds):
        t0 = time.perf_counter()
        cfg = ShardConfig(sampler="whole_graphs", world_size=1, seed=seed,
                          samplers={"whole_graphs": {"graphs_per_batch": SETTINGS["batch"]}})  # fmt: skip
        write_minibatch_shards(inputs, work / f"shards{seed}", cfg)
        shard_seconds.append(time.perf_counter() - t0)
        for hops in khop:
            settings = {"khop_graphs": {"graphs_per_batch": SETTINGS["batch"], "hops": hops}}
            cfg = ShardConfig(sampler="khop_graphs", world_size=1, seed=seed, samplers=settings)
            write_minibatch_shards(inputs, work / f"khop{hops}_{seed}", cfg)
    return {"graph_seconds": graph_seconds, "shard_seconds": statistics.median(shard_seconds)}


VARIANTS = (
    ("virtual node", {"graph.virtual_node": True}),
    ("attention readout", {"graph.readout": "attention"}),
    ("atom columns as learned embeddings", {"graph.categorical": "embedding"}),
    ("atom columns one-hot, unscaled", {"graph.categorical": "one_hot"}),
    ("2 layers (hops)", {"model.num_layers": 2}),
    ("4 layers (hops)", {"model.num_layers": 4}),
)


def _gnnflow(shards: str, seed: int, threads: int, variant: dict, q) -> None:
    import torch

    torch.set_num_threads(threads)
    from training.graph_train import GRAPH_DEFAULTS, GraphConfig, train_graphs
    from training.task_settings import block_values, task_blocks

    s = SETTINGS
    settings = {"model.hidden": s["hidden"], "model.num_layers": s["num_layers"], "model.dropout": s["dropout"],
                "training.optimizer.lr": s["lr"], "training.epochs": s["epochs"],
                "training.early_stopping_patience": s["patience"], "graph.readout": "mean"}  # fmt: skip
    values = {**GRAPH_DEFAULTS, **settings, **variant, "training.seed": seed}
    cfg = GraphConfig(**block_values(values, "graph"))
    out = train_graphs(shards, None, cfg, *task_blocks(values), log=lambda m: None)
    q.put(
        {
            "roc_auc": out["test"]["roc_auc"],
            "epoch_seconds": statistics.median(out["epoch_seconds"]),
            "epochs": out["epochs"],
            "peak_rss": peak_rss_bytes(),  # VmHWM: this process alone
        }
    )


def _dgl_graphs(landing: Path):
    """One dgl.graph per molecule from the Parquet files, as a DGL user builds them; the atom
    columns per node, the labels and splits."""
    import dgl
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    graphs = pq.read_table(landing / "graphs.parquet").to_pandas().sort_values("graph_id")
    nodes = pq.read_table(landing / "nodes.parquet").to_pandas().sort_values(["graph_id", "node_id"])
    edges = pq.read_table(landing / "edges.parquet").to_pandas()
    columns = [c for c in nodes.columns if c not in ("graph_id", "node_id")]
    codes = {c: np.unique(nodes[c], return_inverse=True) for c in columns}
    for c, (_values, inverse) in codes.items():
        nodes[c] = inverse
    cards = [len(codes[c][0]) for c in columns]
    by_graph_nodes = dict(tuple(nodes.groupby("graph_id")))
    by_graph_edges = dict(tuple(edges.groupby("graph_id")))
    out = []
    for gid in graphs["graph_id"]:
        n = by_graph_nodes[gid]
        e = by_graph_edges.get(gid)
        src = e["src"].to_numpy() if e is not None else np.zeros(0, dtype=np.int64)
        dst = e["dst"].to_numpy() if e is not None else np.zeros(0, dtype=np.int64)
        g = dgl.graph((np.concatenate([src, dst]), np.concatenate([dst, src])), num_nodes=len(n))
        g.ndata["atoms"] = torch.from_numpy(n[columns].to_numpy(dtype=np.int64))
        out.append(g)
    labels = torch.from_numpy(graphs["label"].to_numpy(dtype=np.int64))
    split = graphs["split"].to_numpy()
    return out, labels, split, cards


def _standardized_one_hot(graphs, split, cards) -> None:
    """Set ``g.ndata["hot"]`` of every graph: its atoms' one-hot codes, each column shifted and
    scaled to mean 0 and variance 1 over the training graphs' atoms."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    def one_hot(atoms):
        return torch.cat([F.one_hot(atoms[:, k], c) for k, c in enumerate(cards)], 1).to(torch.float32)

    train = torch.cat([one_hot(graphs[i].ndata["atoms"]) for i in np.flatnonzero(split == "train")])
    mean, std = train.mean(0), train.std(0, correction=0)
    scale = torch.where(std > 0, 1 / std.clamp(min=1e-12), torch.ones_like(std))
    for g in graphs:
        g.ndata["hot"] = (one_hot(g.ndata["atoms"]) - mean) * scale


def _dgl(landing: str, seed: int, threads: int, encoding: str, q) -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from dgl.dataloading import GraphDataLoader
    from dgl.nn import AvgPooling, GINConv
    from torch import nn

    torch.set_num_threads(threads)
    from training.metrics import roc_auc

    graphs, labels, split, cards = _dgl_graphs(Path(landing))
    if encoding == "one_hot_standardized":
        _standardized_one_hot(graphs, split, cards)
    s = SETTINGS
    torch.manual_seed(seed)

    class GIN(nn.Module):  # DGL's examples/pytorch/gin model, with embedded or one-hot atom columns
        def __init__(self):
            super().__init__()
            h = s["hidden"]
            embedded = encoding == "embedding"
            self.embeddings = nn.ModuleList(nn.Embedding(c, h) for c in cards) if embedded else None
            self.linear_in = None if embedded else nn.Linear(sum(cards), h)
            self.convs = nn.ModuleList(
                GINConv(nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, h)), "sum")
                for _ in range(s["num_layers"])
            )
            self.norms = nn.ModuleList(nn.BatchNorm1d(h) for _ in range(s["num_layers"]))
            self.heads = nn.ModuleList(nn.Linear(h, 2) for _ in range(s["num_layers"] + 1))
            self.pool, self.drop = AvgPooling(), nn.Dropout(s["dropout"])

        def forward(self, g):
            if self.linear_in is not None:
                h = self.linear_in(g.ndata["hot"])
            else:
                h = sum(emb(g.ndata["atoms"][:, k]) for k, emb in enumerate(self.embeddings))
            out = self.heads[0](self.pool(g, h))
            for layer, conv in enumerate(self.convs):
                h = self.drop(F.relu(self.norms[layer](conv(g, h))))
                out = out + self.heads[layer + 1](self.pool(g, h))
            return out

    model = GIN()
    opt = torch.optim.Adam(model.parameters(), lr=s["lr"])
    index = {name: np.flatnonzero(split == name) for name in ("train", "val", "test")}
    data = {name: [(graphs[i], labels[i]) for i in idx] for name, idx in index.items()}
    loader = GraphDataLoader(data["train"], batch_size=s["batch"], shuffle=True)

    @torch.no_grad()
    def score(name):
        model.eval()
        probs, ys = [], []
        for g, y in GraphDataLoader(data[name], batch_size=512):
            probs.append(torch.softmax(model(g), 1)[:, 1])
            ys.append(y)
        return roc_auc(torch.cat(ys).numpy() == 1, torch.cat(probs).numpy())

    best, best_state, stale, seconds = -1.0, None, 0, []
    for _epoch in range(s["epochs"]):
        model.train()
        t0 = time.perf_counter()
        for g, y in loader:
            loss = F.cross_entropy(model(g), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        seconds.append(time.perf_counter() - t0)
        val = score("val")
        if val > best:
            best, best_state, stale = val, {k: v.clone() for k, v in model.state_dict().items()}, 0
        else:
            stale += 1
            if stale >= s["patience"]:
                break
    model.load_state_dict(best_state)
    q.put(
        {
            "roc_auc": score("test"),
            "epoch_seconds": statistics.median(seconds),
            "epochs": len(seconds),
            "peak_rss": peak_rss_bytes(),  # VmHWM: this process alone
        }
    )


def _row(name: str, runs: list[dict]) -> str:
    auc = [r["roc_auc"] for r in runs]
    sd = statistics.stdev(auc) if len(auc) > 1 else 0.0
    epoch = statistics.median(r["epoch_seconds"] for r in runs)
    rss = max(r["peak_rss"] for r in runs) / 2**30
    epochs = statistics.median(r["epochs"] for r in runs)
    return f"| {name} | {statistics.mean(auc):.4f} ± {sd:.4f} | {epoch:.3f} | {epochs:.0f} | {rss:.2f} |"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--landing", default=str(ROOT / "datasets" / "bbbp"))
    p.add_argument("--work", default="/tmp/gnnflow-bench-graph-collections")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    p.add_argument("--variants", action="store_true", help="also the variant rows (see above)")
    p.add_argument("--khop", default="", help="also rows trained on k-hop subgraphs, for these k (e.g. 1,2,3,4)")
    args = p.parse_args(argv)
    work = Path(args.work)
    khop = tuple(int(k) for k in args.khop.split(",") if k.strip())
    facts = prepare(work, Path(args.landing), args.seeds, khop)
    runs = {"gnnflow": [], "DGL": []}
    for seed in range(args.seeds):  # alternating, each run in a fresh child
        shards = str(work / f"shards{seed}")
        runs["gnnflow"].append(run_in_child(_gnnflow, shards, seed, args.threads, {}))
        runs["DGL"].append(run_in_child(_dgl, args.landing, seed, args.threads, "embedding"))
        print(f"seed {seed}: gnnflow {runs['gnnflow'][-1]}, DGL {runs['DGL'][-1]}", flush=True)
    for name, variant in VARIANTS if args.variants else ():
        runs[f"gnnflow, {name}"] = [
            run_in_child(_gnnflow, str(work / f"shards{seed}"), seed, args.threads, variant)
            for seed in range(args.seeds)
        ]
        print(_row(f"gnnflow, {name}", runs[f"gnnflow, {name}"]), flush=True)
    for hops in khop:
        name = f"gnnflow, trained on {hops}-hop subgraphs (khop_graphs)"
        runs[name] = [
            run_in_child(_gnnflow, str(work / f"khop{hops}_{seed}"), seed, args.threads, {})
            for seed in range(args.seeds)
        ]
        print(_row(name, runs[name]), flush=True)
    if args.variants:
        name = "DGL, atom columns one-hot, standardized"
        runs[name] = [
            run_in_child(_dgl, args.landing, seed, args.threads, "one_hot_standardized") for seed in range(args.seeds)
        ]
        print(_row(name, runs[name]), flush=True)
    print(f"\nBBBP (scaffold split), {args.seeds} seeds, {args.threads} threads; gnnflow's graph stages "
          f"{facts['graph_seconds']:.2f} s once, shards {facts['shard_seconds']:.2f} s per seed\n")  # fmt: skip
    print("| side | test ROC-AUC | median epoch, s | epochs run | peak RSS, GiB |\n|---|---|---|---|---|")
    for name, r in runs.items():
        print(_row(name, r))
    ours = statistics.median(r["epoch_seconds"] for r in runs["gnnflow"])
    theirs = statistics.median(r["epoch_seconds"] for r in runs["DGL"])
    print(f"\nepoch time gnnflow / DGL: {ours / theirs:.2f}x")
    pairs = [("gnnflow", "DGL", "each side's default encoding")]
    if args.variants:
        pairs += [
            ("gnnflow, atom columns as learned embeddings", "DGL", "both embedded"),
            ("gnnflow", "DGL, atom columns one-hot, standardized", "both one-hot, standardized"),
        ]
    for a, b, what in pairs if args.seeds > 1 else ():
        ours, theirs = [r["roc_auc"] for r in runs[a]], [r["roc_auc"] for r in runs[b]]
        se = (statistics.variance(ours) / len(ours) + statistics.variance(theirs) / len(theirs)) ** 0.5
        diff = statistics.mean(ours) - statistics.mean(theirs)
        print(f"test ROC-AUC gnnflow - DGL, {what}: {diff:+.4f} (standard error {se:.4f})")


if __name__ == "__main__":
    main()
