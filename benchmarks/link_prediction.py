"""Link-prediction benchmark: our defaults against DGL's link-prediction example and training-free
heuristics, and Bloom rejection against exact rejection of negatives.

    .venv/bin/python benchmarks/link_prediction.py                         # ego-Facebook + a generated graph
    .venv/bin/python benchmarks/link_prediction.py --graphs ego-facebook,email-eu-core --threads 1
    .venv/bin/python benchmarks/link_prediction.py --graphs generated --nodes 20000 --edges 200000

Every row in one process, on the same edge split (`graphs.stages.edge_split`: 5% validation, 10%
test, seeded) and the same evaluation (test edges ranked against the split's 10 000 fixed
negatives with `training.metrics.link_prediction_report`: ROC-AUC, MRR, Hits@K).

ours       the pipeline with no configuration: edge_split -> normalized_adjacency ->
           metis_partitions -> compressed_graph (Bloom filters over *all* edges) ->
           `graphs.sampling.link.write_link_shards` with `ShardConfig()` ->
           `training.link_train.train_link` with `LinkConfig()` and the model and training blocks at
           link prediction's defaults (`training.link.LINK_DEFAULTS`; what trained_model uses: the hybrid scorer, the step floor, early stopping on
           validation MRR, the best validation model tested).
DGL        DGL's ``examples/pytorch/graphsage/link_pred.py`` configuration, in DGL: the training
           graph made bidirected with ``to_bidirected_with_reverse_mapping`` (copied from the
           example), every directed edge a seed edge, ``NeighborSampler([15, 10, 5])`` wrapped by
           ``as_edge_prediction_sampler(exclude="reverse_id", negative_sampler=Uniform(1))``,
           ``DataLoader(batch_size=512, shuffle=True)``, three ``dgl.nn.SAGEConv`` mean layers
           of 256 units (ReLU between), Adam lr 0.0005, BCE with logits, the example's MLP
           scorer on ``h_u * h_v`` (``--peer-scorer dot``: the dot product), at most
           ``--steps`` minibatches per epoch (the example: 1000) for ``--peer-epochs`` epochs,
           the same input features as ours (the dataset's, or one-hot log2-degree buckets).
heuristics common neighbours, Adamic-Adar and resource allocation of each pair on the
           message-passing graph (`training.pair_features.PairHeuristics`), no training.

Seconds: ours = writing the shards + training (evaluation included); DGL = its training loop
(sampling included). Then, per graph, Bloom rejection against exact sorted-key rejection on 1M
uniform candidate pairs (`graphs.stages.negatives.compare_rejection`) and both structures' sizes at
100M undirected edges computed from the formats (`graphs.stages.negatives.sizes_at`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

FANOUTS = [15, 10, 5]  # link_pred.py
BATCH = 512
LR = 0.0005
HIDDEN = 256


def prepare(landing: Path, home: Path, parts: int) -> dict:
    """Every stage of our pipeline up to the compressed graph, cached under `home`."""
    from graphs.formats.stage_artifact import StageArtifact
    from graphs.stages.canonical import build_canonical_graph
    from graphs.stages.compress import CompressConfig, build_compressed_graph
    from graphs.stages.edge_split import EdgeSplitConfig, build_edge_split
    from graphs.stages.normalize import build_normalized_adjacency
    from graphs.stages.partition import PartitionConfig, build_partitions

    d = {name: home / name for name in ("canonical", "split", "adj", "parts", "compressed")}
    summary = StageArtifact.SUMMARY  # every stage writes one, last
    if not (d["canonical"] / summary).exists():
        build_canonical_graph(landing, d["canonical"])
    if not (d["split"] / summary).exists():
        build_edge_split(d["canonical"], d["split"], EdgeSplitConfig())
    if not (d["adj"] / summary).exists():
        build_normalized_adjacency(d["split"], d["adj"])
    if not (d["parts"] / summary).exists():
        build_partitions(d["split"], d["parts"], PartitionConfig(num_parts=parts, write_distdgl=False))
    if not (d["compressed"] / summary).exists():
        build_compressed_graph(d["canonical"], d["adj"], d["parts"], d["compressed"], CompressConfig())
    return d


def features_for(d: dict):
    import torch

    from graphs.stages.canonical import CanonicalGraph
    from training.features import degree_features

    path = CanonicalGraph.open(d["canonical"]).features_path
    if path.is_file():
        return torch.from_numpy(np.load(path))
    from graphs.stages.normalize import load_csr

    return degree_features(np.asarray(load_csr(d["adj"]).indptr), 16)


# ----------------------------------------------------------------------------- ours


def run_ours(d: dict) -> dict:
    """The pipeline's defaults: ShardConfig(), LinkConfig(), the model and training blocks at
    link prediction's defaults."""
    from graphs.sampling import ShardConfig, load_shard_inputs
    from graphs.sampling.link import write_link_shards
    from training.link import LINK_DEFAULTS, LinkConfig
    from training.link_train import train_link
    from training.task_settings import task_blocks

    inputs = load_shard_inputs(d["split"], d["adj"], d["parts"], d["compressed"])
    shards = d["split"].parent / "shards-default"
    t0 = time.perf_counter()
    m = write_link_shards(inputs, shards, ShardConfig(), canonical_dir=d["canonical"])
    shard_seconds = time.perf_counter() - t0
    s = train_link(
        shards, d["split"], d["adj"], None, LinkConfig(), *task_blocks(LINK_DEFAULTS), log=lambda m: print("  ours:", m)
    )
    return {
        "test": s["test"],
        "seconds": shard_seconds + sum(s["epoch_seconds"]),
        "note": f"{s['epochs']} epochs, best {s['best_epoch']}",
        "negative_sampling": m["link"]["negative_sampling"],
    }


