"""Partition benchmark: our METIS step vs calling DGL directly, DistDGL writing, METIS vs random.

    .venv/bin/python benchmarks/partition.py --nodes 1000000 --edges 10000000
    .venv/bin/python benchmarks/partition.py --nodes 200000 --edges 2000000 --parts 8

Generates the graph and its canonical form once (cached under --work, shared with
benchmarks/adjacency.py), loads the canonical edges, and times in this one process:
  dgl     `dgl.metis_partition_assignment(g, k)` on a DGL graph built beforehand;
  ours    `graphs.partition.metis_assign((indptr, indices), k)`, which builds the DGL graph
          from the CSR arrays itself and returns int32 numpy (target: <= 1.15x dgl);
  random  the seeded hash baseline, and the edge-cut / balance / halo metrics of both;
  distdgl writing DGL's partition format from our assignment (`write_distdgl`) vs DGL's
          own `partition_graph(part_method="metis")`, which runs METIS again.
Before all that, the whole stage (`build_partitions`: METIS, halos, clusters, DistDGL
files) runs in a fresh child process for its wall time and peak RSS.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _child import run_in_child  # benchmarks/_child.py
from adjacency import canonical_graph_for  # noqa: E402  (same graph cache as the adjacency benchmark)


def _stage(canonical: str, out: str, k: int, queue) -> None:
    import dgl  # noqa: F401  (import outside the timing, as in the asset process)

    from graphs.partition import PartitionConfig, build_partitions
    from graphs.storage import peak_rss_bytes

    base = peak_rss_bytes()
    t = time.perf_counter()
    s = build_partitions(canonical, out, PartitionConfig(num_parts=k), "bench")
    queue.put({"seconds": time.perf_counter() - t, "rss": peak_rss_bytes(), "base": base, "steps": s["seconds"]})


def _best(fn, repeat: int):
    best, value = None, None
    for _ in range(repeat):
        t = time.perf_counter()
        value = fn()
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    return best, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges", type=int, default=10_000_000, help="generated edge rows (before symmetrizing)")
    ap.add_argument("--landing", type=Path, help="use this landing folder instead of a generated graph")
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--work", type=Path, default=Path("bench_out/graphs"))
    ap.add_argument("--repeat", type=int, default=1, help="runs of each METIS variant; the best time is kept")
    ap.add_argument("--skip-native", action="store_true", help="skip DGL's own partition_graph (re-runs METIS)")
    args = ap.parse_args()

    import contextlib
    import io

    import dgl
    import numpy as np

    from graphs.partition import (
        core_and_halo,
        csr_indptr,
        dgl_graph,
        metis_assign,
        partition_metrics,
        random_assign,
        read_edges,
        write_distdgl,
    )
    from graphs.storage import peak_rss_bytes

    work = args.work.resolve()
    canonical = canonical_graph_for(args.nodes, args.edges, work, args.landing)
    k = args.parts

    # The child first: on Linux a spawned child inherits its parent's peak RSS reading.
    stage_out = work / "partition-stage"
    shutil.rmtree(stage_out, ignore_errors=True)
    stage = run_in_child(_stage, str(canonical), str(stage_out), k)
    shutil.rmtree(stage_out, ignore_errors=True)

    t = time.perf_counter()
    n, src, dst = read_edges(canonical)
    indptr = csr_indptr(src, n)
    t_load = time.perf_counter() - t
    g = dgl_graph(indptr, dst)
    with contextlib.redirect_stdout(io.StringIO()):
        t_dgl, dgl_part = _best(lambda: dgl.metis_partition_assignment(g, k), args.repeat)
    t_ours, part = _best(lambda: metis_assign((indptr, dst), k), args.repeat)
    same = bool(np.array_equal(dgl_part.numpy(), part))

    t_random, random_part = _best(lambda: random_assign(n, k, 0), 1)
    t = time.perf_counter()
    halos = core_and_halo(src, dst, part, k)[1]
    t_halo = time.perf_counter() - t
    metis = partition_metrics(src, dst, part, k, halos)
    random = partition_metrics(src, dst, random_part, k, core_and_halo(src, dst, random_part, k)[1])

    # each writer gets a freshly built graph, so neither inherits the other's cached formats
    out = work / "partition-distdgl"
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    write_distdgl(dgl_graph(indptr, dst), part, k, out / "ours", "bench")
    t_write = time.perf_counter() - t
    t_native = None
    if not args.skip_native:
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            dgl.distributed.partition_graph(
                dgl_graph(indptr, dst), "bench", k, str(out / "native"), part_method="metis"
            )
        t_native = time.perf_counter() - t
    shutil.rmtree(out, ignore_errors=True)
    rss_main = peak_rss_bytes()

    print(
        f"\ngraph: {n:,} nodes, {len(dst):,} "
        f"canonical (directed) edges, k = {k} parts; edges loaded + CSR in {t_load:.2f} s"
    )
    print(f"{'METIS assignment':<52}{'seconds':>9}")
    print(f"{'dgl.metis_partition_assignment (graph prebuilt)':<52}{t_dgl:>9.2f}")
    print(f"{'ours metis_assign (builds graph from CSR, int32)':<52}{t_ours:>9.2f}")
    print(f"ratio ours / dgl: {t_ours / t_dgl:.3f} (target <= 1.15); same assignment: {same}")
    print(f"\n{'metric':<22}{'METIS':>12}{'random':>12}")
    for name in ("edge_cut_ratio", "node_balance", "edge_balance", "halo_replication"):
        print(f"{name:<22}{metis[name]:>12.4f}{random[name]:>12.4f}")
    print(f"{'assign seconds':<22}{t_ours:>12.2f}{t_random:>12.3f}")
    print(
        f"edge-cut ratio METIS / random: {metis['edge_cut_ratio'] / random['edge_cut_ratio']:.3f}; "
        f"halos computed in {t_halo:.2f} s"
    )
    print("\nDistDGL format")
    print(f"{'ours: write_distdgl from our assignment':<52}{t_write:>9.2f} s")
    if t_native is not None:
        print(
            f"{'DGL partition_graph(part_method=metis)':<52}{t_native:>9.2f} s"
            f"  = {t_native / t_dgl:.2f}x the assignment alone; ours saves {t_native - t_write:.1f} s"
        )
    print(f"peak RSS of this process: {rss_main / 2**30:.2f} GB")
    steps = ", ".join(f"{name} {v:.2f}" for name, v in stage["steps"].items())
    print(
        f"\nwhole stage build_partitions (fresh process): {stage['seconds']:.2f} s, peak RSS "
        f"{stage['rss'] / 2**30:.2f} GB ({(stage['rss'] - stage['base']) / 2**30:.2f} GB above imports)"
    )
    print(f"  steps (s): {steps}")


if __name__ == "__main__":
    main()
