"""Typed link prediction: ours against DGL's heterogeneous link prediction and training-free
rankings, on one target relation of a typed graph, per user.

    .venv/bin/python benchmarks/typed_link.py --dataset datasets/cora-typed --relation cites
    .venv/bin/python benchmarks/typed_link.py --users 20000 --relation buys

The graph is `graphs.synthetic.typed` (users buy items, follow users; items are in categories) or
a typed landing folder (--dataset), ingested with ``add_reverse`` and split on --relation by
edge_split (5% validation, 10% test, seeded; `graphs.stages.edge_split_typed`), then
normalized_adjacency, metis_partitions (2 parts) and compressed_graph, once, cached under --work.
Every side is scored the same way on the same split: ROC-AUC and MRR of the test edges against
the split's fixed negatives (`training.metrics.link_prediction_report`), and the per-user ranking
of every destination of the relation (`training.ranking.ranking_report`: user MRR, recall@k, the
test users, each user's training and validation edges set aside).

ours        the pipeline at link prediction's defaults on a typed graph: `ShardConfig()` edge-seed
            shards over the relational Â (negatives of the destination type, Bloom-filtered),
            `training.link_train.train_link` with `LinkConfig()` (hybrid scorer, hard negatives)
            and the model and training blocks at link prediction's defaults with the typed
            default ``model.conv: rgcn``; early stopping on validation MRR.
DGL         DGL's heterogeneous link prediction as its user guide builds it (6.3, "heterogeneous
            graphs"): the split's graph as a ``dgl.heterograph`` (each reverse relation built as
            its relation's edges reversed, in the same order, as ``exclude="reverse_types"``
            requires), ``as_edge_prediction_sampler(NeighborSampler([15, 10, 5]),
            exclude="reverse_types", negative_sampler=Uniform(1))`` over the target relation's
            edges, ``HeteroGraphConv({relation: SAGEConv(mean)})`` x 3 at 256 units (a linear map
            per featured type, a learned vector per node of a featureless type), the link_pred.py
            MLP scorer on ``h_u * h_v``, Adam lr 0.0005, batch 512, --peer-epochs epochs.
popularity  each destination scored by its training edges' count (no training).
Adamic-Adar each pair's Adamic-Adar index on the message-passing graph (no training).

Each trained side runs in a fresh spawned child (its peak RSS its own). Results:
benchmarks/results/typed_link-<graph>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("DGLBACKEND", "pytorch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from _child import run_in_child  # noqa: E402  (benchmarks/_child.py)

from graphs.infra.storage import SUMMARY_NAME  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PEER = SimpleNamespace(fanout_list=[15, 10, 5], hidden=256, dropout=0.0, lr=0.0005, batch_size=512)
STAGES = ("canonical", "split", "adj", "parts", "compressed")


def prepare(args) -> dict:
    """The stages' folders under --work (built once per graph and relation)."""
    name = Path(args.dataset).name if args.dataset else f"users{args.users}-seed{args.seed}"
    root = Path(args.work).resolve() / f"{name}-{args.relation}"
    d = {s: root / s for s in STAGES}
    if not (d["compressed"] / SUMMARY_NAME).exists():
        run_in_child(_prepare, str(root), args)
    return d


def _prepare(root: str, args, queue) -> None:
    from graphs.stages.canonical import CanonicalConfig, build_canonical_graph
    from graphs.stages.compress import CompressConfig, build_compressed_graph
    from graphs.stages.edge_split import EdgeSplitConfig, build_edge_split
    from graphs.stages.normalize import build_normalized_adjacency
    from graphs.stages.partition import PartitionConfig, build_partitions
    from graphs.synthetic.typed import generate_typed

    root = Path(root)
    shutil.rmtree(root, ignore_errors=True)
    landing = root / "landing" / "typed"
    if args.dataset:
        shutil.copytree(args.dataset, landing)
    else:
        generate_typed(landing, args.users, seed=args.seed)
    d = {s: root / s for s in STAGES}
    build_canonical_graph(landing, d["canonical"], CanonicalConfig(add_reverse=True))
    build_edge_split(d["canonical"], d["split"], EdgeSplitConfig(relation=args.relation))
    build_normalized_adjacency(d["split"], d["adj"])
    build_partitions(d["split"], d["parts"], PartitionConfig(num_parts=2, write_distdgl=False))
    build_compressed_graph(d["canonical"], d["adj"], d["parts"], d["compressed"], CompressConfig())
    queue.put({})


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _in_child(side: str, d: dict, args, queue) -> None:
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    result = run_ours(d, args) if side == "ours" else run_dgl(d, args)
    result["peak_rss"] = _peak_rss()
    queue.put(result)


# ----------------------------------------------------------------------------- ours


