"""Ingest benchmark: our canonical_graph stage vs the bare DuckDB dedupe of the same files.

    .venv/bin/python benchmarks/ingest.py --nodes 1000000 --edges 10000000
    .venv/bin/python benchmarks/ingest.py --nodes 10000000 --edges 100000000 --memory-limit 4GB
    .venv/bin/python benchmarks/ingest.py --baseline-code /path/to/other/checkout   # + that code's ingest

Generates the graph (cached under --work), then, each in a fresh child process so peak
RSS is its own: (1) ours, `build_canonical_graph` (validate, relabel, symmetrize, dedupe,
sort, labels/features, degree stats); (2) the bare DuckDB equivalent
`COPY (SELECT DISTINCT src, dst FROM read_parquet(...)) TO ... (FORMAT parquet)` with no
relabelling. Prints edges/s, seconds, peak RSS and the ratio ours / bare.

Weighted variant: the same edge rows with a ``weight`` column (``heavy_weight``: intra-class
rows 5.0, others 1.0), ingested by ours (weights summed over duplicates and both
directions) and by the bare DuckDB ``SELECT src, dst, sum(weight) ... GROUP BY src, dst``.
With ``--baseline-code`` the unweighted ingest of another checkout (e.g. main before a
change) runs too, on the same files in the same run.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from _child import run_in_child  # benchmarks/_child.py


def _ours(landing: str, out: str, memory_limit: str, budget_mb: int, queue, code: str | None = None) -> None:
    if code:  # another checkout's graphs/ package, imported in this fresh child only
        import sys

        sys.path.insert(0, code)
    from graphs.canonical import CanonicalConfig, build_canonical_graph
    from graphs.storage import peak_rss_bytes

    t = time.perf_counter()
    s = build_canonical_graph(landing, out, CanonicalConfig(memory_limit=memory_limit, sort_budget_mb=budget_mb))
    queue.put(
        {"seconds": time.perf_counter() - t, "rss": peak_rss_bytes(), "rows_out": s["edges"], "nodes": s["nodes"]}
    )


def _bare(landing: str, out: str, memory_limit: str, queue) -> None:
    from graphs import duck
    from graphs.storage import peak_rss_bytes

    Path(out).mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    con = duck.connect(memory_limit, temp_directory=f"{out}/tmp")
    con.execute("SET preserve_insertion_order = true")  # as in a plain DuckDB session
    # COPY (SELECT DISTINCT src, dst FROM read_parquet(...)) TO ..., with the paths as arguments
    con.read_parquet(f"{landing}/edges/*.parquet").select("src, dst").distinct().write_parquet(f"{out}/edges.parquet")
    rows = con.execute("SELECT count(*) FROM read_parquet(?)", [f"{out}/edges.parquet"]).fetchall()[0][0]
    queue.put({"seconds": time.perf_counter() - t, "rss": peak_rss_bytes(), "rows_out": rows})


def _bare_weighted(landing: str, out: str, memory_limit: str, queue) -> None:
    import duckdb

    from graphs.storage import peak_rss_bytes

    Path(out).mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    con = duckdb.connect(config={"memory_limit": memory_limit, "temp_directory": f"{out}/tmp"})
    edges = con.read_parquet(f"{landing}/edges/*.parquet")  # paths through the relation API
    edges.aggregate("src, dst, sum(weight) AS weight", "src, dst").write_parquet(f"{out}/edges.parquet")
    rows = con.read_parquet(f"{out}/edges.parquet").count("*").fetchall()[0][0]
    queue.put({"seconds": time.perf_counter() - t, "rss": peak_rss_bytes(), "rows_out": rows})


def _ours_baseline(landing: str, out: str, memory_limit: str, budget_mb: int, code: str, queue) -> None:
    _ours(landing, out, memory_limit, budget_mb, queue, code)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges", type=int, default=10_000_000)
    ap.add_argument("--work", default="bench_out/ingest")
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--sort-budget-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each variant; the best time is kept")
    ap.add_argument("--baseline-code", default=None, help="another checkout whose unweighted ingest runs too")
    ap.add_argument("--no-weighted", action="store_true", help="skip the weighted variant")
    args = ap.parse_args()

    from graphs.generate import generate_dataset, scale_config

    work = Path(args.work).resolve()
    landing = work / f"landing-{args.nodes}-{args.edges}"
    if not landing.exists():
        t = time.perf_counter()
        generate_dataset(scale_config(args.nodes, args.edges, seed=0), landing, progress=True)
        print(f"generated {landing} in {time.perf_counter() - t:.1f} s")
    import duckdb

    rows = duckdb.execute("SELECT count(*) FROM read_parquet(?)", [f"{landing}/edges/*.parquet"]).fetchall()[0][0]

    # The same edge files without nodes/features: our edge work alone against the same query.
    edges_only = work / f"edges-only-{args.nodes}-{args.edges}"
    if not edges_only.exists():
        edges_only.mkdir(parents=True)
        (edges_only / "edges").symlink_to(landing / "edges")
    import dataclasses

    weighted = work / f"weighted-{args.nodes}-{args.edges}"
    if not args.no_weighted and not weighted.exists():
        generate_dataset(dataclasses.replace(scale_config(args.nodes, args.edges, seed=0), heavy_weight=5.0), weighted)

    variants = ["bare", "ours", "ours_edges_only"]
    variants += [] if args.no_weighted else ["bare_weighted", "ours_weighted"]
    variants += ["ours_baseline_code"] if args.baseline_code else []
    results = {}
    for name in variants:
        best = None
        for _ in range(args.repeat):
            out = work / f"out-{name}"
            shutil.rmtree(out, ignore_errors=True)
            if name == "ours_baseline_code":
                code = str(Path(args.baseline_code).resolve())
                r = run_in_child(_ours_baseline, str(landing), str(out), args.memory_limit, args.sort_budget_mb, code)
            elif name.startswith("ours"):
                source = {"ours": landing, "ours_edges_only": edges_only, "ours_weighted": weighted}[name]
                r = run_in_child(_ours, str(source), str(out), args.memory_limit, args.sort_budget_mb)
            elif name == "bare_weighted":
                r = run_in_child(_bare_weighted, str(weighted), str(out), args.memory_limit)
            else:
                r = run_in_child(_bare, str(landing), str(out), args.memory_limit)
            best = r if best is None or r["seconds"] < best["seconds"] else best
            shutil.rmtree(out, ignore_errors=True)
        results[name] = best

    print(f"\ninput: {rows:,} edge rows, {args.nodes:,} nodes requested, files in {landing}")
    print(f"{'variant':<44}{'seconds':>9}{'in rows/s':>14}{'rows out':>14}{'peak RSS':>11}")
    labels = {
        "bare": "bare DuckDB COPY SELECT DISTINCT",
        "ours": "ours (relabel+symmetrize+dedupe+sort+stats)",
        "ours_edges_only": "ours, same edges, no nodes/features files",
        "bare_weighted": "bare DuckDB GROUP BY src, dst sum(weight)",
        "ours_weighted": "ours, weighted (sum over dups + directions)",
        "ours_baseline_code": f"ours, code of {args.baseline_code}",
    }
    for name, r in results.items():
        print(
            f"{labels[name]:<44}{r['seconds']:>9.2f}{rows / r['seconds']:>14,.0f}{r['rows_out']:>14,}"
            f"{r['rss'] / 2**30:>9.2f} GB"
        )
    ratio = results["ours"]["seconds"] / results["bare"]["seconds"]
    print(f"ratio ours / bare (time): {ratio:.2f}   (target <= 2.0)")
    edge_ratio = results["ours_edges_only"]["seconds"] / results["bare"]["seconds"]
    print(f"ratio ours on the edges alone / bare (time): {edge_ratio:.2f}")
    print(f"peak RSS ours: {results['ours']['rss'] / 2**30:.2f} GB, bare: {results['bare']['rss'] / 2**30:.2f} GB")
    if "ours_weighted" in results:
        w, u, bw = results["ours_weighted"], results["ours"], results["bare_weighted"]
        print(
            f"weighted / unweighted (ours): time {w['seconds'] / u['seconds']:.2f}, peak RSS {w['rss'] / u['rss']:.2f}; "
            f"ours weighted / bare weighted: time {w['seconds'] / bw['seconds']:.2f}, "
            f"peak RSS {w['rss'] / bw['rss']:.2f}"
        )
    if "ours_baseline_code" in results:
        b = results["ours_baseline_code"]
        print(
            f"unweighted ours / baseline code: time {results['ours']['seconds'] / b['seconds']:.2f}, "
            f"peak RSS {results['ours']['rss'] / b['rss']:.2f}"
        )


if __name__ == "__main__":
    main()