def run_heuristics(d: dict) -> dict:
    """Test reports of common neighbours, Adamic-Adar and resource allocation on the message-passing graph."""
    import torch

    from graphs.stages.edge_split import load_edge_split
    from training.blocks import remove_self_loops
    from training.evaluate import load_full_block
    from training.metrics import link_prediction_report
    from training.pair_features import PairHeuristics

    split = load_edge_split(d["split"])
    block = remove_self_loops(load_full_block(d["adj"]))
    t0 = time.perf_counter()
    g = PairHeuristics(block.indptr, block.indices)
    pos = g.counts(torch.from_numpy(split.test).T)
    neg = g.counts(torch.from_numpy(split.test_negatives).T)
    seconds = time.perf_counter() - t0
    names = ("common neighbours", "Adamic-Adar", "resource allocation")
    return {
        name: {"test": link_prediction_report(p.double().numpy(), q.double().numpy()), "seconds": seconds, "note": ""}
        for name, p, q in zip(names, pos, neg)
    }


# ----------------------------------------------------------------------------- peer (DGL)


def to_bidirected_with_reverse_mapping(g):
    """Copied from DGL's examples/pytorch/graphsage/link_pred.py."""
    import dgl
    import torch

    g_simple, mapping = dgl.to_simple(dgl.add_reverse_edges(g), return_counts="count", writeback_mapping=True)
    c = g_simple.edata["count"]
    num_edges = g.num_edges()
    mapping_offset = torch.zeros(g_simple.num_edges() + 1, dtype=g_simple.idtype)
    mapping_offset[1:] = c.cumsum(0)
    idx = mapping.argsort()
    idx_uniq = idx[mapping_offset[:-1]]
    reverse_idx = torch.where(idx_uniq >= num_edges, idx_uniq - num_edges, idx_uniq + num_edges)
    reverse_mapping = mapping[reverse_idx]
    src1, dst1 = g_simple.edges()
    src2, dst2 = g_simple.find_edges(reverse_mapping)
    assert torch.equal(src1, dst2)
    assert torch.equal(src2, dst1)
    return g_simple, reverse_mapping


