"""Framework comparison: PyG, DGL and gnnflow training the same model on the same graphs, one table.

    .venv/bin/python benchmarks/frameworks.py                              # cora, citeseer, DC-SBM 100k
    .venv/bin/python benchmarks/frameworks.py --graphs generated --nodes 1000000 --edges 10000000 --repeat 2
    make peers                                                             # installs PyG (the [peers] extra)

Graphs (--graphs): ``cora`` and ``citeseer`` from the repository's datasets/ (Planetoid split),
``generated`` the demo DC-SBM of ``graphs.generate`` at --nodes / --edges rows; each is ingested
once (canonical graph and normalized adjacency, cached under --work). Every side trains the same
model, GraphSAGE-mean with --layers = len(--fanouts) layers of --hidden units, dropout before every
layer, Adam --lr, on the same raw features, fanouts, batch size, epochs, training nodes, torch
threads and seed (the Planetoid graphs, 140 and 120 training nodes, take --planetoid-epochs and
--planetoid-batch-size instead, so that a run has more than one step per epoch):

PyG      ``torch_geometric.loader.NeighborLoader`` (``num_neighbors`` = the fanouts from the seeds
         outwards, i.e. DGL's order reversed) and ``torch_geometric.nn.SAGEConv``, PyG's example loop:
         ``model(batch.x, batch.edge_index)[:batch.batch_size]``; test accuracy by full-graph
         inference over a ``SparseTensor`` adjacency.
DGL      ``dgl.dataloading.DataLoader`` + ``NeighborSampler`` and ``dgl.nn.SAGEConv``
         (`benchmarks/train_vs_dgl.py`'s ``run_dgl``).
gnnflow  minibatch shards written once, then `training.train.train` reading them
         (`benchmarks/train_vs_dgl.py`'s ``run_ours``); a second row adds the shard-writing time
         divided over the epochs.

Each run of each side is a fresh spawned child (its peak RSS its own, `benchmarks/_child.py`); the
sides alternate --repeat times, so a burst of load on a shared machine hits each of them. Epoch time
is the training loop alone (evaluation excluded); the table shows the median over every epoch of
every repeat, the fastest and slowest epoch, the mean test accuracy and the largest peak RSS.
Without PyG (or without its sampling library, torch-sparse or pyg-lib) the script says so and
compares DGL and gnnflow.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import harness  # noqa: E402  (benchmarks/harness.py)
import numpy as np  # noqa: E402
import train_vs_dgl  # noqa: E402  (benchmarks/train_vs_dgl.py: the DGL and gnnflow sides)
from _child import run_in_child  # noqa: E402  (benchmarks/_child.py)

REPO = Path(__file__).resolve().parents[1]
DATASETS = REPO / "datasets"
SIDES = ("pyg", "dgl", "gnnflow")
LABELS = {
    "pyg": "PyG NeighborLoader + SAGEConv",
    "dgl": "DGL DataLoader + SAGEConv",
    "gnnflow": "gnnflow (reading shards)",
}
PLANETOID = ("cora", "citeseer")


def pyg_missing() -> str:
    """Why PyG cannot run here ('' when it can): the package, or a neighbour-sampling backend."""
    if importlib.util.find_spec("torch_geometric") is None:
        return "torch_geometric is not installed (`make peers` installs the [peers] extra)"
    if not any(importlib.util.find_spec(m) for m in ("pyg_lib", "torch_sparse")):
        return "NeighborLoader needs pyg-lib or torch-sparse, neither is installed (`make peers` builds torch-sparse)"
    return ""


@dataclasses.dataclass(frozen=True)
class GraphRun:
    """One graph of the comparison and the per-graph settings every side uses on it."""

    name: str
    nodes: int
    edges: int
    epochs: int
    batch_size: int

    @property
    def label(self) -> str:
        return self.name if self.name in PLANETOID else f"DC-SBM {self.nodes:,} nodes"


def graph_runs(args) -> list[GraphRun]:
    runs = []
    for name in [g for g in args.graphs.split(",") if g]:
        if name in PLANETOID:
            runs.append(GraphRun(name, 0, 0, args.planetoid_epochs, args.planetoid_batch_size))
        elif name == "generated":
            runs.append(GraphRun(name, args.nodes, args.edges, args.epochs, args.batch_size))
        else:
            raise SystemExit(f"--graphs: unknown graph {name!r}; one of cora, citeseer, generated")
    return runs


# ------------------------------------------------------------------------------- ingest


def prepare(graph: GraphRun, work: Path) -> tuple[Path, Path]:
    """The graph's canonical graph and normalized adjacency under `work` (built once)."""
    if graph.name in PLANETOID:
        return train_vs_dgl.staged_inputs(DATASETS / graph.name, work / graph.name)
    tag = f"{graph.nodes}-{graph.edges}"
    return train_vs_dgl.staged_inputs(work / f"landing-{tag}", work / f"home-{tag}", (graph.nodes, graph.edges))


