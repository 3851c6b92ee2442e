"""Typed graphs: gnnflow's R-GCN beside DGL's on the same typed graph, split, model and settings.

    .venv/bin/python benchmarks/typed_vs_dgl.py                          # 20k users, R-GCN 2 x 64, 10 epochs
    .venv/bin/python benchmarks/typed_vs_dgl.py --users 100000 --repeat 3 --num-bases 2
    .venv/bin/python benchmarks/typed_vs_dgl.py --dataset datasets/cora-typed --batch-size 32 --epochs 30

The graph is `graphs.synthetic.typed` (users, items, categories; the users' planted segment is the
label; users and items have features of different widths, categories none), or with --dataset a
typed landing folder such as datasets/cora-typed (papers and the words they use); it is ingested
once with ``add_reverse`` (canonical_graph, normalized_adjacency; cached under --work). Both sides train the
same network on the same training users, with the same fanouts (drawn over a node's in-edges of
every relation together), batch size, epochs, Adam learning rate, dropout, torch threads and seed:

- input: a linear map per featured node type (users 16 -> hidden, items 8 -> hidden), and a learned
  vector per node for the featureless type (``nn.Embedding(sparse=True)`` stepped by ``SparseAdam``);
- len(--fanouts) R-GCN layers over every relation (the given ones and their reverses): DGL's
  ``dgl.nn.RelGraphConv(regularizer="basis" when --num-bases, self_loop=True)`` with ``norm`` =
  1 / (the destination's sampled in-edges of that relation), i.e. the mean per relation that
  gnnflow's ``rgcn`` computes; dropout before every layer, ReLU between.

DGL     ``dgl.to_homogeneous`` layout (node types in blocks of ids, ``dgl.ETYPE`` per edge) built from
        the canonical typed edges, ``dgl.dataloading.DataLoader`` + ``NeighborSampler``: DGL's R-GCN
        entity-classification example (examples/pytorch/rgcn/entity_sample.py) with features;
gnnflow minibatch shards written once, then `training.train.train` (``model.conv: rgcn``) reading them;
        the amortized row adds the shard writing divided over the epochs.

Each run of each side is a fresh spawned child (its peak RSS its own), the sides alternate --repeat
times. Epoch time is the training loop alone (median, best and worst over every epoch of every
run); accuracy is each run's final model on the test users by full-graph inference (mean ± sample
standard deviation). Results: benchmarks/results/typed_vs_dgl-<users>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from _child import run_in_child  # noqa: E402  (benchmarks/_child.py)
from typed_dgl_hetero import optimizers, run_dgl_hetero, timed_epochs  # noqa: E402  (benchmarks/typed_dgl_hetero.py)

from graphs.stages.normalize import Adjacency  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--dataset", help="a typed landing folder to read instead of generating one")
    ap.add_argument("--fanouts", default="10,10")
    ap.add_argument(
        "--conv", choices=("rgcn", "sage"), default="rgcn",
        help="rgcn: R-GCN beside DGL's RelGraphConv; sage: a SAGE layer per relation, summed, beside DGL's "
        "HeteroGraphConv on a heterograph (both sampling each relation's fanout)",
    )  # fmt: skip
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--num-bases", type=int, default=0, help="basis decomposition (0: a weight per relation)")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--dgl-embedding-init", choices=("torch", "gnnflow"), default="torch",
        help="DGL's learned vectors: nn.Embedding's N(0, 1) (its users' default) or gnnflow's N(0, 1/hidden)",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch intra-op threads, both sides")
    ap.add_argument("--work", default=str(REPO / "bench_out" / "typed_vs_dgl"))
    ap.add_argument("--no-write", action="store_true", help="do not write benchmarks/results/typed_vs_dgl-<users>.json")
    args = ap.parse_args(argv)
    args.fanout_list = [int(f) for f in args.fanouts.split(",")]
    return args


# ----------------------------------------------------------------------------- the graph


def prepare(args) -> tuple[Path, Path]:
    """(canonical, adjacency) folders of the generated typed graph, built once per size and seed."""
    root = Path(args.work).resolve() / (
        Path(args.dataset).name if args.dataset else f"users{args.users}-seed{args.seed}"
    )
    can, adj = root / "canonical_graph", root / "normalized_adjacency"
    if args.dataset or not (adj / Adjacency.SUMMARY).exists():
        run_in_child(_prepare, str(root), args.users, args.seed, args.dataset)
    return can, adj


def _prepare(root: str, users: int, seed: int, dataset: str | None, queue) -> None:
    from graphs.stages.canonical import CanonicalConfig, build_canonical_graph
    from graphs.stages.normalize import build_normalized_adjacency
    from graphs.synthetic.typed import generate_typed

    root = Path(root)
    shutil.rmtree(root, ignore_errors=True)
    landing = root / "landing" / "typed"
    if dataset:
        shutil.copytree(dataset, landing)
    else:
        generate_typed(landing, users, seed=seed)
    build_canonical_graph(landing, root / "canonical_graph", CanonicalConfig(add_reverse=True))
    build_normalized_adjacency(root / "canonical_graph", root / "normalized_adjacency")
    queue.put({})


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _in_child(side: str, can: str, adj: str, args, queue) -> None:
    import torch

    torch.set_num_threads(args.threads)
    if side == "gnnflow":
        result = run_ours(Path(can), Path(adj), args)
    else:
        result = (run_dgl if args.conv == "rgcn" else run_dgl_hetero)(Path(can), args)
    result["peak_rss"] = _peak_rss()
    queue.put(result)


# ----------------------------------------------------------------------------- DGL


def dgl_inputs(can: Path):
    """The typed canonical graph as DGL's homogeneous layout (``dgl.ETYPE`` per edge), its padded
    features, labels, training users, val / test masks and schema."""
    import dgl
    import pyarrow.parquet as pq
    import torch

    from graphs.formats.canonical_files import CanonicalGraph
    from graphs.formats.graph_schema import TypedSchema

    graph = CanonicalGraph.open(can)
    typed = TypedSchema.read(can)
    edges = pq.read_table(graph.path(graph.TYPED_EDGES)).to_pandas()
    nodes = pq.read_table(graph.nodes_path, columns=["label", "split"]).to_pandas()
    g = dgl.graph(
        (torch.from_numpy(edges.src.to_numpy()), torch.from_numpy(edges.dst.to_numpy())), num_nodes=len(nodes)
    )
    g.edata[dgl.ETYPE] = torch.from_numpy(edges.etype.to_numpy().astype(np.int64))
    # no type with features: every type learns its vectors, the rows are never read
    feat = np.load(graph.features_path) if graph.has_features else np.zeros((len(nodes), 1), np.float32)
    g.ndata["feat"] = torch.from_numpy(feat)
    g.ndata["label"] = torch.from_numpy(nodes.label.to_numpy().astype(np.int64))
    g.ndata["ntype"] = torch.from_numpy(typed.node_types_of(np.arange(len(nodes))))
    split, labelled = nodes.split.to_numpy(), nodes.label.to_numpy() >= 0
    train_nids = torch.from_numpy(np.flatnonzero((split == "train") & labelled))
    masks = {name: torch.from_numpy((split == name) & labelled) for name in ("val", "test")}
    return g, train_nids, masks, typed


def relation_mean_norm(dst, etype, relations: int):
    """[E, 1]: 1 / (the destination's in-edges of the edge's relation): RelGraphConv's ``norm``
    for a mean per relation."""
    import torch

    key = dst * relations + etype
    counts = torch.bincount(key)
    return (1.0 / counts[key].float()).unsqueeze(1)


def dgl_model(args, typed, classes: int):
    """Per-type input (linear or sparse embedding) and len(fanouts) RelGraphConv layers."""
    import dgl
    import dgl.nn as dglnn
    import torch
    import torch.nn.functional as F
    from torch import nn

    schema, relations = typed.schema, len(typed.schema.relations)
    layers = len(args.fanout_list)
    dims = [args.hidden] * layers + [classes]
    bases = args.num_bases if 0 < args.num_bases < relations else None
    offsets = torch.from_numpy(typed.offsets)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.ModuleDict(
                {t: nn.Linear(w, args.hidden) for t, w in zip(schema.node_types, typed.feat_widths) if w}
            )
            self.embed = nn.ModuleDict(
                {
                    t: nn.Embedding(c, args.hidden, sparse=True)
                    for t, w, c in zip(schema.node_types, typed.feat_widths, typed.counts)
                    if not w
                }
            )
            if args.dgl_embedding_init == "gnnflow":
                for e in self.embed.values():
                    nn.init.normal_(e.weight, std=args.hidden**-0.5)
            self.convs = nn.ModuleList(
                dglnn.RelGraphConv(dims[i], dims[i + 1], relations, "basis" if bases else None, bases, self_loop=True)
                for i in range(layers)
            )
            self.dropout = nn.Dropout(args.dropout)

        def inputs(self, nids, ntype, feat):
            h = feat.new_zeros(len(nids), args.hidden)
            for i, (t, w) in enumerate(zip(schema.node_types, typed.feat_widths)):
                rows = (ntype == i).nonzero().view(-1)
                part = self.proj[t](feat[rows, :w]) if w else self.embed[t](nids[rows] - offsets[i])
                h = h.index_copy(0, rows, part)
            return h

        def forward(self, blocks, h):
            for i, (block, conv) in enumerate(zip(blocks, self.convs)):
                etype = block.edata[dgl.ETYPE]
                norm = relation_mean_norm(block.edges()[1], etype, relations)
                h = conv(block, self.dropout(h), etype, norm)
                if i < layers - 1:
                    h = F.relu(h)
            return h

    model = Net()
    return model, optimizers(model, args.lr)


def run_dgl(can: Path, args) -> dict:
    import dgl
    import torch
    import torch.nn.functional as F

    g, train_nids, masks, typed = dgl_inputs(can)
    torch.manual_seed(args.seed)
    dgl.seed(args.seed)
    classes = int(g.ndata["label"].max()) + 1
    model, opts = dgl_model(args, typed, classes)
    sampler = dgl.dataloading.NeighborSampler(args.fanout_list, prefetch_node_feats=["feat", "ntype", "label"])
    loader = dgl.dataloading.DataLoader(g, train_nids, sampler, batch_size=args.batch_size, shuffle=True)

    def loss_of(input_nodes, _, blocks):
        x = model.inputs(input_nodes, blocks[0].srcdata["ntype"], blocks[0].srcdata["feat"])
        return F.cross_entropy(model(blocks, x), blocks[-1].dstdata["label"])

    seconds = timed_epochs(model, opts, loader, args.epochs, loss_of)
    model.eval()
    with torch.no_grad():
        full = dgl.to_block(g, torch.arange(g.num_nodes()), include_dst_in_src=True)
        full.edata[dgl.ETYPE] = g.edata[dgl.ETYPE][full.edata[dgl.EID]]
        x = model.inputs(torch.arange(g.num_nodes()), g.ndata["ntype"], g.ndata["feat"])
        pred = model([full] * len(args.fanout_list), x).argmax(1)
    test = masks["test"]
    acc = float((pred[test] == g.ndata["label"][test]).float().mean())
    return {"epoch_seconds": seconds, "test_acc": acc}


# ----------------------------------------------------------------------------- gnnflow


def run_ours(can: Path, adj: Path, args) -> dict:
    import pyarrow.parquet as pq

    from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
    from training.config import RunConfig
    from training.outputs import METRICS
    from training.train import train

    work = Path(args.work).resolve() / "ours"
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    write_minibatch_shards(
        load_shard_inputs(can, adj),
        work / "minibatch_shards",
        ShardConfig(
            fanouts=args.fanouts,
            batch_size=args.batch_size,
            epochs=args.epochs,
            world_size=1,
            seed=args.seed,
            # sage: the fanout of every relation, as DGL's sampler on a heterograph draws it
            samplers={"neighbor": {"per_relation": args.conv != "rgcn"}},
        ),
    )
    shard_seconds = time.perf_counter() - t0
    cfg = RunConfig.from_dict(
        {
            "model": {
                "conv": args.conv,
                "hidden": args.hidden,
                "num_layers": len(args.fanout_list),
                "dropout": args.dropout,
                "num_bases": args.num_bases,
            },
            "training": {
                "epochs": args.epochs,
                "optimizer": {"type": "Adam", "lr": args.lr},
                "profiler": "none",
                "eval_every": args.epochs,
                "early_stopping_patience": 0,
                "feature_norm": "none",  # DGL's loop feeds the features as they are
                "checkpoint_every": args.epochs,
                "seed": args.seed,
            },
            "paths": {"shards": str(work / "minibatch_shards"), "out": str(work / "trained_model")},
        }
    )
    summary = train(cfg)
    metrics = pq.read_table(work / "trained_model" / METRICS).to_pandas()
    shutil.rmtree(work, ignore_errors=True)
    return {
        "epoch_seconds": metrics.train_seconds.tolist(),
        "test_acc": summary["final_test_acc"],
        "shard_seconds": shard_seconds,
    }


# ----------------------------------------------------------------------------- table


def side_row(runs: list[dict], amortize: bool = False) -> dict:
    epochs = [s for r in runs for s in r["epoch_seconds"]]
    extra = statistics.median(r["shard_seconds"] / len(r["epoch_seconds"]) for r in runs) if amortize else 0.0
    accs = [r["test_acc"] for r in runs]
    return {
        "median_epoch_s": statistics.median(epochs) + extra,
        "best_epoch_s": min(epochs) + extra,
        "worst_epoch_s": max(epochs) + extra,
        "test_acc_mean": statistics.mean(accs),
        "test_acc_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
        "peak_rss_gb": max(r["peak_rss"] for r in runs) / 1e9,
        "runs": len(runs),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    can, adj = prepare(args)
    runs: dict[str, list[dict]] = {"dgl": [], "gnnflow": []}
    for rep in range(args.repeat):
        for side in ("dgl", "gnnflow") if rep % 2 == 0 else ("gnnflow", "dgl"):
            result = run_in_child(_in_child, side, str(can), str(adj), args)
            runs[side].append(result)
            print(f"  {side} run {rep + 1}: median epoch {statistics.median(result['epoch_seconds']):.3f} s, "
                  f"test acc {result['test_acc']:.4f}", flush=True)  # fmt: skip
    rows = {"DGL": side_row(runs["dgl"]), "gnnflow": side_row(runs["gnnflow"]),
            "gnnflow + shard writing": side_row(runs["gnnflow"], amortize=True)}  # fmt: skip
    dgl = rows["DGL"]
    model = "R-GCN" if args.conv == "rgcn" else "SAGE per relation (HeteroGraphConv), fanout per relation,"
    header = (f"{args.dataset or f'users {args.users}'}, {model} {len(args.fanout_list)} x {args.hidden}, fanouts {args.fanouts}, "
              f"bases {args.num_bases or 'none'}, batch {args.batch_size}, {args.epochs} epochs, "
              f"{args.threads} threads, {args.repeat} runs per side")  # fmt: skip
    print(header)
    print("| side | median epoch s | best / worst | vs DGL (median) | test acc | peak RSS GB |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['median_epoch_s']:.3f} | {r['best_epoch_s']:.3f} / {r['worst_epoch_s']:.3f} | "
              f"{r['median_epoch_s'] / dgl['median_epoch_s']:.2f}x | {r['test_acc_mean']:.4f} ± {r['test_acc_std']:.4f} | "
              f"{r['peak_rss_gb']:.2f} |")  # fmt: skip
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        settings = {k: v for k, v in vars(args).items() if k not in ("work", "no_write")}
        name = (Path(args.dataset).name if args.dataset else args.users, *(["sage"] if args.conv != "rgcn" else []))
        name = "-".join(str(p) for p in name)
        (RESULTS / f"typed_vs_dgl-{name}.json").write_text(
            json.dumps({"settings": settings, "rows": rows, "runs": runs}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
