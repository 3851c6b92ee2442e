"""Training benchmark: our trained_model loop reading shards vs the textbook DGL loop sampling online.

    .venv/bin/python benchmarks/train_vs_dgl.py                       # demo graph: 100k nodes, 1M edge rows
    .venv/bin/python benchmarks/train_vs_dgl.py --nodes 1000000 --edges 10000000 --epochs 3

One process, one after the other, on the same graph (the generator's DC-SBM, cached under
--work with its canonical graph and normalized adjacency), the same model (GraphSAGE-mean,
--layers layers of --hidden units, dropout --dropout before every layer, Adam --lr), the
same fanouts, batch size, epochs and training nodes:

baseline  DGL's textbook loop (DGL's GraphSAGE example): ``dgl.dataloading.DataLoader`` with
          ``NeighborSampler(fanouts)`` sampling online in the training process (features and
          labels prefetched by the sampler), ``dgl.nn.SAGEConv`` layers.
ours      `graphs.sampling.write_minibatch_shards` once (world size 1, no added self loops,
          so the blocks are the same kind DGL samples), then `training.train.train`: shard
          stream with a prefetch thread, our plain-torch SAGEConv (DGL's CPU kernels for the
          aggregation when DGL is importable, as in production), Adam.

Threads: both sides run with the settings our trainer runs with (`training.threads`: each
OpenMP team as many threads as the cores, idle threads asleep, ``OMP_WAIT_POLICY=PASSIVE``),
set in the environment before either side's runtimes load; ``--wait-policy default`` gives both
the runtimes' default (a spin before sleeping) instead, ``--threads`` another team size. Both
sides also run under the same allocator setting (``--peer-host-memory reuse``).

Load: each repeat runs both sides on the idle host and then with a fixed background load, one
process spinning on one core (`_child.Burner`) for the whole of each side's run (``--load``).

Epoch time = the training loop only (both sides; our `train_seconds` column of
metrics.parquet), evaluation excluded; the two sides alternate --repeat times and the
median, best and worst over every epoch are compared. Target: median at most 0.8x DGL's, idle
and loaded, at equal accuracy (within 0.5 points). Accuracy = test accuracy of the final model by
full-graph inference (DGL: ``SAGEConv`` on the whole graph; ours: layer-wise inference over
the normalized adjacency's structure). The ratio ours / DGL is printed twice: reading
shards only, and with the shard-writing time divided over the epochs added. Each run of each side is a fresh child
process (peak RSS its own; the graph is prepared in a child too), so neither side inherits
the other's allocator state or warm caches beyond the shared page cache.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
# this checkout's packages, whatever checkout the venv's editable install points at
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import harness  # noqa: E402  (benchmarks/harness.py)
import numpy as np  # noqa: E402
from _child import Burner, run_in_child  # noqa: E402  (benchmarks/_child.py)


def prepare(args) -> tuple[Path, Path]:
    """The generated graph of `args.nodes` / `args.edges` under `args.work` (built once)."""
    work = Path(args.work).resolve()
    landing = work / f"landing-{args.nodes}-{args.edges}"
    return staged_inputs(landing, work / f"home-{args.nodes}-{args.edges}", (args.nodes, args.edges))


def staged_inputs(landing: Path, home: Path, generate: tuple[int, int] | None = None) -> tuple[Path, Path]:
    """(canonical graph, normalized adjacency) of `landing` under `home`, each built only when
    missing or stale; `generate` = (nodes, edges) writes a demo-recipe graph into `landing` first
    when it does not exist yet."""
    from graphs.stages.canonical import CanonicalGraph, build_canonical_graph
    from graphs.stages.normalize import build_normalized_adjacency
    from graphs.synthetic.generate import GenerateConfig, demo_config, generate_dataset

    if generate is not None and not landing.exists():
        nodes, edges = generate
        cfg = GenerateConfig(**{**demo_config().__dict__, "num_nodes": nodes, "num_edges": edges})
        generate_dataset(cfg, landing, progress=False)
    can, adj = home / "canonical_graph", home / "normalized_adjacency"
    if not (can / CanonicalGraph.SUMMARY).exists():
        build_canonical_graph(landing, can)
    if not harness.adjacency_current(adj):
        build_normalized_adjacency(can, adj)
    return can, adj


def _prepare(args, queue) -> None:
    can, adj = prepare(args)
    queue.put({"can": str(can), "adj": str(adj)})


def _in_child(side: str, can: str, adj: str, args, queue) -> None:
    """One run of one side in this fresh process; its peak RSS with it."""
    import torch

    from graphs.infra.storage import peak_rss_bytes

    if args.threads:
        torch.set_num_threads(args.threads)
    r = run_dgl(Path(can), args) if side == "dgl" else run_ours(Path(can), Path(adj), args)
    queue.put(r | {"rss": peak_rss_bytes()})


# ----------------------------------------------------------------------------- DGL baseline


def run_dgl(can: Path, args) -> dict:
    """DGL's example loop with ``args.conv`` layers (`dgl_model`): seconds of each epoch, test accuracy of
    the final model by full-graph inference and, with ``args.eval_each_epoch``, the validation accuracy
    after each epoch (outside the timed loop)."""
    import dgl
    import torch

    from graphs.infra.host_memory import reuse_freed_memory

    # gcn/gat: each node's self loop in the graph, as DGL's GraphConv/GATConv examples add it
    g, train_nids, masks = dgl_graph(can, self_loops=args.conv != "sage")
    torch.manual_seed(args.seed)
    dgl.seed(args.seed)
    classes = int(g.ndata["label"].max()) + 1
    model = dgl_model(args, g.ndata["feat"].shape[1], classes)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = dgl.dataloading.NeighborSampler(args.fanout_list, prefetch_node_feats=["feat"], prefetch_labels=["label"])
    loader = dgl.dataloading.DataLoader(
        g, train_nids, sampler, batch_size=args.batch_size, shuffle=True, drop_last=False, num_workers=0
    )
    val_acc: list[float] = []
    after_epoch = (lambda: val_acc.append(dgl_accuracy(model, g, masks["val"]))) if args.eval_each_epoch else None
    # --peer-host-memory reuse: DGL's epochs under the allocator setting our trainer uses (graphs.infra.host_memory)
    with reuse_freed_memory(args.peer_host_memory == "reuse"):
        epochs = _dgl_epochs(model, opt, loader, args.epochs, after_epoch)
    return {"epoch_seconds": epochs, "test_acc": dgl_accuracy(model, g, masks["test"]), "val_acc": val_acc}


def dgl_graph(can: Path, self_loops: bool):
    """The canonical graph as a DGL graph (features, labels), its training nodes and the labelled
    val / test masks; `self_loops` replaces any self loop by exactly one per node."""
    import dgl
    import pyarrow.parquet as pq
    import torch

    from graphs.stages.canonical import CanonicalGraph

    graph = CanonicalGraph.open(can)
    edges = pq.read_table(graph.edges_path)
    nodes = pq.read_table(graph.nodes_path, columns=["label", "split"]).to_pandas()
    g = dgl.graph(
        (torch.from_numpy(edges.column("src").to_numpy()), torch.from_numpy(edges.column("dst").to_numpy())),
        num_nodes=len(nodes),
    )
    if self_loops:
        g = dgl.add_self_loop(dgl.remove_self_loop(g))
    g.ndata["feat"] = torch.from_numpy(np.load(graph.features_path))
    g.ndata["label"] = torch.from_numpy(nodes.label.to_numpy().astype(np.int64))
    split, labelled = nodes.split.to_numpy(), nodes.label.to_numpy() >= 0
    train_nids = torch.from_numpy(np.flatnonzero((split == "train") & labelled))
    masks = {name: torch.from_numpy((split == name) & labelled) for name in ("val", "test")}
    return g, train_nids, masks


def dgl_model(args, in_feats: int, classes: int):
    """The DGL side's network: len(args.fanout_list) layers of ``args.conv``, dropout --dropout before
    every layer, ReLU between. sage: ``SAGEConv(aggregator_type="mean")``; gcn: ``GraphConv(norm="both")``;
    gat: ``GATConv`` with args.heads heads of hidden / heads features, concatenated, in hidden layers and
    1 head (averaged) in the output layer. ``forward(blocks, x)`` takes sampled blocks or the whole graph
    once per layer."""
    import dgl.nn as dglnn
    import torch.nn.functional as F
    from torch import nn

    n = len(args.fanout_list)
    dims = [in_feats] + [args.hidden] * (n - 1) + [classes]

    def conv(a: int, b: int, last: bool) -> nn.Module:
        if args.conv == "sage":
            return dglnn.SAGEConv(a, b, "mean")
        if args.conv == "gcn":
            return dglnn.GraphConv(a, b, norm="both")
        heads = 1 if last else args.heads
        return dglnn.GATConv(a, b // heads, heads)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(conv(a, b, i == n - 1) for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])))
            self.dropout = nn.Dropout(args.dropout)

        def forward(self, blocks, x):
            h = x
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, self.dropout(h))
                if args.conv == "gat":  # [nodes, heads, out]
                    h = h.mean(1) if i == n - 1 else h.flatten(1)
                if i != n - 1:
                    h = F.relu(h)
            return h

    return Net()


def dgl_accuracy(model, g, mask) -> float:
    """Accuracy on `mask` by full-graph inference (eval mode: no dropout)."""
    import torch

    model.eval()
    with torch.no_grad():
        pred = model([g] * len(model.layers), g.ndata["feat"]).argmax(1)
    return float((pred[mask] == g.ndata["label"][mask]).float().mean())


def _dgl_epochs(model, opt, loader, epochs: int, after_epoch=None) -> list[float]:
    """DGL's example loop: seconds of each epoch; `after_epoch()` (untimed) after each."""
    import torch.nn.functional as F

    seconds = []
    for _ in range(epochs):
        model.train()
        t0 = time.perf_counter()
        for _, _, blocks in loader:
            x, y = blocks[0].srcdata["feat"], blocks[-1].dstdata["label"]
            loss = F.cross_entropy(model(blocks, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        seconds.append(time.perf_counter() - t0)
        if after_epoch is not None:
            after_epoch()
    return seconds


# ----------------------------------------------------------------------------- ours


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
            # sage: blocks as DGL samples them; gcn/gat: each destination's self loop (Â_vv), as
            # PyG's layers and DGL's add_self_loop give them
            self_loops=args.conv != "sage",
            seed=args.seed,
        ),
    )
    shard_seconds = time.perf_counter() - t0
    cfg = RunConfig.from_dict(
        {
            "model": {
                "conv": args.conv,
                "heads": args.heads,
                "hidden": args.hidden,
                "num_layers": len(args.fanout_list),
                "dropout": args.dropout,
            },
            "training": {
                "epochs": args.epochs,
                "optimizer": {"type": "Adam", "lr": args.lr},
                "profiler": "none",
                # each epoch's validation accuracy (outside train_seconds) only when asked for
                "eval_every": 1 if args.eval_each_epoch else args.epochs,
                "early_stopping_patience": 0,  # every side trains --epochs epochs
                # DGL's loop feeds the features as they are; ours would divide each row by its L1 norm
                # (the Planetoid recipe, our default), a different input than the peer's
                "feature_norm": args.feature_norm,
                "checkpoint_every": args.epochs,
                "seed": args.seed,
                **({"aggregation": args.aggregation} if args.aggregation else {}),
            },
            "paths": {"shards": str(work / "minibatch_shards"), "out": str(work / "trained_model")},
        }
    )
    summary = train(cfg)
    metrics = pq.read_table(work / "trained_model" / METRICS).to_pandas()
    shard_bytes = sum(p.stat().st_size for p in (work / "minibatch_shards").rglob("*.npz"))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "epoch_seconds": metrics.train_seconds.tolist(),
        "val_acc": metrics.val_acc.tolist() if args.eval_each_epoch else [],
        "data_wait_share": metrics.data_wait_share.tolist(),
        "test_acc": summary["final_test_acc"],
        "shard_seconds": shard_seconds,
        "shard_bytes": shard_bytes,
    }


