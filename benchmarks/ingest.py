"""Ingest benchmark: our canonical_graph stage vs the bare DuckDB dedupe of the same files.

    .venv/bin/python benchmarks/ingest.py --nodes 1000000 --edges 10000000
    .venv/bin/python benchmarks/ingest.py --nodes 1000000 --edges 10000000 --ids sparse
    .venv/bin/python benchmarks/ingest.py --nodes 10000000 --edges 100000000 --memory-limit 4GB
    .venv/bin/python benchmarks/ingest.py --baseline-code /path/to/other/checkout   # + that code's ingest

Generates the graph (cached under --work, in a child process) with the ids of each kind in
--ids: ``dense`` (the generator's 0..n-1), ``sparse`` (every node mapped to a distinct int64
drawn from 0..10^12, in random order) and ``string`` (``"n"`` + that sparse number). Then,
per id kind, each variant in a fresh child process (peak RSS is the child's own,
`graphs.infra.storage.peak_rss_bytes`), with the input files read once right before it so every
variant starts from the same warm page cache:

  ours   `build_canonical_graph` (validate, relabel, symmetrize, dedupe, sort, labels,
         features, degree stats), and the same on the edge files alone;
  bare   the bare DuckDB equivalent ``COPY (SELECT DISTINCT src, dst FROM read_parquet(...))
         TO ... (FORMAT parquet)``, no relabelling, on a connection with our settings
         (`graphs.infra.duck.connect`: the same memory_limit, threads, preserve_insertion_order);
  floor  with --floor, DuckDB doing our edge work step by step on the same connection settings:
         + each row's reverse without self loops, distinct (``UNION``), then + ``ORDER BY src,
         dst``. Each step's cost over the bare query is a floor the ratio ours / bare cannot go
         below with DuckDB's own operators; ours on the edge files is compared with the last
         (target at 10M rows: at most 1.0x, DuckDB's own operators doing the same work).

Only the work is timed: the output's row count is read after the clock stops on both
sides. With --repeat R every variant runs once per round, in reverse order every other round,
and the best of the R rounds is kept (the machine's drift reaches every variant alike). Prints
seconds, rows/s, peak RSS and the ratio ours / bare (target at 10M rows: at most `BARE_TARGET`).

Weighted variant (dense ids): the same edge rows with a ``weight`` column (``heavy_weight``:
intra-class rows 5.0, others 1.0), ours (weights summed over duplicates and both
directions) against the bare ``SELECT src, dst, sum(weight) ... GROUP BY src, dst``.
With ``--baseline-code`` the unweighted ingest of another checkout (e.g. main before a
change) runs too, on the same files in the same run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages

import harness  # noqa: E402  (benchmarks/harness.py)
from _child import run_in_child  # noqa: E402  (benchmarks/_child.py)

ID_KINDS = ("dense", "sparse", "string")
FLOOR_STEPS = ("symmetrize", "sort")  # the DuckDB floor's steps beyond the bare query, in order
SPARSE_ID_RANGE = 10**12
# ours / the bare query at 10M rows; the floor records show what DuckDB itself needs for our edge work
BARE_TARGET = 1.5


def _ours(landing: str, out: str, memory_limit: str, budget_mb: int, queue, code: str | None = None) -> None:
    if code:  # another checkout's graphs/ package, imported in this fresh child only
        sys.path.insert(0, code)
    from graphs.infra.storage import peak_rss_bytes
    from graphs.stages.canonical import CanonicalConfig, build_canonical_graph

    t, c = time.perf_counter(), harness.cpu_seconds()
    s = build_canonical_graph(landing, out, CanonicalConfig(memory_limit=memory_limit, sort_budget_mb=budget_mb))
    seconds, cpu = time.perf_counter() - t, harness.cpu_seconds() - c
    queue.put({"seconds": seconds, "cpu": cpu, "rss": peak_rss_bytes(), "rows_out": s["edges"], "nodes": s["nodes"]})


def _rows_of(path: str) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def _bare(landing: str, out: str, memory_limit: str, queue) -> None:
    from graphs.infra import duck
    from graphs.infra.storage import peak_rss_bytes

    Path(out).mkdir(parents=True, exist_ok=True)
    t, c = time.perf_counter(), harness.cpu_seconds()
    con = duck.connect(memory_limit, temp_directory=f"{out}/tmp")  # ours's settings, threads included
    # COPY (SELECT DISTINCT src, dst FROM read_parquet(...)) TO ..., with the paths as arguments
    edges = duck.read_parquet(con, sorted(Path(landing, "edges").glob("*.parquet")))  # literal paths, no glob
    edges.select("src, dst").distinct().write_parquet(f"{out}/edges.parquet")
    con.close()
    seconds, cpu = time.perf_counter() - t, harness.cpu_seconds() - c
    queue.put({"seconds": seconds, "cpu": cpu, "rss": peak_rss_bytes(), "rows_out": _rows_of(f"{out}/edges.parquet")})


def _floor(landing: str, out: str, memory_limit: str, step: str, queue) -> None:
    """DuckDB doing the edge work of our stage up to `step` (`FLOOR_STEPS`), on the raw ids: the
    rows and their reverses without self loops, distinct (``symmetrize``), then in (src, dst)
    order (``sort``), written as Parquet like the bare query."""
    from graphs.infra import duck
    from graphs.infra.storage import peak_rss_bytes

    Path(out).mkdir(parents=True, exist_ok=True)
    t, c = time.perf_counter(), harness.cpu_seconds()
    con = duck.connect(memory_limit, temp_directory=f"{out}/tmp")
    edges = duck.read_parquet(con, sorted(Path(landing, "edges").glob("*.parquet"))).select("src, dst")
    both = edges.union(edges.select("dst AS src, src AS dst")).filter("src <> dst").distinct()  # union: UNION ALL
    if step == "sort":
        both = both.order("src, dst")
    both.write_parquet(f"{out}/edges.parquet")
    con.close()
    seconds, cpu = time.perf_counter() - t, harness.cpu_seconds() - c
    queue.put({"seconds": seconds, "cpu": cpu, "rss": peak_rss_bytes(), "rows_out": _rows_of(f"{out}/edges.parquet")})


def _bare_weighted(landing: str, out: str, memory_limit: str, queue) -> None:
    from graphs.infra import duck
    from graphs.infra.storage import peak_rss_bytes

    Path(out).mkdir(parents=True, exist_ok=True)
    t, c = time.perf_counter(), harness.cpu_seconds()
    con = duck.connect(memory_limit, temp_directory=f"{out}/tmp")
    edges = duck.read_parquet(con, sorted(Path(landing, "edges").glob("*.parquet")))  # literal paths, no glob
    edges.aggregate("src, dst, sum(weight) AS weight", "src, dst").write_parquet(f"{out}/edges.parquet")
    con.close()
    seconds, cpu = time.perf_counter() - t, harness.cpu_seconds() - c
    queue.put({"seconds": seconds, "cpu": cpu, "rss": peak_rss_bytes(), "rows_out": _rows_of(f"{out}/edges.parquet")})


def _ours_baseline(landing: str, out: str, memory_limit: str, budget_mb: int, code: str, queue) -> None:
    _ours(landing, out, memory_limit, budget_mb, queue, code)


def _generate(nodes: int, edges: int, landing: str, weighted: str, queue) -> None:
    """The dense-id graph (and its weighted twin), generated in a child so this parent stays small."""
    import dataclasses

    from graphs.synthetic.generate import generate_dataset, scale_config

    if not Path(landing).exists():
        t = time.perf_counter()
        generate_dataset(scale_config(nodes, edges, seed=0), landing, progress=False)
        print(f"generated {landing} in {time.perf_counter() - t:.1f} s", flush=True)
    if weighted and not Path(weighted).exists():
        weighted_config = dataclasses.replace(scale_config(nodes, edges, seed=0), heavy_weight=5.0)
        generate_dataset(weighted_config, weighted, progress=False)
    queue.put({})


def _derive(dense: str, out: str, kind: str, queue) -> None:
    """A copy of the dense-id landing folder whose ids are `kind` (sparse int64 or strings)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    src_dir, tmp = Path(dense), Path(out + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "edges").mkdir(parents=True)
    n = pq.ParquetFile(src_dir / "nodes.parquet").metadata.num_rows
    rng = np.random.default_rng(12345)
    values = np.unique(rng.integers(0, SPARSE_ID_RANGE, size=n + n // 100 + 64, dtype=np.int64))
    while len(values) < n:  # collisions among 10^12 are rare; draw again if too many
        values = np.unique(np.concatenate([values, rng.integers(0, SPARSE_ID_RANGE, size=n, dtype=np.int64)]))
    mapping = pa.array(rng.permutation(values)[:n])  # random order: new ids do not follow the old ones
    if kind == "string":
        mapping = pc.binary_join_element_wise("n", pc.cast(mapping, pa.string()), "")

    def remap(table: pa.Table, columns: tuple[str, ...]) -> pa.Table:
        for c in columns:
            i = table.schema.get_field_index(c)
            table = table.set_column(i, c, pc.take(mapping, table.column(c)))
        return table

    for f in sorted((src_dir / "edges").glob("*.parquet")):
        pq.write_table(remap(pq.read_table(f), ("src", "dst")), tmp / "edges" / f.name, row_group_size=1 << 20)
    for name in ("nodes.parquet", "features.parquet"):
        if (src_dir / name).exists():
            pq.write_table(remap(pq.read_table(src_dir / name), ("node_id",)), tmp / name)
    tmp.rename(out)
    queue.put({})


def _warm(folder: Path) -> None:
    """Read every file under `folder` once, so each variant starts from the same warm page cache."""
    for p in sorted(folder.rglob("*.parquet")):
        with open(p.resolve(), "rb") as f:
            while f.read(1 << 24):
                pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges", type=int, default=10_000_000)
    ap.add_argument("--ids", default="dense,sparse,string", help=f"id kinds, comma-separated: {ID_KINDS}")
    ap.add_argument("--work", default="bench_out/ingest")
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--sort-budget-mb", type=int, default=1024)
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds (every variant once per round, alternate rounds reversed); the best time is kept",
    )
    ap.add_argument("--baseline-code", default=None, help="another checkout whose unweighted ingest runs too")
    ap.add_argument("--no-weighted", action="store_true", help="skip the weighted variant")
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also time DuckDB doing our edge work step by step (symmetrize, then sort): the floor of the ratio",
    )
    ap.add_argument("--record", help="append result records here (benchmarks/harness.py)")
    args = ap.parse_args()
    kinds = [k for k in args.ids.split(",") if k]
    for k in kinds:
        if k not in ID_KINDS:
            ap.error(f"--ids: unknown id kind {k!r}; one of {ID_KINDS}")

    work = Path(args.work).resolve()
    dense = work / f"landing-{args.nodes}-{args.edges}"
    weighted = work / f"weighted-{args.nodes}-{args.edges}"
    run_in_child(_generate, args.nodes, args.edges, str(dense), "" if args.no_weighted else str(weighted))
    landings = {"dense": dense}
    for kind in kinds:
        if kind != "dense":
            landings[kind] = work / f"landing-{kind}-{args.nodes}-{args.edges}"
            if not landings[kind].exists():
                run_in_child(_derive, str(dense), str(landings[kind]), kind)
    import pyarrow.parquet as pq

    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in sorted((dense / "edges").glob("*.parquet")))

    def once(target, source: Path, *extra) -> dict:
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        _warm(source)
        r = run_in_child(target, str(source), str(out), *extra)
        shutil.rmtree(out, ignore_errors=True)
        return r

    variants: dict[str, tuple] = {}  # name -> (target, source, extra arguments)
    for kind in kinds:
        landing = landings[kind]
        # The same edge files without nodes/features: our edge work alone against the same query.
        edges_only = work / f"edges-only-{landing.name}"
        if not edges_only.exists():
            edges_only.mkdir(parents=True)
            (edges_only / "edges").symlink_to(landing / "edges")
        variants[f"bare/{kind}"] = (_bare, landing, args.memory_limit)
        variants[f"ours/{kind}"] = (_ours, landing, args.memory_limit, args.sort_budget_mb)
        variants[f"ours_edges_only/{kind}"] = (_ours, edges_only, args.memory_limit, args.sort_budget_mb)
        if args.floor:
            for step in FLOOR_STEPS:
                variants[f"floor_{step}/{kind}"] = (_floor, landing, args.memory_limit, step)
    if not args.no_weighted:
        variants["bare_weighted"] = (_bare_weighted, weighted, args.memory_limit)
        variants["ours_weighted"] = (_ours, weighted, args.memory_limit, args.sort_budget_mb)
    if args.baseline_code:
        code = str(Path(args.baseline_code).resolve())
        for kind in kinds:
            variants[f"ours_baseline_code/{kind}"] = (
                _ours_baseline,
                landings[kind],
                args.memory_limit,
                args.sort_budget_mb,
                code,
            )
    # Every variant once per round, the order reversed every other round, best of the rounds:
    # on a machine whose speed drifts, running one variant's repeats back to back (or every
    # baseline-code variant last) would hand the drift to whichever side ran later.
    results: dict[str, dict] = {}
    names = list(variants)
    for round_ in range(args.repeat):
        for name in names if round_ % 2 == 0 else names[::-1]:
            r = once(*variants[name])
            if name not in results or r["seconds"] < results[name]["seconds"]:
                results[name] = r
    results = {name: results[name] for name in names}

    print(f"\ninput: {rows:,} edge rows, {args.nodes:,} nodes requested, files in {work}")
    print(f"{'variant':<52}{'seconds':>9}{'CPU s':>8}{'in rows/s':>14}{'rows out':>14}{'peak RSS':>11}")
    labels = {
        "bare": "bare DuckDB COPY SELECT DISTINCT",
        "ours": "ours (relabel+symmetrize+dedupe+sort+stats)",
        "ours_edges_only": "ours, same edges, no nodes/features files",
        "bare_weighted": "bare DuckDB GROUP BY src, dst sum(weight)",
        "ours_weighted": "ours, weighted (sum over dups + directions)",
        "ours_baseline_code": f"ours, code of {args.baseline_code}",
        "floor_symmetrize": "DuckDB: + reverses, no self loops, distinct",
        "floor_sort": "DuckDB: + ORDER BY src, dst (our edge work)",
    }
    for name, r in results.items():
        base, _, kind = name.partition("/")
        label = labels[base] + (f", {kind} ids" if kind else "")
        print(
            f"{label:<52}{r['seconds']:>9.2f}{r['cpu']:>8.2f}{rows / r['seconds']:>14,.0f}{r['rows_out']:>14,}"
            f"{r['rss'] / 2**30:>9.2f} GB"
        )
    records = []
    for kind in kinds:
        o, e, b = results[f"ours/{kind}"], results[f"ours_edges_only/{kind}"], results[f"bare/{kind}"]
        print(
            f"{kind} ids: ours / bare {o['seconds'] / b['seconds']:.2f} (target <= {BARE_TARGET}; CPU seconds "
            f"{o['cpu'] / b['cpu']:.2f}), edges alone "
            f"{e['seconds'] / b['seconds']:.2f}; peak RSS ours {o['rss'] / 2**30:.2f} GB, bare {b['rss'] / 2**30:.2f} GB"
        )
        common = {"benchmark": "ingest", "metric": "seconds", "nodes": args.nodes, "edges": rows}
        records += [
            harness.Record(
                **common,
                stage=f"ingest, {kind} ids",
                ours=o["seconds"],
                peer=b["seconds"],
                peer_name="bare DuckDB SELECT DISTINCT",
                max_ratio=harness.target_at(rows, BARE_TARGET),
                ours_rss_bytes=o["rss"],
                peer_rss_bytes=b["rss"],
                ours_cpu_seconds=o["cpu"],
                peer_cpu_seconds=b["cpu"],
                notes=f"CPU seconds ours / bare {o['cpu'] / b['cpu']:.2f}"
                + (
                    ""
                    if rows >= harness.TARGET_EDGES
                    else f"; the <= {BARE_TARGET} target is set at {harness.TARGET_EDGES:,} rows"
                )
                + (
                    "; ours also relabels, symmetrizes, sorts, writes nodes, features and degree stats"
                    if kind == kinds[0]
                    else ""
                ),
            ),
            harness.Record(
                **common,
                stage=f"ingest, {kind} ids, edge files alone",
                ours=e["seconds"],
                peer=b["seconds"],
                peer_name="bare DuckDB SELECT DISTINCT",
                ours_rss_bytes=e["rss"],
                peer_rss_bytes=b["rss"],
                ours_cpu_seconds=e["cpu"],
                peer_cpu_seconds=b["cpu"],
            ),
        ]
    for kind in kinds if args.floor else []:
        records += _floor_records(results, kind, rows, args.nodes)
    if "ours_weighted" in results:
        w, bw = results["ours_weighted"], results["bare_weighted"]
        print(f"weighted: ours / bare {w['seconds'] / bw['seconds']:.2f}, peak RSS {w['rss'] / bw['rss']:.2f}")
        records.append(
            harness.Record(
                benchmark="ingest",
                stage="ingest, weighted, dense ids",
                metric="seconds",
                ours=w["seconds"],
                peer=bw["seconds"],
                peer_name="bare DuckDB GROUP BY sum(weight)",
                ours_rss_bytes=w["rss"],
                peer_rss_bytes=bw["rss"],
                ours_cpu_seconds=w["cpu"],
                peer_cpu_seconds=bw["cpu"],
                nodes=args.nodes,
                edges=rows,
            )
        )
    for kind in kinds if args.baseline_code else []:
        b, u = results[f"ours_baseline_code/{kind}"], results[f"ours/{kind}"]
        print(
            f"{kind} ids, ours / baseline code: time {u['seconds'] / b['seconds']:.2f}, CPU seconds "
            f"{u['cpu'] / b['cpu']:.2f} ({u['cpu']:.2f} vs {b['cpu']:.2f}), peak RSS {u['rss'] / b['rss']:.2f}"
        )
    harness.emit(args.record, records)