def dgl_model(in_size: int, hid_size: int, scorer: str):
    """The example's SAGE (three SAGEConv mean layers, ReLU between) with the chosen scorer."""
    import dgl.nn as dglnn
    import torch.nn.functional as F
    from torch import nn

    class SAGE(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(
                [
                    dglnn.SAGEConv(in_size, hid_size, "mean"),
                    dglnn.SAGEConv(hid_size, hid_size, "mean"),
                    dglnn.SAGEConv(hid_size, hid_size, "mean"),
                ]
            )
            self.predictor = nn.Sequential(
                nn.Linear(hid_size, hid_size),
                nn.ReLU(),
                nn.Linear(hid_size, hid_size),
                nn.ReLU(),
                nn.Linear(hid_size, 1),
            )

        def encode(self, blocks_or_graph, x, full: bool = False):
            h = x
            for i, layer in enumerate(self.layers):
                h = layer(blocks_or_graph if full else blocks_or_graph[i], h)
                if i != len(self.layers) - 1:
                    h = F.relu(h)
            return h

        def score(self, hu, hv):
            if scorer == "dot":
                return (hu * hv).sum(-1)
            return self.predictor(hu * hv).squeeze(-1)

        def forward(self, pair_graph, neg_pair_graph, blocks, x):
            h = self.encode(blocks, x)
            pos_src, pos_dst = pair_graph.edges()
            neg_src, neg_dst = neg_pair_graph.edges()
            return self.score(h[pos_src], h[pos_dst]), self.score(h[neg_src], h[neg_dst])

    return SAGE()


def run_peer(d: dict, epochs: int, scorer: str, x, max_steps: int) -> dict:
    import dgl
    import torch
    import torch.nn.functional as F
    from dgl.dataloading import DataLoader, NeighborSampler, as_edge_prediction_sampler, negative_sampler

    from graphs.stages.edge_split import load_edge_split
    from training.metrics import link_prediction_report

    split = load_edge_split(d["split"])
    train = torch.from_numpy(split.train)
    g = dgl.graph((train[:, 0], train[:, 1]), num_nodes=split.n)
    g, reverse_eids = to_bidirected_with_reverse_mapping(g)
    g.ndata["feat"] = x
    seed_edges = torch.arange(g.num_edges())
    sampler = as_edge_prediction_sampler(
        NeighborSampler(FANOUTS, prefetch_node_feats=["feat"]),
        exclude="reverse_id",
        reverse_eids=reverse_eids,
        negative_sampler=negative_sampler.Uniform(1),
    )
    loader = DataLoader(g, seed_edges, sampler, batch_size=BATCH, shuffle=True, drop_last=False, num_workers=0)
    torch.manual_seed(0)
    model = dgl_model(x.shape[1], HIDDEN, scorer)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    times = []
    for epoch in range(epochs):
        model.train()
        t0 = time.perf_counter()
        total, steps = 0.0, 0
        for _, pair_graph, neg_pair_graph, blocks in loader:
            pos, neg = model(pair_graph, neg_pair_graph, blocks, blocks[0].srcdata["feat"])
            score = torch.cat([pos, neg])
            labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
            loss = F.binary_cross_entropy_with_logits(score, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
            steps += 1
            if steps == max_steps:  # link_pred.py: `if (it + 1) == 1000: break`
                break
        times.append(time.perf_counter() - t0)
        print(f"  DGL: epoch {epoch + 1}: loss {total / max(steps, 1):.4f} ({times[-1]:.2f} s)", flush=True)
    model.eval()
    with torch.no_grad():
        h = model.encode(g, x, full=True)
        pos = torch.from_numpy(split.test).T
        neg = torch.from_numpy(split.test_negatives).T
        report = link_prediction_report(
            model.score(h[pos[0]], h[pos[1]]).numpy(), model.score(h[neg[0]], h[neg[1]]).numpy()
        )
    return {"test": report, "seconds": sum(times), "note": f"{epochs} epochs of <= {max_steps} steps"}


# ----------------------------------------------------------------------------- Bloom vs exact


def rejection(d: dict) -> dict:
    import resource

    from graphs.stages.canonical import read_summary
    from graphs.stages.compress import load_bloom_filters
    from graphs.stages.negatives import EdgeKeys, compare_rejection
    from graphs.stages.partition import Partitions

    n = read_summary(d["canonical"])["nodes"]
    filters = load_bloom_filters(d["compressed"])
    part = np.load(Partitions.open(d["parts"]).path(Partitions.PART_ID)).astype(np.int32)
    t0 = time.perf_counter()
    exact = EdgeKeys.from_canonical(d["canonical"], n)
    build_exact = time.perf_counter() - t0
    r = compare_rejection(filters, part, exact, 1_000_000, np.random.default_rng(0))
    r["exact_build_seconds"] = build_exact
    stats = json.loads((d["compressed"] / "run_stats.json").read_text())  # timings live apart from content
    r["bloom_build_seconds"] = stats["bloom"]["seconds"]
    r["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return r


def print_rejection(name: str, r: dict) -> None:
    print(f"\n## Negatives: Bloom filters vs exact sorted keys ({name}, {r['candidates']:,} uniform candidates)")
    print("| | Bloom (per part, routed) | exact (sorted int64 keys) |")
    print("| --- | --- | --- |")
    print(f"| rejected as edge | {r['bloom_rejected']:,} | {r['exact_rejected']:,} |")
    print(f"| true non-edges wrongly rejected | {r['bloom_wrongly_rejected']:,} | 0 |")
    print(f"| edges accepted (false negatives) | {r['bloom_missed_edges']} | 0 |")
    print(
        f"| measured FPR (wrongly rejected / {r['true_non_edges']:,} non-edges) | {r['measured_fpr']:.4%} "
        f"(model {np.mean(r['expected_fpr']):.4%}) | 0 |"
    )
    print(
        f"| query time, 1M pairs | {r['bloom_seconds'] * 1e3:.1f} ms ({r['bloom_queries_per_second'] / 1e6:.1f} M/s) "
        f"| {r['exact_seconds'] * 1e3:.1f} ms ({r['exact_queries_per_second'] / 1e6:.1f} M/s) |"
    )
    print(f"| build time | {r['bloom_build_seconds']:.3f} s (compressed_graph) | {r['exact_build_seconds']:.3f} s |")
    print(
        f"| memory | {r['bloom_filter_bytes'] / 2**20:.2f} MiB filters + {(r['bloom_bytes'] - r['bloom_filter_bytes']) / 2**20:.2f}"
        f" MiB part ids | {r['exact_bytes'] / 2**20:.2f} MiB |"
    )


def print_sizes() -> None:
    from graphs.stages.negatives import sizes_at

    print("\n## At 100M undirected edges (200M directed keys), 10M nodes — computed from the formats, not measured")
    print("| target FPR | parts | cut share | Bloom bytes | exact bytes | exact / Bloom |")
    print("| --- | --- | --- | --- | --- | --- |")
    for fpr, parts, cut in ((0.01, 1, 0.0), (0.01, 8, 0.2), (0.001, 8, 0.2)):
        s = sizes_at(200_000_000, 10_000_000, fpr, cut, parts)
        print(
            f"| {fpr:g} | {parts} | {cut:.0%} | {s['bloom_bytes'] / 2**30:.2f} GiB | {s['exact_bytes'] / 2**30:.2f} GiB "
            f"| {s['ratio_exact_to_bloom']:.1f}x |"
        )


# ----------------------------------------------------------------------------- main


def print_table(rows: list[tuple[str, str, dict]]) -> None:
    print("\n## Link prediction on the test edges (same split, same 10,000 fixed negatives)")
    print("| graph | method | MRR | Hits@50 | ROC-AUC | seconds | notes |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for graph, method, r in rows:
        t = r["test"]
        print(
            f"| {graph} | {method} | {t['mrr']:.4f} | {t['hits@50']:.4f} | {t['auc']:.4f} | {r['seconds']:.1f} "
            f"| {r['note']} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default="ego-facebook,generated", help="dataset folders under datasets/, or generated")
    ap.add_argument("--nodes", type=int, default=10_000, help="generated graph: nodes")
    ap.add_argument("--edges", type=int, default=100_000, help="generated graph: edge rows")
    ap.add_argument("--peer-epochs", type=int, default=3, help="DGL's epochs (link_pred.py: 10)")
    ap.add_argument("--steps", type=int, default=1000, help="DGL's minibatches per epoch at most (link_pred.py: 1000)")
    ap.add_argument("--peer-scorer", default="mlp", choices=("dot", "mlp"), help="DGL's scorer (link_pred.py: mlp)")
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--work", default=".bench/link_prediction")
    ap.add_argument("--threads", type=int, default=0, help="OpenMP/torch threads for every row; 0 = default")
    ap.add_argument("--no-peer", action="store_true", help="skip DGL's example (ours and the heuristics only)")
    args = ap.parse_args()
    if args.threads:  # before torch and DGL start their OpenMP pools
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.work).resolve()
    rows: list[tuple[str, str, dict]] = []
    for name in args.graphs.split(","):
        label, landing, home = _graph(name, args, work)
        print(f"\n# {label}", flush=True)
        d = prepare(landing, home, args.parts)
        for method, r in run_heuristics(d).items():
            rows.append((label, method, r))
        if not args.no_peer:
            rows.append(
                (
                    label,
                    "DGL link_pred.py",
                    run_peer(d, args.peer_epochs, args.peer_scorer, features_for(d), args.steps),
                )
            )
        rows.append((label, "ours (defaults)", run_ours(d)))
        print_rejection(label, rejection(d))
    print_table(rows)
    print_sizes()


def _graph(name: str, args, work: Path) -> tuple[str, Path, Path]:
    """(label, landing folder, cache folder) of a --graphs entry; a generated graph is written once."""
    from graphs.synthetic.generate import GenerateConfig, generate_dataset

    if name == "generated":
        landing = work / f"landing-{args.nodes}-{args.edges}"
        if not landing.exists():
            generate_dataset(
                GenerateConfig(num_nodes=args.nodes, num_edges=args.edges, feature_dim=32, seed=0),
                landing,
                progress=False,
            )
        return (
            f"generated ({args.nodes:,} nodes, {args.edges:,} edge rows)",
            landing,
            work / f"home-{name}-{args.nodes}-{args.edges}",
        )
    landing = Path(__file__).resolve().parents[1] / "datasets" / name
    if not landing.is_dir():
        raise SystemExit(f"{landing}: no such dataset folder")
    return name, landing, work / f"home-{name}"


if __name__ == "__main__":
    main()