def _prepare(graph: GraphRun, work: str, queue) -> None:
    from graphs.canonical import CanonicalGraph

    can, adj = prepare(graph, Path(work))
    summary = CanonicalGraph.open(can).summary
    queue.put({"can": str(can), "adj": str(adj), "nodes": summary["nodes"], "edges": summary["edges"]})


# ------------------------------------------------------------------------------- sides


def _in_child(side: str, can: str, adj: str, args, queue) -> None:
    """One run of one side in this fresh process; its peak RSS with it."""
    import torch

    from graphs.storage import peak_rss_bytes

    if args.threads:
        torch.set_num_threads(args.threads)
    if side == "pyg":
        r = run_pyg(Path(can), args)
    elif side == "dgl":
        r = train_vs_dgl.run_dgl(Path(can), args)
    else:
        r = train_vs_dgl.run_ours(Path(can), Path(adj), args)
    queue.put(r | {"rss": peak_rss_bytes()})


def load_pyg_data(can: Path):
    """The canonical graph as a ``torch_geometric.data.Data``, its training nodes and test mask."""
    import pyarrow.parquet as pq
    import torch
    from torch_geometric.data import Data

    from graphs.canonical import CanonicalGraph

    graph = CanonicalGraph.open(can)
    edges = pq.read_table(graph.edges_path, columns=["src", "dst"])
    nodes = pq.read_table(graph.nodes_path, columns=["label", "split"]).to_pandas()
    src = torch.from_numpy(edges.column("src").to_numpy().astype(np.int64))
    dst = torch.from_numpy(edges.column("dst").to_numpy().astype(np.int64))
    label = nodes.label.to_numpy().astype(np.int64)
    split = nodes.split.to_numpy()
    data = Data(
        x=torch.from_numpy(np.load(graph.features_path)),
        y=torch.from_numpy(label),
        edge_index=torch.stack([src, dst]),  # messages flow src -> dst, as in DGL
        num_nodes=len(nodes),
    )
    train_nids = torch.from_numpy(np.flatnonzero((split == "train") & (label >= 0)))
    test_mask = torch.from_numpy((split == "test") & (label >= 0))
    return data, train_nids, test_mask


def pyg_sage(in_feats: int, hidden: int, classes: int, layers: int, dropout: float):
    """GraphSAGE-mean in PyG, the same architecture as the DGL side's."""
    import torch.nn.functional as F
    from torch import nn
    from torch_geometric.nn import SAGEConv

    class SAGE(nn.Module):
        def __init__(self):
            super().__init__()
            dims = [in_feats] + [hidden] * (layers - 1) + [classes]
            self.layers = nn.ModuleList(SAGEConv(a, b, aggr="mean") for a, b in zip(dims[:-1], dims[1:]))
            self.dropout = nn.Dropout(dropout)

        def forward(self, x, edge_index):
            h = x
            for i, layer in enumerate(self.layers):
                h = layer(self.dropout(h), edge_index)
                if i != len(self.layers) - 1:
                    h = F.relu(h)
            return h

    return SAGE()


