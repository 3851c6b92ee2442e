"""Framework comparison: PyG, DGL and gnnflow training the same model on the same graphs, one table.

    .venv/bin/python benchmarks/frameworks.py                              # cora, citeseer, DC-SBM 100k
    .venv/bin/python benchmarks/frameworks.py --graphs cora,citeseer --convs sage,gcn,gat --seeds 5 --repeat 1
    .venv/bin/python benchmarks/frameworks.py --graphs generated --nodes 1000000 --edges 10000000 --repeat 2
    make peers                                                             # installs PyG (the [peers] extra)

Graphs (--graphs): ``cora`` and ``citeseer`` from the repository's datasets/ (Planetoid split),
``generated`` the demo DC-SBM of ``graphs.synthetic.generate`` at --nodes / --edges rows; each is ingested
once (canonical graph and normalized adjacency, cached under --work). Every side trains the same
model, --layers = len(--fanouts) layers of each layer type in --convs (sage, gcn, gat; default sage)
with --hidden units, dropout --dropout before every layer, ReLU between, Adam --lr, on the same raw
features, fanouts, batch size, epochs, training nodes, torch threads and seeds (the Planetoid graphs,
140 and 120 training nodes, take --planetoid-epochs and --planetoid-batch-size instead, so that a run
has more than one step per epoch). Each side runs the layer as its users would for neighbour-sampled
minibatches:

sage     PyG ``SAGEConv(aggr="mean")``; DGL ``SAGEConv("mean")``; gnnflow ``model.conv: sage``, shards
         without added self loops (the blocks DGL samples).
gcn      symmetric normalization with self loops. PyG ``GCNConv`` (its defaults: a self loop per node
         added to the sampled subgraph, D^-1/2 (A+I) D^-1/2 over the subgraph's degrees); DGL
         ``GraphConv(norm="both")`` on ``dgl.add_self_loop(g)`` (the self loop a candidate neighbour like
         any other, degrees those of each sampled block); gnnflow ``model.conv: gcn``: each block's
         edges weighted by Â = D^-1/2 (A+I) D^-1/2 of the whole graph times the sampler's correction
         deg/sampled, each destination's self loop Â_vv added by the shards (``self_loops: true``).
gat      --heads heads of hidden / heads features, concatenated, in the hidden layers; 1 head (averaged)
         in the output layer; no attention dropout. PyG ``GATConv`` (self loops added to the sampled
         subgraph, its default); DGL ``GATConv`` on ``dgl.add_self_loop(g)``; gnnflow ``model.conv: gat``
         with ``model.heads`` = --heads, shards with each destination's self loop.

PyG      ``torch_geometric.loader.NeighborLoader`` (``num_neighbors`` = the fanouts from the seeds
         outwards, i.e. DGL's order reversed), PyG's example loop:
         ``model(batch.x, batch.edge_index)[:batch.batch_size]``; accuracy by full-graph inference over
         a ``SparseTensor`` adjacency.
DGL      ``dgl.dataloading.DataLoader`` + ``NeighborSampler`` (`benchmarks/train_vs_dgl.py`'s ``run_dgl``).
gnnflow  minibatch shards written once, then `training.train.train` reading them
         (`benchmarks/train_vs_dgl.py`'s ``run_ours``); a second row adds the shard-writing time
         divided over the epochs.

Each run of each side is a fresh spawned child (its peak RSS its own, `benchmarks/_child.py`); for
every seed (--seeds N on the Planetoid graphs: seeds --seed .. --seed+N-1; the generated graph: --seed)
the sides alternate --repeat times, so a burst of load on a shared machine hits each of them. Epoch
time is the training loop alone; the table shows the median over every epoch of every run, the
fastest and slowest epoch, the test accuracy of the final model (mean ± sample standard deviation
over the runs) and the largest peak RSS. Time to target: each side evaluates the validation accuracy
by full-graph inference after every epoch, outside the timed loop; a run's time to target is the
training seconds summed up to the first epoch whose validation accuracy reaches the graph's
--target-val-acc (default cora 0.75, citeseer 0.65: about three points under the test accuracy
GraphSAGE reaches on them in 30 epochs, so the figure measures how fast a side gets near its plateau
rather than small differences on it; generated 0.95), and the table shows the median over the runs that reached it and how
many did ("not reached" when none did); gnnflow's amortized row adds the shard writing per epoch
trained. Without PyG (or without its sampling library, torch-sparse or pyg-lib) the script says so
and compares DGL and gnnflow.
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
CONVS = ("sage", "gcn", "gat")
LAYER_NAMES = {"sage": "SAGEConv", "gcn": "GCNConv", "gat": "GATConv"}  # PyG's classes
DGL_LAYER_NAMES = {"sage": "SAGEConv", "gcn": "GraphConv", "gat": "GATConv"}
MODEL_NAMES = {"sage": "SAGE", "gcn": "GCN", "gat": "GAT"}
PLANETOID = ("cora", "citeseer")
DEFAULT_TARGETS = "cora=0.75,citeseer=0.65,generated=0.95"


def labels(conv: str) -> dict[str, str]:
    """Each side's row label for layer type `conv`."""
    return {
        "pyg": f"PyG NeighborLoader + {LAYER_NAMES[conv]}",
        "dgl": f"DGL DataLoader + {DGL_LAYER_NAMES[conv]}",
        "gnnflow": "gnnflow (reading shards)",
        "amortized": "gnnflow, shard writing amortized",
    }


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
    seeds: tuple[int, ...] = (0,)
    target: float | None = None  # validation accuracy the time-to-target column waits for

    @property
    def label(self) -> str:
        return self.name if self.name in PLANETOID else f"DC-SBM {self.nodes:,} nodes"


