"""Training nodes per part: METIS alone, METIS with the training-node constraint, random.

    .venv/bin/python benchmarks/partition_balance.py                        # Cora and CiteSeer, k = 2, 4, 8
    .venv/bin/python benchmarks/partition_balance.py --graphs cora --parts 4,16

For each graph (a folder of `datasets/`) and part count k: metis_partitions
(`graphs.stages.partition.build_partitions`) with ``balance_train_nodes`` off and on, and the
seeded random assignment the stage measures beside METIS, in the same run. Printed per row: the
training nodes of each part, their imbalance (largest part over the mean: under ``placement:
partition`` the seed share of the rank owning the largest part) and the edge-cut ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    from graphs.stages.canonical import build_canonical_graph
    from graphs.stages.partition import PartitionConfig, build_partitions

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="cora,citeseer")
    ap.add_argument("--parts", default="2,4,8")
    ap.add_argument("--datasets", default=str(ROOT / "datasets"))
    args = ap.parse_args()
    print("| graph | k | assignment | training nodes per part | imbalance | edge cut |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="partition-balance-") as tmp:
        for name in args.graphs.split(","):
            canonical = Path(tmp) / name / "canonical"
            build_canonical_graph(Path(args.datasets) / name, canonical)
            for k in (int(p) for p in args.parts.split(",")):
                for balance in (False, True):
                    cfg = PartitionConfig(num_parts=k, balance_train_nodes=balance, write_distdgl=False)
                    s = build_partitions(canonical, Path(tmp) / name / f"parts-{k}-{balance}", cfg)
                    rows = [("METIS + training-node constraint" if balance else "METIS", s["metis"])]
                    rows += [] if balance else [("random", s["random"])]
                    for label, m in rows:
                        print(
                            f"| {name} | {k} | {label} | {m['train_nodes']} | {m['train_imbalance']:.3f} | "
                            f"{m['edge_cut_ratio']:.3f} |",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
