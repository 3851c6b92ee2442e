"""Wall time and peak RSS of the first stages at one graph size, each stage in a fresh spawned
child (its peak RSS is its own), appended to benchmarks/results/scale_stages.json for the
scale table (stage, edges, nodes, wall_s, peak_rss_bytes, machine, date).

    .venv/bin/python benchmarks/scale_stages.py --nodes 100000 --edges 1000000
    .venv/bin/python benchmarks/scale_stages.py --nodes 1000000 --edges 10000000

Stages: generate (graphs.synthetic.generate, scale_config), canonical_graph (DuckDB ingest),
normalized_adjacency, metis_partitions (default PartitionConfig: METIS, or the multilevel
METIS above `metis_max_edges`, halos, clusters, the DistDGL parts). The library functions
the assets call, without Dagster. A record with the same (stage, edges) is replaced.
The 10M-node / 100M-edge figures come from the Dagster run of every stage (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _child import run_in_child  # benchmarks/_child.py

RESULTS = Path(__file__).resolve().parent / "results" / "scale_stages.json"


def machine() -> str:
    """CPU model, cores and memory of this machine, in words."""
    import os

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    except OSError:
        mem = 0.0
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM (shared with other jobs)"


def _stage(name: str, nodes: int, edges: int, root: str, queue) -> None:
    from graphs.infra.storage import peak_rss_bytes

    root_p = Path(root)
    t = time.perf_counter()
    if name == "generate":
        from graphs.synthetic.generate import generate_dataset, scale_config

        generate_dataset(scale_config(nodes, edges, seed=0), root_p / "landing", progress=False)
    elif name == "canonical_graph":
        from graphs.stages.canonical import build_canonical_graph

        build_canonical_graph(root_p / "landing", root_p / "canonical_graph")
    elif name == "normalized_adjacency":
        from graphs.stages.normalize import AdjacencyConfig, build_normalized_adjacency

        build_normalized_adjacency(root_p / "canonical_graph", root_p / "normalized_adjacency", AdjacencyConfig())
    elif name == "metis_partitions":
        from graphs.stages.partition import PartitionConfig, build_partitions

        build_partitions(root_p / "canonical_graph", root_p / "metis_partitions", PartitionConfig(), "scale")
    queue.put({"wall_s": time.perf_counter() - t, "peak_rss_bytes": peak_rss_bytes()})


STAGES = ("generate", "canonical_graph", "normalized_adjacency", "metis_partitions")
SCOPE = "library function in a fresh spawned process (no Dagster, no asset checks)"


def upsert(records: list[dict], path: Path = RESULTS) -> None:
    """Add `records` to the JSON list at `path`, replacing those with the same (stage, edges)."""
    old = json.loads(path.read_text()) if path.is_file() else []
    keys = {(r["stage"], r["edges"]) for r in records}
    merged = [r for r in old if (r["stage"], r["edges"]) not in keys] + records
    merged.sort(key=lambda r: (r["edges"], STAGES.index(r["stage"]) if r["stage"] in STAGES else 99, r["stage"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--edges", type=int, required=True, help="generated edge rows (before symmetrizing)")
    ap.add_argument("--work", type=Path, default=Path("bench_out/scale"))
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    root = args.work.resolve() / f"n{args.nodes}-e{args.edges}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    records = []
    for name in args.stages.split(","):
        if name not in STAGES:
            raise SystemExit(f"--stages: unknown stage {name!r}; choose from {STAGES}")
        r = run_in_child(_stage, name, args.nodes, args.edges, str(root))
        rec = {"stage": name, "edges": args.edges, "nodes": args.nodes, **r, "machine": machine(), "date": date}
        rec["scope"] = SCOPE
        rec["wall_s"] = round(rec["wall_s"], 2)
        records.append(rec)
        print(f"{name}: {rec['wall_s']:.1f} s, peak RSS {rec['peak_rss_bytes'] / 2**30:.2f} GiB", flush=True)
    upsert(records, args.out)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