def parse_targets(text: str) -> dict[str, float]:
    """--target-val-acc: one accuracy for every graph ("0.7") or per graph ("cora=0.72,citeseer=0.62")."""
    if "=" not in text:
        return {name: float(text) for name in (*PLANETOID, "generated")}
    pairs = [p.split("=", 1) for p in text.split(",") if p]
    return {name.strip(): float(value) for name, value in pairs}


def graph_runs(args) -> list[GraphRun]:
    targets = parse_targets(args.target_val_acc)
    seed, n = args.seed, args.seeds
    runs = []
    for name in [g for g in args.graphs.split(",") if g]:
        if name in PLANETOID:
            seeds = tuple(range(seed, seed + n))
            runs.append(GraphRun(name, 0, 0, args.planetoid_epochs, args.planetoid_batch_size, seeds))
        elif name == "generated":
            runs.append(GraphRun(name, args.nodes, args.edges, args.epochs, args.batch_size, (seed,)))
        else:
            raise SystemExit(f"--graphs: unknown graph {name!r}; one of cora, citeseer, generated")
    return [dataclasses.replace(r, target=targets.get(r.name)) for r in runs]


def conv_list(text: str) -> list[str]:
    convs = [c for c in text.split(",") if c]
    unknown = [c for c in convs if c not in CONVS]
    if unknown or not convs:
        raise SystemExit(f"--convs: unknown layer type(s) {unknown}; a comma-separated choice of {', '.join(CONVS)}")
    return convs


# ------------------------------------------------------------------------------- ingest


def prepare(graph: GraphRun, work: Path) -> tuple[Path, Path]:
    """The graph's canonical graph and normalized adjacency under `work` (built once)."""
    if graph.name in PLANETOID:
        return train_vs_dgl.staged_inputs(DATASETS / graph.name, work / graph.name)
    tag = f"{graph.nodes}-{graph.edges}"
    return train_vs_dgl.staged_inputs(work / f"landing-{tag}", work / f"home-{tag}", (graph.nodes, graph.edges))


def _prepare(graph: GraphRun, work: str, queue) -> None:
    from graphs.stages.canonical import CanonicalGraph

    can, adj = prepare(graph, Path(work))
    summary = CanonicalGraph.open(can).summary
    queue.put({"can": str(can), "adj": str(adj), "nodes": summary["nodes"], "edges": summary["edges"]})