def run_pyg(can: Path, args) -> dict:
    """PyG's example loop (NeighborLoader, SAGEConv); seconds of each epoch and test accuracy."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.loader import NeighborLoader
    from torch_sparse import SparseTensor

    data, train_nids, test_mask = load_pyg_data(can)
    torch.manual_seed(args.seed)
    classes = int(data.y.max()) + 1
    model = pyg_sage(data.num_features, args.hidden, classes, len(args.fanout_list), args.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    # PyG's num_neighbors[0] is the seeds' own hop; DGL's (and gnnflow's) fanouts[0] the input layer's
    loader = NeighborLoader(
        data, num_neighbors=args.fanout_list[::-1], batch_size=args.batch_size, input_nodes=train_nids, shuffle=True
    )
    seconds = []
    for _ in range(args.epochs):
        model.train()
        t0 = time.perf_counter()
        for batch in loader:
            out = model(batch.x, batch.edge_index)[: batch.batch_size]
            loss = F.cross_entropy(out, batch.y[: batch.batch_size])
            opt.zero_grad()
            loss.backward()
            opt.step()
        seconds.append(time.perf_counter() - t0)
    model.eval()
    src, dst = data.edge_index
    # full-graph inference over a sparse adjacency: messages are never materialized per edge
    adj_t = SparseTensor(row=dst, col=src, sparse_sizes=(data.num_nodes, data.num_nodes))
    with torch.no_grad():
        pred = model(data.x, adj_t).argmax(1)
    acc = float((pred[test_mask] == data.y[test_mask]).float().mean())
    return {"epoch_seconds": seconds, "test_acc": acc}


# ------------------------------------------------------------------------------- table


def side_args(args, graph: GraphRun):
    """`args` with this graph's epochs, batch size and work folder (what the sides read)."""
    ns = argparse.Namespace(**vars(args))
    ns.epochs, ns.batch_size = graph.epochs, graph.batch_size
    ns.work = str(Path(args.work).resolve() / graph.name)
    return ns


def compare(graph: GraphRun, args, sides: tuple[str, ...]) -> tuple[GraphRun, dict[str, list[dict]]]:
    """Every side --repeat times, alternating, each run a fresh child; the graph with the sizes of
    a dataset filled in (its canonical graph's nodes and stored edges)."""
    paths = run_in_child(_prepare, graph, str(Path(args.work).resolve()))
    if graph.name in PLANETOID:
        graph = dataclasses.replace(graph, nodes=paths["nodes"], edges=paths["edges"])
    ns = side_args(args, graph)
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for _ in range(args.repeat):
        for side in sides:
            runs[side].append(run_in_child(_in_child, side, paths["can"], paths["adj"], ns))
    return graph, runs