def run_ours(d: dict, args) -> dict:
    from dataclasses import replace

    from graphs.sampling import ShardConfig, load_shard_inputs
    from graphs.sampling.link import write_link_shards
    from training.link import LINK_DEFAULTS, LinkConfig
    from training.link_train import train_link
    from training.task_settings import task_blocks, with_values

    inputs = load_shard_inputs(d["split"], d["adj"], d["parts"], d["compressed"])
    shards = d["split"].parent / "shards-default"
    t0 = time.perf_counter()
    write_link_shards(inputs, shards, ShardConfig(), canonical_dir=d["canonical"])
    shard_seconds = time.perf_counter() - t0
    model, training = task_blocks(LINK_DEFAULTS)[:2]
    training = with_values(training, {"seed": args.seed})
    s = train_link(
        shards, d["split"], d["adj"], None, LinkConfig(ranking_users=args.ranking_users),
        replace(model, conv="rgcn"), training, log=lambda m: None if m.startswith("step") else print("  ours:", m),
    )  # fmt: skip
    return {
        "test": s["test"],
        "epochs": s["epochs"],
        "best_epoch": s["best_epoch"],
        "epoch_seconds": s["epoch_seconds"],
        "shard_seconds": shard_seconds,
    }


# ----------------------------------------------------------------------------- DGL


def hetero_graph(split: Path):
    """The split's graph as a heterograph (type-local ids; a reverse relation as its relation's
    edges reversed, in the same order), with features; the schema and the reverse-type map."""
    import dgl
    import pyarrow.parquet as pq
    import torch

    from graphs.formats.canonical_files import CanonicalGraph
    from graphs.formats.graph_schema import TypedSchema

    graph, typed = CanonicalGraph.open(split), TypedSchema.read(split)
    schema, offsets = typed.schema, typed.offsets
    doc = {r["key"]: r["reverse_of"] for r in typed.to_json()["relations"]}
    edges = pq.read_table(graph.path(graph.TYPED_EDGES), columns=["src", "dst", "etype"]).to_pandas()
    data, reverse = {}, {}
    for r, rel in enumerate(schema.relations):
        if doc[rel.key] is not None:
            continue  # built below, from its relation
        part = edges[edges.etype == r]
        s, t = schema.type_index(rel.src_type), schema.type_index(rel.dst_type)
        src = torch.from_numpy(part.src.to_numpy() - offsets[s])
        dst = torch.from_numpy(part.dst.to_numpy() - offsets[t])
        data[(rel.src_type, rel.key, rel.dst_type)] = (src, dst)
        back = next((k for k, of in doc.items() if of == rel.key), None)
        if back is not None:
            data[(rel.dst_type, back, rel.src_type)] = (dst, src)
            reverse |= {rel.key: back, back: rel.key}
    hg = dgl.heterograph(data, num_nodes_dict=dict(zip(schema.node_types, typed.counts)))
    feats = np.load(graph.features_path) if graph.has_features else None
    for t, (name, width) in enumerate(zip(schema.node_types, typed.feat_widths)):
        if width:
            rows = np.ascontiguousarray(feats[offsets[t] : offsets[t + 1], :width])
            hg.nodes[name].data["feat"] = torch.from_numpy(rows)
    return hg, typed, reverse


def run_dgl(d: dict, args) -> dict:
    """DGL's heterogeneous link prediction (module docstring): epoch seconds and the test report."""
    import dgl
    import torch
    import torch.nn.functional as F
    from torch import nn
    from typed_dgl_hetero import hetero_model, timed_epochs  # noqa: E402  (benchmarks/typed_dgl_hetero.py)

    from graphs.stages.edge_split import load_edge_split
    from graphs.stages.edge_split_typed import TargetRelation

    hg, typed, reverse = hetero_graph(d["split"])
    split = load_edge_split(d["split"])
    target = TargetRelation.from_json(split.summary["split"]["relation"])
    rel = typed.schema.relations[target.index]
    dgl.seed(args.seed)
    model, opts = hetero_model(PEER, typed, PEER.hidden)
    h = PEER.hidden
    predictor = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))
    opts.append(torch.optim.Adam(predictor.parameters(), lr=PEER.lr))
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler(PEER.fanout_list, prefetch_node_feats={t: ["feat"] for t in model.proj}),
        exclude="reverse_types" if reverse else None,
        reverse_etypes=reverse or None,
        negative_sampler=dgl.dataloading.negative_sampler.Uniform(1),
    )
    eids = {rel.key: torch.arange(hg.num_edges(rel.key))}
    loader = dgl.dataloading.DataLoader(hg, eids, sampler, batch_size=PEER.batch_size, shuffle=True)
    canonical = (rel.src_type, rel.key, rel.dst_type)

    def loss_of(input_nodes, pair_graph, neg_graph, blocks):
        feats = {t: blocks[0].srcnodes[t].data["feat"] for t in model.proj}
        out = model(blocks, model.inputs(input_nodes, feats))
        scores = []
        for g in (pair_graph, neg_graph):
            u, v = g.edges(etype=canonical)
            scores.append(predictor(out[rel.src_type][u] * out[rel.dst_type][v]).squeeze(-1))
        labels = torch.cat([torch.ones_like(scores[0]), torch.zeros_like(scores[1])])
        return F.binary_cross_entropy_with_logits(torch.cat(scores), labels)

    seconds = timed_epochs(model, opts, loader, args.peer_epochs, loss_of)
    model.eval()
    with torch.no_grad():
        nids = {t: torch.arange(hg.num_nodes(t)) for t in hg.ntypes}
        feats = {t: hg.nodes[t].data["feat"] for t in model.proj}
        out = model([hg] * len(PEER.fanout_list), model.inputs(nids, feats))
        emb = torch.cat([out[t] for t in typed.schema.node_types])  # global ids: types in order
    return {"test": _report(emb, lambda hu, hv: predictor(hu * hv).squeeze(-1), split, target, args),
            "epochs": args.peer_epochs, "epoch_seconds": seconds}  # fmt: skip


