"""Partitioning strategies side by side: random, METIS edge-cut, METIS + training-node balance, hybrid,
vertex cut (HDRF and DBH).

    .venv/bin/python benchmarks/partitioning.py                       # Cora + a generated power-law graph
    .venv/bin/python benchmarks/partitioning.py --graphs generated --world-sizes 2,4 --nodes 20000

For each graph and W ranks (k = W METIS parts): metis_partitions with and without
``balance_train_nodes`` (timed, with their edge cut and halo replication), then minibatch_shards
with the same sampler, fanouts, batch size and seed under each strategy:

- random: seeds cut at random over the ranks (the baseline), rows owned by METIS part;
- METIS: ``placement: partition`` (each rank's seeds from its parts);
- METIS + balance: the same over the parts of the training-node-balanced METIS;
- hybrid: METIS plus ``replicate``: the highest-degree rows that fit a fixed memory budget per rank
  (--budget-share, PaGraph's rule) held by every rank, so fewer rows at wider features;
- vertex cut: metis_partitions' ``vertex_cut`` (HDRF, DBH) and ``placement: vertex_cut``: each rank
  samples its own edges and holds every row they touch, so a row is remote only for a seed moved
  off its master's rank; the cost is the replicas (rows held per rank) and partial neighbourhoods
  (fewer sampled edges, the accuracy column); each is followed by hybrid given the same rows per
  rank (METIS plus the highest-degree rows up to the vertex cut's largest rank), the comparison at
  equal memory.

Printed per row, from the shards' manifest (accounting of the rows each step gathers; on 2
cores only W = 2 also trains): remote feature bytes per rank and step at each feature width
(remote rows x D x 4 bytes), the remote row share, the feature rows the largest rank holds (its
parts' nodes, plus the replicated rows for hybrid, plus the replicas for a vertex cut) as a share
of n, the replication factor (1 + replicated rows x (W - 1) / n for hybrid; vertex copies over n
for a vertex cut; METIS's halo replication is printed beside), the per-rank load imbalance (max /
mean sampled edges of an epoch, mean over epochs), the sampled edges per step, the training-node
imbalance of the parts (of the masters for a vertex cut), partitioning seconds (METIS's call, or
the edge partitioner's), the metis_partitions stage's peak RSS (built in a fresh process per
setting: METIS, its clusters and, where set, the vertex cut), and for W = 2 test accuracy (one training process reading the W streams:
the DDP-averaged gradient; mean ± std over --seeds training seeds; hybrid samples exactly
METIS's shards, so its accuracy is METIS's).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from _child import run_in_child  # noqa: E402  (benchmarks/_child.py: a fresh process per variant)
from placement import GRAPHS  # noqa: E402  (benchmarks/placement.py: each graph's shard and training settings)

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (64, 256, 512)
VERTEX_CUTS = ("hdrf", "dbh")


def prepare(name: str, work: Path, nodes: int) -> Path:
    """canonical_graph and normalized_adjacency of `name` under work/name (built once)."""
    from graphs.stages.canonical import CanonicalGraph, build_canonical_graph
    from graphs.stages.normalize import Adjacency, build_normalized_adjacency

    home = work / name
    landing = ROOT / "datasets" / name
    if name == "generated":
        from graphs.synthetic.generate import GenerateConfig, generate_dataset

        landing = home / "landing"
        if not landing.exists():  # the demo's DC-SBM: power-law degrees, communities
            generate_dataset(
                GenerateConfig(num_nodes=nodes, num_edges=8 * nodes, feature_dim=32), landing, progress=False
            )
    if not (home / "canonical_graph" / CanonicalGraph.SUMMARY).exists():
        build_canonical_graph(landing, home / "canonical_graph")
    if not (home / "normalized_adjacency" / Adjacency.SUMMARY).exists():
        build_normalized_adjacency(home / "canonical_graph", home / "normalized_adjacency")
    return home


def _partition_child(home: Path, out: Path, w: int, balance: bool, vertex_cut: str, queue) -> None:
    """metis_partitions in a fresh process: its summary and that process's peak RSS."""
    from graphs.infra.storage import peak_rss_bytes
    from graphs.stages.partition import PartitionConfig, build_partitions

    t = time.perf_counter()
    cfg = PartitionConfig(num_parts=w, balance_train_nodes=balance, write_distdgl=False, vertex_cut=vertex_cut)
    s = build_partitions(home / "canonical_graph", out, cfg)
    queue.put({"summary": s, "wall_seconds": time.perf_counter() - t, "peak_rss_bytes": peak_rss_bytes()})