# ------------------------------------------------------------------------------- sides


def _in_child(side: str, can: str, adj: str, args, queue) -> None:
    """One run of one side in this fresh process; its peak RSS with it."""
    import torch

    from graphs.infra.storage import peak_rss_bytes

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
    """The canonical graph as a ``torch_geometric.data.Data``, its training nodes and the labelled
    val / test masks."""
    import pyarrow.parquet as pq
    import torch
    from torch_geometric.data import Data

    from graphs.stages.canonical import CanonicalGraph

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
    masks = {name: torch.from_numpy((split == name) & (label >= 0)) for name in ("val", "test")}
    return data, train_nids, masks


def pyg_model(args, in_feats: int, classes: int):
    """The PyG side's network, the same architecture as the DGL side's (`train_vs_dgl.dgl_model`):
    sage ``SAGEConv(aggr="mean")``, gcn ``GCNConv()``, gat ``GATConv`` with args.heads concatenated
    heads in hidden layers and one in the output layer (``concat=False``: averaged)."""
    import torch.nn.functional as F
    from torch import nn
    from torch_geometric.nn import GATConv, GCNConv, SAGEConv

    n = len(args.fanout_list)
    dims = [in_feats] + [args.hidden] * (n - 1) + [classes]

    def conv(a: int, b: int, last: bool) -> nn.Module:
        if args.conv == "sage":
            return SAGEConv(a, b, aggr="mean")
        if args.conv == "gcn":
            return GCNConv(a, b)  # self loops added, symmetric normalization
        heads = 1 if last else args.heads
        return GATConv(a, b // heads, heads=heads, concat=not last)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(conv(a, b, i == n - 1) for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])))
            self.dropout = nn.Dropout(args.dropout)

        def forward(self, x, edge_index):
            h = x
            for i, layer in enumerate(self.layers):
                h = layer(self.dropout(h), edge_index)
                if i != n - 1:
                    h = F.relu(h)
            return h

    return Net()


def run_pyg(can: Path, args) -> dict:
    """PyG's example loop (NeighborLoader, args.conv layers): seconds of each epoch, test accuracy and,
    with ``args.eval_each_epoch``, the validation accuracy after each epoch (untimed)."""
    import torch
    from torch_geometric.loader import NeighborLoader
    from torch_sparse import SparseTensor

    data, train_nids, masks = load_pyg_data(can)
    torch.manual_seed(args.seed)
    model = pyg_model(args, data.num_features, int(data.y.max()) + 1)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    # PyG's num_neighbors[0] is the seeds' own hop; DGL's (and gnnflow's) fanouts[0] the input layer's
    loader = NeighborLoader(
        data, num_neighbors=args.fanout_list[::-1], batch_size=args.batch_size, input_nodes=train_nids, shuffle=True
    )
    src, dst = data.edge_index
    # full-graph inference over a sparse adjacency: messages are never materialized per edge
    adj_t = SparseTensor(row=dst, col=src, sparse_sizes=(data.num_nodes, data.num_nodes))
    seconds, val_acc = [], []
    for _ in range(args.epochs):
        seconds.append(pyg_epoch(model, opt, loader))
        if args.eval_each_epoch:
            val_acc.append(pyg_accuracy(model, data, adj_t, masks["val"]))
    return {"epoch_seconds": seconds, "test_acc": pyg_accuracy(model, data, adj_t, masks["test"]), "val_acc": val_acc}


def pyg_epoch(model, opt, loader) -> float:
    """One epoch of PyG's example loop; its seconds."""
    import torch.nn.functional as F

    model.train()
    t0 = time.perf_counter()
    for batch in loader:
        out = model(batch.x, batch.edge_index)[: batch.batch_size]
        loss = F.cross_entropy(out, batch.y[: batch.batch_size])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


def pyg_accuracy(model, data, adj_t, mask) -> float:
    """Accuracy on `mask` by full-graph inference (eval mode: no dropout): over the sparse
    adjacency for sage and gcn; layer by layer over batches of nodes with all their in-edges for
    gat (`pyg_layerwise`)."""
    import torch

    model.eval()
    with torch.no_grad():
        gat = type(model.layers[0]).__name__ == "GATConv"
        pred = (pyg_layerwise(model, data) if gat else model(data.x, adj_t)).argmax(1)
    return float((pred[mask] == data.y[mask]).float().mean())


def pyg_layerwise(model, data, batch_size: int = 4096):
    """Every node's output computed layer by layer over `NeighborLoader` batches of nodes with every
    in-edge, as PyG's examples infer on large graphs: a ``GATConv`` call makes one message per edge
    and head, too much memory for a million-node graph's edges at once; the attention is
    normalized per destination, so the result is exact."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    structure = Data(edge_index=data.edge_index, num_nodes=data.num_nodes)
    loader = NeighborLoader(structure, num_neighbors=[-1], batch_size=batch_size, input_nodes=None, shuffle=False)
    h = data.x
    for i, layer in enumerate(model.layers):
        parts = [layer(h[b.n_id], b.edge_index)[: b.batch_size] for b in loader]
        h = torch.cat(parts)
        if i != len(model.layers) - 1:
            h = F.relu(h)
    return h


# ------------------------------------------------------------------------------- runs


def side_args(args, graph: GraphRun, conv: str, seed: int):
    """`args` with this graph's epochs, batch size and work folder, the layer type and the seed (what
    the sides read); each epoch's validation accuracy when the graph has a target."""
    ns = argparse.Namespace(**vars(args))
    ns.epochs, ns.batch_size, ns.conv, ns.seed = graph.epochs, graph.batch_size, conv, seed
    ns.eval_each_epoch = graph.target is not None
    ns.work = str(Path(args.work).resolve() / graph.name)
    return ns