LOADS = {"idle": False, "loaded": True}  # whether a Burner spins on one core during the runs


def main() -> None:
    args = parse_args()
    from training.threads import thread_env

    if args.wait_policy == "passive":  # both sides' children inherit it: the runtimes read it as they load
        os.environ.update(thread_env(1))
    else:
        os.environ.pop("OMP_WAIT_POLICY", None)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    args.fanout_list = [int(f) for f in args.fanouts.split(",")]
    # what run_dgl / run_ours also read (benchmarks/frameworks.py sets them per run)
    args.conv, args.heads, args.eval_each_epoch = "sage", 4, False

    paths = run_in_child(_prepare, args)
    can, adj = paths["can"], paths["adj"]
    loads = list(LOADS) if args.load == "both" else [args.load]
    print(
        f"graph: {args.nodes} nodes, {args.edges} edge rows; fanouts {args.fanouts}, batch {args.batch_size}, "
        f"{args.epochs} epochs, SAGE {len(args.fanout_list)}x{args.hidden}; both sides: OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', '(default)')}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(default)')}"
        f", host memory {args.peer_host_memory}; {args.repeat} alternating repeat(s), {' and '.join(loads)}"
        f"{f' (loaded: a process spinning on core {Burner().cpu})' if 'loaded' in loads else ''}"
    )
    runs: dict[tuple[str, str], list[dict]] = {(load, side): [] for load in loads for side in ("dgl", "ours")}
    for _ in range(args.repeat):  # alternate, so a burst of load on a shared machine hits both sides
        for load in loads:
            for side in ("dgl", "ours"):
                with Burner(enabled=LOADS[load]):
                    runs[load, side].append(run_in_child(_in_child, side, can, adj, args))
                every = " ".join(f"{s:.2f}" for s in runs[load, side][-1]["epoch_seconds"])
                print(f"  {load} {side} run {len(runs[load, side])}: epochs {every} s", flush=True)
    records = [r for load in loads for r in report(load, runs[load, "dgl"], runs[load, "ours"], args)]
    harness.emit(args.record, records)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--edges", type=int, default=1_000_000)
    ap.add_argument("--work", default="bench_out/train_vs_dgl")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--feature-norm", default="none", help="our training.feature_norm; none = the raw features DGL's side trains on"
    )
    ap.add_argument(
        "--threads", type=int, default=0, help="OpenMP threads of both sides; 0 = training.threads' choice (the cores)"
    )
    ap.add_argument(
        "--wait-policy",
        choices=("passive", "default"),
        default="passive",
        help="both sides' OpenMP idle threads: asleep (training.threads, what our trainer runs with) or the "
        "runtimes' default (spinning a while)",
    )
    ap.add_argument(
        "--load",
        choices=("idle", "loaded", "both"),
        default="both",
        help="run on the idle host, with one core kept busy by a spinning process, or both",
    )
    ap.add_argument(
        "--aggregation", default="", help="our training.aggregation (torch/dgl/auto); default: the config's"
    )
    ap.add_argument(
        "--peer-host-memory",
        choices=("default", "reuse"),
        default="reuse",
        help="DGL's epochs under the allocator setting our trainer uses (training.reuse_host_memory) or under "
        "glibc's defaults (what its users run)",
    )
    ap.add_argument(
        "--repeat", type=int, default=3, help="alternating DGL / ours runs (each load); medians over all epochs"
    )
    ap.add_argument("--keep", action="store_true", help="keep our shards and outputs under --work/ours")
    ap.add_argument("--record", help="append result records here (benchmarks/harness.py)")
    return ap.parse_args()