def partitions(home: Path, w: int, balance: bool, vertex_cut: str = "none") -> tuple[Path, dict]:
    """The partitions of one setting, built in a spawned child (`benchmarks/_child.py`) so its peak
    memory is the stage's own (imports included, the same for every row)."""
    out = home / f"metis-k{w}-{'balanced' if balance else 'plain'}-{vertex_cut}"
    child = run_in_child(_partition_child, home, out, w, balance, vertex_cut)
    s = child["summary"]
    facts = {**s["metis"], "wall_seconds": child["wall_seconds"], "random": s["random"]}
    facts["stage_peak_mb"] = child["peak_rss_bytes"] / 2**20
    if vertex_cut != "none":
        facts["vertex_cut"] = s["vertex_cut"]
    return out, facts


def shard_row(home: Path, parts: Path, w: int, label: str, **settings) -> dict:
    """Write the shards of one strategy; its accounting figures."""
    from graphs.formats.partition_files import Partitions
    from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards

    inputs = load_shard_inputs(home / "canonical_graph", home / "normalized_adjacency", parts)
    out = home / f"shards-w{w}-{label.replace(' ', '_').replace('+', 'p')}"
    m = write_minibatch_shards(inputs, out, ShardConfig(world_size=w, **GRAPHS[home.name][0], **settings))
    steps = w * m["epochs"] * m["minibatches_per_epoch_per_rank"]
    remote = sum(s["remote_rows"] for s in m["streams"])
    per_epoch = [[s["sampled_edges"] for s in m["streams"] if s["epoch"] == e] for e in range(m["epochs"])]
    placement = m["placement"]
    replicated = placement["replicated_rows"]
    own = placement.get("own_edges")
    if own is not None:  # a vertex cut: each rank's replicas
        held, replication = max(own["rows_held_per_rank"]), own["replication_factor"]
    else:  # the nodes of the rank's METIS parts, plus the rows every rank holds
        part_id = np.load(parts / Partitions.PART_ID)
        rank_of_node = np.asarray(placement["rank_of_part"])[part_id]
        held = int(np.bincount(rank_of_node, minlength=w).max()) + replicated
        replication = 1 + replicated * (w - 1) / inputs.n
    return {
        "shards": out,
        "n": inputs.n,
        "remote_rows_per_step": remote / steps,
        "remote_share": placement["remote_row_share_total"],
        "held_share": held / inputs.n,
        "replication": replication,
        "edges_per_step": m["sampled_edges"] / steps,
        "edge_imbalance": float(np.mean([max(e) / np.mean(e) for e in per_epoch])),
    }


def test_accuracy(name: str, shards: Path, out: Path, seeds: int) -> tuple[float, float]:
    """Mean and standard deviation of the test accuracy (%) over training seeds 0..seeds-1."""
    from training.config import RunConfig
    from training.train import train

    _, model, training = GRAPHS[name]
    accs = []
    for seed in range(seeds):
        paths = {"shards": str(shards), "out": str(out / f"seed{seed}")}
        run = {**training, "profiler": "none", "seed": seed}
        cfg = RunConfig.from_dict({"model": model, "training": run, "paths": paths})
        accs.append(100 * float(train(cfg)["test_acc_at_best_val"]))
    return float(np.mean(accs)), float(np.std(accs))