def staged(graph: GraphRun, args) -> tuple[GraphRun, dict]:
    """The graph's canonical graph and adjacency (prepared in a child), and the graph with the sizes
    of a dataset filled in (its canonical graph's nodes and stored edges)."""
    paths = run_in_child(_prepare, graph, str(Path(args.work).resolve()))
    if graph.name in PLANETOID:
        graph = dataclasses.replace(graph, nodes=paths["nodes"], edges=paths["edges"])
    return graph, paths


def compare(graph: GraphRun, conv: str, paths: dict, args, sides: tuple[str, ...]) -> dict[str, list[dict]]:
    """For every seed, every side --repeat times, alternating, each run a fresh child."""
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for seed in graph.seeds:
        ns = side_args(args, graph, conv, seed)
        for _ in range(args.repeat):
            for side in sides:
                runs[side].append(run_in_child(_in_child, side, paths["can"], paths["adj"], ns))
    return runs


# ------------------------------------------------------------------------------- table


def seconds_to_target(run: dict, target: float, per_epoch: float = 0.0) -> float | None:
    """Training seconds (plus `per_epoch` for each epoch) up to the first epoch whose validation
    accuracy reaches `target`; None when none does."""
    total = 0.0
    for seconds, acc in zip(run["epoch_seconds"], run.get("val_acc", [])):
        total += seconds + per_epoch
        if acc >= target:
            return total
    return None


def side_row(rs: list[dict], target: float | None, per_epoch: float = 0.0) -> dict:
    """Median / min / max epoch (each plus `per_epoch`), test accuracy mean and sample standard
    deviation over the runs, peak RSS, and each run's time to `target`."""
    every = [s + per_epoch for r in rs for s in r["epoch_seconds"]]
    accs = [r["test_acc"] for r in rs]
    return {
        "median": float(np.median(every)),
        "min": min(every),
        "max": max(every),
        "acc": float(np.mean(accs)),
        "acc_std": float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0,
        "runs": len(rs),
        "rss": max(r["rss"] for r in rs),
        "to_target": [] if target is None else [seconds_to_target(r, target, per_epoch) for r in rs],
    }