def _report(emb, pair_score, split, target, args) -> dict:
    """Fixed-negative and per-user ranking figures of embeddings `emb` [n, h] under `pair_score`."""
    import torch

    from training.metrics import link_prediction_report
    from training.ranking import cross_pairs, ranking_report

    def scores(pairs: np.ndarray) -> np.ndarray:
        p = torch.from_numpy(pairs)
        return pair_score(emb[p[:, 0]], emb[p[:, 1]]).numpy()

    def score(users, items):
        pairs = cross_pairs(users, items)
        return pair_score(emb[pairs[0]], emb[pairs[1]]).view(len(users), -1)

    with torch.no_grad():
        out = link_prediction_report(scores(split.test), scores(split.test_negatives))
        ranked = ranking_report(
            score, split, "test", target.dst_range, users=args.ranking_users, seed=args.seed,
            symmetric=target.symmetric, chunk_pairs=1 << 18,
        )  # fmt: skip
    return out | ranked


# ----------------------------------------------------------------------------- report


def row(name: str, r: dict, prefix: str = "") -> str:
    t = r["test"]
    secs = r.get("epoch_seconds")
    epoch = f"{np.median(secs):.2f}" if secs else "-"
    rss = f"{r['peak_rss'] / 2**20:.0f}" if "peak_rss" in r else "-"
    return (
        f"| {name} | {t.get(prefix + 'user_mrr', float('nan')):.4f} | {t.get(prefix + 'recall@10', float('nan')):.4f} "
        f"| {t.get(prefix + 'recall@20', float('nan')):.4f} | {t.get(prefix + 'recall@50', float('nan')):.4f} "
        f"| {t.get('auc', float('nan')) if not prefix else float('nan'):.4f} | {epoch} | {r.get('epochs', '-')} | {rss} |"
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="", help="a typed landing folder (e.g. datasets/cora-typed); else generated")
    ap.add_argument("--users", type=int, default=20_000, help="generated graph: users")
    ap.add_argument("--relation", default="buys", help="the target relation (edge_split.relation)")
    ap.add_argument("--peer-epochs", type=int, default=10, help="DGL's epochs (link_pred.py: 10)")
    ap.add_argument("--ranking-users", type=int, default=1000, help="test users ranked (0 = all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=".bench/typed_link")
    ap.add_argument("--no-peer", action="store_true", help="skip DGL (ours and the training-free rankings only)")
    args = ap.parse_args(argv)
    d = prepare(args)
    ours = run_in_child(_in_child, "ours", d, args)
    sides = {"ours": ours}
    if not args.no_peer:
        sides["DGL"] = run_in_child(_in_child, "dgl", d, args)
    name = Path(args.dataset).name if args.dataset else f"{args.users}"
    print(f"\n## {name}, relation {args.relation}: test users ranked against every destination")
    print("| method | user MRR | recall@10 | recall@20 | recall@50 | ROC-AUC | epoch s | epochs | peak RSS MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(row("ours (defaults, R-GCN)", ours))
    if "DGL" in sides:
        print(row("DGL HeteroGraphConv", sides["DGL"]))
    print(row("popularity", ours, "popularity_"))
    print(row("Adamic-Adar", ours, "adamic_adar_"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"typed_link-{name}.json"
    out.write_text(json.dumps({"args": vars(args), **sides}, indent=2, default=float))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