def _floor_records(results: dict, kind: str, rows: int, nodes: int) -> list:
    """Each DuckDB floor step against the bare query (what the step costs DuckDB), and ours
    against the last step (DuckDB doing our edge work), printed and as records."""
    bare, ours = results[f"bare/{kind}"], results[f"ours_edges_only/{kind}"]
    common = {"benchmark": "ingest", "metric": "seconds", "nodes": nodes, "edges": rows}
    records, before = [], ("bare", bare)
    for step in FLOOR_STEPS:
        r = results[f"floor_{step}/{kind}"]
        print(
            f"{kind} ids, DuckDB + {step}: {r['seconds']:.2f} s = {r['seconds'] / bare['seconds']:.2f}x the bare "
            f"query (+{r['seconds'] - before[1]['seconds']:.2f} s over {before[0]})"
        )
        records.append(
            harness.Record(
                **common,
                stage=f"ingest floor, {kind} ids: DuckDB + {step}",
                ours=r["seconds"],
                peer=bare["seconds"],
                peer_name="bare DuckDB SELECT DISTINCT",
                ours_rss_bytes=r["rss"],
                peer_rss_bytes=bare["rss"],
                ours_cpu_seconds=r["cpu"],
                peer_cpu_seconds=bare["cpu"],
                notes=f"DuckDB alone, steps of our edge work up to {step}; 'ours' = that query",
            )
        )
        before = (step, r)
    last = before[1]
    print(
        f"{kind} ids, ours (edge files alone) / DuckDB doing the same edge work: {ours['seconds'] / last['seconds']:.2f}"
    )
    records.append(
        harness.Record(
            **common,
            stage=f"ingest, {kind} ids, edge files alone, against DuckDB doing our edge work",
            ours=ours["seconds"],
            peer=last["seconds"],
            peer_name="DuckDB: symmetrize, dedupe, sort, write",
            max_ratio=harness.target_at(rows, 1.0),
            ours_rss_bytes=ours["rss"],
            peer_rss_bytes=last["rss"],
            ours_cpu_seconds=ours["cpu"],
            peer_cpu_seconds=last["cpu"],
            notes="ours also relabels" if kind != "dense" else "",
        )
    )
    return records


if __name__ == "__main__":
    main()
