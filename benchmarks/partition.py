"""Partition benchmark: our METIS (pymetis on a streamed CSR) vs DGL's METIS called directly,
each side in its own fresh process for its peak RSS; the whole stage; DistDGL writing.

    .venv/bin/python benchmarks/partition.py --nodes 1000000 --edges 10000000
    .venv/bin/python benchmarks/partition.py --nodes 200000 --edges 2000000 --parts 8 --distdgl

The generated graph and its canonical form are built once in a child process (cached under
--work, shared with benchmarks/adjacency.py), so this parent never holds the graph and the
children it spawns do not inherit a large peak RSS (Linux keeps a process's peak across
fork and exec). Then, each in a fresh spawned child that does nothing else first:
  dgl     load the canonical edges, build the DGL graph, `dgl.metis_partition_assignment(g, k)`
          (what a DGL user calls); its time is the METIS call alone;
  ours    `read_csr` (streamed idx_t CSR) and `metis_assign_csr` (pymetis, seeded); its time
          is the METIS call alone (target <= 1.15x dgl), edge cut within 1.05x of dgl's;
  coarse  `read_csr` and `metis_assign_csr(max_edges=...)`: multilevel METIS within an edge
          budget (graphs/kernels/coarsen.py: label-propagation coarsening, METIS on the coarse graph,
          refinement), forced here with a budget below the graph's size; what the stage does
          above `metis_max_edges` (100M edges: `--skip-dgl --skip-direct`);
  stage   the whole `build_partitions` (METIS, halos, clusters, metrics; DistDGL off);
  distdgl (with --distdgl) the DistDGL files from our assignment: `write_distdgl` (DGL's own
          `partition_graph`) and `write_distdgl_parts` (ours, part by part from the CSR).
Each child reports seconds, peak RSS and the RSS it had before loading the graph.
Timings on a shared machine are noisy: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # DGL's own writer: dgl_reference.py
import harness  # noqa: E402  (benchmarks/harness.py)
from _child import run_in_child  # noqa: E402  (benchmarks/_child.py)


def _build(nodes: int, edges: int, work: str, landing: str | None, queue) -> None:
    from adjacency import canonical_graph_for  # same graph cache as the adjacency benchmark

    queue.put({"canonical": str(canonical_graph_for(nodes, edges, Path(work), Path(landing) if landing else None))})


def _cut(indptr, indices, part) -> int:
    from graphs.stages.partition_metrics import csr_metrics

    return int(csr_metrics(indptr, indices, part, int(part.max()) + 1, [])["edge_cut"])


def _dgl(canonical: str, k: int, queue) -> None:
    import contextlib
    import io

    import dgl

    from graphs.infra.storage import peak_rss_bytes
    from graphs.stages.partition import csr_indptr, dgl_graph, read_edges

    base = peak_rss_bytes()
    t = time.perf_counter()
    n, src, dst = read_edges(canonical)
    indptr = csr_indptr(src, n)
    del src
    g = dgl_graph(indptr, dst)
    t_load = time.perf_counter() - t
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        part = dgl.metis_partition_assignment(g, k)
    seconds = time.perf_counter() - t
    rss = peak_rss_bytes()
    part = part.numpy().astype("int32")
    queue.put({"seconds": seconds, "load": t_load, "rss": rss, "base": base, "cut": _cut(indptr, dst, part)})


def _ours(canonical: str, k: int, queue) -> None:
    from graphs.infra.storage import peak_rss_bytes
    from graphs.stages.partition import metis_assign_csr, read_csr

    base = peak_rss_bytes()
    t = time.perf_counter()
    n, indptr, indices = read_csr(canonical)
    t_load = time.perf_counter() - t
    t = time.perf_counter()
    part = metis_assign_csr(indptr, indices, k, symmetric=True, seed=0)
    seconds = time.perf_counter() - t
    rss = peak_rss_bytes()
    queue.put({"seconds": seconds, "load": t_load, "rss": rss, "base": base, "cut": _cut(indptr, indices, part)})


def _coarse(canonical: str, k: int, max_edges: int, queue) -> None:
    from graphs.infra.storage import peak_rss_bytes
    from graphs.stages.partition import metis_assign_csr, read_csr

    base = peak_rss_bytes()
    t = time.perf_counter()
    n, indptr, indices = read_csr(canonical)
    t_load = time.perf_counter() - t
    t = time.perf_counter()
    part = metis_assign_csr(indptr, indices, k, symmetric=True, seed=0, max_edges=max_edges)
    seconds = time.perf_counter() - t
    rss = peak_rss_bytes()
    queue.put({"seconds": seconds, "load": t_load, "rss": rss, "base": base, "cut": _cut(indptr, indices, part)})


def _stage(canonical: str, out: str, k: int, queue) -> None:
    from graphs.infra.storage import peak_rss_bytes
    from graphs.stages.partition import PartitionConfig, build_partitions

    base = peak_rss_bytes()
    t = time.perf_counter()
    s = build_partitions(canonical, out, PartitionConfig(num_parts=k, write_distdgl=False), "bench")
    queue.put({"seconds": time.perf_counter() - t, "rss": peak_rss_bytes(), "base": base, "steps": s["seconds"]})


def _distdgl(canonical: str, out: str, k: int, queue) -> None:
    from dgl_reference import write_distdgl  # tests/dgl_reference.py (on sys.path above)

    from graphs.infra.storage import peak_rss_bytes
    from graphs.stages.partition import dgl_graph, metis_assign_csr, read_csr

    base = peak_rss_bytes()
    n, indptr, indices = read_csr(canonical)
    part = metis_assign_csr(indptr, indices, k, symmetric=True)
    before = peak_rss_bytes()
    t = time.perf_counter()
    write_distdgl(dgl_graph(indptr, indices), part, k, out, "bench")
    queue.put({"seconds": time.perf_counter() - t, "rss": peak_rss_bytes(), "base": base, "before": before})


def _distdgl_ours(canonical: str, out: str, k: int, queue) -> None:
    from graphs.formats.distdgl_format import write_distdgl_parts
    from graphs.infra.storage import peak_rss_bytes
    from graphs.stages.partition import metis_assign_csr, read_csr

    base = peak_rss_bytes()
    n, indptr, indices = read_csr(canonical)
    part = metis_assign_csr(indptr, indices, k, symmetric=True)
    before = peak_rss_bytes()
    t = time.perf_counter()
    write_distdgl_parts(indptr, indices, part, k, out, "bench")
    queue.put({"seconds": time.perf_counter() - t, "rss": peak_rss_bytes(), "base": base, "before": before})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges", type=int, default=10_000_000, help="generated edge rows (before symmetrizing)")
    ap.add_argument("--landing", type=Path, help="use this landing folder instead of a generated graph")
    ap.add_argument("--canonical", type=Path, help="use this materialized canonical_graph folder as it is")
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--work", type=Path, default=Path("bench_out/graphs"))
    ap.add_argument("--skip-dgl", action="store_true", help="skip DGL's METIS (e.g. where it does not fit)")
    ap.add_argument("--skip-direct", action="store_true", help="skip METIS on the whole graph (where it does not fit)")
    ap.add_argument("--skip-stage", action="store_true", help="skip the whole-stage run")
    ap.add_argument(
        "--max-edges", type=int, default=0, help="edge budget of the multilevel run (0: a quarter of the graph's edges)"
    )
    ap.add_argument("--distdgl", action="store_true", help="also time the DistDGL export from our assignment")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--record", help="append result records here (benchmarks/harness.py)")
    args = ap.parse_args()

    work = args.work.resolve()
    landing = str(args.landing.resolve()) if args.landing else None
    if args.canonical:
        canonical = str(args.canonical.resolve())
    else:
        canonical = run_in_child(_build, args.nodes, args.edges, str(work), landing)["canonical"]
    from graphs.stages.canonical import CanonicalGraph

    facts = CanonicalGraph.open(canonical).summary
    k = args.parts

    from adjacency import warm  # the same warm page cache for each side

    max_edges = args.max_edges or facts["edges"] // 4
    rows = {}
    if not args.skip_direct:
        warm(Path(canonical))
        rows["ours"] = run_in_child(_ours, canonical, k)
    warm(Path(canonical))
    rows["coarse"] = run_in_child(_coarse, canonical, k, max_edges)
    if not args.skip_dgl:
        warm(Path(canonical))
        rows["dgl"] = run_in_child(_dgl, canonical, k)
    stage = None
    if not args.skip_stage:
        stage_out = work / "partition-stage"
        shutil.rmtree(stage_out, ignore_errors=True)
        stage = run_in_child(_stage, canonical, str(stage_out), k)
        shutil.rmtree(stage_out, ignore_errors=True)
    distdgl = None
    if args.distdgl:
        out = work / "partition-distdgl"
        shutil.rmtree(out, ignore_errors=True)
        distdgl = run_in_child(_distdgl, canonical, str(out), k)
        shutil.rmtree(out, ignore_errors=True)
        distdgl_ours = run_in_child(_distdgl_ours, canonical, str(out), k)
        shutil.rmtree(out, ignore_errors=True)

    gb = 2**30
    print(f"\ngraph: {facts['nodes']:,} nodes, {facts['edges']:,} canonical (directed) edges, k = {k} parts")
    print("| METIS | load s | METIS s | peak RSS GB | RSS above imports GB | edge cut |")
    print("| --- | --- | --- | --- | --- | --- |")
    names = {
        "ours": "ours: read_csr + metis_assign_csr (pymetis)",
        "coarse": f"ours, multilevel within {max_edges:,} edges (graphs/kernels/coarsen.py)",
        "dgl": "DGL: dgl.metis_partition_assignment",
    }
    for name, r in rows.items():
        print(
            f"| {names[name]} | {r['load']:.2f} | {r['seconds']:.2f} | {r['rss'] / gb:.2f} | "
            f"{(r['rss'] - r['base']) / gb:.2f} | {r['cut']:,} |"
        )
    result = {"nodes": facts["nodes"], "edges": facts["edges"], "parts": k, "max_edges": max_edges, **rows}
    result["stage"] = stage
    if "dgl" in rows:
        dgl = rows["dgl"]
        for name in ("ours", "coarse"):
            if name not in rows:
                continue
            ours = rows[name]
            ratios = {
                "time": ours["seconds"] / dgl["seconds"],
                "cut": ours["cut"] / max(dgl["cut"], 1),
                "rss": ours["rss"] / dgl["rss"],
                "rss_above_imports": (ours["rss"] - ours["base"]) / max(dgl["rss"] - dgl["base"], 1),
            }
            result["ratios" if name == "ours" else f"{name}_ratios"] = ratios
            print(
                f"{name} / DGL: METIS time {ratios['time']:.3f} (target <= 1.15), edge cut {ratios['cut']:.3f} "
                f"(target <= 1.05), peak RSS {ratios['rss']:.3f} ({ratios['rss_above_imports']:.3f} above imports)"
            )
    if stage is not None:
        steps = ", ".join(f"{name} {v:.2f}" for name, v in stage["steps"].items())
        print(
            f"\nwhole stage build_partitions, DistDGL off (fresh process): {stage['seconds']:.2f} s, peak RSS "
            f"{stage['rss'] / gb:.2f} GB ({(stage['rss'] - stage['base']) / gb:.2f} GB above imports); steps (s): {steps}"
        )
    if distdgl is not None:
        result["distdgl"], result["distdgl_ours"] = distdgl, distdgl_ours
        for name, r in (("write_distdgl, DGL's partition_graph", distdgl), ("write_distdgl_parts, ours", distdgl_ours)):
            print(
                f"DistDGL export ({name}): {r['seconds']:.2f} s, peak RSS "
                f"{r['rss'] / gb:.2f} GB vs {r['before'] / gb:.2f} GB with the CSR and parts alone"
            )
    records = []
    if "dgl" in rows:
        dgl = rows["dgl"]
        common = {"benchmark": "partition", "nodes": facts["nodes"], "edges": args.edges}
        labels = {"ours": "METIS", "coarse": f"multilevel METIS within {max_edges:,} edges"}
        for name in ("ours", "coarse"):
            if name not in rows:
                continue
            ours = rows[name]
            records += [
                harness.Record(
                    **common,
                    stage=f"{labels[name]}, k = {k}",
                    metric="seconds (METIS call)",
                    ours=ours["seconds"],
                    peer=dgl["seconds"],
                    peer_name="dgl.metis_partition_assignment",
                    max_ratio=1.15,
                    ours_rss_bytes=ours["rss"],
                    peer_rss_bytes=dgl["rss"],
                    notes="peak RSS includes loading the graph; DGL's side also imports torch "
                    f"(RSS above imports: ours {(ours['rss'] - ours['base']) / gb:.2f} GB, "
                    f"DGL {(dgl['rss'] - dgl['base']) / gb:.2f} GB)",
                ),
                harness.Record(
                    **common,
                    stage=f"{labels[name]} edge cut, k = {k}",
                    metric="cut edges",
                    ours=ours["cut"],
                    peer=max(dgl["cut"], 1),
                    peer_name="dgl.metis_partition_assignment",
                    max_ratio=1.05,
                ),
            ]
    harness.emit(args.record, records)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