def rows_of(name: str, home: Path, w: int, budget_share: float, accuracy: int) -> list[dict]:
    """The table's rows of one graph at W ranks; `accuracy` training seeds per trained strategy (0: none)."""
    plain, s_plain = partitions(home, w, balance=False)
    balanced, s_bal = partitions(home, w, balance=True)
    strategies = [
        ("random", plain, s_plain["random"] | {"wall_seconds": 0.0, "stage_peak_mb": float("nan")}, {}),
        ("METIS", plain, s_plain, {"placement": "partition"}),
        ("METIS + balance", balanced, s_bal, {"placement": "partition"}),
    ]
    rows = []
    for label, parts, s, settings in strategies:
        r = shard_row(home, parts, w, label, **settings)
        rows.append({"strategy": label, "partition": s, **r})
    n = rows[0]["n"]
    budget_mb = budget_share * n * WIDTHS[0] * 4 / 2**20  # a fixed memory budget per rank
    for d in WIDTHS:  # hybrid: the rows that fit the budget at this width
        share = budget_share * WIDTHS[0] / d
        r = shard_row(home, plain, w, f"hybrid-d{d}", placement="partition", replicate=round(share, 6))
        rows.append({"strategy": f"hybrid ({budget_mb:.2f} MB/rank at D={d})", "partition": s_plain, "width": d, **r})
    for cut in VERTEX_CUTS:
        parts, s = partitions(home, w, balance=False, vertex_cut=cut)
        vc = s["vertex_cut"]
        facts = {
            "halo_replication": float("nan"),
            "train_imbalance": vc["train_imbalance"],
            "wall_seconds": vc["seconds"],
            "stage_peak_mb": s["stage_peak_mb"],
        }
        r = shard_row(home, parts, w, f"vertex-cut-{cut}", placement="vertex_cut")
        rows.append({"strategy": f"vertex cut ({cut.upper()})", "partition": facts, **r})
        # METIS + hybrid given the rows this vertex cut holds: the same memory per rank
        extra = max(0.0, r["held_share"] - rows[1]["held_share"])
        r = shard_row(home, plain, w, f"hybrid-as-{cut}", placement="partition", replicate=round(extra, 6))
        rows.append({"strategy": f"hybrid at {cut.upper()}'s rows", "partition": s_plain, **r})
    if accuracy:  # hybrid samples METIS's shards: METIS's accuracy
        for r in [r for r in rows if not r["strategy"].startswith("hybrid")]:
            run = home / "runs" / f"w{w}-{r['strategy'].replace(' ', '_')}"
            r["accuracy"] = test_accuracy(name, r["shards"], run, accuracy)
    for r in rows:
        r["graph"], r["w"] = name, w
    return rows


def print_table(rows: list[dict]) -> None:
    widths = " | ".join(f"remote KB/step D={d}" for d in WIDTHS)
    print(
        f"| graph | W | strategy | {widths} | remote row share | rows held by the largest rank / n | replication | "
        "METIS halo replication | sampled edges per step | sampled-edge imbalance | training-node imbalance | "
        "partition s | stage peak MB | test acc % (W=2) |"
    )
    print("|" + "---|" * (13 + len(WIDTHS)))
    for r in rows:
        kb = [(f"{r['remote_rows_per_step'] * d * 4 / 1024:.1f}" if r.get("width", d) == d else "") for d in WIDTHS]
        p = r["partition"]
        acc = f"{r['accuracy'][0]:.2f} ± {r['accuracy'][1]:.2f}" if "accuracy" in r else ""
        halo = "—" if np.isnan(p["halo_replication"]) else f"{p['halo_replication']:.3f}"
        peak = "—" if np.isnan(p["stage_peak_mb"]) else f"{p['stage_peak_mb']:.0f}"
        print(
            f"| {r['graph']} | {r['w']} | {r['strategy']} | {' | '.join(kb)} | {r['remote_share']:.3f} | "
            f"{r['held_share']:.3f} | {r['replication']:.3f} | {halo} | "
            f"{r['edges_per_step']:.0f} | {r['edge_imbalance']:.3f} | "
            f"{p['train_imbalance']:.3f} | {p['wall_seconds']:.2f} | {peak} | {acc} |",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="cora,generated")
    ap.add_argument("--world-sizes", default="2,4,8")
    ap.add_argument("--nodes", type=int, default=20000, help="nodes of the generated graph (8 edges per node)")
    ap.add_argument(
        "--budget-share",
        type=float,
        default=0.1,
        help=f"hybrid: replicated feature memory per rank, as this share of the rows at D={WIDTHS[0]}",
    )
    ap.add_argument("--seeds", type=int, default=3, help="training seeds per strategy at W = 2 (mean ± std)")
    ap.add_argument("--work", default="bench_out/partitioning")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    rows = []
    for name in args.graphs.split(","):
        home = prepare(name, work, args.nodes)
        for w in (int(x) for x in args.world_sizes.split(",")):
            rows += rows_of(name, home, w, args.budget_share, accuracy=args.seeds if w == 2 else 0)
    print("\nsampler neighbor; shard and training settings per graph: GRAPHS in benchmarks/placement.py\n")
    print_table(rows)


if __name__ == "__main__":
    main()
