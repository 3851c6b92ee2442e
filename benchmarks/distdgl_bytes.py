"""Bytes that really move between machines in the DistDGL engine, per node partitioning strategy.

    .venv/bin/python benchmarks/distdgl_bytes.py                 # 20k-node DC-SBM, D = 64 and 256
    .venv/bin/python benchmarks/distdgl_bytes.py --nodes 50000 --widths 128 --epochs 3

Two DistDGL machines (one server and one trainer each, `training.distdgl`) in network namespaces
joined by a veth pair, each with a private /dev/shm (tests/netns.py, the harness of the DistDGL
tests; it needs `ip netns` and mount namespaces, so root), trained from the DistDGL partitions of
one generated DC-SBM graph (power-law degrees, communities) under three assignments of its nodes
to the 2 machines: random (metis_partitions' hash baseline), METIS, and METIS with
``balance_train_nodes``. The same fanouts, batch size, model, seed and epochs for every run.

Printed per feature width D and strategy: the bytes each machine's interface received per
training step, measured by the engine from the interface's counter (`rx_bytes_per_step`:
sampled blocks, feature rows and gradients together; evaluation left out), the feature bytes
accounted from the input rows the trainers pulled from the other machine's part (remote rows x D
x 4 bytes per step), the remote input share, and test accuracy. The gradients' bytes are the same
in every row of a width, so the differences between rows are the partitioning's. The vertex cut
(metis_partitions' ``vertex_cut``) has no DistDGL form: DistDGL partitions nodes, so it is
measured by accounting in benchmarks/partitioning.py only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))  # the two-machine harness: tests/netns.py

from netns import run_distdgl_machines, skip_without_mount_namespaces, two_hosts  # noqa: E402

from training.outputs import SUMMARY  # noqa: E402

STRATEGIES = ("random", "METIS", "METIS + balance")
GRAPH = "bytes"


def prepare(work: Path, nodes: int, width: int) -> Path:
    """The generated graph's canonical folder at feature width `width` (built once)."""
    from graphs.stages.canonical import CanonicalGraph, build_canonical_graph
    from graphs.synthetic.generate import GenerateConfig, generate_dataset

    home = work / f"d{width}"
    if not (home / "canonical_graph" / CanonicalGraph.SUMMARY).exists():
        gen = GenerateConfig(num_nodes=nodes, num_edges=8 * nodes, feature_dim=width)
        generate_dataset(gen, home / "landing", progress=False)
        build_canonical_graph(home / "landing", home / "canonical_graph")
    return home


def part_config(home: Path, strategy: str) -> Path:
    """The DistDGL partition config of `strategy` over 2 machines (written once)."""
    from graphs.formats.distdgl_format import write_distdgl_parts
    from graphs.formats.partition_files import Partitions
    from graphs.stages.partition import PartitionConfig, build_partitions, random_assign, read_csr
    from graphs.stages.partition_nodes import node_data

    out = home / strategy.replace(" + ", "-").lower()
    config = out / Partitions.DISTDGL / f"{GRAPH}.json"
    if config.exists():
        return config
    can = home / "canonical_graph"
    if strategy == "random":
        n, indptr, indices = read_csr(can)
        write_distdgl_parts(
            indptr, indices, random_assign(n, 2, 0), 2, out / Partitions.DISTDGL, GRAPH, node_data(can, n)
        )
    else:
        cfg = PartitionConfig(num_parts=2, clusters_per_part=1, balance_train_nodes=strategy != "METIS")
        build_partitions(can, out, cfg, graph_name=GRAPH)
    return config


def train(config: Path, out: Path, args, index: int) -> dict:
    """Two machines training from `config`; the engine's summary."""
    flags = ["--part-config", str(config), "--out", str(out), "--torch-port", "29491"]
    flags += ["--fanouts", args.fanouts, "--batch-size", str(args.batch_size), "--epochs", str(args.epochs)]
    flags += ["--lr", "0.01", "--model-hidden", str(args.hidden)]
    with two_hosts("gfby", 200 + index) as hosts:
        skip_without_mount_namespaces(hosts[0][0])
        run_distdgl_machines(hosts, flags, out.parent / f"{out.name}-logs", timeout=1200)
    return json.loads((out / SUMMARY).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=20000, help="nodes of the generated graph (8 edge rows per node)")
    ap.add_argument("--widths", default="64,256")
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--work", default="bench_out/distdgl_bytes")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    rows = []
    for width in (int(w) for w in args.widths.split(",")):
        home = prepare(work, args.nodes, width)
        for strategy in STRATEGIES:
            out = home / "runs" / strategy.replace(" + ", "-").lower()
            s = train(part_config(home, strategy), out, args, len(rows))
            remote = sum(sum(r["trainer_remote"]) for r in s["history"])
            steps = s["steps_per_trainer"] * s["trainers"]
            rows.append(
                {
                    "width": width,
                    "strategy": strategy,
                    "rx": s["rx_bytes_per_step"],
                    "accounted": remote * width * 4 / steps,
                    "share": s["remote_input_share"],
                    "acc": 100 * s["test_acc_at_best_val"],
                    "steps": s["steps_per_trainer"],
                }
            )
            print(rows[-1], flush=True)
    print(
        f"\n{args.nodes:,} nodes, 2 machines x (1 server + 1 trainer), fanouts {args.fanouts}, batch "
        f"{args.batch_size}, hidden {args.hidden}, {args.epochs} epochs\n"
    )
    print(
        "| D | strategy | received KB per step (measured) | vs random | feature KB per step (accounted) | "
        "remote input share | steps per trainer | test acc % |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        base = next(b for b in rows if b["width"] == r["width"] and b["strategy"] == "random")
        print(
            f"| {r['width']} | {r['strategy']} | {r['rx'] / 1024:.1f} | {r['rx'] / base['rx']:.3f} | "
            f"{r['accounted'] / 1024:.1f} | {r['share']:.3f} | {r['steps']} | {r['acc']:.2f} |"
        )


if __name__ == "__main__":
    main()