def summarize(graph: GraphRun, runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per side (and gnnflow's amortized row): median / min / max epoch, mean accuracy, peak RSS."""
    rows = {}
    for side, rs in runs.items():
        every = [s for r in rs for s in r["epoch_seconds"]]
        rows[side] = {
            "median": float(np.median(every)),
            "min": min(every),
            "max": max(every),
            "acc": float(np.mean([r["test_acc"] for r in rs])),
            "rss": max(r["rss"] for r in rs),
        }
    if "gnnflow" in runs:
        shard = float(np.median([r["shard_seconds"] for r in runs["gnnflow"]])) / graph.epochs
        rows["amortized"] = {k: v + shard if k in ("median", "min", "max") else v for k, v in rows["gnnflow"].items()}
        rows["amortized"]["shard_seconds"] = shard * graph.epochs
    return rows


def table(graph: GraphRun, rows: dict[str, dict], args) -> str:
    head = (
        f"{graph.label}: SAGE-mean {len(args.fanout_list)}x{args.hidden}, fanouts {args.fanouts}, batch "
        f"{graph.batch_size}, {graph.epochs} epochs x {args.repeat} alternating runs, seed {args.seed}"
    )
    lines = [
        head,
        f"{'':34s} {'epoch s median':>14s} {'min':>7s} {'max':>7s} {'test acc %':>10s} {'peak RSS GB':>11s}",
    ]
    labels = LABELS | {"amortized": "gnnflow, shard writing amortized"}
    for side, r in rows.items():
        lines.append(
            f"{labels[side]:34s} {r['median']:14.3f} {r['min']:7.3f} {r['max']:7.3f} {100 * r['acc']:10.2f} "
            f"{r['rss'] / 2**30:11.2f}"
        )
    return "\n".join(lines)


def records(graph: GraphRun, rows: dict[str, dict], args) -> list[harness.Record]:
    """gnnflow against each peer: epoch from shards, epoch with shard writing amortized, accuracy."""
    model = f"SAGE {len(args.fanout_list)}x{args.hidden}, fanouts {args.fanouts}"
    common = {"benchmark": "frameworks", "nodes": graph.nodes, "edges": graph.edges}
    runs = f"{graph.epochs} epochs x {args.repeat} alternating runs; batch {graph.batch_size}"
    out = []
    ours, amortized = rows["gnnflow"], rows["amortized"]
    for peer in (s for s in ("pyg", "dgl") if s in rows):
        theirs = rows[peer]
        epoch = dict(metric="seconds per epoch (median)", peer=theirs["median"], peer_name=LABELS[peer])
        out += [
            harness.Record(
                **common,
                **epoch,
                stage=f"{graph.label}: training epoch from shards, {model}",
                ours=ours["median"],
                max_ratio=1.0,
                ours_rss_bytes=ours["rss"],
                peer_rss_bytes=theirs["rss"],
                notes=f"{runs}; epochs {ours['min']:.3g}-{ours['max']:.3g} s vs {theirs['min']:.3g}-{theirs['max']:.3g} s",
            ),
            harness.Record(
                **common,
                **epoch,
                stage=f"{graph.label}: training epoch, shard writing amortized, {model}",
                ours=amortized["median"],
                notes=f"shard writing {amortized['shard_seconds']:.1f} s divided over {graph.epochs} epochs",
            ),
            harness.Record(
                **common,
                stage=f"{graph.label}: test accuracy, {model}",
                metric="test accuracy %",
                ours=100 * ours["acc"],
                peer=100 * theirs["acc"],
                peer_name=LABELS[peer],
                notes=f"gnnflow - {peer} = {100 * (ours['acc'] - theirs['acc']):+.2f} points (target: within 0.5)",
            ),
        ]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default="cora,citeseer,generated", help="comma-separated: cora, citeseer, generated")
    ap.add_argument("--nodes", type=int, default=100_000, help="nodes of the generated graph")
    ap.add_argument("--edges", type=int, default=1_000_000, help="edge rows of the generated graph")
    ap.add_argument("--work", default="bench_out/frameworks")
    ap.add_argument("--epochs", type=int, default=3, help="epochs on the generated graph")
    ap.add_argument("--batch-size", type=int, default=1024, help="batch size on the generated graph")
    ap.add_argument("--planetoid-epochs", type=int, default=30)
    ap.add_argument("--planetoid-batch-size", type=int, default=32)
    ap.add_argument("--fanouts", default="10,5", help="DGL's order: fanouts[0] is the input layer's")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="OpenMP/torch threads of every side; 0 = default")
    ap.add_argument("--repeat", type=int, default=2, help="alternating runs of every side")
    ap.add_argument("--skip-pyg", action="store_true", help="compare DGL and gnnflow only")
    ap.add_argument("--record", help="append result records here (benchmarks/harness.py)")
    args = ap.parse_args(argv)
    if args.threads:  # before torch and DGL start their OpenMP pools (the children inherit it)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    args.fanout_list = [int(f) for f in args.fanouts.split(",")]
    # what train_vs_dgl's sides read besides the above: raw features on every side, default kernels
    args.feature_norm, args.aggregation, args.peer_host_memory, args.keep = "none", "", "default", False
    missing = "--skip-pyg" if args.skip_pyg else pyg_missing()
    if missing:
        print(f"PyG left out: {missing}; comparing DGL and gnnflow")
    sides = tuple(s for s in SIDES if not (missing and s == "pyg"))
    for graph in graph_runs(args):
        graph, runs = compare(graph, args, sides)
        rows = summarize(graph, runs)
        print(table(graph, rows, args), end="\n\n", flush=True)
        harness.emit(args.record, records(graph, rows, args))


if __name__ == "__main__":
    main()