def _epochs(runs: list[dict]) -> list[float]:
    return [s for r in runs for s in r["epoch_seconds"]]


def report(load: str, dgl: list[dict], ours: list[dict], args) -> list[harness.Record]:
    """Print one load's table and return its records."""
    d_all, o_all = _epochs(dgl), _epochs(ours)
    d_epoch, o_epoch = float(np.median(d_all)), float(np.median(o_all))
    shard_seconds = float(np.median([r["shard_seconds"] for r in ours]))
    amortized = o_epoch + shard_seconds / args.epochs
    d_acc = float(np.mean([r["test_acc"] for r in dgl]))
    o_acc = float(np.mean([r["test_acc"] for r in ours]))
    print(f"\n{load}:")
    print(f"{'':28s} {'median':>7s} {'best':>6s} {'worst':>6s}   {'every epoch, every repeat':<40s} {'test acc':>9s}")
    for label, every, acc in (("DGL DataLoader + SAGEConv", d_all, d_acc), ("ours (shards)", o_all, o_acc)):
        print(
            f"{label:28s} {float(np.median(every)):7.2f} {min(every):6.2f} {max(every):6.2f}   "
            f"{' '.join(f'{s:.2f}' for s in every):<40s} {acc:9.4f}"
        )
    waits = [w for r in ours for w in r["data_wait_share"]]
    print(
        f"shard writing: {shard_seconds:.2f} s for {args.epochs} epochs ({ours[0]['shard_bytes'] / 1e6:.0f} MB); "
        f"our data-wait share per epoch: {' '.join(f'{w:.0%}' for w in waits)}"
    )
    print(
        f"ratio ours / DGL, reading shards only:     {o_epoch / d_epoch:.2f}x median, {min(o_all) / min(d_all):.2f}x "
        f"best, {max(o_all) / max(d_all):.2f}x worst  (target <= 0.8x median)"
    )
    print(f"ratio ours / DGL, shard writing amortized: {amortized / d_epoch:.2f}x median")
    print(f"accuracy difference ours - DGL:            {100 * (o_acc - d_acc):+.2f} points (target within 0.5)")
    model = f"SAGE {len(args.fanout_list)}x{args.hidden}, fanouts {args.fanouts}"
    where = "" if load == "idle" else ", one core loaded"
    spread = (
        f"best {min(o_all):.3g} / {min(d_all):.3g} s, worst {max(o_all):.3g} / {max(d_all):.3g} s (ours / DGL); "
        f"{args.epochs} epochs x {args.repeat} alternating runs; batch {args.batch_size}"
    )
    common = {
        "benchmark": "train_vs_dgl",
        "nodes": args.nodes,
        "edges": args.edges,
        "peer_name": "DGL DataLoader + SAGEConv",
    }
    return [
        harness.Record(
            **common,
            stage=f"training epoch from shards{where}, {model}",
            metric="seconds per epoch (median)",
            ours=o_epoch,
            peer=d_epoch,
            max_ratio=0.8,
            ours_rss_bytes=max(r["rss"] for r in ours),
            peer_rss_bytes=max(r["rss"] for r in dgl),
            notes=spread,
        ),
        harness.Record(
            **common,
            stage=f"training epoch, shard writing amortized{where}, {model}",
            metric="seconds per epoch (median)",
            ours=amortized,
            peer=d_epoch,
            notes=f"shard writing {shard_seconds:.1f} s divided over {args.epochs} epochs",
        ),
        harness.Record(
            **common,
            stage=f"test accuracy{where}, {model}",
            metric="test accuracy %",
            ours=100 * o_acc,
            peer=100 * d_acc,
            notes=f"ours - DGL = {100 * (o_acc - d_acc):+.2f} points (target: within 0.5)",
        ),
    ]


if __name__ == "__main__":
    main()