def summarize(graph: GraphRun, runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per side (and gnnflow's amortized row, shard writing divided over the epochs): `side_row`."""
    rows = {side: side_row(rs, graph.target) for side, rs in runs.items()}
    if "gnnflow" in runs:
        shard = float(np.median([r["shard_seconds"] for r in runs["gnnflow"]])) / graph.epochs
        rows["amortized"] = side_row(runs["gnnflow"], graph.target, shard) | {"shard_seconds": shard * graph.epochs}
    return rows


def median_to_target(times: list[float | None]) -> float | None:
    reached = [t for t in times if t is not None]
    return float(np.median(reached)) if reached else None


def target_cell(times: list[float | None]) -> str:
    """'median s (reached/runs)', 'not reached (0/runs)', or '-' without a target."""
    if not times:
        return "-"
    reached = sum(t is not None for t in times)
    best = median_to_target(times)
    return f"not reached (0/{len(times)})" if best is None else f"{best:.2f} ({reached}/{len(times)})"


def model_name(conv: str, args) -> str:
    heads = f" ({args.heads} heads)" if conv == "gat" else ""
    return f"{MODEL_NAMES[conv]} {len(args.fanout_list)}x{args.hidden}{heads}"


TABLE_HEAD = (
    "| graph | model | side | epoch s median (min–max) | test acc % mean ± std | s to target val acc, median "
    "(runs reaching it) | peak RSS GB |\n| --- | --- | --- | --- | --- | --- | --- |"
)


def table_rows(graph: GraphRun, conv: str, rows: dict[str, dict], args) -> list[str]:
    """The Markdown rows of one graph and layer type (under `TABLE_HEAD`)."""
    runs = f"{len(graph.seeds)} seed(s) x {args.repeat} run(s)"
    target = "" if graph.target is None else f", target val acc {graph.target:g}"
    first = f"{graph.label} ({graph.epochs} epochs, batch {graph.batch_size}, {runs}{target})"
    out = []
    for i, (side, r) in enumerate(rows.items()):
        cells = [
            first if i == 0 else "",
            model_name(conv, args) if i == 0 else "",
            labels(conv)[side],
            f"{r['median']:.3f} ({r['min']:.3f}–{r['max']:.3f})",
            f"{100 * r['acc']:.2f} ± {100 * r['acc_std']:.2f}",
            target_cell(r["to_target"]),
            f"{r['rss'] / 2**30:.2f}",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def table(graph: GraphRun, conv: str, rows: dict[str, dict], args) -> str:
    """One graph and layer type: a heading line and its Markdown table."""
    head = (
        f"{graph.label}: {model_name(conv, args)}, fanouts {args.fanouts}, batch {graph.batch_size}, "
        f"{graph.epochs} epochs x {args.repeat} alternating runs, seeds {', '.join(map(str, graph.seeds))}"
    )
    return "\n".join([head, TABLE_HEAD, *table_rows(graph, conv, rows, args)])


def records(graph: GraphRun, conv: str, rows: dict[str, dict], args) -> list[harness.Record]:
    """gnnflow against each peer: epoch from shards, epoch with shard writing amortized, accuracy,
    and the time to the target validation accuracy where both reached it."""
    model = f"{model_name(conv, args)}, fanouts {args.fanouts}"
    common = {"benchmark": "frameworks", "nodes": graph.nodes, "edges": graph.edges}
    runs = f"{graph.epochs} epochs x {args.repeat} alternating runs; batch {graph.batch_size}"
    if len(graph.seeds) > 1:
        runs += f"; seeds {graph.seeds[0]}-{graph.seeds[-1]}"
    out = []
    ours, amortized = rows["gnnflow"], rows["amortized"]
    for peer in (s for s in ("pyg", "dgl") if s in rows):
        theirs, name = rows[peer], labels(conv)[peer]
        epoch = dict(metric="seconds per epoch (median)", peer=theirs["median"], peer_name=name)
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
                peer_name=name,
                notes=f"gnnflow - {peer} = {100 * (ours['acc'] - theirs['acc']):+.2f} points (target: within 0.5); "
                f"std over {ours['runs']} runs {100 * ours['acc_std']:.2f} vs {100 * theirs['acc_std']:.2f}",
            ),
        ]
        out += target_records(graph, model, ours, theirs, name, common)
    return out


def target_records(graph: GraphRun, model: str, ours: dict, theirs: dict, name: str, common: dict) -> list:
    """The time-to-target record of one peer, when both sides reached the target in some run."""
    mine, peer = median_to_target(ours["to_target"]), median_to_target(theirs["to_target"])
    if mine is None or peer is None:
        return []
    return [
        harness.Record(
            **common,
            stage=f"{graph.label}: training seconds to validation accuracy {graph.target:g}, {model}",
            metric="seconds (median over the runs reaching it)",
            ours=mine,
            peer=peer,
            peer_name=name,
            notes=f"reached in {target_cell(ours['to_target'])} vs {target_cell(theirs['to_target'])} runs",
        )
    ]


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default="cora,citeseer,generated", help="comma-separated: cora, citeseer, generated")
    ap.add_argument("--convs", default="sage", help=f"comma-separated layer types, of {', '.join(CONVS)}")
    ap.add_argument("--nodes", type=int, default=100_000, help="nodes of the generated graph")
    ap.add_argument("--edges", type=int, default=1_000_000, help="edge rows of the generated graph")
    ap.add_argument("--work", default="bench_out/frameworks")
    ap.add_argument("--epochs", type=int, default=3, help="epochs on the generated graph")
    ap.add_argument("--batch-size", type=int, default=1024, help="batch size on the generated graph")
    ap.add_argument("--planetoid-epochs", type=int, default=30)
    ap.add_argument("--planetoid-batch-size", type=int, default=32)
    ap.add_argument("--fanouts", default="10,5", help="DGL's order: fanouts[0] is the input layer's")
    ap.add_argument("--hidden", type=int, default=128, help="hidden width (all heads together for gat)")
    ap.add_argument("--heads", type=int, default=4, help="gat: heads of every hidden layer (output layer: 1)")
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--seed", type=int, default=0, help="the first seed")
    ap.add_argument("--seeds", type=int, default=1, help="Planetoid graphs: seeds --seed .. --seed+N-1")
    ap.add_argument(
        "--target-val-acc",
        default=DEFAULT_TARGETS,
        help="validation accuracy the time-to-target column waits for: one value, or graph=value pairs",
    )
    ap.add_argument("--threads", type=int, default=0, help="OpenMP/torch threads of every side; 0 = default")
    ap.add_argument("--repeat", type=int, default=2, help="alternating runs of every side, per seed")
    ap.add_argument("--skip-pyg", action="store_true", help="compare DGL and gnnflow only")
    ap.add_argument("--record", help="append result records here (benchmarks/harness.py)")
    args = ap.parse_args(argv)
    args.fanout_list = [int(f) for f in args.fanouts.split(",")]
    # what train_vs_dgl's sides read besides the above: raw features on every side, default kernels
    args.feature_norm, args.aggregation, args.peer_host_memory, args.keep = "none", "", "default", False
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:  # before torch and DGL start their OpenMP pools (the children inherit it)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    convs = conv_list(args.convs)
    missing = "--skip-pyg" if args.skip_pyg else pyg_missing()
    if missing:
        print(f"PyG left out: {missing}; comparing DGL and gnnflow")
    sides = tuple(s for s in SIDES if not (missing and s == "pyg"))
    every_row = []
    for graph in graph_runs(args):
        graph, paths = staged(graph, args)
        for conv in convs:
            rows = summarize(graph, compare(graph, conv, paths, args, sides))
            print(table(graph, conv, rows, args), end="\n\n", flush=True)
            every_row += table_rows(graph, conv, rows, args)
            harness.emit(args.record, records(graph, conv, rows, args))
    if len(every_row) > len(sides) + 1:  # more than one table: all of them in one
        print("\n".join(["All runs:", TABLE_HEAD, *every_row]), flush=True)


if __name__ == "__main__":
    main()
